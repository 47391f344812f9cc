"""Parser drift caught without root (issue 11): ebpf/parse.h, the data plane's packet parser,
compiled with the host C compiler (tests/unit/parse_host.c, AddressSanitizer + UBSan when
the toolchain has them) against the offline numba parser (skewscope/sources/offline/kernel/parse.py,
which mirrors the same C), frame by frame and field by field:

- the fuzz corpus (tests/fuzzcorpus.py: valid, truncated, mutated and random frames,
  encapsulated ones included, 0..3.6 KB);
- every skewgen preset (skewscope.gen.PRESETS), headers-only (snaplen 128, so the wire
  length exceeds the captured bytes as in a real snaplen-cut capture), at most
  CAP_PER_PRESET frames each, spread over the whole capture.

Fields: the frame's category (accounted / non_roce / pfc / truncated_* / bad_length /
unknown_opcode ...), decapsulation (G_DECAP), the PFC per-priority counters, and for an
accounted frame the flow key (src, dst, dest_qp, ipver, roce), opcode and its class, PSN,
payload length, RETH length, AETH syndrome, FECN/BECN, traffic class, ECN (ecn_capable / CE),
UDP source port and the bytes accounted (the inner Ethernet frame's when decapsulated). A
disagreement names the frame (source, index, how it was made, its first bytes) and the field.

Truth that comes from neither parser: the corpus' unmutated RoCE templates must be accounted
with the opcode, QP and PSN at the BTH offset the corpus recorded when it built them, and
the category totals over the whole fuzz pcap must equal offline.parse_file's.

The compiled BPF program runs the same parse.h; the kernel tier (tests/kernel/
test_offline_vs_kernel.py, test_fuzz_kernel.py) checks it against the offline parser too.
"""
from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

import fuzzcorpus as fc

from skewscope.core import layout as L

ROOT = Path(__file__).resolve().parents[2]
EBPF = ROOT / "ebpf"
HOST_C = Path(__file__).with_name("parse_host.c")
N_FUZZ = 40_000
CAP_PER_PRESET = 1500
SNAPLEN = 128

# struct ss_host_out (parse_host.c); its size is checked against what the program prints
HOST_DTYPE = np.dtype([
    ("cat", "<u4"), ("opinfo", "<u4"),
    ("src", "u1", (16,)), ("dst", "u1", (16,)), ("dest_qp", "<u4"), ("ipver", "u1"), ("roce", "u1"),
    ("_kpad", "u1", (2,)),
    ("wire_len", "<u8"), ("payload", "<u8"), ("psn", "<u4"), ("reth_len", "<u4"), ("sport", "<u2"),
    ("opcode", "u1"), ("tclass", "u1"), ("ecn_valid", "u1"), ("fb", "u1"), ("syndrome", "u1"), ("_pad", "u1"),
    ("counts", "<u8", (L.G_N,)),
])

# compared per frame; the second group only when both say accounted (else -1 on both sides)
ALWAYS = ("category", "decap") + tuple(f"pfc_{k}{p}" for k in ("pause", "xon", "quanta") for p in range(8))
ACCOUNTED = ("src", "dst", "dest_qp", "ipver", "roce", "opcode", "opclass", "psn", "payload", "reth_len",
             "syndrome", "fecn", "becn", "tclass", "ecn_capable", "ce", "sport", "wire_len")
FIELDS = ALWAYS + ACCOUNTED


def _cat_name(c: int) -> str:
    return L.CATEGORY_NAMES[c] if 0 <= c < L.G_NCAT else str(c)


# ---- the host-compiled parser -----------------------------------------------------------
def _build(gcc: str, exe: Path, defines: list[str]) -> bool:
    """Build parse_host.c into exe (AddressSanitizer + UBSan when the toolchain has them);
    returns whether it is sanitized."""
    base = [gcc, "-std=gnu11", "-g", "-Wall", "-Wextra", "-Werror", "-Wno-unknown-pragmas", f"-I{EBPF}",
            *defines, "-o", str(exe), str(HOST_C)]
    # parse.h reads its naturally aligned wire structs at 2-byte packet offsets on purpose
    san = ["-O1", "-fsanitize=address,undefined", "-fno-sanitize=alignment", "-fno-sanitize-recover=all"]
    r = subprocess.run(base[:1] + san + base[1:], capture_output=True, text=True)
    if r.returncode == 0:
        return True
    if "sanitize" not in r.stderr and "asan" not in r.stderr.lower():
        pytest.fail(f"parse.h does not build with the host compiler:\n{r.stderr}")
    r = subprocess.run(base[:1] + ["-O2"] + base[1:], capture_output=True, text=True)
    assert r.returncode == 0, f"parse.h does not build with the host compiler:\n{r.stderr}"
    return False


@pytest.fixture(scope="module")
def host_parser(tmp_path_factory):
    """run(pcap) -> the host-compiled ss_parse's answers for every record. parse.h is built
    twice: as the program builds it (the fast path for the common frame first) and with
    -DSS_NO_FAST_PARSE (every frame through the general parser); every record must get the
    same category, counters and, when accounted, the same parsed packet from both, and the
    first build's answers are returned (the tests compare them with the offline parser)."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    assert gcc, "gcc not found: `make setup` installs it (tools/setup.sh PKGS)"
    d = tmp_path_factory.mktemp("parse_host")
    exe, exe_general = d / "parse_host", d / "parse_host_general"
    sanitized = _build(gcc, exe, [])
    _build(gcc, exe_general, ["-DSS_NO_FAST_PARSE=1"])
    optab = d / "optable.bin"
    np.ascontiguousarray(L.OPCODE_TABLE, dtype="<u4").tofile(optab)

    def run_one(binary: Path, pcap: Path) -> np.ndarray:
        out = pcap.with_suffix(f".{binary.name}")
        p = subprocess.run([str(binary), str(pcap), str(out), str(optab)], capture_output=True, text=True,
                           env={"ASAN_OPTIONS": "detect_leaks=0", "UBSAN_OPTIONS": "print_stacktrace=1"})
        assert p.returncode == 0, f"host-compiled parse.h failed on {pcap.name} (rc {p.returncode}):\n{p.stderr[-4000:]}"
        size, gn, n = (int(x) for x in p.stdout.split())
        assert size == HOST_DTYPE.itemsize and gn == L.G_N, \
            f"struct ss_host_out is {size} bytes / SS_G_N {gn}: update HOST_DTYPE"
        a = np.fromfile(out, dtype=HOST_DTYPE)
        out.unlink()
        assert len(a) == n
        return a

    def run(pcap: Path) -> np.ndarray:
        a, g = run_one(exe, pcap), run_one(exe_general, pcap)
        compare(host_fields(a), host_fields(g), lambda i: f"record {i} of {pcap.name}", pcap.name,
                names=("parse.h with its fast path", "parse.h's general parser (-DSS_NO_FAST_PARSE)"))
        return a

    run.sanitized = sanitized
    return run


def host_fields(h: np.ndarray) -> dict:
    acc = h["cat"] == L.G_ACCOUNTED
    neg = np.full(len(h), -1, np.int64)

    def only(v):
        v = np.asarray(v, np.int64)
        return np.where(acc, v, neg)

    opinfo = h["opinfo"].astype(np.int64)
    ecn = h["tclass"].astype(np.int64) & 3
    ev = h["ecn_valid"] != 0
    f = {"category": h["cat"].astype(np.int64), "decap": h["counts"][:, L.G_DECAP].astype(np.int64)}
    for k, base in (("pause", L.G_PFC_PAUSE), ("xon", L.G_PFC_XON), ("quanta", L.G_PFC_QUANTA)):
        for p in range(8):
            f[f"pfc_{k}{p}"] = h["counts"][:, base + p].astype(np.int64)
    f["src"] = np.where(acc[:, None], h["src"].astype(np.int64), -1)
    f["dst"] = np.where(acc[:, None], h["dst"].astype(np.int64), -1)
    for n in ("dest_qp", "ipver", "roce", "opcode", "psn", "payload", "tclass", "sport", "wire_len"):
        f[n] = only(h[n])
    f["opclass"] = only((opinfo & L.OPT_CLASS_MASK) >> L.OPT_CLASS_SHIFT)
    f["reth_len"] = only(np.where(opinfo & L.OPT_RETH, h["reth_len"].astype(np.int64), -1))
    f["syndrome"] = only(np.where(opinfo & L.OPT_AETH, h["syndrome"].astype(np.int64), -1))
    fb = h["fb"].astype(np.int64)
    f["fecn"] = only(fb >> 7)
    f["becn"] = only((fb >> 6) & 1)
    f["ecn_capable"] = only(ev & (ecn != 0))
    f["ce"] = only(ev & (ecn == 3))
    return f


# ---- the offline parser, one record at a time ---------------------------------------------
def pcap_records(path: Path) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The file as a writable byte array, and (offset, end) of every record (little-endian
    classic pcap, as both writers here produce)."""
    b = np.fromfile(path, np.uint8)
    mv = memoryview(b)
    assert struct.unpack_from("<I", mv, 0)[0] in (0xA1B2C3D4, 0xA1B23C4D)
    recs, pos, n = [], 24, len(b)
    while pos + 16 <= n:
        incl = struct.unpack_from("<I", mv, pos + 8)[0]
        recs.append((pos, pos + 16 + incl))
        pos += 16 + incl
    assert pos == n
    return b, recs


def offline_fields(path: Path) -> dict:
    """Every record of `path` through the numba parser (kernel.scan, the entry parse_file and
    dissect use), one record per call so that the per-frame effects on the global counters
    (G_DECAP, PFC) and on the flow (bytes, ECN, opcode class) can be read. A one-entry flow
    table: each accounted frame's flow row is the one it touched."""
    from skewscope.sources.offline import kernel as K  # heavy (numba)
    from skewscope.sources.offline import tables as offline_tables  # heavy (numba)
    b, recs = pcap_records(path)
    ts_mult = 1 if struct.unpack_from("<I", b, 0)[0] == 0xA1B23C4D else 1000
    t = offline_tables._Tables(1, packets=1)
    n = len(recs)
    cols = {k: np.full(n, -1, np.int64) for k in FIELDS if k not in ("src", "dst")}
    src = np.full((n, 16), -1, np.int64)
    dst = np.full((n, 16), -1, np.int64)
    C = K.STAT_COLS
    st = t.st
    for i, (pos, end) in enumerate(recs):
        st[K.ST_PKN] = st[K.ST_EVN] = st[K.ST_INSTN] = 0
        g0 = t.g.copy()
        s0 = t.S[0].copy() if st[K.ST_NUSED] else np.zeros_like(t.S[0])
        while True:
            p, status = K.scan(b, pos, end, K.FMT_PCAP, False, ts_mult, K.K_ETHERNET, offline_tables._NO_IF,
                               offline_tables._NO_IF, offline_tables._NO_IF, 0, *t.args())
            if status == K.S_GROW:
                t.grow()
                continue
            break
        assert int(p) == end and st[K.ST_PKN] == 1, (path.name, i, int(p), end, int(status))
        dg = t.g - g0
        row = t.pk[0]
        cat = int(row[K.PK_CAT])
        cols["category"][i] = cat
        cols["decap"][i] = dg[L.G_DECAP]
        for k, base in (("pause", L.G_PFC_PAUSE), ("xon", L.G_PFC_XON), ("quanta", L.G_PFC_QUANTA)):
            for q in range(8):
                cols[f"pfc_{k}{q}"][i] = dg[base + q]
        if cat != L.G_ACCOUNTED:
            continue
        if dg[L.G_FLOWS_CREATED]:
            s0 = np.zeros_like(s0)
        ds = t.S[0] - s0
        assert ds[C["packets"][0]] == 1
        for name, col in (("dest_qp", K.PK_QP), ("ipver", K.PK_IPVER), ("roce", K.PK_ROCE),
                          ("opcode", K.PK_OPCODE), ("psn", K.PK_PSN), ("payload", K.PK_PAYLOAD),
                          ("reth_len", K.PK_RETH), ("syndrome", K.PK_SYND), ("tclass", K.PK_TCLASS),
                          ("sport", K.PK_SPORT)):
            cols[name][i] = row[col]
        cols["fecn"][i] = (row[K.PK_FB] >> 7) & 1
        cols["becn"][i] = (row[K.PK_FB] >> 6) & 1
        o0 = C["op"][0]
        cols["opclass"][i] = int(np.argmax(ds[o0:o0 + L.N_OPCLASS])) if ds[o0:o0 + L.N_OPCLASS].sum() == 1 else -2
        cols["ecn_capable"][i] = ds[C["ecn_capable"][0]]
        cols["ce"][i] = ds[C["ce"][0]]
        cols["wire_len"][i] = ds[C["bytes"][0]]
        addr = row[K.PK_W0:K.PK_W3 + 1].astype("<i8").view(np.uint8)
        src[i] = addr[:16]
        dst[i] = addr[16:]
    cols["src"], cols["dst"] = src, dst
    return cols


# ---- comparison ---------------------------------------------------------------------------
def compare(host: dict, off: dict, describe, what: str, names=("host parse.h", "offline")) -> None:
    """Fail naming frame and field for every disagreement (the first 25 listed); names: what
    the two sides are called in the message."""
    n = len(host["category"])
    assert len(off["category"]) == n, (what, n, len(off["category"]))
    bad, per_field = [], {}
    for name in FIELDS:
        h, o = np.asarray(host[name]), np.asarray(off[name])
        diff = h != o
        if diff.ndim > 1:
            diff = diff.any(axis=1)
        idx = np.nonzero(diff)[0]
        if len(idx):
            per_field[name] = len(idx)
            for i in idx[:25]:
                hv, ov = h[i], o[i]
                if name == "category":
                    hv, ov = _cat_name(int(hv)), _cat_name(int(ov))
                elif np.ndim(hv):
                    hv, ov = bytes(np.asarray(hv) & 0xFF).hex(), bytes(np.asarray(ov) & 0xFF).hex()
                bad.append((int(i), name, hv, ov))
    if bad:
        bad.sort()
        lines = [f"{what}: frame {i} ({describe(i)}), field {name}: {names[0]} {hv}, {names[1]} {ov}"
                 for i, name, hv, ov in bad[:25]]
        pytest.fail(f"{names[0]} and {names[1]} disagree ({per_field} frames per field):\n" + "\n".join(lines))


def _hexhead(b: np.ndarray, recs, i: int, k: int = 48) -> str:
    pos, end = recs[i]
    return bytes(b[pos + 16:min(end, pos + 16 + k)]).hex()


# ---- fuzz corpus ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fuzz(tmp_path_factory):
    T = fc.build_templates(seed=12)
    c = fc.make_corpus(N_FUZZ, seed=21, min_len=0, templates=T)
    p = tmp_path_factory.mktemp("fuzz") / "corpus.pcap"
    c.write_pcap(str(p))
    return T, c, p


@pytest.mark.timeout(300)
def test_fuzz_corpus_host_vs_offline(host_parser, fuzz):
    T, c, p = fuzz
    h = host_parser(p)
    assert len(h) == len(c)
    hf = host_fields(h)
    off = offline_fields(p)
    b, recs = pcap_records(p)

    def describe(i):
        return (f"fuzz corpus seed 21, kind {fc.KINDS[c.kind[i]]}, template {int(c.template[i])}, "
                f"{int(c.length[i])} bytes: {_hexhead(b, recs, i)}")
    compare(hf, off, describe, "fuzz corpus")
    # the corpus reaches every category the parser can decide, and decapsulation
    cats = set(np.unique(hf["category"]).tolist())
    missing = set(range(L.G_NCAT)) - {L.G_SAMPLED_OUT, L.G_NO_FLOW_SLOT} - cats
    assert not missing, f"not reached: {[_cat_name(m) for m in missing]}"
    assert (hf["decap"] > 0).any() and (hf["pfc_pause0"] + hf["pfc_xon0"] > 0).any()


def test_fuzz_valid_templates_against_construction(host_parser, fuzz):
    """Truth from the corpus builder, not from a parser: an unmutated RoCE template is accounted
    with the BTH it was built with."""
    T, c, p = fuzz
    h = host_parser(p)
    roce = np.isin(T.family, (fc.FAM_V4, fc.FAM_V6, fc.FAM_V1, fc.FAM_ENCAP))
    sel = np.nonzero((c.kind == fc.K["valid"]) & (c.template >= 0))[0]
    sel = sel[roce[c.template[sel]] & (T.bth_off[c.template[sel]] >= 0)]
    assert len(sel) > 500
    for i in sel:
        fr = c.frame(int(i))
        bo = int(T.bth_off[c.template[i]])
        want = (L.G_ACCOUNTED, fr[bo], int.from_bytes(fr[bo + 5:bo + 8], "big"), int.from_bytes(fr[bo + 9:bo + 12], "big"))
        got = (int(h["cat"][i]), int(h["opcode"][i]), int(h["dest_qp"][i]), int(h["psn"][i]))
        assert got == want, f"valid template frame {i} (template {int(c.template[i])}): " \
            f"(category, opcode, dest_qp, psn) = {got}, built as {want}"


def test_fuzz_totals_match_parse_file(host_parser, fuzz):
    """The host parser's category totals over the whole corpus == offline.parse_file's (the
    public entry, not the per-record loop above)."""
    from skewscope.sources import offline  # heavy (numba)
    _T, c, p = fuzz
    h = host_parser(p)
    g = offline.parse_file(str(p)).globals
    hc = np.bincount(h["cat"], minlength=L.G_NCAT)[:L.G_NCAT]
    assert hc.tolist() == [int(x) for x in g[:L.G_NCAT]], {
        _cat_name(i): (int(hc[i]), int(g[i])) for i in range(L.G_NCAT) if hc[i] != g[i]}
    assert int(h["counts"][:, L.G_DECAP].sum()) == int(g[L.G_DECAP])
    pfc = slice(L.G_PFC_PAUSE, L.G_PFC_QUANTA + 8)
    assert h["counts"][:, pfc].sum(axis=0).tolist() == [int(x) for x in g[pfc]]


# ---- generator presets ------------------------------------------------------------------------
def _presets():
    from skewscope import gen as skewgen
    return list(skewgen.PRESETS)


def _capped(cap, src: Path, dst: Path, limit: int) -> np.ndarray:
    """At most `limit` records of `src` (the capture `cap` written with snaplen SNAPLEN),
    evenly spread over it, written to `dst`; returns their indices. Record offsets come from
    the capture's frame lengths (caplen = min(length, snaplen)); every record taken is
    checked against its header."""
    lens = np.asarray(cap.frame_lengths(), np.int64)
    incl = np.minimum(lens, SNAPLEN)
    roff = np.zeros(len(lens), np.int64)
    roff[1:] = np.cumsum(16 + incl)[:-1]
    roff += 24
    b = np.memmap(src, np.uint8, "r")
    assert len(b) == 24 + int((16 + incl).sum()), f"{src.name}: not the records expected"
    idx = np.arange(len(lens))
    if len(lens) > limit:
        idx = np.unique(np.linspace(0, len(lens) - 1, limit).astype(np.int64))
    with open(dst, "wb") as fh:
        fh.write(bytes(b[:24]))
        for i in idx:
            pos = int(roff[i])
            rec = bytes(b[pos:pos + 16 + int(incl[i])])
            assert struct.unpack_from("<II", rec, 8) == (incl[i], lens[i]), (src.name, int(i))
            fh.write(rec)
    del b
    return idx


@pytest.mark.timeout(300)
def test_presets_host_vs_offline(host_parser, tmp_path):
    from skewscope import gen as skewgen
    presets = _presets()
    assert presets
    seen = set()
    for preset in presets:
        full = tmp_path / f"{preset}.full.pcap"
        cap = skewgen.generate(preset, seed=5)
        cap.write_pcap(full, snaplen=SNAPLEN)
        p = tmp_path / f"{preset}.pcap"
        idx = _capped(cap, full, p, CAP_PER_PRESET)
        full.unlink()
        h = host_parser(p)
        hf = host_fields(h)
        off = offline_fields(p)
        b, recs = pcap_records(p)

        def describe(i, preset=preset, idx=idx, b=b, recs=recs):
            pos, _ = recs[i]
            incl, orig = struct.unpack_from("<II", b, pos + 8)
            return f"preset {preset} seed 5 snaplen {SNAPLEN}, record {int(idx[i])}, {incl}/{orig} bytes: " \
                   f"{_hexhead(b, recs, i)}"
        compare(hf, off, describe, f"preset {preset}")
        assert (hf["category"] == L.G_ACCOUNTED).any(), f"preset {preset}: nothing accounted"
        seen |= set(np.unique(hf["category"]).tolist())
    # the presets include PFC storms and VLAN-tagged and IPv6 traffic: not only RoCEv2/IPv4
    assert L.G_PFC in seen, [_cat_name(c) for c in sorted(seen)]
