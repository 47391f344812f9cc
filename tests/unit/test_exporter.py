"""Exporter unit tests (no root). Expected values come from the Snapshot's own arrays
(summed here with plain Python, independently of the exporter's numpy code) and from the
generator's ground truth; /metrics is parsed with prometheus_client.parser."""
from __future__ import annotations

import collections
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from skewscope.core import layout as L
from skewscope.core.snapshot import Snapshot, ip_bytes, ip_str
from skewscope.outputs import exporter as E
from skewscope.outputs import expose as X

ROOT = Path(__file__).resolve().parents[2]


def parse(text: str) -> dict:
    """{sample name: {frozenset(labels): value}}"""
    out = collections.defaultdict(dict)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name][frozenset(s.labels.items())] = s.value
    return out


def by_pair(samples: dict, name: str, node: str) -> dict:
    """Sum a per-peer metric over its other labels -> {(src, dst): value}."""
    acc = collections.defaultdict(float)
    for labels, v in samples[name].items():
        d = dict(labels)
        assert d["node"] == node
        acc[(d["src"], d["dst"])] += v
    return dict(acc)


def expected_pairs(snap: Snapshot, fields) -> dict:
    acc = collections.defaultdict(int)
    for r in snap.flows:
        v = int(r["ipver"])
        key = (ip_str(r["src"], v), ip_str(r["dst"], v))
        acc[key] += sum(int(r[f]) for f in fields)
    return dict(acc)


def run_cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "skewscope.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


# ---- a generated capture, through the offline parser ---------------------------------------------
@pytest.fixture(scope="module")
def gen_snap(tmp_path_factory):
    from skewscope import gen as skewgen
    d = tmp_path_factory.mktemp("ssp-exp")
    pcap = d / "cong.pcap"
    cap = skewgen.write("congestion", str(pcap), seed=1)      # CE marks and CNPs
    loss = d / "loss.pcap"
    cap_loss = skewgen.write("loss", str(loss), seed=1)        # NAKs, retransmissions
    from skewscope.cli.common import load_source
    out = {}
    for name, p, c in (("congestion", pcap, cap), ("loss", loss, cap_loss)):
        snap = load_source(str(p))
        snapfile = d / f"{name}.snap"
        snap.save(snapfile)
        out[name] = (p, snapfile, snap, c.truth)
    return out


@pytest.mark.parametrize("scenario", ["congestion", "loss"])
def test_from_file_values_equal_snapshot(gen_snap, scenario):
    """`export --from FILE --once`: per-peer bytes, packets, CNPs, CE, NAKs, retransmissions
    equal the Snapshot's per-pair sums, and per-pair bytes equal the generator's truth."""
    pcap, snapfile, snap, truth = gen_snap[scenario]
    r = run_cli("export", "--from", str(snapfile), "--once", "--node", "dpu-a")
    assert r.returncode == 0, r.stderr
    m = parse(r.stdout)
    for metric, fields in (("skewscope_peer_bytes_total", ["bytes"]), ("skewscope_peer_packets_total", ["packets"]),
                           ("skewscope_peer_cnp_packets_total", ["cnp"]), ("skewscope_peer_ce_packets_total", ["ce"]),
                           ("skewscope_peer_naks_total", ["nak_seq", "nak_rnr", "nak_other"]),
                           ("skewscope_peer_retransmitted_packets_total", ["retransmissions"]),
                           ("skewscope_peer_messages_total", ["messages"])):
        got = by_pair(m, metric, "dpu-a")
        want = expected_pairs(snap, fields)
        assert {k: int(v) for k, v in got.items()} == want, metric
    # against the generator's ground truth (independent of the parser too)
    tb = collections.defaultdict(int)
    tc = collections.defaultdict(int)
    tn = collections.defaultdict(int)
    for f in truth["flows"]:
        tb[(f["src"], f["dst"])] += f["bytes"]
        tc[(f["src"], f["dst"])] += f["cnp_packets"]
        tn[(f["src"], f["dst"])] += f["naks"]
    got_b = by_pair(m, "skewscope_peer_bytes_total", "dpu-a")
    assert {k: int(v) for k, v in got_b.items()} == dict(tb)
    assert {k: int(v) for k, v in by_pair(m, "skewscope_peer_cnp_packets_total", "dpu-a").items()} == dict(tc)
    assert {k: int(v) for k, v in by_pair(m, "skewscope_peer_naks_total", "dpu-a").items()} == dict(tn)
    if scenario == "congestion":
        assert sum(tc.values()) > 0
    else:
        assert sum(tn.values()) > 0
    # the pcap gives the same exposition as its snapshot (load_source: offline parser)
    r2 = run_cli("export", "--from", str(pcap), "--once", "--node", "dpu-a")
    assert r2.returncode == 0, r2.stderr
    assert by_pair(parse(r2.stdout), "skewscope_peer_bytes_total", "dpu-a") == got_b


def test_once_openmetrics_is_the_same_exposition_stamped_for_backfill(gen_snap, tmp_path):
    """`export --once --format openmetrics --timestamp T`: the OpenMetrics text, every sample
    at T, the same values as the text exposition, no process_* series (they would describe
    the converting process), `# EOF` last; `promtool tsdb create-blocks-from openmetrics`
    (the backfill it is for) takes it whole. A bad combination of options is a one-line
    usage error."""
    import re
    _, snapfile, snap, _ = gen_snap["congestion"]
    t = 1767225600.0
    r = run_cli("export", "--from", str(snapfile), "--once", "--node", "dpu-a", "--format", "openmetrics",
                "--timestamp", str(t))
    assert r.returncode == 0, r.stderr
    assert r.stdout.endswith("# EOF\n")
    om = collections.defaultdict(dict)
    line_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+) (\S+)$')
    lab_re = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
    for line in r.stdout.splitlines():
        if line.startswith("#"):
            continue
        m = line_re.match(line)
        assert m, line
        assert float(m.group(4)) == t, line
        om[m.group(1)][frozenset(lab_re.findall(m.group(2) or ""))] = float(m.group(3))
    assert om and not [n for n in om if n.startswith("process_")]
    text = parse(run_cli("export", "--from", str(snapfile), "--once", "--node", "dpu-a").stdout)
    for name in ("skewscope_peer_bytes_total", "skewscope_peer_ce_packets_total", "skewscope_peer_busy_seconds_total",
                 "skewscope_message_size_bytes_bucket"):
        assert om[name] == text[name], name
    assert by_pair(om, "skewscope_peer_bytes_total", "dpu-a") == {k: float(v) for k, v in
                                                                  expected_pairs(snap, ["bytes"]).items()}
    if shutil.which("promtool"):
        f = tmp_path / "x.om"
        f.write_text(r.stdout)
        p = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(f), str(tmp_path / "db")],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        series = sum(len(v) for v in om.values())
        assert re.search(rf"\s{series}\s+{series}\s+{series}\s", p.stdout), (series, p.stdout)
    for bad in (["--format", "openmetrics"], ["--once", "--timestamp", "5"]):
        r = run_cli("export", "--from", str(snapfile), *bad)
        assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_histograms_are_cumulative_with_exact_bounds(gen_snap):
    """Message-size buckets: count(le=b) = number of WRITE messages of size <= b, counted
    from the message records (bytes = RETH length), not from the histogram."""
    _, snapfile, snap, _ = gen_snap["congestion"]
    st_ = E.state_from_snapshot(snap, "n")
    text = X.render(X.make_registry(X.SkewscopeCollector(lambda: st_), process_metrics=False))
    m = parse(text)
    buckets = {float(dict(k)["le"]): v for k, v in m["skewscope_message_size_bytes_bucket"].items()}
    les = sorted(buckets)
    assert les[-1] == float("inf") and len(les) == L.MSG_SLOTS
    vals = [buckets[b] for b in les]
    assert vals == sorted(vals), "buckets must be cumulative"
    ev = snap.events
    sizes = ev["bytes"][ev["opclass"] == L.OPC_WRITE].astype(np.int64)
    assert len(sizes) > 100
    hist_total = int(snap.flows["msg_hist"].sum())
    assert m["skewscope_message_size_bytes_count"][frozenset({("node", "n")})] == hist_total
    assert m["skewscope_message_size_bytes_sum"][frozenset({("node", "n")})] == int(snap.flows["msg_bytes"].sum())
    # every record is one histogram observation here (generator: WRITE messages only, all complete)
    assert len(sizes) == hist_total
    for b in (63, 64, 65535, 65536, 131071, 524287, 524288, 1048575, 1048576, 2097151):
        if float(b) in buckets:
            assert buckets[float(b)] == int((sizes <= b).sum()), b
    assert 1048575.0 in buckets and 1048576.0 not in buckets   # exact bounds 2^s - 1
    # gap histogram: cumulative, +Inf = count, no _sum
    g = {float(dict(k)["le"]): v for k, v in m["skewscope_message_gap_seconds_bucket"].items()}
    assert len(g) == L.GAP_SLOTS and sorted(g.values()) == [g[k] for k in sorted(g)]
    assert "skewscope_message_gap_seconds_sum" not in m
    assert m["skewscope_message_gap_seconds_count"][frozenset({("node", "n")})] == int(snap.flows["gap_hist"].sum())


# ---- synthetic tables --------------------------------------------------------------------------------
def mk_flows(rows):
    """rows: (src, dst, qp, packets, bytes, messages, msg_bytes, first_ts)"""
    f = np.zeros(len(rows), L.FLOW_DTYPE)
    for i, (s, d, qp, pk, by, msgs, mb, t0) in enumerate(rows):
        f["src"][i] = np.frombuffer(ip_bytes(s)[0], np.uint8)
        f["dst"][i] = np.frombuffer(ip_bytes(d)[0], np.uint8)
        f["ipver"][i] = ip_bytes(s)[1]
        f["roce"][i] = 2
        f["dest_qp"][i] = qp
        f["packets"][i], f["bytes"][i], f["messages"][i], f["msg_bytes"][i] = pk, by, msgs, mb
        f["first_ts"][i] = t0
        f["op"][i][L.OPC_WRITE] = pk
    return f


def test_counters_stay_monotonic_across_eviction():
    """Successive cumulative reads through live.flow_delta: a flow evicted and re-created
    (its counters restart) must not make the per-peer counter go down, and the total must
    be every packet ever counted."""
    from skewscope.sources.live import flow_delta
    acc = E.Accumulator()
    reads = [
        mk_flows([("10.0.0.1", "10.0.0.2", 5, 10, 1000, 0, 0, 1), ("10.0.0.1", "10.0.0.2", 6, 5, 500, 0, 0, 1)]),
        mk_flows([("10.0.0.1", "10.0.0.2", 5, 30, 3000, 0, 0, 1)]),                 # qp 6 evicted
        mk_flows([("10.0.0.1", "10.0.0.2", 5, 2, 200, 0, 0, 9),                      # qp 5 re-created
                  ("10.0.0.1", "10.0.0.2", 6, 1, 100, 0, 0, 9), ("fd00::1", "fd00::2", 7, 4, 400, 0, 0, 9)]),
    ]
    prev = None
    seen = []
    for cum in reads:
        d = flow_delta(prev, cum)
        acc.add(d, None, cum_flows=cum)
        st_ = acc.state("n", np.zeros(L.G_N, np.uint64), {}, top_k=1)
        tot = {(s, t): 0 for s, t in zip(st_.peer_src, st_.peer_dst)}
        for s, t, c in zip(st_.peer_src, st_.peer_dst, st_.peer_counts[:, E.COL["bytes"]]):
            tot[(s, t)] += int(c)
        seen.append(tot)
        prev = cum
    assert seen[0][("10.0.0.1", "10.0.0.2")] == 1500
    assert seen[1][("10.0.0.1", "10.0.0.2")] == 3500
    assert seen[2][("10.0.0.1", "10.0.0.2")] == 3800
    assert seen[2][("fd00::1", "fd00::2")] == 400
    assert len(st_.flows) == 1 and int(st_.flows[0]["bytes"]) == 400     # top-K by bytes of the table now


def test_max_peers_overflow_conserves_totals():
    rows = [(f"10.0.1.{i}", "10.0.2.1", i, i, 100 * i, 0, 0, 1) for i in range(1, 9)]
    f = mk_flows(rows)
    snap = Snapshot(f, np.zeros(0, L.EVENT_DTYPE), np.zeros(L.G_N, np.uint64), {})
    st_ = E.state_from_snapshot(snap, "n", top_k=3, max_peers=3)
    assert len(st_.peer_src) == 4 and st_.peer_src[-1] == E.OVERFLOW_LABEL
    assert int(st_.peer_counts[:, E.COL["bytes"]].sum()) == sum(r[4] for r in rows)
    text = X.render(X.make_registry(X.SkewscopeCollector(lambda: st_), process_metrics=False))
    m = parse(text)
    assert len(m["skewscope_peer_bytes_total"]) == 4
    assert len(m["skewscope_flow_bytes_total"]) == 3
    top = sorted(int(v) for v in m["skewscope_flow_bytes_total"].values())
    assert top == [600, 700, 800]
    assert len(m["skewscope_flow_message_size_bytes_bucket"]) == 3 * L.MSG_SLOTS


def brute_busy(intervals):
    pts = sorted(intervals)
    tot, cs, ce = 0, None, None
    for s, e in pts:
        if cs is None or s > ce:
            if cs is not None:
                tot += ce - cs
            cs, ce = s, e
        else:
            ce = max(ce, e)
    return tot + (ce - cs if cs is not None else 0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1000), st.integers(0, 200)), min_size=1, max_size=40),
       st.integers(1, 39))
def test_busy_union_matches_brute_force_across_reads(evs, split):
    """busy_ns_per_peer over two consecutive batches (with the carry) = the union of all
    intervals per key, computed by brute force."""
    ev = np.zeros(len(evs), L.EVENT_DTYPE)
    ev["flow"] = [p for p, _, _ in evs]
    ev["start_ts"] = [s for _, s, _ in evs]
    ev["end_ts"] = [s + d for _, s, d in evs]
    ev = ev[np.argsort(ev["end_ts"], kind="stable")]          # records arrive at message end
    fp = np.arange(3)
    k = min(split, len(ev))
    b1, c = E.busy_ns_per_peer(ev[:k], fp, 3)
    b2, _ = E.busy_ns_per_peer(ev[k:], fp, 3, c)
    for p in range(3):
        iv = [(int(s), int(e)) for f, s, e in zip(ev["flow"], ev["start_ts"], ev["end_ts"]) if f == p]
        # one read: exact union
        assert E.busy_ns_per_peer(ev, fp, 3)[0][p] == brute_busy(iv)
        # two reads: batch 1 exact; batch 2 adds what lies past batch 1's union end, so the
        # overlap is never counted twice, and at most what batch 1 left uncovered before its
        # union's end is missed (a batch-2 message may have started before any of batch 1's:
        # records arrive at message end)
        iv1 = [(int(s), int(e)) for f, s, e in zip(ev["flow"][:k], ev["start_ts"][:k], ev["end_ts"][:k]) if f == p]
        assert b1[p] == brute_busy(iv1)
        assert b1[p] + b2[p] <= brute_busy(iv)
        if iv1:
            gaps1 = (max(e for _, e in iv1) - min(s for s, _ in iv)) - brute_busy(iv1)
            assert b1[p] + b2[p] >= brute_busy(iv) - gaps1


def test_parse_listen():
    assert X.parse_listen("127.0.0.1:9435") == ("127.0.0.1", 9435)
    assert X.parse_listen("[::1]:9") == ("::1", 9)
    assert X.parse_listen(":9435") == ("127.0.0.1", 9435)
    for bad in ("9435", "host:9435", "1.2.3.4:x", "1.2.3.4:70000", "::1:9435", "[::1]9435"):
        with pytest.raises(X.ListenError):
            X.parse_listen(bad)


@pytest.mark.parametrize("args,code,needle", [
    (["export"], 2, "exactly one of"),
    (["export", "--from", "/nonexistent.snap", "--once"], 3, "no such file"),
    (["export", "--from", "x", "--listen", "nohost:1"], 2, "not a numeric IP"),
    (["export", "--from", "x", "--node", " "], 2, "--node"),
    (["cluster", "--prometheus", "ftp://x"], 2, "invalid --prometheus"),
    (["cluster", "--prometheus", "http://127.0.0.1:1", "--window", "5 minutes"], 2, "invalid --window"),
])
def test_bad_input_is_one_line(args, code, needle):
    r = run_cli(*args, timeout=60)
    assert r.returncode == code, (r.returncode, r.stderr)
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0, r.stderr


def test_http_server_serves_metrics_on_loopback(gen_snap):
    _, snapfile, snap, _ = gen_snap["congestion"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([sys.executable, "-m", "skewscope.cli", "export", "--from", str(snapfile), "--listen",
                          f"127.0.0.1:{port}", "--node", "dpu-http"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        body = None
        for _ in range(200):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
                    body = r.read().decode()
                    break
            except OSError:
                if p.poll() is not None:
                    break
                time.sleep(0.1)
        assert body is not None, p.stderr.read() if p.poll() is not None else "no answer"
        m = parse(body)
        got = by_pair(m, "skewscope_peer_bytes_total", "dpu-http")
        assert {k: int(v) for k, v in got.items()} == expected_pairs(snap, ["bytes"])
        assert "process_cpu_seconds_total" in m           # the exporter's own overhead, scraped too
        # busy-second and timing families present for every pair series
        assert len(m["skewscope_peer_busy_seconds_total"]) == len(m["skewscope_peer_bytes_total"])
    finally:
        p.terminate()
        out, err = p.communicate(timeout=15)
    assert p.returncode == 0, err
    assert "serving http://127.0.0.1:" in err


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing (Debian package prometheus)")
def test_rule_files_and_scrape_config_pass_promtool():
    d = ROOT / "docs" / "prometheus"
    r = subprocess.run(["promtool", "check", "rules", str(d / "skewscope-rules.yml"), str(d / "skewscope-alerts.yml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run(["promtool", "check", "config", str(d / "prometheus.yml")], capture_output=True, text=True,
                       timeout=60, cwd=d)
    assert r.returncode == 0, r.stdout + r.stderr


def test_dashboard_uses_only_recorded_or_exported_series():
    import json
    import re
    d = ROOT / "docs" / "prometheus"
    dash = json.loads((d / "skewscope-grafana.json").read_text())
    rules = (d / "skewscope-rules.yml").read_text()
    recorded = set(re.findall(r"record: (\S+)", rules))
    f = mk_flows([("10.0.0.1", "10.0.0.2", 5, 10, 1000, 1, 8192, 1)])
    st_ = E.state_from_snapshot(Snapshot(f, np.zeros(0, L.EVENT_DTYPE), np.zeros(L.G_N, np.uint64), {}), "n")
    exported = set(parse(X.render(X.make_registry(X.SkewscopeCollector(lambda: st_), process_metrics=False))))
    for p in dash["panels"]:
        for t in p["targets"]:
            for name in re.findall(r"[a-z_]*:[a-z_]+:[a-z0-9_]+|skewscope_[a-z_]+", t["expr"]):
                base = re.sub(r"_(bucket|total)$", "", name)
                assert name in recorded or base in exported or name in exported, (p["title"], name)
