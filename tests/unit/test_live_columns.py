"""The live per-interval passes of analysis.context (node index, node pairs, source-port
partners, CTS roles, elimination partners, data pairs, link counters, node matrix) against
plain numpy / per-flow Python forms of the same definitions (docs/metrics.md "Flows"), on
random flow tables: shuffled and key-sorted (the runs the kernels probe once), IPv4 and
IPv6, ports that collide, nodes talking to themselves, READ requesters that also WRITE."""
from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import pytest

from skewscope.analysis import context, link_counters, node_matrix
from skewscope.analysis import flows as FL
from skewscope.core import layout as L
from skewscope.core.snapshot import Snapshot, flow_key_matrix, ip_str

KINDS = ("data", "cts", "ack", "cnp", "read_req", "read_resp", "send_small", "mixed", "empty")


def _addresses(nodes: int, v6: bool) -> np.ndarray:
    ip = np.zeros((nodes, 16), np.uint8)
    if v6:
        ip[:, 0], ip[:, 1] = 0xFD, 0x00
        ip[:, 14] = np.arange(nodes) // 7           # addresses that share leading bytes
        ip[:, 15] = (np.arange(nodes) * 37) % 251
    else:
        ip[:, 10:12] = 0xFF
        ip[:, 12] = 10
        ip[:, 14] = np.arange(nodes) % 3
        ip[:, 15] = (np.arange(nodes) * 53) % 251
    return ip


def random_snapshot(seed: int, n: int, nodes: int, v6: bool, key_sorted: bool) -> Snapshot:
    rng = np.random.default_rng(seed)
    ip = _addresses(nodes, v6)
    # the first half random (some flows to the node itself), then their reverse flows (the
    # other direction of a QP pair: the same source port), then a few more QPs of those
    # reverse flows' node pairs with their ports (a port no longer unique one way only)
    h = (n + 1) // 2
    e = n // 20
    s = rng.integers(0, nodes, h)
    d = np.where(rng.random(h) < 0.03, s, rng.integers(0, nodes, h))
    dup = rng.integers(0, max(1, n - h - e), e)
    s, d = np.concatenate([s, d[:n - h - e], d[dup]]), np.concatenate([d, s[:n - h - e], s[dup]])
    fl = np.zeros(n, L.FLOW_DTYPE)
    fl["src"], fl["dst"] = ip[s], ip[d]
    fl["ipver"] = 6 if v6 else 4
    fl["roce"] = 2
    fl["dest_qp"] = np.where(rng.random(n) < 0.02, 1, rng.permutation(n) + 0x100)
    r = rng.random(h)
    sp = np.where(r < 0.1, 0, np.where(r < 0.25, rng.integers(1, 4, h), rng.integers(4, 65536, h)))  # 0, collisions
    fl["sport"] = np.concatenate([sp, sp[:n - h - e], sp[dup]])
    kind = rng.integers(0, len(KINDS), n)
    m = rng.integers(1, 20, n).astype(np.uint64)
    op = np.zeros((n, L.N_OPCLASS), np.uint64)
    msg_bytes = np.zeros(n, np.uint64)
    for k, name in enumerate(KINDS):
        w = kind == k
        if name == "data":
            op[w, L.OPC_WRITE] = m[w] * 16
            msg_bytes[w] = m[w] * 65536
        elif name == "cts":
            op[w, L.OPC_WRITE] = m[w]
            msg_bytes[w] = m[w] * 64
        elif name == "ack":
            op[w, L.OPC_ACK] = m[w]
        elif name == "cnp":
            op[w, L.OPC_CNP] = m[w]
        elif name == "read_req":
            op[w, L.OPC_READ_REQ] = m[w]
            msg_bytes[w] = m[w] * 4096
        elif name == "read_resp":
            op[w, L.OPC_READ_RESP] = m[w] * 4
        elif name == "send_small":
            op[w, L.OPC_SEND] = m[w]
            msg_bytes[w] = m[w] * 256
        elif name == "mixed":
            op[w, L.OPC_READ_REQ] = m[w]
            op[w, L.OPC_WRITE] = m[w]
            msg_bytes[w] = m[w] * 2048
    fl["op"] = op
    has_msgs = np.isin(kind, [KINDS.index(x) for x in ("data", "cts", "read_req", "send_small", "mixed")])
    fl["messages"] = np.where(has_msgs, m, 0)
    fl["msg_bytes"] = msg_bytes
    fl["payload_bytes"] = np.where(kind == KINDS.index("read_resp"), m * 16384, msg_bytes)
    mean = np.where(has_msgs, msg_bytes // np.maximum(m, 1), 0)
    slot = np.where(mean > 0, np.floor(np.log2(np.maximum(mean, 1))).astype(np.int64) + 1, 0)
    fl["msg_hist"][np.nonzero(has_msgs)[0], slot[has_msgs]] = m[has_msgs]
    fl["packets"] = op.sum(axis=1)
    fl["bytes"] = fl["packets"] * np.uint64(1100)
    fl["ecn_capable"] = fl["packets"]
    fl["ce"] = np.where(rng.random(n) < 0.2, fl["packets"] // 3, 0)
    fl["cnp"] = np.where(rng.random(n) < 0.2, rng.integers(0, 9, n), 0)
    for name in ("psn_gaps", "retransmissions", "nak_seq", "nak_rnr", "nak_other"):
        fl[name] = np.where(rng.random(n) < 0.1, rng.integers(1, 5, n), 0)
    fl["first_ts"], fl["last_ts"] = 10, 2_000_000_010
    if key_sorted:
        fl = fl[np.lexsort(flow_key_matrix(fl).T[::-1])]
    # the SEND/WRITE records of some flows (the mixed READ requesters' own messages)
    ne = 4 * n
    ev = np.zeros(ne, L.EVENT_DTYPE)
    ev["flow"] = rng.integers(-1, n, ne)
    ev["opclass"] = rng.choice([L.OPC_SEND, L.OPC_WRITE, L.OPC_READ_REQ], ne)
    ev["bytes"] = rng.choice([64, 512, 4096, 65536], ne)
    ev["start_ts"] = np.sort(rng.integers(10, 2_000_000_000, ne))
    ev["end_ts"] = ev["start_ts"] + 1000
    return Snapshot(fl, ev, np.zeros(L.G_N, np.uint64), {"duration_s": 2.0})


# ---- the numpy / per-flow forms ---------------------------------------------------------------
def ref_nodes(fl):
    """Addresses sorted by their bytes; each formatted with the IP version of its first
    appearance (sources first, then destinations)."""
    both = np.concatenate([fl["src"], fl["dst"]])
    u, first, inv = np.unique(both, axis=0, return_index=True, return_inverse=True)
    ver = np.concatenate([fl["ipver"], fl["ipver"]])
    ips = [ip_str(u[k], int(ver[first[k]])) for k in range(len(u))]
    inv = inv.reshape(-1)
    return ips, inv[:len(fl)], inv[len(fl):]


def ref_sport_partners(s, d, sport):
    cnt = Counter(zip(s.tolist(), d.tolist(), sport.tolist()))
    where = {k: i for i, k in enumerate(zip(s.tolist(), d.tolist(), sport.tolist()))}
    out = np.full(len(s), -1)
    for i, (a, b, p) in enumerate(zip(s.tolist(), d.tolist(), sport.tolist())):
        if p != 0 and a != b and cnt[(a, b, p)] == 1 and cnt[(b, a, p)] == 1:
            out[i] = where[(b, a, p)]
    return out


def ref_roles(snap, cols, s, d, partner):
    """The base role, big and candidate flags (the kernel, fed the per-flow SEND/WRITE
    records of every mixed flow in numpy), then CTS and management per flow in Python."""
    fl, ev = snap.flows, snap.events
    n = len(fl)
    op = fl["op"]
    mixed = (op[:, L.OPC_READ_REQ] > 0) & ((op[:, L.OPC_SEND] > 0) | (op[:, L.OPC_WRITE] > 0))
    f = ev["flow"].astype(np.int64)
    ok = (f >= 0) & (f < n) & np.isin(ev["opclass"], [L.OPC_SEND, L.OPC_WRITE])
    ok &= mixed[np.clip(f, 0, n - 1)]
    cnt = np.where(mixed, np.bincount(f[ok], minlength=n), -1)
    tot = np.bincount(f[ok], weights=ev["bytes"][ok].astype(np.float64), minlength=n)
    mx = np.zeros(n, np.int64)
    np.maximum.at(mx, f[ok], ev["bytes"][ok].astype(np.int64))
    roles = np.full(n, FL.ROLE_OTHER, np.int8)
    big, cand = np.zeros(n, bool), np.zeros(n, bool)
    FL._roles_kernel(cols["op"], cols["messages"], cols["msg_bytes"], cols["payload_bytes"], cols["packets"],
                     cols["max_slot"], cols["dest_qp"], cnt, tot, mx, roles, big, cand)
    big_pairs = {(a, b) for a, b, x in zip(s.tolist(), d.tolist(), big.tolist()) if x}
    for i in range(n):
        p = partner[i]
        cts = bool(big[p]) if p >= 0 else (int(d[i]), int(s[i])) in big_pairs
        if cand[i] and cts:
            roles[i] = FL.ROLE_CTS
    roles[fl["dest_qp"] == 1] = FL.ROLE_MGMT
    return roles


def ref_elimination(s, d, roles, by_sport):
    out = by_sport.copy()
    ctrl_roles = (FL.ROLE_CTS, FL.ROLE_ACK, FL.ROLE_CNP, FL.ROLE_READ_REQ)
    data_of, ctrl_of = defaultdict(list), defaultdict(list)
    for i, r in enumerate(roles.tolist()):
        if r == FL.ROLE_DATA:
            data_of[(s[i], d[i])].append(i)
        elif r in ctrl_roles:
            ctrl_of[(s[i], d[i])].append(i)
    for (a, b), fs in data_of.items():
        back = ctrl_of.get((b, a), [])
        if len(fs) == 1 and len(back) == 1 and out[fs[0]] < 0 and by_sport[back[0]] < 0:
            out[fs[0]], out[back[0]] = back[0], fs[0]
    return out


@pytest.mark.parametrize("seed,n,nodes,v6,key_sorted", [
    (1, 3000, 9, False, True), (2, 3000, 9, False, False), (3, 2500, 40, True, True),
    (4, 2500, 40, True, False), (5, 700, 3, False, True), (6, 1, 2, True, True),
])
def test_live_passes_equal_numpy_forms(seed, n, nodes, v6, key_sorted):
    snap = random_snapshot(seed, n, nodes, v6, key_sorted)
    fl = snap.flows
    ctx = context(snap)
    ips, s, d = ref_nodes(fl)
    assert ctx.nodes.ips == ips
    assert np.array_equal(ctx.nodes.src, s) and np.array_equal(ctx.nodes.dst, d)
    assert ctx.nodes.src.dtype == np.int32
    # the node pairs: ids consistent with the keys, each reverse the pair of the swapped key
    pid, keys, rev = ctx.pairs
    nn = len(ips)
    assert np.array_equal(keys[pid], s * nn + d) and len(np.unique(keys)) == len(keys)
    for q, k in enumerate(keys.tolist()):
        back = np.nonzero(keys == (k % nn) * nn + k // nn)[0]
        assert rev[q] == (back[0] if len(back) else -1)
    by_sport = ref_sport_partners(s, d, fl["sport"].astype(np.int64))
    assert np.array_equal(ctx.partner_sport, by_sport)
    roles = ref_roles(snap, ctx.cols, s, d, by_sport)
    assert np.array_equal(ctx.roles, roles)
    assert np.array_equal(ctx.partner, ref_elimination(s, d, roles, by_sport))
    # data pairs in key order, the link counters' sums and the node matrix
    data = roles == FL.ROLE_DATA
    uk, inv = np.unique((s * nn + d)[data], return_inverse=True)
    want = np.full(len(fl), -1)
    want[data] = inv
    p_id, ps, pd = ctx.pair_index
    assert np.array_equal(p_id, want) and np.array_equal(ps, uk // nn) and np.array_equal(pd, uk % nn)
    lc = link_counters(snap)
    p = want[data]
    vol = np.where(data, fl["payload_bytes"].astype(np.float64), 0.0)
    assert np.array_equal(lc["flows"], np.bincount(p, minlength=len(uk)))
    assert np.array_equal(lc["bytes"], np.bincount(p, weights=vol[data], minlength=len(uk)))
    for name in ("messages", "ce", "ecn_capable", "psn_gaps", "retransmissions"):
        assert np.array_equal(lc[name], np.bincount(p, weights=fl[name][data].astype(np.float64),
                                                    minlength=len(uk))), name
    part = ctx.partner[data]
    cnp = np.where(part >= 0, fl["cnp"][np.maximum(part, 0)].astype(np.float64), 0.0)
    naks = (fl["nak_seq"] + fl["nak_rnr"] + fl["nak_other"])[np.maximum(part, 0)].astype(np.float64)
    assert np.array_equal(lc["cnp"], np.bincount(p, weights=cnp, minlength=len(uk)))
    assert np.array_equal(lc["naks"], np.bincount(p, weights=np.where(part >= 0, naks, 0.0), minlength=len(uk)))
    m = np.zeros((nn, nn))
    np.add.at(m, (s[data], d[data]), vol[data])
    assert np.array_equal(node_matrix(snap)[1], m)
    if n > 1:
        assert data.any() and (roles == FL.ROLE_CTS).any() and (by_sport >= 0).any()


def test_dropped_snapshot_gives_its_columns_back():
    """A Context refers to a twin of its Snapshot (no cycle): dropping the Snapshot frees
    its pooled columns at once, and the next Snapshot's columns reuse that memory."""
    snap = random_snapshot(7, 2000, 9, False, True)
    cols = context(Snapshot(snap.flows, snap.events, snap.globals, dict(snap.meta))).cols
    addr = cols["packets"].__array_interface__["data"][0]
    del cols
    again = context(Snapshot(snap.flows, snap.events, snap.globals, dict(snap.meta))).cols
    assert again["packets"].__array_interface__["data"][0] == addr
    assert np.array_equal(again["packets"], snap.flows["packets"])
