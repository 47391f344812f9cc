"""The pipelined offline parser (issue 30): parse on one core, account on another, with the
one-core result exactly (no root).

skewscope/sources/offline/pipeline.py is forced on (SKEWSCOPE_OFFLINE_PIPELINE=1) and off (=0)
for the same file, with row blocks made tiny (a handful of rows) so that every capture here
crosses many hand-overs between the two threads and table growths inside a block. The
reference is the one-core path, itself checked against the generator's truth, scapy, tshark
and the kernel by the other offline tests. Compared: `skewscope report --json` byte for byte
(findings, flows, totals, warnings) and the Snapshot field by field (every flow column, every
message record, every global counter, the meta but for the time it took).

Inputs: every generator preset (one iteration, headers-only), the fuzz corpus (every category,
GRE/ERSPAN/VXLAN encapsulations, frames cut anywhere), every real capture in
../shared/data/real (pcap, pcapng, gzip; the refused ERF one must be refused alike), and the
paths where state crosses a block: LRU eviction (max_flows), the message-record cap
(max_events), a capture cut inside a record, pcapng with interfaces declared part-way.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from test_offline_formats import ng_block, ng_epb, ng_idb, ng_shb, ng_spb, pcap_bytes, reference_packets, write

from skewscope.cli import main
from skewscope.core import layout as L
from skewscope.core.errors import PcapError
from skewscope.gen import generate
from skewscope.gen.presets import PRESETS
from skewscope.sources import offline
from skewscope.sources.offline import pipeline

REAL = Path(__file__).resolve().parents[3] / "shared" / "data" / "real"
REAL_FILES = sorted(p for p in REAL.glob("*") if p.name.endswith((".pcap", ".pcapng", ".gz")))


@pytest.fixture(autouse=True)
def tiny_blocks(monkeypatch):
    """Blocks of 7 rows, 2 in flight: thousands of hand-overs even on small captures."""
    monkeypatch.setattr(pipeline, "ROWS", 7)
    monkeypatch.setattr(pipeline, "BLOCKS", 2)


class Used:
    """Counts the rows handed to the accounting thread (rows), the blocks they came in
    (blocks), and the threads that accounted them (threads)."""

    def __init__(self, monkeypatch):
        self.rows = 0
        self.blocks = 0
        self.threads: set[str] = set()
        put = pipeline._Accountant.put
        account_block = pipeline.account_block

        def counting_put(acc, rows, n):
            self.rows += n
            self.blocks += 1
            put(acc, rows, n)

        def noting_account_block(t, rows, n):
            self.threads.add(threading.current_thread().name)
            account_block(t, rows, n)
        monkeypatch.setattr(pipeline._Accountant, "put", counting_put)
        monkeypatch.setattr(pipeline, "account_block", noting_account_block)


def parse_both(monkeypatch, path, **kw):
    """(one-core Snapshot, pipelined Snapshot, Used)."""
    used = Used(monkeypatch)
    monkeypatch.setenv("SKEWSCOPE_OFFLINE_PIPELINE", "0")
    one = offline.parse_file(path, **kw)
    assert used.rows == 0
    monkeypatch.setenv("SKEWSCOPE_OFFLINE_PIPELINE", "1")
    two = offline.parse_file(path, **kw)
    return one, two, used


def assert_same(one, two, used):
    assert one.flows.dtype == two.flows.dtype and np.array_equal(one.flows, two.flows)
    assert np.array_equal(one.events, two.events)
    assert np.array_equal(one.globals, two.globals)
    m1, m2 = dict(one.meta), dict(two.meta)
    m1.pop("parse_seconds")
    m2.pop("parse_seconds")
    assert m1 == m2
    # the pipeline did the accounting, on its own thread: one row per accounted frame, in
    # full blocks but for the last one
    accounted = int(two.globals[L.G_ACCOUNTED])
    assert used.rows == accounted
    assert used.blocks == -(-accounted // pipeline.ROWS)
    assert used.threads <= {"skewscope-accounting"} and bool(used.threads) == (accounted > 0)


def report_json(monkeypatch, path, force: str, *extra) -> tuple[int, str, str]:
    monkeypatch.setenv("SKEWSCOPE_OFFLINE_PIPELINE", force)
    r = CliRunner().invoke(main, ["report", "--json", *extra, str(path)])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r.exit_code, r.stdout, r.stderr


def without_time(out: str) -> str:
    """The report but for meta.parse_seconds (the one value that differs run to run)."""
    lines = [x for x in out.splitlines() if not x.lstrip().startswith('"parse_seconds":')]
    assert len(lines) == len(out.splitlines()) - 1
    return "\n".join(lines)


def assert_same_report(monkeypatch, path, *extra):
    one = report_json(monkeypatch, path, "0", *extra)
    used = Used(monkeypatch)
    two = report_json(monkeypatch, path, "1", *extra)
    assert one[0] == two[0] == 0 and one[2] == two[2]
    assert without_time(one[1]) == without_time(two[1])
    assert json.loads(one[1])["meta"]["frames"] > 0
    return used


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_report_json_identical(monkeypatch, tmp_path, preset):
    monkeypatch.setattr(pipeline, "ROWS", 61)   # up to 0.5 M frames: still ~10^4 hand-overs
    sc = dict(PRESETS[preset])
    sc["iterations"] = 1
    p = tmp_path / f"{preset}.pcap"
    generate(sc, seed=3).write_pcap(p, snaplen=128)
    used = assert_same_report(monkeypatch, p)
    assert used.rows > 0 and used.blocks > 1
    assert_same(*parse_both(monkeypatch, p))


@pytest.mark.parametrize("path", REAL_FILES, ids=lambda p: p.name)
def test_real_captures_identical(monkeypatch, path):
    try:
        one, two, used = parse_both(monkeypatch, path)
    except PcapError as e:   # refused (ERF): refused alike, nothing handed over
        monkeypatch.setenv("SKEWSCOPE_OFFLINE_PIPELINE", "1")
        with pytest.raises(PcapError) as e2:
            offline.parse_file(path)
        assert str(e2.value) == str(e)
        return
    assert_same(one, two, used)
    assert used.rows > 0
    assert_same_report(monkeypatch, path)


def test_fuzz_corpus_identical(monkeypatch, tmp_path):
    """Every category, every encapsulation, frames cut anywhere; a small flow table (LRU
    evictions between blocks) and a small message-record cap (events_lost)."""
    import fuzzcorpus as fc
    c = fc.make_corpus(30_000, seed=5, min_len=0)
    p = tmp_path / "corpus.pcap"
    c.write_pcap(str(p))
    one, two, used = parse_both(monkeypatch, p)
    assert_same(one, two, used)
    g = one.globals
    assert int(g[L.G_DECAP]) > 0 and int(g[L.G_TRUNC_ETH]) > 0 and int(g[L.G_BAD_LENGTH]) > 0
    one, two, used = parse_both(monkeypatch, p, max_flows=16, max_events=50)
    assert_same(one, two, used)
    assert one.meta["flows_evicted"] > 0 and one.meta["events_lost"] > 0
    assert_same_report(monkeypatch, p, "--max-flows", "16")


def test_damaged_and_pcapng_identical(monkeypatch, tmp_path):
    """A capture cut inside a record (gzip too): the same warning and the records before it;
    a pcapng whose second interface is declared after packets of the first."""
    ref = reference_packets()
    recs = [(x.ts, x.frame, len(x.frame)) for x in ref] * 5
    data = pcap_bytes(recs)
    cut = tmp_path / "cut.pcap"
    write(cut, data[:-9])
    one, two, used = parse_both(monkeypatch, cut)
    assert_same(one, two, used)
    assert len(one.meta["warnings"]) == 1 and "ends inside record" in one.meta["warnings"][0]
    gz = tmp_path / "cut.pcap.gz"
    write(gz, data[:-9], gz=True)
    assert_same(*parse_both(monkeypatch, gz))
    assert_same_report(monkeypatch, cut)

    blocks = [ng_shb(), ng_idb(1)]
    blocks += [ng_epb(0, x.ts // 1000, x.frame, len(x.frame)) for x in ref]
    blocks += [ng_idb(1, tsresol=9), ng_block(0x0BADF00D, b"\0" * 8)]
    blocks += [ng_epb(i % 2, x.ts if i % 2 else x.ts // 1000, x.frame, len(x.frame)) for i, x in enumerate(ref)]
    ng = tmp_path / "two.pcapng"
    write(ng, b"".join(blocks))
    one, two, used = parse_both(monkeypatch, ng)
    assert_same(one, two, used)
    assert one.meta["warnings"] and int(one.globals[L.G_FRAMES]) == 2 * len(ref)


@pytest.mark.parametrize("rows", [3, 5, 7, 11])
def test_skipped_blocks_and_packets_identical(monkeypatch, tmp_path, rows):
    """With row blocks of several sizes, so that skipped blocks and packets fall at every
    place of a block: the counters the record walk keeps itself (not in the rows): pcapng
    blocks of unknown types (count and the last type in the warning),
    packets on an interface of an unsupported link type (skipped_unsupported_linktype), and
    simple packet blocks; then a packet for an undeclared interface ends the file early."""
    monkeypatch.setattr(pipeline, "ROWS", rows)
    ref = reference_packets()
    blocks = [ng_shb(), ng_idb(1), ng_idb(147)]
    for i, x in enumerate(ref * 4):
        blocks.append(ng_epb(0, x.ts // 1000, x.frame, len(x.frame)))
        if i % 3 == 0:
            blocks.append(ng_epb(1, x.ts // 1000, x.frame, len(x.frame)))
        if i % 5 == 0:
            blocks.append(ng_block(0x0BAD0000 + i, b"\0" * 4))
        if i % 7 == 0:
            blocks.append(ng_spb(x.frame, len(x.frame)))
    ng = tmp_path / "skips.pcapng"
    write(ng, b"".join(blocks))
    one, two, used = parse_both(monkeypatch, ng)
    assert_same(one, two, used)
    assert one.meta["skipped_unsupported_linktype"] > 0
    assert any("unknown type (last: 0x0bad" in w for w in one.meta["warnings"])
    assert_same_report(monkeypatch, ng)
    bad = tmp_path / "badif.pcapng"
    write(bad, b"".join(blocks + [ng_epb(5, 0, ref[0].frame, len(ref[0].frame))] + blocks[3:40]))
    one, two, used = parse_both(monkeypatch, bad)
    assert_same(one, two, used)
    assert any("interface" in w for w in one.meta["warnings"])


def test_modes(monkeypatch):
    """auto (the default): large files on two or more CPUs only; 0: never; 1: any file."""
    cpus = len(os.sched_getaffinity(0))
    for mode in (None, "auto"):
        if mode is None:
            monkeypatch.delenv("SKEWSCOPE_OFFLINE_PIPELINE", raising=False)
        else:
            monkeypatch.setenv("SKEWSCOPE_OFFLINE_PIPELINE", mode)
        assert not pipeline.wanted(pipeline.PIPELINE_MIN_BYTES - 1)
        assert pipeline.wanted(pipeline.PIPELINE_MIN_BYTES) == (cpus >= 2)
    monkeypatch.setenv("SKEWSCOPE_OFFLINE_PIPELINE", "0")
    assert not pipeline.wanted(1 << 40)
    monkeypatch.setenv("SKEWSCOPE_OFFLINE_PIPELINE", "1")
    assert pipeline.wanted(0)


def test_message_records_sorted_stably_in_or_out_of_order():
    """tables._events skips the sort when the records already come in start order; out of
    order they are sorted stably (ties keep their record order), as a Python sort does."""
    from skewscope.core.snapshot import flows_from_raw
    from skewscope.sources.offline.tables import _events
    flows = flows_from_raw(np.zeros((0, 40), np.uint8), np.zeros((0, L.FLOW_STATS_DTYPE.itemsize), np.uint8))
    rng = np.random.default_rng(1)
    ikeys = np.zeros((1, 5), np.int64)
    for start in (np.arange(50) // 3, rng.integers(0, 10, 50)):
        ev = np.zeros((50, 5), np.int64)
        ev[:, 1] = np.arange(50)          # record order, to see the ties' order
        ev[:, 2] = start
        ev[:, 3] = start + 5
        out = _events(flows, ikeys, ev)
        want = sorted(range(50), key=lambda i: int(start[i]))
        assert list(out["opclass"]) == [int(ev[i, 1]) for i in want]
        assert list(out["start_ts"]) == sorted(int(x) for x in start)


def test_blocks_across_windows_identical(monkeypatch, tmp_path):
    """Row blocks larger than the read window: a block is filled across many refills (mmap
    windows of 64 KiB, the gzip copy's read buffer of the same size) and handed over
    part-way through a window; the result is still the one-core result."""
    monkeypatch.setattr(pipeline, "ROWS", 4099)
    sc = dict(PRESETS["ring-straggler"])
    sc["iterations"] = 1
    p = tmp_path / "windows.pcap"
    generate(sc, seed=5).write_pcap(p, snaplen=128)
    gz = tmp_path / "windows.pcap.gz"
    write(gz, p.read_bytes(), gz=True)
    for path in (p, gz):
        one, two, used = parse_both(monkeypatch, path, chunk_bytes=1 << 16)
        assert_same(one, two, used)
        assert one.meta["bytes_read"] > 20 * (1 << 16) and used.blocks > 5
