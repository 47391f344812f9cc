"""Onset of findings (docs/metrics.md "Onset"): `since` / `until` against the generator's truth.

Truth comes from the generator, never from the analysis: a mid-capture onset is built by
putting two captures of one job one after the other in time (genlib.concat: healthy then
pathological, or the other way round -- the onset is where the second capture's first
packet is, the end where the first capture's last packet is), or from the generator's own
timing knobs (incast `at_ms`/`repeat`, PFC `start_ms`/`count`/`interval_us`), and a loss's
drops are found by reading the pcap's PSNs here (an independent parse). The statistics of
the change-point scan are checked by simulation."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import genlib

from skewscope.analysis import analyze
from skewscope.analysis import onset as O
from skewscope.outputs import events as E
from skewscope.core.when import Clock

A2A = {"kind": "all_to_all", "bytes_per_peer": "128KiB", "channels": 1, "combine": True}
RING = {"kind": "ring_allreduce", "bytes": "8MiB", "channels": 2}
KV = {"kind": "kv_transfer", "prefill": [0, 1, 2, 3], "decode": [4, 5, 6, 7], "interval_us": 100,
      "block_bytes": "64KiB", "block_bytes_max": "256KiB", "blocks_per_request": 16, "prefill_us": 50}


def _one(an, kind, ip=None):
    fs = [f for f in an["findings"] if f["kind"] == kind and (ip is None or f["entities"]["ips"][0] == ip)]
    assert fs, f"no {kind} finding: {[f['kind'] for f in an['findings']]}"
    return fs[0]


def _ns(x):
    return None if x is None else x * 1e9


# ---- the scan's statistics (simulation) -------------------------------------------------------
@pytest.mark.parametrize("n", [20, 40, 120, 240])
def test_scan_chance_level(n):
    """On exchangeable noise (continuous and 0/1) the best stretch reaches z_min(n) in at
    most ~0.5 % of the series: z_min is the scan's own 99.9th-percentile chance level."""
    rng = np.random.default_rng(n)
    reps = 400 if n <= 40 else 150
    hits = sum(O.scan(rng.standard_normal(n))[2] >= O.z_min(n) for _ in range(reps))
    hits += sum(O.scan(rng.integers(0, 2, n).astype(float))[2] >= O.z_min(n) for _ in range(reps))
    assert hits <= max(2, 0.01 * 2 * reps)


def test_series_onset_shapes():
    t = np.arange(60, dtype=float) * 1e6
    rng = np.random.default_rng(3)
    noise = rng.normal(0, 0.05, 60)
    step = np.where(np.arange(60) >= 25, 2.0, 1.0) + noise
    assert O.series_onset(t, step, 1, thr=1.5) == O.Onset(25e6, None)                 # began at 25
    rec = np.where(np.arange(60) < 40, 2.0, 1.0) + noise
    assert O.series_onset(t, rec, 1, thr=1.5) == O.Onset(0.0, 39e6)                   # ended after 39
    mid = np.where((np.arange(60) >= 10) & (np.arange(60) < 30), 0.3, 1.0) + noise
    assert O.series_onset(t, mid, -1, thr=0.8) == O.Onset(10e6, 29e6)                 # lower is worse
    assert O.series_onset(t, 2.0 + noise, 1, thr=1.5) == O.Onset(0.0, None)           # throughout
    # a change of strength above the threshold on both sides: it held throughout
    assert O.series_onset(t, step + 1.0, 1, thr=1.5) == O.Onset(0.0, None)
    # short series: a clean split by the threshold is an onset, noise is not
    t6 = np.arange(6, dtype=float)
    assert O.series_onset(t6, [1, 1, 1, 3, 3, 3], 1, thr=2.0) == O.Onset(3.0, None)
    assert O.series_onset(t6, [1, 3, 1, 3, 1, 3], 1, thr=2.0) == O.Onset(0.0, None)
    # no threshold: a change of less than MIN_EFFECT is no onset, however significant
    small = np.where(np.arange(60) >= 30, 1.1, 1.0)
    assert O.series_onset(t, small, 1) == O.Onset(0.0, None)
    assert O.series_onset(t, small * 3 - 2, 1).since_ns == 30e6
    assert O.series_onset([], [], 1) == O.NONE


def test_episode():
    # periodic occurrences over the whole data: from the start, still holding
    s = np.arange(1, 10) * 10.0
    assert O.episode(s, s + 1, 0.0, 100.0) == O.Onset(0.0, None)
    # a late burst of occurrences after a long clean stretch, ending well before the end
    s = 500.0 + np.arange(5) * 10.0
    assert O.episode(s, s + 2, 0.0, 1000.0) == O.Onset(500.0, 542.0)
    # one occurrence: an event (since = until), unless it is at the very end
    assert O.episode([300.0], [310.0], 0.0, 1000.0) == O.Onset(300.0, 310.0)
    assert O.episode([990.0], [999.0], 0.0, 1000.0) == O.Onset(990.0, None)
    assert O.episode([], [], 0.0, 1.0) == O.NONE


def test_concurrency_spans():
    s = np.array([0.0, 1.0, 2.0, 10.0])
    e = np.array([5.0, 6.0, 3.0, 11.0])
    a, b = O.concurrency_spans(s, e, 2)
    assert a.tolist() == [1.0] and b.tolist() == [5.0]
    a, b = O.concurrency_spans(s, e, 3)
    assert a.tolist() == [2.0] and b.tolist() == [3.0]


# ---- against the generator: onsets and ends built by concatenation ----------------------------
def _pair(first, second, **kw):
    ta, a = genlib.get_any(first)
    tb, b = genlib.get_any(second)
    s, shift, t_b = genlib.concat(a, b, **kw)
    return s, int(a.meta["last_ts"]), t_b


def _a2a(hot: bool, it: int = 4):
    d = {"nodes": 8, "iterations": it, "period_ms": 5.0, "workloads": [dict(A2A)]}
    if hot:
        d["pathologies"] = [{"kind": "hot_expert", "node": 5, "factor": 4.0}]
    return d


def _ring(patho=None, nodes=4, it=3, period_ms=4.0):
    d = {"nodes": nodes, "iterations": it, "period_ms": period_ms, "workloads": [dict(RING)]}
    if patho:
        d["pathologies"] = [patho]
    return d


def _truth_window(truth):
    """(since, until) of the scenario's pathology: pcap-time ns (None: open)."""
    p = truth["pathologies"][0]
    return p.get("since_ns"), p.get("until_ns")


#: (scenario, kind, how far after the truth's onset `since` may be (ns), how far before the
#: truth's end `until` may be: the last affected observation ends before it)
GEN = {
    "hot_expert_since": ({"nodes": 8, "iterations": 8, "period_ms": 5.0, "workloads": [dict(A2A)],
                          "pathologies": [{"kind": "hot_expert", "node": 5, "factor": 4.0, "since_ms": 20}]},
                         "hot_destination", 5e6, None),
    "hot_expert_until": ({"nodes": 8, "iterations": 8, "period_ms": 5.0, "workloads": [dict(A2A)],
                          "pathologies": [{"kind": "hot_expert", "node": 5, "factor": 4.0, "until_ms": 20}]},
                         "alltoall_destination_skew", None, 5e6),
    "congestion_since": (_ring({"kind": "congestion", "into": 2, "ce_fraction": 0.3, "rate_factor": 0.6, "since_ms": 12},
                               it=6), "ecn_congestion", 2e5, None),
    "cnp_since": (_ring({"kind": "congestion", "into": 2, "ce_fraction": 0.3, "rate_factor": 0.6, "since_ms": 12},
                        it=6), "cnp_storm", 2e5, None),
    "slow_link_window": (_ring({"kind": "slow_link", "node": 2, "mode": "slow", "speed_factor": 0.25, "since_ms": 16,
                                "until_ms": 32}, it=6, period_ms=8.0), "slow_link", 2e5, 8e6),
    "pipeline_since": ({"nodes": 4, "iterations": 6, "period_ms": 12.0,
                        "workloads": [{"kind": "p2p_pipeline", "activation_bytes": "1MiB", "microbatches": 6}],
                        "pathologies": [{"kind": "pipeline_bubble", "stage": 1, "compute_factor": 3.0, "since_ms": 36}]},
                       "pipeline_bubbles", 2e6, None),
    "hot_destination_decode": ({"nodes": 8, "workloads": [{"kind": "decode_ep", "layers": 4, "tokens": 12,
                                                           "bytes_per_dest": "2KiB", "compute_gap_us": 2000}],
                                "pathologies": [{"kind": "hot_destination", "node": 5, "factor": 4.0, "since_ms": 12}]},
                               "hot_destination", 5e6, None),
    # a sender slow by rate (no start lag): the rate series (detectors.rings ONSET_FNS)
    "ring_straggler_rate": (_ring({"kind": "straggler", "node": 3, "rate_factor": 0.4, "start_lag_us": 0,
                                   "since_ms": 18}, nodes=8, it=6, period_ms=6.0),
                            ("ring_straggler", "10.0.0.4"), 2e5, None),
    "tree_straggler": ({"nodes": 8, "iterations": 6, "period_ms": 6.0,
                        "workloads": [{"kind": "tree_allreduce", "bytes": "4MiB", "channels": 2}],
                        "pathologies": [{"kind": "straggler", "node": 5, "rate_factor": 0.4, "since_ms": 18}]},
                       ("straggler", "10.0.0.6"), 2e5, None),
}


@pytest.mark.parametrize("case", sorted(GEN))
def test_onset_against_generator_truth(case):
    """Pathologies with since_ms / until_ms (the generator's truth since_ns / until_ns): the
    finding's since within the case's tolerance after the truth's onset (never more than
    0.1 ms before it: a message already in flight), until null when it holds to the end;
    with an end, until between (truth end - tolerance) and the truth end; without an onset,
    since = the first data."""
    sc, kind, late, early = GEN[case]
    truth, snap = genlib.get_any(sc)
    t_since, t_until = _truth_window(truth)
    f = _one(analyze(snap), *(kind if isinstance(kind, tuple) else (kind,)))
    since, until = _ns(f["since"]), _ns(f["until"])
    if t_since is None:
        assert since <= snap.meta["first_ts"] + 1e5, (since, snap.meta["first_ts"])
    else:
        assert t_since - 1e5 <= since <= t_since + late, (case, since - t_since)
    if t_until is None:
        assert until is None, (case, until)
    else:
        assert until is not None and t_until - early <= until <= t_until + 1e5, (case, until, t_until)


def test_onset_and_end_by_concatenation():
    """Two captures of one all-to-all one after the other (healthy, then a hot expert; and
    the other way round): the onset where the second begins, the end where the first ends."""
    period = 5e6
    ta, a = genlib.get_any(_a2a(False))
    tb, b = genlib.get_any(_a2a(True))
    s, _, t_b = genlib.concat(a, b, shift_ns=4 * period)
    f = _one(analyze(s), "hot_destination")
    assert f["entities"]["ips"][0] == "10.0.0.6"
    assert t_b - 0.1 * period <= _ns(f["since"]) <= t_b + 0.5 * period and f["until"] is None
    s, _, t_b = genlib.concat(b, a, shift_ns=4 * period)
    f = _one(analyze(s), "hot_destination")
    a_end = int(b.meta["last_ts"])
    assert _ns(f["since"]) <= s.meta["first_ts"] + 0.1 * period
    assert a_end - 0.5 * period <= _ns(f["until"]) <= t_b, (f["until"], a_end, t_b)


def _drop_times(cap) -> list[int]:
    """Timestamps of the request packets that follow a PSN gap (a drop), per flow, read from
    the frames (IPv4, no VLAN): the independent truth of when the losses happened."""
    nxt, out = {}, []
    for ts, fr in cap.frames_iter():
        if len(fr) < 54 or fr[12:14] != b"\x08\x00" or fr[23] != 17 or int.from_bytes(fr[36:38], "big") != 4791:
            continue
        if fr[42] > 0x0F:                       # RC requests only (SEND/WRITE/READ_REQUEST)
            continue
        key = (fr[26:30], fr[30:34], int.from_bytes(fr[47:50], "big"))
        psn = int.from_bytes(fr[51:54], "big")
        d = (psn - nxt[key]) & 0xFFFFFF if key in nxt else 0
        if 0 < d < (1 << 23):
            out.append(int(ts))
        if d < (1 << 23):
            nxt[key] = (psn + 1) & 0xFFFFFF
    return sorted(out)


def test_loss_onset_is_the_first_drop():
    """The loss preset's 6 drops (found in the pcap by their PSN gaps): packet_loss since =
    the start of the message the first drop hit (at most one message before it); with a
    healthy ring before it, the onset is in the lossy part."""
    from skewscope import gen as skewgen
    drops = _drop_times(skewgen.generate("loss", seed=0))
    assert len(drops) == 6
    truth, snap = genlib.get("loss")
    an = analyze(snap)
    for kind in ("packet_loss", "retransmissions", "nak_errors"):
        f = _one(an, kind)
        assert drops[0] - 3e5 <= _ns(f["since"]) <= drops[0], (kind, f["since"], drops[0])
    # from since_ms 8 on: the first drop is then, or later (random packets of the flows)
    sc = _ring({"kind": "loss", "pairs": [[1, 2]], "count": 6, "since_ms": 8}, it=4)
    drops = _drop_times(skewgen.generate(sc, seed=0))
    truth, snap = genlib.get_any(sc)
    t_since, _ = _truth_window(truth)
    assert drops[0] >= t_since
    f = _one(analyze(snap), "packet_loss")
    assert drops[0] - 3e5 <= _ns(f["since"]) <= drops[0] and f["until"] is None


def test_incast_window():
    """An incast of 3 bursts, 2 ms apart from 10 ms on, inside an 8-iteration ring that runs on
    for 25 ms after it: since = the first burst (within 0.1 ms), until = the end of the last
    (within 2 ms of its start)."""
    sc = {"nodes": 8, "iterations": 8, "period_ms": 5.0,
          "workloads": [{"kind": "ring_allreduce", "bytes": "2MiB", "channels": 1}],
          "pathologies": [{"kind": "incast", "target": 0, "senders": 6, "bytes": "1MiB", "at_ms": 10.0, "repeat": 3,
                           "period_ms": 2.0}]}
    truth, snap = genlib.get_any(sc)
    starts = [g["details"]["burst_starts_ns"] for g in truth["groups"] if g["kind"] == "incast"][0]
    epoch = truth["model"]["epoch_ns"]
    f = _one(analyze(snap), "incast")
    assert abs(_ns(f["since"]) - (epoch + starts[0])) <= 1e5
    assert f["until"] is not None
    assert epoch + starts[-1] <= _ns(f["until"]) <= epoch + starts[-1] + 2e6


def test_incast_throughout():
    """The incast preset bursts at 1 ms and 6 ms of a 6.5 ms capture: since = the first
    burst, still holding at the end."""
    truth, snap = genlib.get("incast")
    starts = [g["details"]["burst_starts_ns"] for g in truth["groups"] if g["kind"] == "incast"][0]
    f = _one(analyze(snap), "incast")
    assert abs(_ns(f["since"]) - (truth["model"]["epoch_ns"] + starts[0])) <= 1e5 and f["until"] is None


def test_pfc_storm_window():
    """40 pause frames every 15 us from start_ms 0.3 (+ the model's 50 us): since within 60 us
    of the first pause, until within 100 us of the last pause's end (the end of the last
    message it stalled)."""
    truth, snap = genlib.get("pfc")
    pat = truth["scenario"]["pathologies"][0]
    epoch = truth["model"]["epoch_ns"]
    t_first = epoch + pat["start_ms"] * 1e6 + 50_000
    t_last = t_first + (pat["count"] - 1) * pat["interval_us"] * 1e3 + truth["pathologies"][0]["magnitude"]["pause_us_each"] * 1e3
    f = _one(analyze(snap), "pfc_pause")
    assert abs(_ns(f["since"]) - t_first) <= 6e4, (f["since"], t_first)
    assert abs(_ns(f["until"]) - t_last) <= 1e5, (f["until"], t_last)


def test_pd_imbalance_onset_and_end():
    """P/D: a balanced router for 24 requests, then one sending 60 % to decode node 4 for
    48 (and the other way round)."""
    h = {"nodes": 8, "workloads": [dict(KV, requests=24)]}
    p = {"nodes": 8, "workloads": [dict(KV, requests=48)], "pathologies": [{"kind": "pd_imbalance", "node": 4, "share": 0.6}]}
    s, a_end, t_b = _pair(h, p, gap_ns=1e5)
    f = _one(analyze(s), "pd_imbalance")
    assert f["entities"]["ips"][0] == "10.0.0.5"
    assert t_b - 2e5 <= _ns(f["since"]) <= t_b + 1e6 and f["until"] is None
    s, a_end, t_b = _pair(p, h, gap_ns=1e5)
    f = _one(analyze(s), "pd_imbalance")
    assert _ns(f["since"]) <= s.meta["first_ts"] + 2e5
    assert a_end - 1e6 <= _ns(f["until"]) <= t_b


@pytest.mark.parametrize("name", ["moe-hot-expert", "ep-decode-hot-drift", "slow-link", "congestion",
                                  "pd-imbalanced", "prefill-interference", "tp-decode-slow-shard",
                                  "ring-straggler", "pipeline-bubbles"])
def test_condition_throughout_since_first_data(name):
    """Pathologies present the whole capture: since = the first data (within the first
    iteration / the first 2 % of the capture), until null; a drifting hot destination counts
    as one condition throughout."""
    truth, snap = genlib.get(name)
    an = analyze(snap)
    kinds = {p.get("detector_kinds", [None])[0] for p in truth["pathologies"]} - {None}
    fs = [f for f in an["findings"] if f["severity"] != "info"]
    assert fs
    first, dur = snap.meta["first_ts"], snap.meta["duration_s"] * 1e9
    per = (truth.get("period_s") or 0) * 1e9
    for f in fs:
        if kinds and f["kind"] not in kinds | {"alltoall_destination_skew"}:
            continue
        assert _ns(f["since"]) - first <= max(0.02 * dur, per), (f["kind"], f["since"])
        assert f["until"] is None, f["kind"]


def test_every_finding_has_since_until_json():
    """report --json: every finding has since/until (null or a float on the snapshot's clock
    within the capture), strict JSON."""
    for name in ("demo-mix", "mixed", "tp-decode-prefill"):
        truth, snap, an = genlib.analyzed(name)
        json.dumps(an, allow_nan=False)
        lo, hi = snap.meta["first_ts"] / 1e9, snap.meta["last_ts"] / 1e9
        for f in an["findings"]:
            assert "since" in f and "until" in f
            if f["since"] is not None:
                assert lo - 1e-6 <= f["since"] <= hi + 1e-6, (name, f["kind"])
            if f["until"] is not None:
                assert f["since"] is not None and f["since"] <= f["until"] <= hi + 1e-6, (name, f["kind"])


# ---- outputs ------------------------------------------------------------------------------------
def test_when_text_and_clock():
    ck = Clock.of({"first_ts": 1_700_000_000_000_000_000, "last_ts": 1_700_000_093_000_000_000})
    assert ck.text(None) == ""
    assert ck.text(1_700_000_000.0) == "since the capture's start (22:13:20.000 UTC), still holding at the end of the data"
    assert ck.text(1_700_000_012.3) == "since 22:13:32.300 UTC (+12.3 s into the capture), still holding at the end of the data"
    assert ck.text(1_700_000_087.812, 1_700_000_087.834) == \
        "from 22:14:47.812 to 22:14:47.834 UTC (+87.812 s to +87.834 s; 22 ms)"
    # a live window (monotonic ns): its last read's wall time puts it on the wall clock
    mono = Clock.of({"first_ts": 5_000_000_000, "last_ts": 15_000_000_000, "clock": "monotonic"}, wall_end=1000.0)
    assert mono.wall(15.0) == pytest.approx(1000.0) and mono.wall(7.5) == pytest.approx(992.5)
    # a capture's .snap: through started_at
    cap = Clock.of({"first_ts": 5_000_000_000, "last_ts": 15_000_000_000, "clock": "monotonic", "started_at": 2000.0})
    assert cap.wall(7.5) == pytest.approx(2002.5)
    # no wall clock at all: offsets only
    bare = Clock.of({"first_ts": 5_000_000_000, "last_ts": 15_000_000_000, "clock": "monotonic"})
    assert bare.text(7.5) == "since +2.5 s into the capture, still holding at the end of the data"


def test_tracker_opens_at_the_onset():
    """An event opens at the finding's onset (first_seen = since on the source's clock), and
    carries since/until; a live window maps monotonic time through its last read's wall."""
    f = {"kind": "incast", "severity": "warning", "entities": {"ips": ["10.0.0.1"], "qps": [], "flows": []},
         "evidence": {}, "message": "m", "group": None, "impact": None, "since": 12.0, "until": None}
    meta = {"first_ts": 10_000_000_000, "last_ts": 20_000_000_000, "clock": "monotonic"}
    tr = E.Tracker(hold=5)
    evs = tr.update([f], now=1000.0, seen=(990.0, 1000.0), clock=Clock.of(meta, wall_end=1000.0))
    assert len(evs) == 1 and evs[0]["event"] == "opened"
    assert evs[0]["first_seen"] == pytest.approx(992.0) and evs[0]["since"] == pytest.approx(992.0)
    assert evs[0]["until"] is None and evs[0]["finding"]["since"] == 12.0
    # the next window (slid by 2 s) sees the same condition, the onset now at the window's start
    f2 = dict(f, since=13.0, until=19.0)
    meta2 = {"first_ts": 12_000_000_000, "last_ts": 22_000_000_000, "clock": "monotonic"}
    evs = tr.update([dict(f2, severity="critical")], now=1002.0, seen=(992.0, 1002.0),
                    clock=Clock.of(meta2, wall_end=1002.0))
    assert evs[0]["event"] == "updated" and evs[0]["first_seen"] == pytest.approx(992.0)
    assert evs[0]["since"] == pytest.approx(992.0) and evs[0]["until"] == pytest.approx(999.0)
    # without a clock (the fleet): as before
    tr2 = E.Tracker()
    e = tr2.update([dict(f, since=None)], now=5.0, seen=(1.0, 5.0))[0]
    assert e["first_seen"] == 1.0 and e["since"] is None


def test_watch_from_file_opens_at_the_onset(tmp_path):
    """watch --from a pcap whose incast starts mid-capture: the opened event's first_seen and
    since = the finding's since (pcap time), not the capture's first packet."""
    from skewscope import gen as skewgen
    from skewscope.cli import main
    out = tmp_path / "incast.pcap"
    skewgen.write("incast", str(out), seed=0, snaplen=128)
    truth = json.loads(Path(skewgen.truth_path(str(out))).read_text())
    start = truth["model"]["epoch_ns"] + [g["details"]["burst_starts_ns"] for g in truth["groups"]
                                          if g["kind"] == "incast"][0][0]
    r = CliRunner().invoke(main, ["watch", "--from", str(out), "--json"])
    evs = [json.loads(x) for x in r.output.splitlines() if x.strip()]
    inc = [e for e in evs if e.get("event") == "opened" and e["finding"]["kind"] == "incast"][0]
    assert abs(inc["since"] * 1e9 - start) <= 1e5 and inc["first_seen"] == inc["since"]
    assert inc["first_seen"] > min(x["first_ts"] for x in truth["flows"]) / 1e9 + 5e-4
    r = CliRunner().invoke(main, ["watch", "--from", str(out)])
    assert "since 2025-01-01T00:00:00.001Z, still holding" in r.output
    # diagnose: the line under the finding, and the JSON's clock
    r = CliRunner().invoke(main, ["diagnose", str(out)])
    assert "since 00:00:00.0010" in r.output and "into the capture), still holding at the end of the data" in r.output
    d = json.loads(CliRunner().invoke(main, ["diagnose", str(out), "--json"]).output)
    f = [x for x in d["findings"] if x["kind"] == "incast"][0]
    assert d["capture"]["first_s"] <= f["since"] <= d["capture"]["last_s"] and d["capture"]["clock"] == "pcap"


def test_html_marks_the_onset(tmp_path):
    pytest.importorskip("matplotlib")
    from skewscope.outputs import html as H
    truth, snap, an = genlib.analyzed("pfc")
    page = H.render(snap, an)
    assert "when: from 00:00:00.000" in page
    assert "pfc_pause since" in page                          # the marker on the time charts
    spans = H.onset_spans(an["findings"], snap.meta["first_ts"], snap.meta["last_ts"])
    assert len(spans) == 1 and 0 < spans[0][0] < spans[0][1] < snap.meta["duration_s"] * 1e3
    # a condition there throughout is not shaded
    truth, snap, an = genlib.analyzed("slow-link")
    assert H.onset_spans(an["findings"], snap.meta["first_ts"], snap.meta["last_ts"]) == []


def test_copy_of_fixture_unchanged():
    """genlib.concat leaves its inputs alone (the cached snapshots are shared by tests)."""
    ta, a = genlib.get_any(_a2a(False))
    before = (a.flows.copy(), a.events.copy(), copy.deepcopy(a.meta))
    genlib.concat(a, a, gap_ns=1e6)
    assert (a.flows == before[0]).all() and (a.events == before[1]).all() and a.meta == before[2]


def test_onset_functions_never_fail_on_odd_series():
    """Random lengths (0-300), NaNs, ties, constant and huge values: series_onset / episode
    return an Onset with since <= until, both inside the observations' span."""
    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(0, 300))
        t = np.sort(rng.uniform(0, 1e9, n))
        y = rng.choice([rng.normal(1, 0.3, n), rng.integers(0, 2, n).astype(float), np.ones(n),
                        np.where(rng.random(n) < 0.1, np.nan, rng.lognormal(0, 2, n))])
        thr = rng.choice([None, 0.5, 1.0, 2.0])
        o = O.series_onset(t, y, int(rng.choice([-1, 1])), thr=thr, t_end=t + 10)
        if o.since_ns is not None:
            assert t.min() <= o.since_ns <= t.max() + 10
        if o.until_ns is not None:
            assert o.since_ns <= o.until_ns <= t.max() + 10
        e = O.episode(t, t + 5, 0.0, 1e9 + 10)
        if n:
            assert 0 <= e.since_ns <= t.min() and (e.until_ns is None or e.since_ns <= e.until_ns <= 1e9 + 10)


def test_top_marks_an_onset_inside_its_window():
    """top: a finding that began inside the analysed window gets "(since HH:MM:SS)" in local
    time (the window's clock on the wall through its last read); one there from the window's
    start gets nothing (it began before the window)."""
    import time

    from skewscope.outputs.topview import onset_note
    meta = {"first_ts": 100_000_000_000, "last_ts": 110_000_000_000, "clock": "monotonic"}
    an = {"_clock": Clock.of(meta, wall_end=1_700_000_000.0)}
    f = {"since": 104.0, "until": None}
    want = time.strftime("%H:%M:%S", time.localtime(1_700_000_000.0 - 6.0))
    assert onset_note(f, an) == f" (since {want})"
    ended = time.strftime("%H:%M:%S", time.localtime(1_700_000_000.0 - 2.0))
    assert onset_note({"since": 104.0, "until": 108.0}, an) == f" ({want}-{ended})"
    assert onset_note({"since": 100.0, "until": None}, an) == ""
    assert onset_note({"since": None}, an) == "" and onset_note(f, {}) == ""
