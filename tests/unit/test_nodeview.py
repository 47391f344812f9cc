"""Per-node timing from one DPU's own view (analysis.nodeview), against the generator's
truth: per-node views (`gen --view`) of slow-shard / ring-straggler / rotating-straggler
scenarios and variants (node counts 3..8, message sizes, lags, jitter, MTU); healthy ones
show nothing outstanding; decode ITL = the truth's token period; the numbers do not move
when every DPU's clock is off by its own offset (nothing compares two DPUs' clocks)."""
import json
import subprocess
import sys

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from skewscope import gen as skewgen
from skewscope.analysis.nodeview import NodeViewError, node_timing, per_node_timing
from skewscope.outputs import metrics as M
from skewscope.sources.offline import parse_file

TPD = {"kind": "decode_tp", "layers": 8, "allreduces_per_layer": 2, "tokens": 5, "hidden": 8192,
       "batch": 1, "dtype_bytes": 2, "compute_gap_us": 2000, "layer_compute_us": 10}


def tp(nodes, lag, slow, mtu=4096, jitter=0.0, **kw):
    sc = {"nodes": nodes, "mtu": mtu, "jitter": jitter, "workloads": [dict(TPD, **kw)]}
    if lag:
        sc["pathologies"] = [{"kind": "slow_tp_shard", "node": slow, "lag_us": lag}]
    return sc


def ring(nodes, lag, slow, size="2MiB", channels=1, rate=1.0, mtu=4096, jitter=0.01):
    sc = {"nodes": nodes, "mtu": mtu, "iterations": 3, "period_ms": 3.0, "jitter": jitter,
          "workloads": [{"kind": "ring_allreduce", "bytes": size, "channels": channels}]}
    if lag:
        sc["pathologies"] = [{"kind": "straggler", "node": slow, "rate_factor": rate, "start_lag_us": lag}]
    return sc


def views(tmp_path, scenario, seed=0, skew=0.0, samples=False):
    """(capture, {ip: node_timing of that node's own view pcap, node inferred})."""
    cap = skewgen.generate(scenario, seed=seed)
    out = {}
    for ip, v in cap.views(clock_skew_us=skew).items():
        p = tmp_path / f"{ip}-{skew}.pcap"
        v.write_pcap(str(p), snaplen=128)
        snap = parse_file(str(p))
        nt = node_timing(snap, samples=samples)
        how = "inferred"
        if len(cap.truth["groups"][0]["members"]) == 2:
            # two nodes: both are an end of every flow (each DPU sees the whole job), so the
            # node cannot be inferred and is given, as `report --node-ip` does
            assert nt is None
            nt, how = node_timing(snap, ip, samples=samples), "given"
        assert nt is not None and nt["node"] == ip and nt["node_source"] == how
        out[ip] = nt
    return cap, out


def ring_group(nt):
    gs = [g for g in nt["groups"] if g["role"] in ("ring", "tp_decode")]
    assert len(gs) == 1, nt
    return gs[0]


def fwd_p50_us(nt):
    return ring_group(nt)["forward_latency_s"]["p50"] * 1e6


SLOW = [
    ("tp-decode-slow-shard", 20.0, "tp_decode"),
    (tp(3, 8, 1, mtu=1024, hidden=4096, batch=2), 8.0, "tp_decode"),
    (tp(6, 12, 4, mtu=2048, jitter=0.05), 12.0, "tp_decode"),
    (tp(8, 5, 0, hidden=2048), 5.0, "tp_decode"),
    ("ring-straggler", 20.0, "ring"),
    (ring(5, 30, 2, mtu=2048), 30.0, "ring"),
    (ring(3, 15, 0, size="768KiB", channels=2), 15.0, "ring"),
    # rings of two: the one peer is upstream and downstream
    (tp(2, 20, 1), 20.0, "tp_decode"),
    (tp(2, 40, 0, mtu=2048, hidden=5120, batch=2), 40.0, "tp_decode"),
]


@pytest.mark.parametrize("scenario, lag_us, role", SLOW)
def test_the_slow_nodes_own_forward_latency_stands_out(tmp_path, scenario, lag_us, role):
    cap, nts = views(tmp_path, scenario, seed=1)
    path = cap.truth["pathologies"][0]
    slow = path["entities"]["ips"][0]
    members = cap.truth["groups"][0]["members"]
    assert set(members) <= set(nts)
    f = {ip: fwd_p50_us(nts[ip]) for ip in members}
    others = [f[ip] for ip in members if ip != slow]
    healthy = float(np.median(others))
    for ip in members:
        g = ring_group(nts[ip])
        assert g["role"] == role, (ip, g["role"])
        assert g["steps"] > 0 and g["forward_latency_s"]["count"] == g["steps"]
    # the slow node: about the injected lag on top of the healthy forward latency
    assert 0.8 * lag_us <= f[slow] <= lag_us + healthy + 2.5, (f[slow], lag_us, healthy)
    assert f[slow] - max(others) >= 0.6 * lag_us, f
    # its upstream's data is there before it sends: the most negative arrival offset
    off = {ip: ring_group(nts[ip])["arrival_offset_s"] for ip in members}
    for ip in members:
        (up,) = off[ip].keys()
        assert up != ip and up in members
    p50 = {ip: next(iter(off[ip].values()))["p50"] for ip in members}
    assert min(p50, key=p50.get) == slow and p50[slow] < -0.5 * lag_us * 1e-6, p50


@pytest.mark.parametrize("slow,lag_us,size", [(1, 30, "4MiB"), (0, 60, "2MiB")])
def test_ring_of_two_the_late_nodes_peer_data_is_there_first(tmp_path, slow, lag_us, size):
    """A 2-rank training ring with a late rank, each node's own view: the peer is upstream
    and downstream; the late node finds its peer's data there about the lag before it
    sends (start offset), the other waits about the lag for the late one's."""
    cap, nts = views(tmp_path, ring(2, lag_us, slow, size=size), seed=1)
    late = cap.truth["pathologies"][0]["entities"]["ips"][0]
    for ip, nt in nts.items():
        g = ring_group(nt)
        (peer,) = set(nts) - {ip}
        assert g["role"] == "ring" and g["upstream"] == g["downstream"] == [peer]
        p50 = g["start_offset_s"][peer]["p50"] * 1e6
        if ip == late:      # (its own later steps wait on its late sends too: more than the lag)
            assert p50 <= -0.8 * lag_us, (ip, p50)
        else:
            assert 0.8 * lag_us <= p50 <= 1.2 * lag_us, (ip, p50)


@pytest.mark.parametrize("scenario", ["tp-decode-healthy", "ring-healthy", tp(6, 0, 0, jitter=0.05),
                                      ring(4, 0, 0, mtu=1024, jitter=0.03), tp(2, 0, 0), ring(2, 0, 0)])
def test_healthy_nodes_show_nothing_outstanding(tmp_path, scenario):
    cap, nts = views(tmp_path, scenario, seed=2)
    members = cap.truth["groups"][0]["members"]
    f = np.array([fwd_p50_us(nts[ip]) for ip in members])
    assert f.max() <= 1.5 * np.median(f) + 1.0, f
    off = np.array([next(iter(ring_group(nts[ip])["arrival_offset_s"].values()))["p50"] for ip in members])
    assert np.ptp(off) * 1e6 <= 2.0 + 0.2 * np.median(np.abs(f)), off


@pytest.mark.parametrize("scenario", ["tp-decode-slow-shard", tp(5, 0, 0, mtu=2048, jitter=0.05, tokens=7)])
def test_decode_itl_and_tokens_per_s_from_each_nodes_own_view(tmp_path, scenario):
    cap, nts = views(tmp_path, scenario, seed=3)
    det = cap.truth["groups"][0]["details"]
    starts = np.array(det["token_starts_ns"], dtype=np.float64)
    d = np.diff(starts)
    for ip in cap.truth["groups"][0]["members"]:
        dec = ring_group(nts[ip])["decode"]
        assert dec["tokens"] == len(starts)
        # a token starts (on the wire) a hop after the model's token start: the spacing holds
        assert dec["itl_p50_s"] == pytest.approx(np.percentile(d, 50) / 1e9, rel=0.01, abs=2e-6)
        assert dec["itl_max_s"] == pytest.approx(d.max() / 1e9, rel=0.01, abs=2e-6)
        assert dec["tokens_per_s"] == pytest.approx((len(starts) - 1) / ((starts[-1] - starts[0]) / 1e9), rel=0.01)


def _numbers(x, path=""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _numbers(v, f"{path}.{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _numbers(v, f"{path}[{i}]")
    elif isinstance(x, float):
        yield path, x


def test_unsynchronised_clocks_change_nothing(tmp_path):
    """Each DPU's clock off by its own offset (up to +-5 ms): every number is a difference
    of one DPU's own timestamps, so none moves."""
    sc = tp(4, 10, 1, jitter=0.02)
    _, a = views(tmp_path, sc, seed=4)
    cap, b = views(tmp_path, sc, seed=4, skew=5000.0)
    offs = {v.truth["view"]["clock_offset_ns"] for v in cap.views(clock_skew_us=5000.0).values()}
    assert len(offs) == 4 and max(abs(o) for o in offs) > 100_000
    for ip in a:
        na, nb = dict(_numbers(a[ip])), dict(_numbers(b[ip]))
        assert na.keys() == nb.keys()
        for k in na:
            assert nb[k] == pytest.approx(na[k], rel=1e-9, abs=1e-12), (ip, k)


def test_rotating_straggler_start_offsets_name_each_iterations_gate(tmp_path):
    cap, nts = views(tmp_path, "ring-rotating-straggler", seed=0, samples=True)
    pat = cap.truth["pathologies"][0]
    lag_ns = cap.truth["scenario"]["pathologies"][0]["lag_us"] * 1e3
    gates = pat["magnitude"]["gating_rank_per_iteration"]
    for ip, nt in nts.items():
        (so,) = ring_group(nt)["_samples"]["start_offset"].values()
        late = int((np.asarray(so) < -0.5 * lag_ns).sum())
        assert late == gates.count(ip), (ip, late, gates)


def test_alltoall_offsets_per_upstream_peer(tmp_path):
    cap, nts = views(tmp_path, "ep-decode-hot-expert", seed=0)
    members = cap.truth["groups"][0]["members"]
    tokens = len(cap.truth["groups"][0]["details"]["token_starts_ns"])
    for ip in members:
        (g,) = nt_groups = [x for x in nts[ip]["groups"] if x["role"] == "alltoall"]
        assert nt_groups and sorted(g["arrival_offset_s"]) == sorted(m for m in members if m != ip)
        assert g["iterations"] == tokens and g["decode"]["tokens"] == tokens
        assert all(s["count"] >= tokens for s in g["arrival_offset_s"].values())
        assert g["forward_latency_s"]["count"] == 0


def test_kv_transfer_collectives_are_the_requests(tmp_path):
    cap, nts = views(tmp_path, "pd-healthy", seed=0)
    reqs = cap.truth["groups"][0]["details"]["requests"]
    for ip, nt in nts.items():
        (g,) = [x for x in nt["groups"] if x["role"] == "kv_transfer"]
        mine = [r for r in reqs if ip in (r["prefill"], r["decode"])]
        assert g["collectives"] == len(mine), (ip, g["collectives"], len(mine))


def test_full_mirror_per_node_sub_views_equal_the_generators_views(tmp_path):
    """A mirror that sees every node: per_node_timing on each node's sub-view = node_timing
    on the generator's view of that node (same frames)."""
    cap, nts = views(tmp_path, tp(4, 10, 2), seed=5)
    p = tmp_path / "full.pcap"
    cap.write_pcap(str(p), snaplen=128)
    snap = parse_file(str(p))
    assert node_timing(snap) is None      # no single node is an end of every flow
    got = {nt["node"]: nt for nt in per_node_timing(snap)}
    assert set(got) == set(nts)
    for ip in nts:
        assert dict(_numbers(got[ip]["groups"])) == pytest.approx(dict(_numbers(nts[ip]["groups"])))
    with pytest.raises(NodeViewError):
        node_timing(snap, "10.9.9.9")


def _series(text):
    s = {}
    for fam in text_string_to_metric_families(text):
        for x in fam.samples:
            s[(x.name, frozenset(x.labels.items()))] = x.value
    return s


def test_export_histograms_of_a_view_and_report_json(tmp_path):
    cap = skewgen.generate("tp-decode-slow-shard", seed=0)
    slow = cap.truth["pathologies"][0]["entities"]["ips"][0]
    v = tmp_path / "slow.pcap"
    cap.view(slow).write_pcap(str(v), snaplen=128)
    r = subprocess.run([sys.executable, "-m", "skewscope.cli", "report", str(v), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    nt = json.loads(r.stdout)["node_timing"]
    g = ring_group(nt)
    assert nt["node"] == slow and g["role"] == "tp_decode"
    r = subprocess.run([sys.executable, "-m", "skewscope.cli", "export", "--from", str(v), "--once",
                        "--node", "dpu-slow"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    s = _series(r.stdout)
    lab = {("node", "dpu-slow"), ("ip", slow), ("role", "tp_decode")}
    fl = M.NODE_FORWARD_LATENCY.name
    assert s[(fl + "_count", frozenset(lab))] == g["steps"]
    assert s[(M.NODE_STEPS.name, frozenset(lab))] == g["steps"]
    assert s[(M.NODE_ITERATIONS.name, frozenset(lab))] == g["iterations"]
    # the bucket holding the JSON median is where the cumulative count crosses half
    p50 = g["forward_latency_s"]["p50"]
    cum = sorted((float(dict(k)["le"]), v) for (n, k), v in s.items() if n == fl + "_bucket")
    below = max(c for le, c in cum if le < p50)
    above = min(c for le, c in cum if le >= p50)
    assert below <= g["steps"] / 2 <= above
    (up,) = g["arrival_offset_s"]
    ol = frozenset(lab | {("peer", up)})
    assert s[(M.NODE_ARRIVAL_OFFSET.name + "_count", ol)] == g["arrival_offset_s"][up]["count"]
    assert (M.NODE_ARRIVAL_OFFSET.name + "_sum", ol) not in s      # signed buckets: no _sum
    r = subprocess.run([sys.executable, "-m", "skewscope.cli", "export", "--from", str(v), "--once",
                        "--node-ip", "10.9.9.9"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "not an address of this capture" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_real_softroce_write_pair_is_a_one_way_transfer_from_both_ends():
    """perftest ib_write_bw (README: 100 WRITEs of 64 KiB 10.77.0.1 -> 10.77.0.2, ACKs
    back, no clear-to-send): one-way, so kv_transfer from either end, the same numbers."""
    from frames import REAL_DATA
    p = REAL_DATA / "softroce_write_pair__headers128.pcap"
    if not p.exists():
        pytest.skip(f"real capture missing: {p}")
    snap = parse_file(str(p))
    assert node_timing(snap) is None          # one pair: either end could be the DPU's node
    a, b = node_timing(snap, "10.77.0.1"), node_timing(snap, "10.77.0.2")
    (ga,), (gb,) = a["groups"], b["groups"]
    assert ga["role"] == gb["role"] == "kv_transfer"
    assert (ga["downstream"], ga["upstream"]) == (["10.77.0.2"], [])
    assert (gb["upstream"], gb["downstream"]) == (["10.77.0.1"], [])
    assert ga["mean_message_bytes"] == 65536.0
    assert ga["collective_s"] == gb["collective_s"] and ga["collectives"] >= 1


def _stretched(snap, k):
    """The view's records with timestamps stretched k times (the fabric's time stretch)."""
    ev = snap.events.copy()
    b = int(ev["start_ts"].min())
    for c in ("start_ts", "end_ts"):
        ev[c] = b + (ev[c].astype(np.int64) - b) * int(k)
    return ev


def _live(snap, ev, ip, cuts, window_s=None):
    """The exporter's live path: the records fed as reads split at `cuts` (ns), then one
    read without records (the node is quiet: the tail is closed); ({(name, key): value},
    the steps exported before that read)."""
    from skewscope.outputs.exporter import Accumulator
    acc = Accumulator(node_ip=ip, window_s=window_s)
    t = ev["start_ts"].astype(np.int64)
    edges = [int(t.min())] + sorted({int(c) for c in cuts} - {int(t.min())}) + [int(t.max()) + 1]
    for a, b in zip(edges[:-1], edges[1:]):
        acc.add(snap.flows, ev[(t >= a) & (t < b)], cum_flows=snap.flows)
    before = sum(v for spec, key, v in acc.timing.rows() if spec is M.NODE_STEPS)
    acc.add(snap.flows, ev[:0], cum_flows=snap.flows)
    rows = {(spec.name, key): v for spec, key, v in acc.timing.rows()}
    return rows, before     # before: steps exported while the traffic went on


def _count(rows, spec, ip, role):
    return rows.get((spec.name, (ip, role)))


def test_live_reads_add_up_to_about_the_whole(tmp_path):
    """The exporter's live path (a sliding window of records, new samples exported per
    read): reads cut at many points, mid-iteration included, with windows holding a few
    tokens only, add up to the whole view's numbers (steps within the window edges), the
    role the whole's, every step and token counted once."""
    cap = skewgen.generate("tp-decode-slow-shard", seed=0)
    slow = cap.truth["pathologies"][0]["entities"]["ips"][0]
    p = tmp_path / "v.pcap"
    cap.view(slow).write_pcap(str(p), snaplen=128)
    snap = parse_file(str(p))
    whole = ring_group(node_timing(snap))
    ev = snap.events
    t = ev["start_ts"].astype(np.int64)
    per_token = whole["steps"] / whole["iterations"]
    rng = np.random.default_rng(1)
    span = int(t.max() - t.min())
    for ncut, window_s in ((1, None), (7, None), (40, 3 * span / 6 / 1e9), (200, 4 * span / 6 / 1e9)):
        cuts = rng.choice(t[1:], ncut)        # at record starts: no read is empty
        rows, before = _live(snap, ev, slow, cuts, window_s)
        roles = {key[1] for (name, key) in rows if name == M.NODE_STEPS.name}
        assert roles == {"tp_decode"}, (ncut, roles)
        steps = _count(rows, M.NODE_STEPS, slow, "tp_decode")
        assert whole["steps"] - per_token <= steps <= whole["steps"], (ncut, steps)
        assert _count(rows, M.NODE_ITERATIONS, slow, "tp_decode") == whole["iterations"]
        buckets, _ = rows[(M.NODE_FORWARD_LATENCY.name, (slow, "tp_decode"))]
        assert buckets[-1][1] == steps
        it_buckets, _ = rows[(M.NODE_ITERATION.name, (slow, "tp_decode"))]
        assert whole["iterations"] - 2 <= it_buckets[-1][1] <= whole["iterations"] - 1


@pytest.mark.parametrize("nodes,stretch,tokens,read_s,seed", [
    (3, 10, 12, 0.01, 0), (4, 160, 6, 3.0, 2), (5, 50, 16, 0.2, 1), (6, 200, 10, 1.0, 3), (8, 100, 12, 0.5, 4)])
def test_live_window_on_stretched_tp_decode_views(tmp_path, nodes, stretch, tokens, read_s, seed):
    """Every node's own view of a slow-shard TP decode, timestamps stretched 10..200x (the
    test fabric's stretch), fed in read-sized chunks (read starts jittered: reads end
    mid-iteration) to the exporter's live path with a window of a few tokens or the
    default: tp_decode on every node, the truth's token count, the slow node's forward
    latency above every other node's."""
    slow_i = nodes // 2
    cap = skewgen.generate(tp(nodes, 25, slow_i, tokens=tokens), seed=seed)
    pat = cap.truth["pathologies"][0]
    slow, want = pat["entities"]["ips"][0], pat["magnitude"]["tokens"]
    rng = np.random.default_rng(seed)
    mean_fwd = {}
    for ip, v in cap.views().items():
        p = tmp_path / f"{ip}.pcap"
        v.write_pcap(str(p), snaplen=128)
        snap = parse_file(str(p))
        ev = _stretched(snap, stretch)
        t = ev["start_ts"].astype(np.int64)
        period = pat["magnitude"]["token_period_s"] * stretch
        for window_s in (None, 8 * period):
            cuts = np.arange(int(t.min()), int(t.max()), int(read_s * 1e9))[1:]
            cuts = cuts + rng.integers(0, int(read_s * 1e9) // 2, len(cuts))
            cuts = [c for c in cuts if ((t >= c) & (t < c + read_s * 1e9)).any()]   # busy reads only
            rows, before = _live(snap, ev, ip, cuts, window_s)
            roles = {key[1] for (name, key) in rows if name == M.NODE_ITERATIONS.name}
            assert roles == {"tp_decode"}, (ip, window_s, roles)
            if window_s is not None and tokens >= 10:   # the window filled: exports went on mid-stream
                assert before > 0
            assert _count(rows, M.NODE_ITERATIONS, ip, "tp_decode") == want, (ip, window_s)
            b, sm = rows[(M.NODE_FORWARD_LATENCY.name, (ip, "tp_decode"))]
            assert b[-1][1] == _count(rows, M.NODE_STEPS, ip, "tp_decode") > 0
            mean_fwd.setdefault(window_s is None, {})[ip] = sm / b[-1][1]
    for fwd in mean_fwd.values():
        others = [x for ip, x in fwd.items() if ip != slow]
        assert fwd[slow] > 3 * max(others), fwd
