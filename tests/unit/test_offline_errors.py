"""Offline parser: bad and damaged input (issue 4), no root.

Contract (docs/offline.md "Bad input"):
- not a capture at all (empty, too short, bad magic, random bytes, garbage gzip, truncated
  file header, unsupported link type such as ERF/native InfiniBand): PcapError with one
  line; `skewscope report` prints "skewscope: <line>" on stderr and exits 3, no traceback;
- damaged part-way (cut inside a record or block, an implausible record length, a corrupt
  pcapng block, a packet for an undeclared interface, a cut gzip stream): the Snapshot of
  everything before the damage, the reason in meta["warnings"]; the CLI prints
  "skewscope: warning: ..." on stderr and the report as usual (exit 0);
- pcapng blocks of unknown type are skipped (as the pcapng spec requires) with a warning.
Never a traceback, never a hang (the module runs under a timeout).
"""
from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from test_offline_formats import ng_block, ng_epb, ng_idb, ng_shb, pcap_bytes, reference_packets, write

from skewscope.cli import main
from skewscope.core import layout as L
from skewscope.core.errors import PcapError
from skewscope.sources import offline

pytestmark = pytest.mark.timeout(300)
REAL = Path(__file__).resolve().parents[2].parent / "shared/data/real"
ERF = REAL / "srinivaskoritala_rdma-softroce-demo__infiniband_ERF_nativeIB.pcap"
SKEWSCOPE = Path(sys.executable).parent / "skewscope"


@pytest.fixture(scope="module")
def ref():
    return reference_packets()


@pytest.fixture(scope="module")
def good(ref):
    return pcap_bytes([(x.ts, x.frame, len(x.frame)) for x in ref])


def cli(*args):
    r = CliRunner().invoke(main, ["report", *map(str, args)])
    assert "Traceback" not in (r.stdout + r.stderr)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r


def assert_refused(path, words):
    with pytest.raises(PcapError) as ei:
        offline.parse_file(path)
    msg = str(ei.value)
    assert "\n" not in msg and str(path) in msg
    for w in words:
        assert w in msg, msg
    r = cli(path)
    assert r.exit_code == 3
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("skewscope: ") and words[0] in lines[0]
    assert r.stdout == ""


def assert_partial(path, n_before, words, json_too=True):
    snap = offline.parse_file(path)
    g = snap.globals
    assert int(g[L.G_FRAMES]) == n_before == snap.meta["frames"]
    assert int(g[:L.G_NCAT].sum()) == n_before
    w = snap.meta["warnings"]
    assert len(w) == 1 and "\n" not in w[0]
    for word in words:
        assert word in w[0], w[0]
    if json_too:
        r = cli("--json", path)
        assert r.exit_code == 0
        doc = json.loads(r.stdout)
        assert doc["totals"]["packets_seen"] == n_before
        err = r.stderr.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("skewscope: warning: ") and words[0] in err[0]
    return snap


@pytest.mark.parametrize("content,words", [
    (b"", ["empty file"]),
    (b"\xd4\xc3", ["too short"]),
    (b"hello, this is not a capture\n" * 4, ["not a pcap or pcapng file"]),
    (struct.pack("<IHH", 0xA1B2C3D4, 2, 4), ["truncated pcap header"]),
    (b"\x0a\x0d\x0d\x0a\x1c\x00\x00\x00\xde\xad\xbe\xef" + b"\0" * 16, ["bad pcapng byte-order magic"]),
    (gzip.compress(b"definitely not a capture"), ["gzip", "not a pcap or pcapng file"]),
    (b"\x1f\x8b\x08\x00garbage after a gzip magic", ["not a readable capture"]),
], ids=["empty", "2 bytes", "text", "short header", "pcapng bad bom", "gzip of text", "broken gzip"])
def test_not_a_capture(tmp_path, content, words):
    assert_refused(write(tmp_path / "bad.pcap", content), words)


def test_random_bytes(tmp_path):
    rng = np.random.default_rng(1234)
    for i in range(20):
        data = rng.integers(0, 256, int(rng.integers(1, 5000)), dtype=np.uint8).tobytes()
        if data[:4] in (b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\xc3\xd4", b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d",
                        b"\x0a\x0d\x0d\x0a") or data[:2] == b"\x1f\x8b":
            continue
        p = write(tmp_path / f"r{i}.bin", data)
        with pytest.raises(PcapError):
            offline.parse_file(p)
    assert_refused(p, ["not a pcap or pcapng file"])


def test_unsupported_link_types(tmp_path, ref):
    assert_refused(ERF, ["unsupported link type 197", "ERF"])
    assert_refused(write(tmp_path / "ib.pcap", pcap_bytes([(1, b"\0" * 64, 64)], linktype=247)),
                   ["unsupported link type 247", "InfiniBand"])
    # pcapng whose only interface is native InfiniBand: refused the same way
    assert_refused(write(tmp_path / "ib.pcapng", ng_shb() + ng_idb(247) + ng_epb(0, 5, b"\0" * 64, 64)),
                   ["unsupported link type 247"])
    # mixed: the Ethernet interface is read, the other's packets skipped with a warning
    body = ng_shb() + ng_idb(1, 9) + ng_idb(197, 9)
    body += b"".join(ng_epb(0, x.ts, x.frame, len(x.frame)) + ng_epb(1, x.ts, b"\0" * 40, 40) for x in ref)
    snap = assert_partial(write(tmp_path / "mixed.pcapng", body), len(ref), ["skipped", "197"])
    assert snap.meta["skipped_unsupported_linktype"] == len(ref)


def test_cut_inside_the_last_record(tmp_path, good, ref):
    for cut in (3, 15, 40):   # inside the record header, just after it, inside the data
        p = write(tmp_path / f"cut{cut}.pcap", good[:len(good) - len(ref[-1].frame) - 16 + cut])
        snap = assert_partial(p, len(ref) - 1, ["ends inside record", str(len(ref))], json_too=cut == 40)
        assert snap.meta["last_ts"] == ref[-2].ts


def test_implausible_record_length(tmp_path, good, ref):
    recs = pcap_bytes([(x.ts, x.frame, len(x.frame)) for x in ref[:5]])
    bad = struct.pack("<IIII", 1, 0, 50_000_000, 50_000_000) + b"\0" * 100
    p = write(tmp_path / "huge.pcap", recs + bad + good[24:])
    assert_partial(p, 5, ["record 6", "50000000", "corrupt"])


def test_gzip_stream_cut(tmp_path, good, ref):
    data = (good[:24] + good[24:] * 50)
    z = gzip.compress(data)
    p = write(tmp_path / "cut.pcap.gz", z[: len(z) // 2])
    snap = offline.parse_file(p)
    n = int(snap.globals[L.G_FRAMES])
    assert 0 < n < 50 * len(ref)
    assert len(snap.meta["warnings"]) >= 1 and "gzip" in snap.meta["warnings"][0]
    r = cli(p)
    assert r.exit_code == 0 and "skewscope: warning:" in r.stderr and "gzip" in r.stderr


def _ng(ref, extra_at=3, extra=b""):
    blocks = [ng_shb(), ng_idb(1, 9)]
    for i, x in enumerate(ref):
        if i == extra_at:
            blocks.append(extra)
        blocks.append(ng_epb(0, x.ts, x.frame, len(x.frame)))
    return b"".join(blocks)


def test_pcapng_unknown_block_is_skipped_with_a_warning(tmp_path, ref):
    unknown = ng_block(0x0BADBEEF & 0x7FFFFFFF, b"some future block body")
    snap = assert_partial(write(tmp_path / "u.pcapng", _ng(ref, 3, unknown)), len(ref), ["unknown type"])
    assert int(snap.globals[L.G_ACCOUNTED]) == sum(1 for x in ref if x.key)


@pytest.mark.parametrize("kind", ["bad length", "trailer mismatch", "epb overrun", "undeclared iface", "cut"])
def test_pcapng_damage(tmp_path, ref, kind):
    good_blocks = _ng(ref[:4], 99)
    x = ref[4]
    if kind == "bad length":
        dmg = struct.pack("<II", 6, 13) + b"\0" * 40
        words = ["corrupt pcapng block"]
    elif kind == "trailer mismatch":
        b = bytearray(ng_epb(0, 1, x.frame, len(x.frame)))
        b[-4:] = struct.pack("<I", 12)
        dmg = bytes(b)
        words = ["corrupt pcapng block"]
    elif kind == "epb overrun":
        b = bytearray(ng_epb(0, 1, x.frame, len(x.frame)))
        b[20:24] = struct.pack("<I", len(x.frame) + 400)
        dmg = bytes(b)
        words = ["corrupt pcapng block"]
    elif kind == "undeclared iface":
        dmg = ng_epb(3, 1, x.frame, len(x.frame))
        words = ["interface 3", "never declared"]
    else:
        dmg = ng_epb(0, 1, x.frame, len(x.frame))[:50]
        words = ["ends inside a pcapng block"]
    p = write(tmp_path / "d.pcapng", good_blocks + dmg + b"".join(ng_epb(0, y.ts, y.frame, len(y.frame))
                                                                   for y in ref[5:]) * (kind != "cut"))
    assert_partial(p, 4, words)


def test_missing_file_and_directory(tmp_path):
    r = cli(tmp_path / "nope.pcap")
    assert r.exit_code == 3 and "no such file" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = cli(tmp_path)   # click's own usage error (exit 2) for a directory
    assert r.exit_code == 2 and "is a directory" in r.stderr and r.stdout == ""
    with pytest.raises(PcapError):
        offline.parse_file(tmp_path / "nope.pcap")
    with pytest.raises(ValueError):
        offline.parse_file(ERF, max_flows=0)


@pytest.mark.skipif(not SKEWSCOPE.exists(), reason="console script not installed in this venv")
def test_real_entry_point(tmp_path, good, ref):
    """The installed `skewscope` command: a refusal and a damaged capture, end to end."""
    env = dict(os.environ, COLUMNS="120")
    r = subprocess.run([str(SKEWSCOPE), "report", str(ERF)], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 3 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and "unsupported link type 197" in r.stderr
    p = write(tmp_path / "cut.pcap", good[:-10])
    r = subprocess.run([str(SKEWSCOPE), "report", "--json", str(p)], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0 and "Traceback" not in r.stderr
    assert r.stderr.startswith("skewscope: warning: ") and r.stderr.count("\n") == 1
    assert json.loads(r.stdout)["totals"]["packets_seen"] == len(ref) - 1


@pytest.mark.skipif(not SKEWSCOPE.exists(), reason="console script not installed in this venv")
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_cli_reads_a_pipe(good, ref, gz):
    """`zstdcat x.pcap.zst | skewscope report /dev/stdin`: a pipe is read once, in order."""
    data = gzip.compress(good) if gz else good
    r = subprocess.run([str(SKEWSCOPE), "report", "--json", "/dev/stdin"], input=data, capture_output=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["totals"]["packets_seen"] == len(ref) and doc["meta"]["warnings"] == []
