"""Collective groups: which data flows belong together and what collective they are.
Definitions: docs/metrics.md "Collectives".

Discovery works on the graph of data flows (CTS/ACK/CNP flows excluded, so each edge
points in the data direction):

1. connected components of the node graph, without background flows (background_flows:
   control-sized messages carrying next to nothing: barriers, a library's start-up
   exchange between every pair);
2. a component is matched as a whole against the patterns below; if none fits, it is
   decomposed: complete bidirectional sub-graphs (>= 4 nodes) become all-to-all groups
   (flows whose message size is >= 8x off the clique's are left out), and the rest is
   split by flow fingerprint (modal message-size slot, message count within 10 %) and
   matched again; leftovers are "unknown".

Patterns (n nodes, E directed data edges, U the undirected edges):

    ring_allreduce   every node has out-degree = in-degree = k and E is k directed cycles
                     covering all nodes (k rings, one per channel order); or U is one cycle
                     with both directions (two opposite rings)
    all_to_all       n >= 3 and E has >= 90 % of the n(n-1) ordered pairs
    tree_allreduce   every edge carries data both ways, U is connected with
                     n-1 < |U| <= 2(n-1) (a double binary tree) or a tree that is not a path
    p2p              a path with data both ways (pipeline stages), a one-way chain, a star
                     (many_to_one / one_to_many) or a single pair
    kv_transfer      one way from >= 2 senders (prefill) into >= 2 receivers (decode), no node
                     both sends and receives (pattern prefill_decode; KV-cache blocks of P/D
                     disaggregation); one-way pairs/stars consistent with it merge into it,
                     and without it >= 2 one-way stars whose roles never mix are one

One-host views (a DPU or mirror sees one host's port: every data edge touches that host,
the "hub"): k predecessors -> hub -> k successors is a ring segment (ring_allreduce,
pattern ring_segment); data both ways with >= 3 peers and no big slices is an all-to-all
seen from one member (alltoall_star); <= 6 peers (two binary trees) with >= 256 KiB slices a tree node;
2 peers with P2P chunks a pipeline (stage). Their confidence is lower (0.5-0.7): the rest of
the collective is not visible.

Ambiguous shapes (2 nodes, 3-node triangle, 3-node path) are settled by NCCL's message
sizes: >= 256 KiB slices -> ring/tree SIMPLE; exactly 32/64/128 KiB chunks -> P2P /
all-to-all; 2 nodes exchanging LL/LL128 messages by their timing (exchange(): a 2-rank
all-reduce's steps answer each other, an all-to-all's and a pipeline's do not). Confidence =
how well the pattern fits (share of nodes/edges that fit) x 0.8 when the sizes disagree
with the pattern, x 0.7 for an ambiguous shape.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from skewscope.analysis.context import context
from skewscope.analysis.stats import median, percentile, unique
from skewscope.core import layout as L

KINDS = ("all_to_all", "ring_allreduce", "tree_allreduce", "p2p", "kv_transfer", "unknown")
#: 2 nodes exchanging LL/LL128 messages are a 2-rank all-reduce when one direction starts at
#: least this share of its messages as answers to the other's (exchange())
PAIR_SHARE = 0.3
#: "answer": starting within this fraction of the direction's 75th-percentile gap between
#: its message starts after a message the other way ended
PAIR_TOL = 0.25
#: ... with the bytes of the two directions within this ratio (an all-reduce's are equal)
PAIR_BALANCE = 0.8
#: ... and at least this many messages each way
PAIR_MIN_MESSAGES = 8
KiB = 1024
MiB = 1 << 20
P2P_CHUNKS = (32 * KiB, 64 * KiB, 128 * KiB)
#: a flow of control-sized messages is background (background_flows) below 1/this of the
#: largest flow's bytes of its component ...
BACKGROUND_BYTES = 64
#: ... and with at most 1/this of its largest message count
BACKGROUND_MESSAGES = 4


@dataclass
class Group:
    kind: str
    members: list            # node indices (ring order / stage order / sorted)
    flows: np.ndarray        # data flow indices
    confidence: float
    evidence: list = field(default_factory=list)
    pattern: str | None = None
    extra: dict = field(default_factory=dict)


# ---- size hints ----------------------------------------------------------------------
SIZE_CLASSES = ("simple", "ll128", "p2p_chunks", "ll", "other")


def _size_class(b: int) -> str:
    """NCCL class of one message size (wire.md "Message sizes")."""
    if b in P2P_CHUNKS:
        return "p2p_chunks"
    if b == 614400 or (b > 65536 and b % 2048 == 0 and b % 65536 != 0 and b <= 614400):
        return "ll128"
    if b >= 256 * KiB:
        return "simple"
    if b <= 65536 and b % 16 == 0:
        return "ll"
    return "other"


def size_hints(ctx, flows: np.ndarray) -> dict:
    """NCCL hints from the exact message sizes of a set of data flows."""
    if len(flows) == 0 or len(ctx.events) == 0:
        return {"top_sizes": [], "protocol": None, "large": False, "p2p_chunks": False}
    u, c = ctx.data_sizes(flows)
    if len(u) == 0:
        return {"top_sizes": [], "protocol": None, "large": False, "p2p_chunks": False}
    wb = (u * c).astype(np.float64)
    top = np.argsort(-c, kind="stable")[:4]
    modal_b = int(u[np.argmax(wb)])          # bytes-weighted mode
    n = int(c.sum())
    chunk_share = float(c[np.isin(u, P2P_CHUNKS)].sum()) / n
    cls = np.array([_size_class(int(x)) for x in u])
    tot = max(1.0, float(wb.sum()))
    shares = {k: round(float(wb[cls == k].sum()) / tot, 4) for k in SIZE_CLASSES if (cls == k).any()}
    proto = _size_class(modal_b) if chunk_share < 0.5 else "p2p_chunks"
    return {"top_sizes": [[int(u[i]), int(c[i])] for i in top], "modal_size": modal_b,
            "protocol": proto, "protocol_shares": shares, "large": modal_b >= 256 * KiB and chunk_share < 0.5,
            "p2p_chunks": chunk_share >= 0.5}


def exchange(ctx, flows: np.ndarray, a: int) -> tuple[float, float, int]:
    """Between the 2 nodes of `flows` (one of them `a`): (answered, balance, n). answered:
    the larger over the two directions of the share of its data messages that start soon
    after a message the other way has ended (within PAIR_TOL of the direction's own 75th
    percentile gap between message starts; the other's message ended strictly before);
    balance: the smaller direction's data bytes over the larger's; n: messages in the
    quieter direction. In a 2-rank all-reduce every step after the first answers the other
    rank's chunk as it lands (a reduce, no compute): about half the messages, in at least
    one direction. Messages sent at the same moment (an all-to-all's dispatch, its combine
    after the expert compute) or a compute time after the other's (pipeline stages: forward
    activations, backward gradients) are not answers."""
    src = ctx.nodes.src[flows]
    vol = ctx.volume[flows]
    out_b, in_b = float(vol[src == a].sum()), float(vol[src != a].sum())
    balance = min(out_b, in_b) / max(out_b, in_b) if max(out_b, in_b) > 0 else 0.0
    if len(ctx.events) == 0:
        return 0.0, balance, 0
    way = np.full(len(ctx.flows), -1, dtype=np.int64)
    way[flows] = np.where(src == a, 0, 1)
    f = ctx.ev_flow
    k = np.where(ctx.ev_data & (f >= 0), way[np.maximum(f, 0)], -1)
    st = [np.sort(ctx.ev_start[k == w]) for w in (0, 1)]
    en = [np.sort(ctx.ev_end[k == w]) for w in (0, 1)]
    n = min(len(st[0]), len(st[1]))
    if n < 2:
        return 0.0, balance, n
    answered = 0.0
    for w in (0, 1):
        s, oe = st[w], en[1 - w]
        g = np.diff(s)
        # messages starting within 1 us of each other are one send (its channels in
        # parallel): the gaps between sends set the tolerance
        g = g[g >= 1000.0]
        if not len(g):
            continue
        tol = PAIR_TOL * float(percentile(g, 75))
        i = np.searchsorted(oe, s, side="left") - 1       # the other's last end before s
        d = np.where(i >= 0, s - oe[np.maximum(i, 0)], np.inf)
        answered = max(answered, float(np.mean(d <= tol)))
    return answered, balance, n


def small_pair_allreduce(ctx, flows: np.ndarray, a: int, hints: dict | None = None) -> str | None:
    """The evidence that the data flows both ways between 2 nodes (one of them `a`), in
    LL/LL128 messages or messages of a P2P chunk's size (a decode all-reduce of a larger
    batch is 32/64 KiB too), or of sizes no NCCL protocol uses (another library), are a
    2-rank all-reduce (exchange()), or None."""
    hints = hints or size_hints(ctx, flows)
    # NCCL's LL/LL128 or P2P-chunk sizes; or sizes of no NCCL class at all (another library:
    # Open MPI's eager SENDs carry its header), where the timing alone decides
    label = {"ll": "LL", "ll128": "LL128", "p2p_chunks": "P2P-chunk-sized", "other": "non-NCCL-sized"}.get(
        hints["protocol"])
    if label is None:
        return None
    pr, bal, nm = exchange(ctx, flows, a)
    if pr < PAIR_SHARE or bal < PAIR_BALANCE or nm < PAIR_MIN_MESSAGES:
        return None
    return (f"2 nodes exchanging {label} messages step by step ({pr:.0%} of one side's "
            f"sent as the other's lands; bytes {bal:.0%} balanced): a 2-rank all-reduce (2-way tensor parallel)")


def pair_allreduce(ctx, flows: np.ndarray, a: int, hints: dict | None = None) -> str | None:
    """Why the data flows both ways between 2 nodes (one of them `a`) are a 2-rank all-reduce
    (ring or tree), or None: slices of >= 256 KiB, or LL/LL128 or P2P-chunk-sized steps that
    answer each other (small_pair_allreduce). The one rule for the whole capture (match_pattern) and for one
    DPU's view of a node with one peer (nodeview)."""
    hints = hints or size_hints(ctx, flows)
    if hints["large"]:
        return "2 nodes both ways with >= 256 KiB slices: a 2-rank ring (or tree)"
    return small_pair_allreduce(ctx, flows, a, hints)


# ---- graph helpers -------------------------------------------------------------------------
def _components(nodes_n, es, ed):
    parent = list(range(nodes_n))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x
    for a, b in zip(es, ed):
        ra, rb = find(int(a)), find(int(b))
        if ra != rb:
            parent[ra] = rb
    comp = {}
    for x in set(int(v) for v in es) | set(int(v) for v in ed):
        comp.setdefault(find(x), []).append(x)
    return list(comp.values())


def _cycle_order(succ: dict) -> list | None:
    """Nodes in cycle order if succ (node -> node) is one cycle over all its keys."""
    if not succ:
        return None
    start = min(succ)
    order = [start]
    cur = succ[start]
    while cur != start:
        if cur not in succ or cur in order:
            return None
        order.append(cur)
        cur = succ[cur]
    return order if len(order) == len(succ) else None


def _path_order(adj: dict) -> list | None:
    ends = [v for v, a in adj.items() if len(a) == 1]
    if len(ends) != 2 or any(len(a) > 2 for a in adj.values()):
        return None
    order = [min(ends)]
    prev = None
    while True:
        nxt = [x for x in adj[order[-1]] if x != prev]
        if not nxt:
            break
        prev = order[-1]
        order.append(nxt[0])
        if len(order) > len(adj):
            return None
    return order if len(order) == len(adj) else None


def _is_cycle(adj: dict) -> list | None:
    if len(adj) < 3 or any(len(a) != 2 for a in adj.values()):
        return None
    start = min(adj)
    order = [start]
    prev = None
    cur = start
    while True:
        nxt = [x for x in sorted(adj[cur]) if x != prev]
        if not nxt:
            return None
        prev, cur = cur, nxt[0]
        if cur == start:
            break
        if cur in order:
            return None
        order.append(cur)
    return order if len(order) == len(adj) else None


def _connected(adj: dict) -> bool:
    if not adj:
        return False
    seen = set()
    stack = [next(iter(adj))]
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        stack.extend(adj[v] - seen)
    return len(seen) == len(adj)


# ---- pattern matching -------------------------------------------------------------------
def match_pattern(ctx, flows: np.ndarray) -> Group:
    src = ctx.nodes.src[flows]
    dst = ctx.nodes.dst[flows]
    E = set(zip(src.tolist(), dst.tolist()))
    V = sorted(set(src.tolist()) | set(dst.tolist()))
    n = len(V)
    m = len(E)
    outd = {v: set() for v in V}
    ind = {v: set() for v in V}
    for a, b in E:
        outd[a].add(b)
        ind[b].add(a)
    bid = sum(1 for a, b in E if (b, a) in E) / max(1, m)
    adj = {v: outd[v] | ind[v] for v in V}
    nU = sum(len(a) for a in adj.values()) // 2
    hints = size_hints(ctx, flows)
    ev = [f"{n} nodes, {m} directed data edges, {bid:.0%} bidirectional"]
    if hints["top_sizes"]:
        ev.append("message sizes " + ", ".join(f"{s}x{c}" for s, c in hints["top_sizes"][:3])
                  + (f" ({hints['protocol']})" if hints["protocol"] else ""))

    def G(kind, members, conf, pattern=None, extra=None, why=None):
        ex = dict(extra or {})
        ex["_hints"] = hints
        return Group(kind, list(members), np.asarray(flows), float(round(conf, 3)),
                     ev + ([why] if why else []), pattern, ex)

    if n < 2:
        return G("unknown", V, 0.0, "loopback", why="data from a node to itself (loopback or GIDs not unique)")
    if n == 2:
        a, b = V
        if m == 1:
            (s, d), = E
            return G("p2p", [s, d], 0.9, "pair", why="one direction only")
        why = pair_allreduce(ctx, flows, a, hints)
        if why:
            return G("ring_allreduce", [a, b], 0.5, "ring", {"ring": [a, b]}, why=why)
        if hints["p2p_chunks"]:
            why = "2 nodes both ways with P2P-sized chunks"
        elif hints["protocol"] in ("ll", "ll128"):
            why = (f"2 nodes both ways in {hints['protocol'].upper()} messages that do not answer each other step by "
                   "step: point-to-point (pipeline stages, expert-parallel exchange)")
        else:
            why = "2 nodes both ways, neither >= 256 KiB slices nor steps that answer each other: point-to-point"
        return G("p2p", [a, b], 0.7, "pair", why=why)
    # one-host view (a DPU sees its own host's port): every edge touches one hub
    hub = [h for h in V if all(h in e for e in E)] if n >= 3 else []
    if hub and not (n == 3 and m == 6):
        h = hub[0]
        O, I = outd[h], ind[h]
        peers = sorted((O | I) - {h})
        if O and I and not (O & I) and len(O) == len(I) and len(O) <= 4:
            order = sorted(I) + [h] + sorted(O)
            return G("ring_allreduce", order, 0.7 if not hints["p2p_chunks"] else 0.6, "ring_segment",
                     {"ring": None, "rings": len(O), "hub": h, "predecessors": sorted(I), "successors": sorted(O)},
                     why=f"one-host view of {len(O)} ring(s): {len(I)} predecessor(s) -> this node -> "
                         f"{len(O)} successor(s)")
        if O == I and len(O) >= 2:
            if len(O) >= 3 and not hints["large"]:
                return G("all_to_all", [h] + peers, 0.6, "alltoall_star", {"hub": h},
                         why=f"one-host view: this node exchanges data with {len(O)} peers both ways")
            if len(O) <= 6 and hints["large"]:
                return G("tree_allreduce", [h] + peers, 0.5, "tree_node", {"hub": h},
                         why=f"one-host view: {len(O)} tree neighbours both ways, >= 256 KiB slices")
            if len(O) == 2:
                return G("p2p", [peers[0], h, peers[1]], 0.6, "pipeline", {"hub": h, "stages": [peers[0], h, peers[1]]},
                         why="a stage exchanging data with its two neighbours (a 3-stage pipeline, or one "
                             "stage of a longer one seen from its host)")
    # ring: every node out = in = k, E is k cycles
    degs_o = {len(outd[v]) for v in V}
    degs_i = {len(ind[v]) for v in V}
    if len(degs_o) == 1 and degs_o == degs_i and bid <= 0.5:
        k = degs_o.pop()
        if k == 1:
            order = _cycle_order({v: next(iter(outd[v])) for v in V})
            if order:
                conf = 1.0 if not hints["p2p_chunks"] else 0.8
                return G("ring_allreduce", order, conf, "ring", {"ring": order, "rings": 1},
                         why="every node sends to exactly one successor: one directed cycle")
        elif k <= 4 and m == k * n:
            return G("ring_allreduce", V, 0.8, "ring", {"ring": None, "rings": k},
                     why=f"every node has {k} successors and {k} predecessors: {k} rings")
    full = m / (n * (n - 1))
    if bid >= 0.9:
        cyc = _is_cycle(adj)
        if cyc and n >= 4:
            return G("ring_allreduce", cyc, 0.8, "bidirectional_ring", {"ring": cyc, "rings": 2},
                     why="one undirected cycle used both ways: two opposite rings")
        path = _path_order(adj)
        if path is not None and nU == n - 1:
            if n == 3 and hints["large"]:
                return G("tree_allreduce", V, 0.6, "tree", why="3-node path with >= 256 KiB slices")
            return G("p2p", path, 0.9, "pipeline", {"stages": path},
                     why="a chain of nodes exchanging data both ways: pipeline stages")
        if n == 3 and full >= 0.99:
            if hints["large"]:
                return G("tree_allreduce", V, 0.6, "tree", why="3-node triangle with >= 256 KiB slices")
            return G("all_to_all", V, 0.7, "all_to_all", why="3 nodes, every ordered pair")
        if full >= 0.9 and n >= 4:
            return G("all_to_all", V, min(1.0, full) * (0.9 if hints["large"] else 1.0), "all_to_all",
                     why=f"{full:.0%} of the {n * (n - 1)} ordered pairs carry data")
        if _connected(adj) and n - 1 <= nU <= 2 * (n - 1):
            conf = 0.9 if not hints["p2p_chunks"] else 0.7
            return G("tree_allreduce", V, conf * bid, "tree",
                     why=f"{nU} undirected edges (<= 2(n-1) = {2 * (n - 1)}), data both ways: "
                         "(double) binary tree, max degree " + str(max(len(a) for a in adj.values())))
    if full >= 0.9 and n >= 3:
        return G("all_to_all", V, full * 0.9, "all_to_all", why=f"{full:.0%} of ordered pairs carry data")
    # prefill/decode disaggregation: one-way bulk transfers from >= 2 senders into >= 2
    # receivers, no node both sends and receives, no data back (KV-cache blocks)
    S = [v for v in V if outd[v] and not ind[v]]
    R = [v for v in V if ind[v] and not outd[v]]
    if bid == 0 and len(S) >= 2 and len(R) >= 2 and len(S) + len(R) == n:
        return G("kv_transfer", S + R, 0.9 if not hints["p2p_chunks"] else 0.8, "prefill_decode",
                 {"prefill": S, "decode": R},
                 why=f"{len(S)} senders -> {len(R)} receivers one way, nothing back: KV-cache transfers "
                     "(prefill -> decode)")
    # stars
    for c in V:
        if len(ind[c]) == n - 1 and m == n - 1:
            return G("p2p", [c] + [v for v in V if v != c], 0.8, "many_to_one",
                     why=f"{n - 1} senders into one node, nothing back")
        if len(outd[c]) == n - 1 and m == n - 1:
            return G("p2p", [c] + [v for v in V if v != c], 0.8, "one_to_many",
                     why=f"one node sends to {n - 1} nodes, nothing back")
    # one-way chain
    if all(len(outd[v]) <= 1 and len(ind[v]) <= 1 for v in V) and m == n - 1:
        start = [v for v in V if not ind[v]]
        if len(start) == 1:
            order = [start[0]]
            while outd[order[-1]]:
                order.append(next(iter(outd[order[-1]])))
            return G("p2p", order, 0.7, "chain", {"stages": order}, why="one-way chain")
    return G("unknown", V, 0.0, None, why="no collective pattern fits")


def _modal_slot(ctx, flows):
    h = ctx.flows["msg_hist"][flows].astype(np.float64)
    lb = np.array([L.slot_lower_bound(i) for i in range(h.shape[1])], dtype=np.float64)
    return np.argmax(h * np.maximum(lb, 1), axis=1)


def _cliques(ctx, flows, min_size=4):
    """Greedy maximal complete bidirectional sub-graphs."""
    src = ctx.nodes.src[flows]
    dst = ctx.nodes.dst[flows]
    E = set(zip(src.tolist(), dst.tolist()))
    V = sorted(set(src.tolist()) | set(dst.tolist()))
    nb = {v: {u for u in V if (v, u) in E and (u, v) in E} for v in V}
    out = []
    used = set()
    for v in sorted(V, key=lambda x: -len(nb[x])):
        if v in used:
            continue
        cl = [v]
        cand = sorted(nb[v] - used, key=lambda x: -len(nb[x]))
        for u in cand:
            if all(u in nb[w] for w in cl):
                cl.append(u)
        if len(cl) >= min_size:
            out.append(sorted(cl))
            used |= set(cl)
    return out


def _fingerprints(ctx, flows):
    """Cluster flows by (modal size slot, message count within 10 %)."""
    if len(flows) == 0:
        return []
    slot = _modal_slot(ctx, flows)
    msgs = ctx.fstat["n_data"][flows].astype(np.float64)
    order = np.lexsort((msgs, slot))
    clusters = []
    cur = [order[0]]
    for a, b in zip(order[:-1], order[1:]):
        if slot[a] == slot[b] and msgs[b] <= max(msgs[a] * 1.1, msgs[a] + 2):
            cur.append(b)
        else:
            clusters.append(cur)
            cur = [b]
    clusters.append(cur)
    return [flows[np.array(c)] for c in clusters]


def _layers(ctx, flows) -> list[np.ndarray]:
    """Split flows into message-size layers when some node pair carries flows of sizes >= 8x
    apart (two communicators on the same nodes, e.g. a DP ring and an EP all-to-all)."""
    if len(flows) < 2:
        return [flows]
    slot = _modal_slot(ctx, flows)
    nn = max(1, ctx.nodes.n)
    key = ctx.nodes.src[flows].astype(np.int64) * nn + ctx.nodes.dst[flows]
    o = np.lexsort((slot, key))
    ks, ss = key[o], slot[o]
    first = np.ones(len(ks), dtype=bool)
    first[1:] = ks[1:] != ks[:-1]
    starts = np.nonzero(first)[0]
    ends = np.append(starts[1:], len(ks)) - 1
    spread = ss[ends] - ss[starts]
    if not (spread >= 3).any():
        return [flows]
    u = unique(slot)
    cuts = u[1:][np.diff(u) >= 3]
    lay = np.searchsorted(cuts, slot, side="right")
    return [flows[lay == k] for k in unique(lay)]


def _decompose(ctx, flows) -> list[Group]:
    groups = []
    rest = np.asarray(flows)
    for cl in _cliques(ctx, rest):
        cs = set(cl)
        inside = np.array([int(ctx.nodes.src[f]) in cs and int(ctx.nodes.dst[f]) in cs for f in rest])
        fin = rest[inside]
        slot = _modal_slot(ctx, fin)
        med = median(slot)
        keep = np.abs(slot - med) < 3
        g = match_pattern(ctx, fin[keep])
        if g.kind == "all_to_all":
            g.evidence.append("found as a complete sub-graph of a larger component")
            groups.append(g)
            rest = np.concatenate([rest[~inside], fin[~keep]])
    if len(rest) == 0:
        return groups
    for fp in _fingerprints(ctx, rest):
        es, ed = ctx.nodes.src[fp], ctx.nodes.dst[fp]
        for comp in _components(ctx.nodes.n, es, ed):
            cs = set(comp)
            sub = fp[np.array([int(ctx.nodes.src[f]) in cs for f in fp])]
            g = match_pattern(ctx, sub)
            if g.kind != "unknown":
                g.confidence = round(g.confidence * 0.9, 3)
                g.evidence.append("separated from a mixed component by message size and count")
            groups.append(g)
    return groups


_ONE_WAY = ("many_to_one", "one_to_many")


def _one_way_ends(g: Group) -> tuple[list, list] | None:
    """(senders, receivers) of a one-way p2p star or pair, else None."""
    # a pair's "one direction only" is not always its last line: a pair separated from a
    # mixed component by message size has that said after it
    if g.kind != "p2p" or not (g.pattern in _ONE_WAY or (g.pattern == "pair" and "one direction only" in g.evidence)):
        return None
    c = g.members[0]
    return ([c], g.members[1:]) if g.pattern in ("one_to_many", "pair") else (g.members[1:], [c])


def _merge_kv(groups: list[Group]) -> list[Group]:
    """One kv_transfer group per capture: the kv_transfer groups and the one-way pairs and
    stars whose senders only send and receivers only receive (a router's sparse pairs form
    several components) merge into one. Without a kv_transfer group, >= 2 one-way stars
    (each a node fanning out to, or gathering from, >= 2 nodes) whose roles never mix -- a
    router that pins each prefill node to its own decode nodes -- are one too; one-way pairs
    alone (two single-stage pipelines look the same) and a single star (incast) stay apart."""
    kv = [g for g in groups if g.kind == "kv_transfer"]
    seeded = bool(kv)
    if not kv:
        stars = [g for g in groups if g.kind == "p2p" and g.pattern in _ONE_WAY]
        if len(stars) < 2:
            return groups
        kv = stars
    snd, rcv = set(), set()
    for g in kv:
        s_, r_ = (g.extra["prefill"], g.extra["decode"]) if seeded else _one_way_ends(g)
        snd |= set(s_)
        rcv |= set(r_)
    if not snd.isdisjoint(rcv) or len(snd) < 2 or len(rcv) < 2:
        return groups
    take = list(kv)
    for g in groups:
        ends = _one_way_ends(g) if not any(g is t for t in take) else None
        if ends is None:
            continue
        s_, r_ = ends
        if snd.isdisjoint(r_) and rcv.isdisjoint(s_):
            take.append(g)
            snd |= set(s_)
            rcv |= set(r_)
    if len(take) == 1:
        return groups
    ids = {id(g) for g in take}
    flows = np.concatenate([np.asarray(g.flows) for g in take])
    S, R = sorted(snd), sorted(rcv)
    if seeded:
        m = Group("kv_transfer", S + R, flows, min(g.confidence for g in kv), list(kv[0].evidence),
                  "prefill_decode", dict(kv[0].extra, prefill=S, decode=R))
        m.extra.pop("_hints", None)
    else:
        m = Group("kv_transfer", S + R, flows, 0.7,
                  [f"{len(S)} senders -> {len(R)} receivers one way in separate stars, no node both sends and "
                   "receives: KV-cache transfers (prefill -> decode)"], "prefill_decode", {"prefill": S, "decode": R})
    m.evidence.append(f"merged from {len(take)} one-way components")
    return [g for g in groups if id(g) not in ids] + [m]


def background_flows(ctx, flows: np.ndarray) -> np.ndarray:
    """Mask over `flows` (one connected component's data flows) of the flows that carry no
    share of the collective worth a graph edge: only control-sized messages (the largest
    < 1 KiB, mean <= 512 bytes: barriers, clock-sync ping-pongs, a library's start-up
    exchange between every pair), under 1/BACKGROUND_BYTES of the component's largest flow's
    bytes and at most 1/BACKGROUND_MESSAGES of its largest message count. A library that
    connects every pair at start-up (Open MPI, UCX) would otherwise make every ring an
    all-to-all: the shape follows where the data goes, not which pairs ever spoke."""
    flows = np.asarray(flows, dtype=np.int64)
    out = np.zeros(len(flows), dtype=bool)
    if len(flows) < 2:
        return out
    c = ctx.cols
    vol = ctx.volume[flows]
    msgs = c["messages"][flows].astype(np.float64)
    mb = c["msg_bytes"][flows].astype(np.float64)
    slot = c["max_slot"][flows]
    rresp = (c["op"][flows, L.OPC_READ_RESP] > 0) & (c["payload_bytes"][flows] > 0)
    small = (msgs > 0) & (slot >= 0) & (slot <= 10) & (mb <= 512 * msgs) & ~rresp
    if not small.any() or small.all():
        return out
    out = small & (vol * BACKGROUND_BYTES < vol.max()) & (msgs * BACKGROUND_MESSAGES <= msgs.max())
    return out


def discover(snap) -> list[Group]:
    """All collective groups of a Snapshot (cached on its Context), largest first."""
    ctx = context(snap)
    cached = getattr(ctx, "_groups", None)
    if cached is not None:
        return cached
    groups: list[Group] = []
    data_flows = np.nonzero(ctx.data)[0]
    if len(data_flows):
        # background traffic (start-up exchanges, barriers) is left out of the shapes: the
        # components are those of the remaining data flows
        keep = np.ones(len(data_flows), dtype=bool)
        src, dst = ctx.nodes.src[data_flows], ctx.nodes.dst[data_flows]
        for comp in _components(ctx.nodes.n, src, dst):
            cs = np.zeros(ctx.nodes.n, dtype=bool)
            cs[comp] = True
            sel = np.nonzero(cs[src])[0]
            keep[sel[background_flows(ctx, data_flows[sel])]] = False
        ctx._background = data_flows[~keep]
        data_flows = data_flows[keep]
        ps, pd = ctx.nodes.src[data_flows], ctx.nodes.dst[data_flows]
        for comp in _components(ctx.nodes.n, ps, pd):
            cs = np.zeros(ctx.nodes.n, dtype=bool)
            cs[comp] = True
            fl = data_flows[cs[ctx.nodes.src[data_flows]]]
            layers = _layers(ctx, fl)
            if len(layers) > 1:
                for lf in layers:
                    for sub in _components(ctx.nodes.n, ctx.nodes.src[lf], ctx.nodes.dst[lf]):
                        ss = np.zeros(ctx.nodes.n, dtype=bool)
                        ss[sub] = True
                        sf = lf[ss[ctx.nodes.src[lf]]]
                        g = match_pattern(ctx, sf)
                        if g.kind == "unknown" or g.confidence < 0.6:
                            dec = _decompose(ctx, sf)
                            if dec and not (len(dec) == 1 and dec[0].kind == "unknown"):
                                groups.extend(dec)
                                continue
                        g.evidence.append("separated from flows of another communicator on the same nodes "
                                          "by message size")
                        groups.append(g)
                continue
            g = match_pattern(ctx, fl)
            if g.kind == "unknown" or g.confidence < 0.6:
                dec = _decompose(ctx, fl)
                if dec and not (len(dec) == 1 and dec[0].kind == "unknown"):
                    groups.extend(dec)
                    continue
            groups.append(g)
    groups = _merge_kv(groups)
    vol = ctx.volume
    groups.sort(key=lambda g: -float(vol[g.flows].sum()))
    ctx._groups = groups
    return groups
