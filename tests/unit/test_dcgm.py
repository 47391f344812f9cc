"""GPU telemetry (issue 27, deliverable 2): a real dcgm-exporter scrape (tests/fixtures/dcgm,
DataDog's BSD-3 fixture) parsed exactly -- every value checked against a regex over the file,
not the parser under test; the reasons bitmask against NVML's constants; a dcgm-exporter URL
served by a real HTTP server (and one that never answers, and a closed port); bad files as
one-line exit-3 errors; and the cause joined on a generated capture whose slow node comes
from the generator's truth: a throttled GPU there is named, a throttled GPU elsewhere blames
no one new, no data says so -- and the findings are identical except `cause`.
The Prometheus path: tests/integration/test_dcgm_prometheus.py."""
from __future__ import annotations

import copy
import http.server
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import dcgmlib
import genlib
import pytest

from skewscope.core.errors import EXIT_NOT_RUN
from skewscope.core.inventory import parse as parse_inventory
from skewscope.telemetry import dcgm
from skewscope.telemetry.cause import COVERED, VERDICTS
from skewscope.telemetry.enrich import Enricher

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm" / "datadog-dcgm-metrics.txt"
LINE = re.compile(r'^(DCGM_FI_\w+)\{([^}]*)\} (\S+)$')
LABEL = re.compile(r'(\w+)="([^"]*)"')


def fixture_rows():
    """(name, labels, value) of every labelled sample line of the fixture, by regex."""
    out = []
    for ln in FIXTURE.read_text().splitlines():
        m = LINE.match(ln)
        if m:
            out.append((m.group(1), dict(LABEL.findall(m.group(2))), float(m.group(3))))
    return out


def test_real_scrape_parsed_exactly():
    rd = dcgm.ScrapeFile(str(FIXTURE)).read(["any"])
    rows = [(n, lab, v) for n, lab, v in fixture_rows() if n in dcgm.FIELDS]
    assert len(rows) >= 7          # SM clock, temp, power, PCIe replay, XID, power limit, throttle reasons
    expect = {}
    for n, lab, v in rows:
        expect.setdefault((lab["Hostname"], int(lab["gpu"])), {}).setdefault(n, []).append((None, v))
    assert rd.series == expect
    # the fields of both hosts, and the old reasons name decoded (the file's own value)
    reasons = [v for n, lab, v in rows if n == "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"]
    host = next(lab["Hostname"] for n, lab, v in rows if n == "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
    assert rd.first_of(host, 0, dcgm.REASONS) == [(None, reasons[0])]
    uuid = next(lab["UUID"] for n, lab, v in rows if n == "DCGM_FI_DEV_SM_CLOCK")
    sm_host = next(lab["Hostname"] for n, lab, v in rows if n == "DCGM_FI_DEV_SM_CLOCK")
    assert rd.labels[(sm_host, 0)]["UUID"] == uuid
    # rows without Hostname/gpu (the vendor's dummy values) are not GPUs
    assert all(h and isinstance(g, int) for h, g in rd.series)


def test_real_scrape_kubernetes_labels_kept():
    row = next((n, lab, v) for n, lab, v in fixture_rows() if "pod" in lab)
    line = next(ln for ln in FIXTURE.read_text().splitlines() if ln.startswith(row[0] + "{"))
    # the A10G row renamed to a field skewscope reads: its pod/namespace/container labels come with it
    rd = dcgm.parse_exposition("# TYPE DCGM_FI_DEV_SM_CLOCK gauge\nDCGM_FI_DEV_SM_CLOCK" + line[len(row[0]):] + "\n")
    lab = rd.labels[(row[1]["Hostname"], int(row[1]["gpu"]))]
    assert (lab["pod"], lab["namespace"], lab["container"]) == (row[1]["pod"], row[1]["namespace"],
                                                                row[1]["container"])


# NVML's nvmlClocksEventReason* / nvmlClocksThrottleReason* constants (nvml.h, the NVML API
# reference "NvmlClocksEventReasons"), written here from the header, not from the code
NVML = {0x0000000000000001: "GPU idle", 0x0000000000000002: "applications clocks setting",
        0x0000000000000004: "SW power cap", 0x0000000000000008: "HW slowdown", 0x0000000000000010: "sync boost",
        0x0000000000000020: "SW thermal slowdown", 0x0000000000000040: "HW thermal slowdown",
        0x0000000000000080: "HW power brake slowdown", 0x0000000000000100: "display clock setting"}


def test_reasons_decoded_as_nvml_bits():
    for bit, name in NVML.items():
        assert dcgm.decode_reasons(bit) == [name]
    assert dcgm.decode_reasons(0x44) == ["SW power cap", "HW thermal slowdown"]
    assert dcgm.decode_reasons(0) == []
    assert dcgm.decode_reasons(0x600) == ["reason bits 0x600"]
    assert dcgm.SLOWDOWN_BITS == 0x4 | 0x8 | 0x20 | 0x40 | 0x80


@pytest.mark.parametrize("text,msg", [
    ("this is not { a scrape\n", "not a Prometheus text exposition"),
    ("# TYPE node_load1 gauge\nnode_load1 0.5\n", "no DCGM_FI_* series"),
])
def test_bad_scrape_files_are_one_line_exit_3(tmp_path, text, msg):
    p = tmp_path / "scrape.txt"
    p.write_text(text)
    with pytest.raises(dcgm.DcgmError) as ei:
        dcgm.open_source(str(p))
    assert ei.value.code == EXIT_NOT_RUN and msg in str(ei.value) and "\n" not in str(ei.value)


def test_missing_or_directory_or_odd_scheme(tmp_path):
    for spec, msg in ((str(tmp_path / "nope.txt"), "cannot read"), (str(tmp_path), "is a directory"),
                      ("ftp://x/metrics", "http(s) URL")):
        with pytest.raises(dcgm.DcgmError, match=re.escape(msg)):
            dcgm.open_source(spec)


class _Handler(http.server.BaseHTTPRequestHandler):
    body = b""
    delay = 0.0

    def do_GET(self):  # noqa: N802 -- http.server's name
        time.sleep(self.delay)
        if self.path != "/metrics":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *a):
        pass


def serve(body: bytes, delay: float = 0.0):
    h = type("H", (_Handler,), {"body": body, "delay": delay})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), h)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def test_exporter_url_detected_and_read():
    srv, base = serve(FIXTURE.read_bytes())
    try:
        for url in (base, base + "/metrics"):
            src = dcgm.open_source(url)
            rd = src.read(["x"])
            assert src.kind == "exporter"
            assert rd.series == dcgm.ScrapeFile(str(FIXTURE)).readings.series
    finally:
        srv.shutdown()


def test_exporter_timeout_and_refused_are_one_line():
    srv, base = serve(b"", delay=3.0)
    try:
        with pytest.raises(dcgm.DcgmError, match="no answer within 0.5 s"):
            dcgm.open_source(base + "/metrics", timeout=0.5).read(["x"])
    finally:
        srv.shutdown()
        srv.server_close()
    port = srv.server_address[1]
    with pytest.raises(dcgm.DcgmError, match="cannot connect"):
        dcgm.open_source(f"http://127.0.0.1:{port}/metrics", timeout=1).read(["x"])


# ---- the cause on a generated capture --------------------------------------------------------
def _inventory(members, prefix="node"):
    rows = "ip,host,gpu\n" + "".join(f"{ip},{prefix}{i + 1},{i % 2}\n" for i, ip in enumerate(members))
    return parse_inventory(rows, "inv.csv")


def _case():
    truth, snap, a = genlib.analyzed("tp-decode-slow-shard", 7)
    slow = truth["pathologies"][0]["entities"]["ips"][0]
    members = truth["groups"][0]["members"]
    return truth, snap, a, slow, members


def _scrape_source(tmp_path, gpus):
    p = tmp_path / "scrape.txt"
    p.write_text(dcgmlib.exposition(gpus))
    return dcgm.open_source(str(p))


def _enrich(a, snap, inv, src):
    doc = copy.deepcopy(a)
    Enricher(inventory=inv, telemetry=src)(doc, meta=snap.meta)
    return doc


def _strip(doc):
    return [{k: v for k, v in f.items() if k != "cause"} for f in doc["findings"]]


def test_throttled_gpu_on_the_slow_node_is_named(tmp_path):
    truth, snap, a, slow, members = _case()
    inv = _inventory(members)
    gpus = [(inv.get(ip).host, inv.get(ip).gpu, dcgmlib.THROTTLED if ip == slow else dcgmlib.HEALTHY)
            for ip in members]
    doc = _enrich(a, snap, inv, _scrape_source(tmp_path, gpus))
    f = next(f for f in doc["findings"] if f["kind"] == "slow_tp_shard")
    assert f["entities"]["ips"][0] == slow
    c = f["cause"]
    e = inv.get(slow)
    assert (c["verdict"], c["host"], c["gpu"]) == ("gpu", e.host, e.gpu)
    assert c["text"].startswith(f"GPU {e.gpu} of {e.host}: SM clock 1,215 MHz vs 1,980 MHz group median")
    assert "HW thermal slowdown" in c["text"] and "GPU at 91 C" in c["text"]
    assert c["evidence"]["reasons"] == ["HW thermal slowdown"]
    assert c["evidence"]["clock_ratio"] == pytest.approx(1215 / 1980)
    assert c["evidence"]["group_gpus"] == len(members) - 1
    # everything but the cause is what the analysis (names only) made
    names_only = copy.deepcopy(a)
    Enricher(inventory=inv)(names_only, meta=snap.meta)
    assert _strip(doc) == names_only["findings"]
    assert all("cause" not in f for f in doc["findings"] if f["kind"] not in COVERED)
    assert all(f["cause"]["verdict"] in VERDICTS for f in doc["findings"] if f["kind"] in COVERED)


def test_throttled_gpu_on_a_healthy_host_blames_no_one_new(tmp_path):
    truth, snap, a, slow, members = _case()
    inv = _inventory(members)
    other = next(ip for ip in members if ip != slow)
    gpus = [(inv.get(ip).host, inv.get(ip).gpu, dcgmlib.THROTTLED if ip == other else dcgmlib.HEALTHY)
            for ip in members]
    doc = _enrich(a, snap, inv, _scrape_source(tmp_path, gpus))
    names_only = copy.deepcopy(a)
    Enricher(inventory=inv)(names_only, meta=snap.meta)
    assert _strip(doc) == names_only["findings"]
    f = next(f for f in doc["findings"] if f["kind"] == "slow_tp_shard")
    assert f["entities"]["ips"][0] == slow
    assert f["cause"]["verdict"] == "gpu_normal"
    assert "looks normal" in f["cause"]["text"] and "look at the NIC/link" in f["cause"]["text"]
    assert f["cause"]["host"] == inv.get(slow).host


def test_no_data_no_inventory_and_worst_gpu(tmp_path):
    truth, snap, a, slow, members = _case()
    inv = _inventory(members)
    gpus = [(inv.get(ip).host, inv.get(ip).gpu, dcgmlib.HEALTHY) for ip in members if ip != slow]
    doc = _enrich(a, snap, inv, _scrape_source(tmp_path, gpus))
    f = next(f for f in doc["findings"] if f["kind"] == "slow_tp_shard")
    assert f["cause"]["verdict"] == "no_data"
    assert f["cause"]["text"].startswith(f"no DCGM data for GPU {inv.get(slow).gpu} of {inv.get(slow).host}")
    # no inventory: said, nothing joined
    doc = _enrich(a, snap, None, _scrape_source(tmp_path, gpus))
    f = next(f for f in doc["findings"] if f["kind"] == "slow_tp_shard")
    assert f["cause"]["verdict"] == "no_inventory"
    assert f["cause"]["text"] == "no inventory: addresses cannot be joined to GPUs (--inventory FILE)"
    # an inventory without GPU indexes: every GPU of the host read, the worst one named
    rows = "ip,host\n" + "".join(f"{ip},box{i + 1}\n" for i, ip in enumerate(members))
    inv2 = parse_inventory(rows, "inv.csv")
    shost = inv2.get(slow).host
    gpus = [(inv2.get(ip).host, g, dcgmlib.HEALTHY) for ip in members for g in range(4)]
    gpus = [(h, g, dcgmlib.THROTTLED if (h, g) == (shost, 2) else v) for h, g, v in gpus]
    doc = _enrich(a, snap, inv2, _scrape_source(tmp_path, gpus))
    c = next(f for f in doc["findings"] if f["kind"] == "slow_tp_shard")["cause"]
    assert (c["verdict"], c["host"], c["gpu"]) == ("gpu", shost, 2)
    assert c["text"].startswith(f"GPU 2 of {shost} (the worst of its 4): SM clock 1,215 MHz vs 1,980 MHz")
    assert c["evidence"]["group_gpus"] == 3 * 4


def test_unreadable_url_keeps_the_findings():
    truth, snap, a, slow, members = _case()
    inv = _inventory(members)
    srv, base = serve(b"")
    srv.shutdown()
    srv.server_close()
    doc = _enrich(a, snap, inv, dcgm.open_source(base + "/metrics", timeout=1))
    f = next(f for f in doc["findings"] if f["kind"] == "slow_tp_shard")
    assert f["cause"]["verdict"] == "unreadable"
    assert f["cause"]["text"].startswith("DCGM telemetry could not be read: ")
    names_only = copy.deepcopy(a)
    Enricher(inventory=inv)(names_only, meta=snap.meta)
    assert _strip(doc) == names_only["findings"]


def _cli(*args):
    p = subprocess.run([sys.executable, "-m", "skewscope", *args], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def test_cli_report_and_diagnose_show_the_cause(tmp_path):
    truth, a, pcap = genlib.run("tp-decode-slow-shard", 7)
    slow = truth["pathologies"][0]["entities"]["ips"][0]
    members = truth["groups"][0]["members"]
    inv = tmp_path / "inv.csv"
    inv.write_text("ip,host,gpu\n" + "".join(f"{ip},node{i + 1},0\n" for i, ip in enumerate(members)))
    scrape = tmp_path / "scrape.txt"
    scrape.write_text(dcgmlib.exposition([(f"node{i + 1}", 0, dcgmlib.THROTTLED if ip == slow else dcgmlib.HEALTHY)
                                          for i, ip in enumerate(members)]))
    shost = f"node{members.index(slow) + 1}"
    rc, out, err = _cli("diagnose", pcap, "--inventory", str(inv), "--dcgm", str(scrape))
    assert rc == 2, err
    assert f"cause: GPU 0 of {shost}: SM clock 1,215 MHz vs 1,980 MHz group median" in out
    srv, base = serve(scrape.read_bytes())
    try:
        rc, out, err = _cli("report", pcap, "--json", "--inventory", str(inv), "--dcgm", base + "/metrics")
    finally:
        srv.shutdown()
    assert rc == 0, err
    f = next(f for f in json.loads(out)["findings"] if f["kind"] == "slow_tp_shard")
    assert (f["cause"]["verdict"], f["cause"]["host"]) == ("gpu", shost)
    rc, out, err = _cli("report", pcap, "--inventory", str(inv), "--dcgm", str(scrape))
    assert rc == 0 and f"cause: GPU 0 of {shost}: SM clock 1,215 MHz" in out, err
    # a bad scrape file: one line, exit 3, before any analysis
    rc, out, err = _cli("diagnose", pcap, "--dcgm", "/etc/hostname")
    assert rc == 3 and err.startswith("skewscope: ") and err.strip().count("\n") == 0, err


class _Fixed:
    """A DCGM source holding timed samples (what a Prometheus read returns), no network."""
    kind = "prometheus"
    spec = "test"

    def __init__(self, rows):
        self.rows = rows
        self.asked = []

    def read(self, hosts, start=None, end=None):
        self.asked.append((sorted(hosts), start, end))
        rd = dcgm.Readings(source=self.spec, kind=self.kind)
        for name, host, gpu, t, v in self.rows:
            if host in hosts:
                rd.add(name, {"Hostname": host, "gpu": str(gpu)}, t, v)
        return rd.finish()


def test_counters_xid_and_the_old_reasons_name_in_the_window():
    truth, snap, a, slow, members = _case()
    inv = _inventory(members)
    t0 = snap.meta["first_ts"] / 1e9
    rows = []
    for ip in members:
        e = inv.get(ip)
        for k in range(5):
            t = t0 - 10 + 5 * k
            rows.append(("DCGM_FI_DEV_SM_CLOCK", e.host, e.gpu, t, 1980))
            rows.append(("DCGM_FI_DEV_XID_ERRORS", e.host, e.gpu, t, 79 if ip == slow and k >= 2 else 0))
            # PCIe replays on the slow GPU: 3, 20, 40, then a counter reset (2), 9
            pcie = [3, 20, 40, 2, 9][k] if ip == slow else 3
            rows.append(("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", e.host, e.gpu, t, pcie))
            rows.append(("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", e.host, e.gpu, t, 0x1 if ip == slow else 0))
    src = _Fixed(rows)
    doc = _enrich(a, snap, inv, src)
    c = next(f for f in doc["findings"] if f["kind"] == "slow_tp_shard")["cause"]
    # increase with a reset: (20-3) + (40-20) + 2 + (9-2) = 46
    assert c["verdict"] == "gpu"
    assert c["text"] == f"GPU {inv.get(slow).gpu} of {inv.get(slow).host}: XID 79, 46 PCIe replays"
    assert c["evidence"]["reasons"] == ["GPU idle"]            # the old field name, decoded; not a slowdown
    # only the finding's hosts were asked for, over its window widened by WINDOW_PAD_S
    hosts, start, end = src.asked[0]
    assert hosts == sorted(inv.get(ip).host for ip in members)
    f = next(f for f in a["findings"] if f["kind"] == "slow_tp_shard")
    last = snap.meta["last_ts"] / 1e9
    assert start == pytest.approx(f["since"] - dcgm.WINDOW_PAD_S)
    assert end == pytest.approx((f["until"] if f["until"] is not None else last) + dcgm.WINDOW_PAD_S)


def test_window_of_a_monotonic_live_capture():
    from skewscope.telemetry.cause import window_of
    meta = {"clock": "monotonic", "first_ts": 5_000_000_000, "last_ts": 7_000_000_000, "started_at": 1_700_000_000.0}
    # 6.0 s on the monotonic clock is 1.0 s after the capture started at unix 1,700,000,000
    assert window_of({"since": 6.0, "until": None}, meta) == (1_700_000_001.0 - dcgm.WINDOW_PAD_S,
                                                              1_700_000_002.0 + dcgm.WINDOW_PAD_S)
    assert window_of({"since": 6.0}, {"clock": "monotonic", "first_ts": 5e9, "last_ts": 7e9}) is None


def test_several_scrape_files_one_per_host(tmp_path):
    truth, a, pcap = genlib.run("tp-decode-slow-shard", 7)
    slow = truth["pathologies"][0]["entities"]["ips"][0]
    members = truth["groups"][0]["members"]
    inv = tmp_path / "inv.csv"
    inv.write_text("ip,host,gpu\n" + "".join(f"{ip},node{i + 1},0\n" for i, ip in enumerate(members)))
    args = []
    for i, ip in enumerate(members):
        p = tmp_path / f"node{i + 1}.prom"
        p.write_text(dcgmlib.exposition([(f"node{i + 1}", 0, dcgmlib.THROTTLED if ip == slow else dcgmlib.HEALTHY)]))
        args += ["--dcgm", str(p)]
    rc, out, err = _cli("diagnose", pcap, "--json", "--inventory", str(inv), *args)
    assert rc == 2, err
    c = next(f for f in json.loads(out)["findings"] if f["kind"] == "slow_tp_shard")["cause"]
    assert (c["verdict"], c["host"], c["evidence"]["group_gpus"]) == ("gpu", f"node{members.index(slow) + 1}", 3)
    assert c["text"].startswith(f"GPU 0 of node{members.index(slow) + 1}: SM clock 1,215 MHz vs 1,980 MHz")


def test_a_url_that_times_out_costs_one_timeout_per_enrichment():
    truth, snap, a, slow, members = _case()
    inv = _inventory(members)
    srv, base = serve(b"", delay=3.0)
    try:
        src = dcgm.open_source(base + "/metrics", timeout=0.5)
        doc = copy.deepcopy(a)
        doc["findings"] = [copy.deepcopy(f) for f in a["findings"] if f["kind"] == "slow_tp_shard"] * 4
        t = time.monotonic()
        Enricher(inventory=inv, telemetry=src)(doc, meta=snap.meta)
        took = time.monotonic() - t
    finally:
        srv.shutdown()
        srv.server_close()
    assert [f["cause"]["verdict"] for f in doc["findings"]] == ["unreadable"] * 4
    assert all("no answer within 0.5 s" in f["cause"]["text"] for f in doc["findings"])
    assert took < 2.0, took          # one 0.5 s timeout, not four


class _FakeProm(http.server.BaseHTTPRequestHandler):
    """Answers buildinfo like a Prometheus, and every query with Prometheus' error shape."""

    def _json(self, code, doc):
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802 -- http.server's name
        if self.path.startswith("/api/v1/status/buildinfo"):
            self._json(200, {"status": "success", "data": {"version": "2.42.0"}})
        else:
            self.send_error(404)

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._json(400, {"status": "error", "errorType": "bad_data", "error": "parse error: unexpected character"})

    def log_message(self, *a):
        pass


def test_prometheus_detected_and_a_failed_query_said_in_the_cause():
    truth, snap, a, slow, members = _case()
    inv = _inventory(members)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeProm)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        src = dcgm.open_source(f"http://127.0.0.1:{srv.server_address[1]}")
        doc = _enrich(a, snap, inv, src)
    finally:
        srv.shutdown()
        srv.server_close()
    assert src.kind == "prometheus"
    c = next(f for f in doc["findings"] if f["kind"] == "slow_tp_shard")["cause"]
    assert c["verdict"] == "unreadable"
    assert c["text"].endswith("the DCGM query failed (HTTP 400: parse error: unexpected character)")


def test_an_exporter_url_answering_html_is_unreadable():
    srv, base = serve(b"<html><body>login</body></html>\n")
    try:
        with pytest.raises(dcgm.DcgmError, match="not a Prometheus text exposition|no DCGM_FI_"):
            dcgm.open_source(base + "/metrics", timeout=1).read(["x"])
    finally:
        srv.shutdown()
        srv.server_close()


def test_window_of_a_cluster_document_over_all_time_is_bounded():
    from skewscope.telemetry.cause import MAX_WINDOW_S, window_of
    at = 1_735_689_600.0
    meta = {"clock": "unix", "first_ts": 0, "last_ts": int(at * 1e9)}     # `cluster --window all`
    assert window_of({"since": None, "until": None}, meta) == (at - MAX_WINDOW_S - dcgm.WINDOW_PAD_S,
                                                               at + dcgm.WINDOW_PAD_S)
