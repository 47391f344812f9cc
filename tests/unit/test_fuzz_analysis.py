"""Fuzzing the analysis behind `report` / `diagnose` / `report --html` (no root).

test_fuzz_offline damages the capture containers; this damages the traffic: generated
captures of several collectives (skewgen presets: TP decode, P/D disaggregation, EP decode,
pipeline, loss, ring) cut to a random window of records (a few packets, a partial
collective, the whole run), with bytes of the IP/UDP/BTH/RETH headers overwritten at a
random rate (opcodes, QPs, PSNs and DMA lengths that no NCCL sends; frames that stop
being RoCE) and timestamps jittered, all equal, or thrown to the ends of the 32-bit range.
Whatever the traffic, the commands must do what their --help says: `report --json` exits 0
with a JSON document counting every record written, `diagnose --json` exits 0/1/2
(healthy/warning/critical) with a JSON document, `report --html` exits 0 and writes the
page; never an exception. Random examples each run (a bounded number); a failure prints
the example that hypothesis shrank it to.
"""
from __future__ import annotations

import json
import struct

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skewscope import gen as skewgen
from skewscope.cli import main

PRESETS = ("tp-decode-slow-shard", "pd-imbalanced", "ep-decode-hot-expert", "pipeline-bubbles", "loss",
           "ring-straggler")
ETH, IP4, UDP, BTH, RETH = 14, 20, 8, 12, 16


class Blob(bytes):
    def __repr__(self):
        return f"<capture of {len(self)} bytes>"


class Captures(dict):
    def __repr__(self):     # hypothesis prints the arguments of a failing example
        return f"<{len(self)} generated captures>"


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    """preset -> (pcap file header, [record bytes]) of a snaplen-128 capture."""
    d = tmp_path_factory.mktemp("afuzz")
    out = Captures()
    for p in PRESETS:
        f = d / f"{p}.pcap"
        skewgen.write(p, f, seed=3, snaplen=128)
        b = f.read_bytes()
        recs, o = [], 24
        while o + 16 <= len(b):
            incl = struct.unpack_from("<I", b, o + 8)[0]
            recs.append(b[o:o + 16 + incl])
            o += 16 + incl
        out[p] = (b[:24], recs)
    return out


@st.composite
def traffic(draw, caps):
    p = draw(st.sampled_from(PRESETS))
    head, recs = caps[p]
    n = len(recs)
    lo = draw(st.integers(0, n - 1))
    hi = draw(st.integers(lo + 1, min(n, lo + draw(st.sampled_from([3, 40, 400, 4000, n])))))
    rate = draw(st.sampled_from([0.0, 0.001, 0.02, 0.3]))
    where = draw(st.sampled_from(["bth+reth", "ip+udp", "anywhere"]))
    tsmode = draw(st.sampled_from(["keep", "jitter", "same", "extreme"]))
    rnd = draw(st.randoms(use_true_random=False))
    out = [head]
    for r in recs[lo:hi]:
        r = bytearray(r)
        incl = len(r) - 16
        if rnd.random() < rate:
            a, b = {"bth+reth": (ETH + IP4 + UDP, ETH + IP4 + UDP + BTH + RETH),
                    "ip+udp": (ETH, ETH + IP4 + UDP), "anywhere": (0, incl)}[where]
            a, b = 16 + a, 16 + min(b, incl)
            for _ in range(rnd.randint(1, 4)):
                if b > a:
                    r[rnd.randrange(a, b)] = rnd.randrange(256)
        if tsmode == "jitter":
            s, us = struct.unpack_from("<II", r, 0)
            struct.pack_into("<II", r, 0, s, (us + rnd.randrange(2_000_000)) % 1_000_000_000)
        elif tsmode == "same":
            struct.pack_into("<II", r, 0, 1_700_000_000, 0)
        elif tsmode == "extreme" and rnd.random() < 0.05:
            struct.pack_into("<II", r, 0, rnd.choice([0, 0xFFFFFFFF]), rnd.randrange(1_000_000_000))
        out.append(bytes(r))
    return p, hi - lo, Blob(b"".join(out))


FUZZ = settings(max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


@pytest.mark.timeout(600)
@FUZZ
@given(data=st.data(), cmd=st.sampled_from(["report", "diagnose", "html"]))
def test_commands_keep_their_contract_on_damaged_traffic(captures, tmp_path, data, cmd):
    preset, nrec, blob = data.draw(traffic(captures))
    f = tmp_path / "t.pcap"      # left there when the example fails
    f.write_bytes(blob)
    page = tmp_path / "t.html"
    page.unlink(missing_ok=True)
    args = ["report", str(f), "--html", str(page)] if cmd == "html" else [cmd, str(f), "--json"]
    r = CliRunner().invoke(main, args)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise AssertionError(f"{preset}, {nrec} records, {args}: {r.exception!r}") from r.exception
    assert r.exit_code in ({0, 1, 2} if cmd == "diagnose" else {0}), (preset, nrec, args, r.output[-800:])
    if cmd == "html":
        assert page.read_bytes().rstrip().endswith(b"</html>")
        return
    doc = json.loads(r.stdout)
    if cmd == "report":
        assert doc["totals"]["packets_seen"] == nrec
    else:
        assert isinstance(doc["findings"], list)
