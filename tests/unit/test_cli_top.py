"""`skewscope top` without root: error paths through the real CLI, and the pure parts of
the live view (deltas, rates, model, keys, plain output) on hand-built flow tables whose
expected numbers are computed here by hand, not by the code under test."""
from __future__ import annotations

import sys

import numpy as np
import pytest
from click.testing import CliRunner

from skewscope.cli import main
from skewscope.core import layout as L
from skewscope.core.rates import flow_rates
from skewscope.core.snapshot import Snapshot, ip_bytes
from skewscope.live import top as T
from skewscope.outputs import toprich
from skewscope.outputs import topview as V
from skewscope.sources import live


def flow(src, dst, qp, **kw):
    r = np.zeros(1, dtype=L.FLOW_DTYPE)
    r["src"], v = np.frombuffer(ip_bytes(src)[0], np.uint8), ip_bytes(src)[1]
    r["dst"] = np.frombuffer(ip_bytes(dst)[0], np.uint8)
    r["dest_qp"], r["ipver"], r["roce"] = qp, v, 2
    for k, val in kw.items():
        r[k] = val
    return r


def table(*rows):
    t = np.concatenate(rows) if rows else np.zeros(0, L.FLOW_DTYPE)
    k = np.ascontiguousarray(t[["src", "dst", "dest_qp"]]).view(np.uint8).reshape(len(t), -1)
    order = sorted(range(len(t)), key=lambda i: bytes(k[i]))
    return t[order]


def snap(flows, globals_=None, **meta):
    g = np.zeros(L.G_N, np.uint64) if globals_ is None else globals_
    return Snapshot(flows=flows, events=np.zeros(0, L.EVENT_DTYPE), globals=g, meta=dict(meta))


def hist(slot, n):
    h = np.zeros(L.MSG_SLOTS, np.uint64)
    h[slot] = n
    return h


# ---- CLI error paths ------------------------------------------------------------------------
runner = CliRunner()


def test_help_lists_examples_and_keys():
    r = runner.invoke(main, ["top", "--help"])
    assert r.exit_code == 0
    assert "Examples:" in r.output and "skewscope top -i pf0hpf" in r.output
    assert "Keys:" in r.output and "[INTERVAL] [COUNT]" in r.output


def test_missing_interface_is_exit_6_one_line():
    r = runner.invoke(main, ["top", "-i", "ssu-nosuchif0"])
    assert r.exit_code == 6
    assert r.stderr.count("\n") == 1 and "ssu-nosuchif0" in r.stderr and "does not exist" in r.stderr
    assert "Traceback" not in r.output


def test_not_root_is_exit_4(monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    r = runner.invoke(main, ["top", "-i", "lo", "1", "1"])
    assert r.exit_code == 4
    assert "needs root" in r.stderr and r.stderr.count("\n") == 1


def test_bcc_missing_is_exit_5(monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 0)
    monkeypatch.setitem(sys.modules, "bcc", None)      # `import bcc` raises ImportError
    r = runner.invoke(main, ["top", "-i", "lo", "1", "1"])
    assert r.exit_code == 5
    assert "python3-bpfcc" in r.stderr and r.stderr.count("\n") == 1


@pytest.mark.parametrize("args,needle", [
    (["--direction", "egress"], "--direction needs --tc"),
    (["0"], "0"),                 # interval below 0.1
    (["1", "0"], "0"),            # count must be >= 1
    (["--sample", "0"], "--sample"),
    (["--xdp-mode", "turbo"], "turbo"),
])
def test_usage_errors_are_exit_2(args, needle):
    r = runner.invoke(main, ["top", "-i", "lo", *args])
    assert r.exit_code == 2, r.output
    assert needle in r.output


def test_ebpf_prints_source_with_flags():
    r = runner.invoke(main, ["top", "-i", "lo", "--ebpf", "--sample", "4", "--max-flows", "1024"])
    assert r.exit_code == 0
    assert "-DSS_SAMPLE_N=4" in r.output and "-DSS_MAX_FLOWS=1024" in r.output
    assert "int skewscope_xdp(" in r.output and "int skewscope_tc(" in r.output


# ---- deltas and rates ----------------------------------------------------------------------------
def test_flow_delta_matches_keys_and_handles_new_and_recreated_flows():
    a1 = flow("10.0.0.1", "10.0.0.2", 7, packets=10, bytes=1000, ce=1, msg_hist=hist(5, 2), first_ts=5, last_ts=9)
    b1 = flow("10.0.0.3", "10.0.0.4", 8, packets=50, bytes=5000)
    c1 = flow("10.0.0.5", "10.0.0.6", 9, packets=7, bytes=700)
    prev = table(a1, b1, c1)
    a2 = flow("10.0.0.1", "10.0.0.2", 7, packets=25, bytes=2600, ce=4, msg_hist=hist(5, 5), first_ts=5, last_ts=99)
    b2 = flow("10.0.0.3", "10.0.0.4", 8, packets=3, bytes=300)          # evicted + re-created: lower
    c2 = flow("10.0.0.5", "10.0.0.6", 9, packets=7, bytes=700)          # idle: dropped from delta
    d2 = flow("10.0.0.7", "10.0.0.8", 1, packets=2, bytes=120)          # new
    cur = table(d2, c2, b2, a2)
    d = live.flow_delta(prev, cur, since_ns=50)
    got = {(int(r["dest_qp"])): r for r in d}
    assert sorted(got) == [1, 7, 8]
    assert int(got[7]["packets"]) == 15 and int(got[7]["bytes"]) == 1600 and int(got[7]["ce"]) == 3
    assert int(got[7]["msg_hist"][5]) == 3 and int(got[7]["last_ts"]) == 99
    assert int(got[7]["first_ts"]) == 50            # clamped to the previous read
    assert int(got[8]["packets"]) == 3 and int(got[8]["bytes"]) == 300
    assert int(got[1]["packets"]) == 2


def test_flow_delta_recreated_flow_that_passed_its_old_count():
    # evicted and re-created between reads, and already busier than the old entry: the
    # new first_ts gives it away; its counters are all new
    prev = table(flow("10.0.0.1", "10.0.0.2", 7, packets=10, bytes=1000, first_ts=5, last_ts=9))
    cur = table(flow("10.0.0.1", "10.0.0.2", 7, packets=40, bytes=4000, first_ts=70, last_ts=90))
    d = live.flow_delta(prev, cur, since_ns=50)
    assert int(d["packets"][0]) == 40 and int(d["bytes"][0]) == 4000


def test_flow_delta_from_nothing_is_the_table():
    cur = table(flow("10.0.0.1", "10.0.0.2", 7, packets=3, bytes=30), flow("10.0.0.1", "10.0.0.2", 8))
    d = live.flow_delta(None, cur)
    assert len(d) == 1 and int(d["packets"][0]) == 3


def test_globals_delta_never_negative():
    p = np.array([5, 10] + [0] * (L.G_N - 2), np.uint64)
    c = np.array([7, 4] + [0] * (L.G_N - 2), np.uint64)     # 2nd went down: counter reset
    g = live.globals_delta(p, c)
    assert int(g[0]) == 2 and int(g[1]) == 4


def test_flow_rates_by_hand():
    f = table(flow("10.0.0.1", "10.0.0.2", 7, packets=1000, bytes=125_000_000, ecn_capable=800, ce=200, cnp=30,
                   retransmissions=2, nak_seq=1, nak_other=1, msg_hist=hist(21, 9) + hist(7, 3)))
    r = flow_rates(f, 2.0, sample_n=1)
    assert r["gbps"][0] == pytest.approx(125e6 * 8 / 2 / 1e9)         # 0.5 Gb/s
    assert r["pps"][0] == pytest.approx(500)
    assert r["cnp_ps"][0] == pytest.approx(15)
    assert r["ce_pct"][0] == pytest.approx(25.0)                     # 200 of 800 ECN-capable
    assert r["naks"][0] == 2 and r["retx"][0] == 2
    assert r["msg_mode"][0] == 1 << 20                               # slot 21 = [1 MiB, 2 MiB)
    r4 = flow_rates(f, 2.0, sample_n=4)
    assert r4["pps"][0] == pytest.approx(2000) and r4["ce_pct"][0] == pytest.approx(25.0)


# ---- the model and the keys -------------------------------------------------------------------------
def three_flows():
    return table(
        flow("10.0.0.1", "10.0.0.6", 0x10, packets=100, bytes=400_000, ce=0, ecn_capable=100, msg_hist=hist(18, 4)),
        flow("10.0.0.2", "10.0.0.6", 0x11, packets=300, bytes=1_200_000, ce=30, ecn_capable=300,
             msg_hist=hist(18, 12)),
        flow("10.0.0.3", "10.0.0.4", 0x12, packets=50, bytes=3_000_000, retransmissions=5, msg_hist=hist(21, 1)),
    )


def test_model_sorts_by_rate_then_by_key_presses():
    st = V.ViewState()
    m = V.build_model(snap(three_flows()), 1.0, st)
    assert [r.qp for r in m.rows] == [0x12, 0x11, 0x10]              # bytes 3M > 1.2M > 400K
    st.key("s")                                                       # -> pkt/s
    m = V.build_model(snap(three_flows()), 1.0, st)
    assert m.sort_title == "pkt/s" and [r.qp for r in m.rows] == [0x11, 0x10, 0x12]
    st.key("r")
    m = V.build_model(snap(three_flows()), 1.0, st)
    assert [r.qp for r in m.rows] == [0x12, 0x10, 0x11]
    st.key("s")                                                       # -> CE%
    st.key("r")
    m = V.build_model(snap(three_flows()), 1.0, st)
    assert m.rows[0].qp == 0x11 and m.rows[0].ce_pct == pytest.approx(10.0)


def test_filter_by_ip_typed_with_keys():
    st = V.ViewState()
    for k in ["/", "1", "0", ".", "0", ".", "0", ".", "4", "enter"]:
        st.key(k)
    assert st.filter == "10.0.0.4" and st.editing is None
    m = V.build_model(snap(three_flows()), 1.0, st)
    assert [r.qp for r in m.rows] == [0x12] and m.nflows_shown == 1
    st.key("esc")
    assert V.build_model(snap(three_flows()), 1.0, st).nflows_shown == 3


def test_selection_follows_flow_and_histogram_shows_its_sizes():
    st = V.ViewState()
    s = snap(three_flows())
    st.key("down", 3)                         # first press selects the first row
    st.key("down", 3)                         # second row: 0x11
    m = V.build_model(s, 1.0, st)
    assert m.selected == 1 and m.rows[1].qp == 0x11
    st.key("enter")
    m = V.build_model(s, 1.0, st, cum=s)
    assert m.hist == [(1 << 17, 12)] and "10.0.0.2->10.0.0.6" in m.hist_label
    st.key("s")                               # re-sort by pkt/s: 0x11 moves to row 0, still selected
    m = V.build_model(s, 1.0, st, cum=s)
    assert m.rows[m.selected].qp == 0x11 and m.selected == 0
    st.key("q")
    assert st.quit


def test_decode_keys():
    assert V.decode_keys(b"q") == ["q"]
    assert V.decode_keys(b"\x1b[A\x1b[Bj\r") == ["up", "down", "j", "enter"]
    assert V.decode_keys(b"\x1b") == ["esc"]
    assert V.decode_keys(b"\x1b[1;5C/\x7f") == ["/", "backspace"]


def test_header_counts_not_accounted_by_reason():
    g = np.zeros(L.G_N, np.uint64)
    g[L.G_ACCOUNTED], g[L.G_NON_ROCE], g[L.G_TRUNC_BTH], g[L.G_FRAMES] = 450, 40, 10, 500
    m = V.build_model(snap(three_flows(), g, flows_evicted=3, sample_n=1), 2.0, V.ViewState())
    assert m.not_accounted == {"non_roce": 40, "truncated_bth": 10}
    assert m.totals["roce_pps"] == pytest.approx(225) and m.evicted == 3
    assert "not accounted 50 (non_roce 40, truncated_bth 10)" in V.counters_line(m)


# ---- plain output ------------------------------------------------------------------------------------
def test_plain_lines_fit_80_columns_even_with_ipv6_and_big_numbers():
    f = table(three_flows(),
              flow("fd00:1234:5678:9abc::11", "fd00:1234:5678:9abc::22", 0xFFFFFF, packets=10**12,
                   bytes=10**15, cnp=10**9, retransmissions=10**8, nak_seq=10**7, msg_hist=hist(33, 1)))
    analysis = {"findings": [
        {"severity": "info", "kind": "x", "message": "small note"},
        {"severity": "critical", "kind": "hot", "message": "all-to-all destination skew 3.4x on 10.0.0.6 " * 3},
    ]}
    m = V.build_model(snap(f), 1.0, V.ViewState(), analysis=analysis)
    lines = V.plain_lines(m)
    assert all(len(ln) < 80 for ln in lines), [ln for ln in lines if len(ln) >= 80]
    assert lines[2] == V.PLAIN_HEADER
    body = lines[3:7]
    assert body[0].split()[0].startswith("…")                            # the IPv6 flow, biggest
    assert body[1].split()[:3] == ["10.0.0.3", "10.0.0.4", "12"]
    fi = [ln for ln in lines if ln.startswith(("CRIT", "INFO"))]
    assert fi[0].startswith("CRIT all-to-all destination skew") and fi[1] == "INFO small note"


def test_fmt_helpers():
    assert V.fmt_num(0) == "0" and V.fmt_num(950) == "950" and V.fmt_num(630188) == "630K"
    assert V.fmt_num(3_815_000) == "3.8M" and V.fmt_num(7.5) == "7.5"
    assert V.fmt_size(-1) == "-" and V.fmt_size(64) == "64" and V.fmt_size(128 << 10) == "128K"
    assert V.fmt_size(1 << 20) == "1M" and V.fmt_size(3 << 19) == "1.5M"
    assert V.fmt_bits(98.2) == "98G" and V.fmt_bits(0.0381) == "38M"


class FakeSession:
    """Stands in for LiveSession: yields the given intervals."""
    iface = "fake0"
    mode, xdp_mode, direction = "xdp", "native", "ingress"

    def __init__(self, ivs):
        self.ivs = ivs

    def describe(self):
        return "fake"

    def intervals(self, interval, count=None, stop=None, wait=None):
        yield from self.ivs[:count]


def make_interval(i, flows):
    g = np.zeros(L.G_N, np.uint64)
    g[L.G_ACCOUNTED] = g[L.G_FRAMES] = int(flows["packets"].sum())
    meta = {"first_ts": i * 10**9, "last_ts": (i + 1) * 10**9, "sample_n": 1, "interface": "fake0"}
    d = Snapshot(flows, np.zeros(0, L.EVENT_DTYPE), g, dict(meta))
    return live.Interval(index=i, wall=0, dt=1.0, elapsed=i + 1.0, delta=d, cum=d,
                         records=np.zeros(0, L.MSG_REC_DTYPE))


def test_run_plain_prints_count_tables_and_survives_a_failing_analysis(capsys):
    calls = []

    def bad(snapshot):
        calls.append(len(snapshot.flows))
        raise ValueError("boom")
    sess = FakeSession([make_interval(i, three_flows()) for i in range(3)])
    n = T.run_plain(sess, 1.0, 2, rows=2, analyze=bad)
    out = capsys.readouterr().out.splitlines()
    assert n == 2 and len(calls) == 2
    assert sum(1 for ln in out if ln == V.PLAIN_HEADER) == 2
    assert "... 1 more flows" in "\n".join(out)
    assert any("analysis failed: ValueError: boom" in ln for ln in out)


def test_run_plain_shows_findings_most_severe_first(capsys):
    def fake(snapshot):
        return {"findings": [{"severity": "warning", "kind": "a", "message": "w1"},
                             {"severity": "critical", "kind": "b", "message": "c1"}], "collectives": []}
    T.run_plain(FakeSession([make_interval(0, three_flows())]), 1.0, 1, analyze=fake)
    out = capsys.readouterr().out
    assert out.index("CRIT c1") < out.index("WARN w1")


def test_rich_render_contains_panels():
    from rich.console import Console
    analysis = {"findings": [{"severity": "critical", "kind": "k", "message": "hot destination 10.0.0.6"}],
                "collectives": [{"kind": "all_to_all", "members": list(range(8)), "confidence": 0.9,
                                 "metrics": {"dest_skew": {"max_over_mean": 2.5}, "hot_destination": "10.0.0.6"}}]}
    st = V.ViewState()
    m = V.build_model(snap(three_flows()), 1.0, st, iface="obs0", attach="XDP native", analysis=analysis,
                      analysis_note="last 10 s")
    con = Console(width=200, record=True, file=open("/dev/null", "w"))
    con.print(toprich.render_rich(m, height=40, width=200))
    text = con.export_text()
    assert "skewscope top  obs0" in text and "hot destination 10.0.0.6" in text
    assert "all_to_all  8 nodes  conf 0.90" in text and "10.0.0.3" in text
    assert "dest skew 2.50x hot 10.0.0.6" in text


def test_window_covers_between_half_and_full_length():
    w = live.Window(4.0)
    f = three_flows()
    for i in range(7):
        cum = f.copy()
        for name in ("packets", "bytes"):
            cum[name] = f[name] * (i + 1)
        g = np.zeros(L.G_N, np.uint64)
        d = Snapshot(cum, np.zeros(0, L.EVENT_DTYPE), g, {"first_ts": i * 10**9, "last_ts": (i + 1) * 10**9})
        c = Snapshot(cum, np.zeros(0, L.EVENT_DTYPE), g, {"first_ts": 0, "last_ts": (i + 1) * 10**9})
        iv = live.Interval(i, 0, 1.0, i + 1.0, d, c, np.zeros(0, L.MSG_REC_DTYPE))
        w.add(iv)
        ws = w.snapshot(iv)
        assert 0 < ws.meta["window_s"] <= 4.0 + 1e-9
        # the window's packets are (i+1 - anchor multiple) times the per-second packets
        k = round(ws.meta["window_s"])
        assert int(ws.flows["packets"].sum()) == int(f["packets"].sum()) * k
