"""Fuzzing the offline path (issue 8), no root needed.

1. The mutation corpus (tests/fuzzcorpus.py, frames of any length 0..3.6 KB, 200k in CI)
   through the numba parser (skewscope.sources.offline): every frame in exactly one category, the
   categories add up to the records, only accounted frames make flows, no flow counts more
   payload than wire bytes, unmutated RoCE templates are all accounted, and the per-frame
   categories of offline.dissect agree with parse_file's totals. (Kernel == offline per frame
   is tests/kernel/test_fuzz_kernel.py.)
2. The capture readers under hypothesis, for a bounded number of examples each: random
   bytes, pcap and pcapng files built from random (often lying) headers, block lengths and
   records, then cut or bit-flipped, gzip too. skewscope.sources.offline.read_frames (the
   reader of `skewscope replay`) and offline.parse_file may only return/yield or raise
   PcapError (the documented error); a file damaged part-way gives a Snapshot whose counters
   still add up, and read_frames yields exactly the records parse_file counted, with the same
   warnings. pytest's timeout fails the test if either ever hangs.
"""
from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import fuzzcorpus as fc

from skewscope.core import layout as L
from skewscope.core.errors import PcapError

try:
    from skewscope.sources import offline
except ImportError:  # pragma: no cover - before issue 4 landed
    offline = None

needs_offline = pytest.mark.skipif(offline is None or not hasattr(offline, "parse_file"),
                                   reason="skewscope.sources.offline.parse_file is not in this tree yet (issue 4)")
N = 200_000
REAL = Path(__file__).resolve().parents[3] / "shared" / "data" / "real"


@pytest.fixture(scope="module")
def corpus_pcap(tmp_path_factory):
    c = fc.make_corpus(N, seed=11, min_len=0)
    p = tmp_path_factory.mktemp("fuzz") / "corpus.pcap"
    c.write_pcap(str(p))
    return c, p


@needs_offline
@pytest.mark.timeout(600)
def test_offline_corpus_invariants(corpus_pcap):
    c, p = corpus_pcap
    snap = offline.parse_file(str(p))
    g = snap.globals
    assert int(g[L.G_FRAMES]) == len(c)
    assert int(g[:L.G_NCAT].sum()) == len(c)
    # frames < 14 bytes exist in this corpus and are truncated_eth
    assert int(g[L.G_TRUNC_ETH]) >= int((c.length < 14).sum()) > 0
    f = snap.flows
    assert len(f) > 0 and int(g[L.G_FLOWS_CREATED]) == len(f)
    assert int(f["packets"].sum()) == int(g[L.G_ACCOUNTED])
    over = f[f["payload_bytes"] > f["bytes"]]
    assert len(over) == 0, f"{len(over)} flows with payload_bytes > bytes (a length lie was accounted)"
    hit = {i for i in range(L.G_NCAT) if g[i]}
    assert hit >= set(range(L.G_NCAT)) - {L.G_SAMPLED_OUT, L.G_NO_FLOW_SLOT}, \
        f"not reached: {[L.CATEGORY_NAMES[i] for i in set(range(L.G_NCAT)) - hit]}"


@needs_offline
@pytest.mark.timeout(600)
def test_offline_per_frame_categories(corpus_pcap):
    """dissect's per-frame category agrees with parse_file's totals and with the corpus'
    ground truth for unmutated RoCE templates."""
    c, p = corpus_pcap
    if not hasattr(offline, "dissect"):
        pytest.skip("offline.dissect not available")
    rows = offline.dissect(str(p))
    assert len(rows) == len(c)
    cat = rows["category"].astype(np.int64)
    assert ((cat >= 0) & (cat < L.G_NCAT)).all()
    snap = offline.parse_file(str(p))
    assert np.array_equal(np.bincount(cat, minlength=L.G_NCAT), snap.globals[:L.G_NCAT].astype(np.int64))
    T = fc.build_templates(seed=11 + 1)
    valid_roce = (c.kind == fc.K["valid"]) & np.isin(T.family[np.maximum(c.template, 0)],
                                                     (fc.FAM_V4, fc.FAM_V6, fc.FAM_V1))
    assert valid_roce.sum() > 100
    assert (cat[valid_roce] == L.G_ACCOUNTED).all()
    assert (cat[c.length < 14] == L.G_TRUNC_ETH).all()
    assert (cat[c.kind == fc.K["vlan_deep"]] != L.G_ACCOUNTED).all()
    assert (cat[c.kind == fc.K["opcode_unknown"]] != L.G_ACCOUNTED).all()


# ---- capture readers under hypothesis ------------------------------------------------------
def _pcap_file(draw) -> bytes:
    big = draw(st.booleans())
    e = ">" if big else "<"
    magic = draw(st.sampled_from([fc.L_PCAP_NS, 0xA1B2C3D4]))
    lt = draw(st.sampled_from([1, 1, 1, 101, 113, 276, 12, 14, 197, 0, 0xFFFFFFFF]))
    out = struct.pack(e + "IHHiIII", magic, 2, 4, 0, 0, draw(st.sampled_from([65535, 0, 64, 0xFFFFFFFF])), lt)
    for _ in range(draw(st.integers(0, 6))):
        body = draw(st.binary(max_size=200))
        incl = draw(st.one_of(st.just(len(body)), st.integers(0, 0xFFFFFFFF), st.integers(0, 300)))
        orig = draw(st.one_of(st.just(len(body)), st.integers(0, 0xFFFFFFFF), st.integers(0, 70000)))
        out += struct.pack(e + "IIII", draw(st.integers(0, 0xFFFFFFFF)), draw(st.integers(0, 0xFFFFFFFF)),
                           incl, orig) + body
    return out


def _block(e, btype, body, blen=None):
    bl = 12 + len(body) if blen is None else blen
    return struct.pack(e + "II", btype, bl) + body + struct.pack(e + "I", bl)


def _pcapng_file(draw) -> bytes:
    big = draw(st.booleans())
    e = ">" if big else "<"
    lie = st.one_of(st.none(), st.integers(0, 0xFFFFFFFF), st.integers(0, 200))
    out = _block(e, 0x0A0D0D0A,
                 struct.pack(e + "IHHq", 0x1A2B3C4D, 1, 0, -1), draw(lie))
    for _ in range(draw(st.integers(0, 3))):
        opts = b""
        if draw(st.booleans()):
            opts = struct.pack(e + "HH", 9, 1) + bytes([draw(st.integers(0, 255))]) + b"\0\0\0" + b"\0\0\0\0"
        if draw(st.booleans()):
            opts += struct.pack(e + "HH", draw(st.integers(0, 0xFFFF)), draw(st.integers(0, 0xFFFF)))
        out += _block(e, 1, struct.pack(e + "HHI", draw(st.sampled_from([1, 101, 113, 276, 197, 0xFFFF])), 0,
                                        draw(st.integers(0, 0xFFFFFFFF))) + opts, draw(lie))
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from([6, 6, 3, 2, 4, 5, 1, 0x0A0D0D0A, 0xDEAD]))
        data = draw(st.binary(max_size=160))
        data += b"\0" * (-len(data) % 4)
        if kind == 6:
            body = struct.pack(e + "IIIII", draw(st.integers(0, 4)), draw(st.integers(0, 0xFFFFFFFF)),
                               draw(st.integers(0, 0xFFFFFFFF)),
                               draw(st.one_of(st.just(len(data)), st.integers(0, 0xFFFFFFFF))),
                               draw(st.one_of(st.just(len(data)), st.integers(0, 0xFFFFFFFF)))) + data
        elif kind == 3:
            body = struct.pack(e + "I", draw(st.one_of(st.just(len(data)), st.integers(0, 0xFFFFFFFF)))) + data
        elif kind == 1 or draw(st.integers(0, 7)) == 0:
            body = data[:draw(st.integers(0, 8))]  # a block too short for its own fields
        elif kind == 0x0A0D0D0A:
            body = struct.pack(e + "IHHq", draw(st.sampled_from([0x1A2B3C4D, 0x4D3C2B1A, 0])), 1, 0, -1)
        else:
            body = data
        out += _block(e, kind, body, draw(lie))
    return out


@st.composite
def capture_files(draw):
    kind = draw(st.sampled_from(["random", "pcap", "pcapng", "real"]))
    if kind == "random":
        b = draw(st.binary(max_size=600))
    elif kind == "pcap":
        b = _pcap_file(draw)
    elif kind == "pcapng":
        b = _pcapng_file(draw)
    else:
        files = sorted(p for p in REAL.glob("*.pcap*") if p.name.endswith((".pcap", ".pcapng", ".gz"))) if REAL.is_dir() else []
        b = files[draw(st.integers(0, len(files) - 1))].read_bytes()[:4096] if files else _pcap_file(draw)
    # damage: cut, flip bytes, overwrite a 32-bit word with an extreme value
    if b and draw(st.booleans()):
        b = b[:draw(st.integers(0, len(b)))]
    if b and draw(st.booleans()):
        ba = bytearray(b)
        for _ in range(draw(st.integers(1, 6))):
            i = draw(st.integers(0, len(ba) - 1))
            ba[i] = draw(st.integers(0, 255))
        if len(ba) >= 8 and draw(st.booleans()):
            i = draw(st.integers(0, len(ba) - 4)) & ~3
            ba[i:i + 4] = draw(st.sampled_from([b"\xff\xff\xff\xff", b"\0\0\0\0", b"\x0c\0\0\0", b"\0\0\0\x0c"]))
        b = bytes(ba)
    if draw(st.integers(0, 9)) == 0:
        b = gzip.compress(b)
        if draw(st.booleans()):
            b = b[:draw(st.integers(0, len(b)))]
    return b


FUZZ = settings(max_examples=400, deadline=5000, derandomize=False, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


_SHB = struct.pack("<II", 0x0A0D0D0A, 28) + struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1) + struct.pack("<I", 28)
_IDB = struct.pack("<II", 1, 20) + struct.pack("<HHI", 1, 0, 0) + struct.pack("<I", 20)
# found by this test (in the former pure-Python reader): struct.error on a short IDB / SPB,
# EOFError on a cut gzip
REGRESSIONS = [
    _SHB + struct.pack("<III", 1, 12, 12),                    # IDB with an empty body
    _SHB + _IDB + struct.pack("<III", 3, 12, 12),             # SPB with an empty body
    gzip.compress(_SHB + _IDB)[:20],                          # gzip stream cut short
    b"\x1f\x8b" + bytes(30),                                  # not really gzip
    # (in the numba reader) SIGFPE: if_tsresol 10^-73 s, whose divisor 10^64 wraps to 0
    _SHB + struct.pack("<II", 1, 32) + struct.pack("<HHI", 1, 0, 0) + struct.pack("<HHB3x", 9, 1, 73)
    + struct.pack("<HHI", 0, 0, 32) + struct.pack("<IIIIIII", 6, 32, 0, 0, 12345, 0, 0) + struct.pack("<I", 32),
]


@pytest.fixture(scope="module")
def warm_offline(tmp_path_factory):
    """Compile the numba kernels (pcap and pcapng paths) before timing examples."""
    d = tmp_path_factory.mktemp("warm")
    c = fc.make_corpus(200, seed=3, min_len=0)
    c.write_pcap(str(d / "w.pcap"))
    offline.parse_file(str(d / "w.pcap"))
    e = "<"
    ng = _block(e, 0x0A0D0D0A, struct.pack(e + "IHHq", 0x1A2B3C4D, 1, 0, -1))
    ng += _block(e, 1, struct.pack(e + "HHI", 1, 0, 65535))
    fr = c.frame(0) + b"\0" * (-len(c.frame(0)) % 4)
    ng += _block(e, 6, struct.pack(e + "IIIII", 0, 0, 1, len(c.frame(0)), len(c.frame(0))) + fr)
    (d / "w.pcapng").write_bytes(ng)
    offline.parse_file(str(d / "w.pcapng"))
    (d / "w.pcap.gz").write_bytes(gzip.compress(ng))
    offline.parse_file(str(d / "w.pcap.gz"))
    for f in ("w.pcap", "w.pcapng", "w.pcap.gz"):   # mapped (read-only) and gunzipped buffers
        list(offline.read_frames(d / f))
        offline.dissect(d / f)


@needs_offline
@pytest.mark.timeout(400)
@FUZZ
@given(blob=capture_files())
@example(blob=REGRESSIONS[0])
@example(blob=REGRESSIONS[1])
@example(blob=REGRESSIONS[2])
@example(blob=REGRESSIONS[3])
@example(blob=REGRESSIONS[4])
def test_offline_reader_raises_only_pcaperror(warm_offline, tmp_path, blob):
    p = tmp_path / "f.pcap"
    p.write_bytes(blob)
    try:
        snap = offline.parse_file(str(p))
    except PcapError as e:
        msg = str(e)
        assert msg and "\n" not in msg
        return
    g = snap.globals
    assert int(g[:L.G_NCAT].sum()) == int(g[L.G_FRAMES])
    assert int(snap.flows["packets"].sum()) == int(g[L.G_ACCOUNTED])
    assert (snap.flows["payload_bytes"] <= snap.flows["bytes"]).all()


@needs_offline
@pytest.mark.timeout(400)
@FUZZ
@given(blob=capture_files())
@example(blob=REGRESSIONS[0])
@example(blob=REGRESSIONS[1])
@example(blob=REGRESSIONS[2])
@example(blob=REGRESSIONS[3])
@example(blob=REGRESSIONS[4])
def test_frame_reader_raises_only_pcaperror(warm_offline, tmp_path, blob):
    """offline.read_frames (the record API `skewscope replay` reads captures with) yields
    batches or raises PcapError with one line, exactly when parse_file does; the batches are
    well formed (0 <= caplen <= orig_len, frames back to back in data) and hold every record
    parse_file counted, with dissect's timestamps and Ethernet-frame lengths and parse_file's
    damage warnings (strict: a PcapError instead, exactly for damage)."""
    p = tmp_path / "f.pcap"
    p.write_bytes(blob)
    try:
        reader = offline.read_frames(p)
        batches = list(reader)
    except PcapError as e:
        msg = str(e)
        assert msg and "\n" not in msg
        with pytest.raises(PcapError):
            offline.parse_file(p)
        return
    ts, wire = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for b in batches:
        assert len(b) > 0
        for a in (b.ts, b.orig_len, b.caplen, b.offset):
            assert a.dtype == np.int64 and len(a) == len(b)
        assert (b.caplen >= 0).all() and (b.caplen <= b.orig_len).all()
        assert np.array_equal(b.offset, np.cumsum(b.caplen) - b.caplen)
        assert b.data.dtype == np.uint8 and len(b.data) == int(b.caplen.sum())
        ts.append(b.ts)
        wire.append(b.orig_len)
    snap = offline.parse_file(p)
    rows = offline.dissect(p)
    n = sum(len(b) for b in batches)
    assert n == int(snap.globals[L.G_FRAMES]) == len(rows)
    assert np.array_equal(np.concatenate(ts), rows["ts"]) and np.array_equal(np.concatenate(wire), rows["wire_len"])
    assert all(w and "\n" not in w for w in reader.warnings)
    assert reader.warnings == snap.meta["warnings"]
    # strict (replay's mode): the damage warning becomes the one PcapError line, nothing else
    damaged = any("records before it" in w for w in reader.warnings)
    try:
        assert sum(len(b) for b in offline.read_frames(p, strict=True)) == n and not damaged
    except PcapError as e:
        assert damaged and str(e) and "\n" not in str(e)
