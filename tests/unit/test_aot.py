"""The ahead-of-time kernel module (skewscope.core.aot, built by `make setup`): current after
set-up, used without importing numba, the same results as numba's JIT on generated and real
captures, and never used for a call whose argument types it was not compiled for, or when
stale. Ground truth: numba's own typeof, the JIT run of the same commands, numpy."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest

from skewscope.core import aot, jit

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT.parent / "shared" / "data" / "real"
SKEWSCOPE = [sys.executable, "-m", "skewscope"]


def _values():
    rec = np.dtype([("a", np.uint64), ("b", np.float32)])
    rec_packed = np.dtype({"names": ["a", "b"], "formats": [np.uint8, np.uint64], "offsets": [0, 1],
                           "itemsize": 9})
    ro = np.arange(6, dtype=np.int64)
    ro.setflags(write=False)
    buf = np.zeros(8 * 9 + 1, np.uint8)
    unaligned = np.frombuffer(buf.data, dtype=np.uint64, count=9, offset=1)
    two = np.zeros((3, 4), np.int32)
    return [
        1, -5, 1 << 62, True, False, 2.5, np.int32(3), np.uint64(7), np.float32(1.0), np.bool_(True),
        np.zeros(3), np.zeros(3, np.float32), np.zeros(3, np.int64), np.zeros(3, np.uint64), ro,
        np.zeros(3, rec), np.zeros(3, rec_packed), np.zeros(3, rec)["a"], unaligned,
        two, two.T, two[:, ::2], two[0], two[:, 1], np.zeros((1, 1)),
        (1, 2), (1, 2.0), (np.zeros(2), 3), ((1, 2), np.zeros(2, np.int8)),
    ]


def test_arg_key_partitions_values_as_numba_typeof_does():
    """Two arguments share a key exactly when numba gives them the same type: a precompiled
    signature is never used for an argument numba would have typed differently."""
    vals = _values()
    keys = [jit.arg_key(v) for v in vals]
    types = [numba.typeof(v, numba.core.typing.typeof.Purpose.argument) for v in vals]
    assert all(k is not None for k in keys)
    def coarse(k):  # the key without alignment, which numba's typeof does not look at
        if isinstance(k, tuple) and k and k[0] == "T":
            return ("T",) + tuple(coarse(x) for x in k[1:])
        return k[:4] if isinstance(k, tuple) else k
    for i in range(len(vals)):
        for j in range(len(vals)):
            if keys[i] == keys[j]:      # sound: one key, one numba type
                assert types[i] == types[j], (vals[i], vals[j], types[i], types[j])
            if types[i] == types[j]:    # complete up to alignment (finer only sends a call to numba)
                assert coarse(keys[i]) == coarse(keys[j]), (vals[i], vals[j], keys[i], keys[j])


def test_arg_key_refuses_what_it_cannot_type():
    assert jit.arg_key(1 << 63) is None          # numba: uint64, not int64
    assert jit.arg_key("x") is None
    assert jit.arg_key(object()) is None
    assert jit.arg_key((1, "x")) is None
    assert jit.arg_key(np.zeros(2, np.dtype([("a", np.int8)]))[0]) is None   # a record scalar


def test_module_is_current_after_setup():
    ok, why = aot.status()
    assert ok, f"the AOT module is not in use ({why}); `make setup` builds it"


def _report(path, env_extra, cmd="report"):
    """((exit code, JSON document without timings or the error lines), numba loaded?) of
    `skewscope <cmd> --json path`."""
    # the process's own command line ends report/diagnose without returning (cli.common.exit_now):
    # what numba loaded is read by an atexit callback, the last line on stderr
    code = ("import atexit, sys, runpy\n"
            "atexit.register(lambda: print('NUMBA' if 'numba' in sys.modules or 'llvmlite' in sys.modules "
            "else 'NONUMBA', file=sys.stderr))\n"
            f"sys.argv = ['skewscope', {cmd!r}, '--json', {str(path)!r}]\n"
            "runpy.run_module('skewscope', run_name='__main__')\n")
    env = dict(os.environ, **env_extra)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    lines = r.stderr.strip().splitlines()
    if r.returncode not in (0, 1, 2):   # a capture skewscope refuses: the same one-line error
        return (r.returncode, lines[:-1]), lines[-1] == "NUMBA"
    doc = json.loads(r.stdout)
    _strip(doc)
    return (r.returncode, doc), lines[-1] == "NUMBA"


def _strip(d):
    if isinstance(d, dict):
        d.pop("parse_seconds", None)
        for v in d.values():
            _strip(v)
    elif isinstance(d, list):
        for v in d:
            _strip(v)


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("aot")
    out = []
    # presets the training workload ran, with another seed and snap length, and a per-node view
    for name, extra in (("moe-hot-expert", ["--seed", "11"]), ("ep-decode-hot-expert", ["--snaplen", "96"]),
                        ("incast", ["--seed", "3"])):
        p = tmp / f"{name}.pcap"
        subprocess.run(SKEWSCOPE + ["gen", name, "-o", str(p)] + extra, check=True, capture_output=True, timeout=600)
        out.append(p)
    p = tmp / "view.pcap"
    subprocess.run(SKEWSCOPE + ["gen", "pd-imbalanced", "-o", str(p), "--view", "node:1"], check=True,
                   capture_output=True, timeout=600)
    out.append(p)
    real = sorted(p for p in REAL.glob("*.pcap*") if p.name.endswith((".pcap", ".pcapng", ".gz")))
    assert real, f"no real captures under {REAL}"
    return out + real


def test_report_identical_with_and_without_the_module_and_no_numba(captures):
    """`report --json` and `diagnose --json`: the same document from the precompiled module as
    from numba's JIT (SKEWSCOPE_AOT=0), and with the module numba is never imported."""
    assert aot.status()[0], aot.status()[1]
    no_numba = []
    for p in captures:
        for cmd in ("report", "diagnose"):
            a, a_numba = _report(p, {}, cmd)
            j, j_numba = _report(p, {"SKEWSCOPE_AOT": "0"}, cmd)
            assert j_numba, "SKEWSCOPE_AOT=0 must run under numba"
            assert a == j, f"{cmd} {p.name}: precompiled and JIT documents differ"
            if not a_numba:
                no_numba.append(f"{cmd} {p.name}")
    # generated presets are what the module was trained on: none of them may need numba
    gen = [f"{c} {p.name}" for p in captures[:4] for c in ("report", "diagnose")]
    assert set(gen) <= set(no_numba), f"needed numba: {sorted(set(gen) - set(no_numba))}"


def _grouped_truth(key, v, w, nkeys):
    """Per key: the value at the middle of its values repeated by their (integer) weights."""
    out = np.full(nkeys, np.nan)
    for k in range(nkeys):
        sel = key == k
        if w[sel].sum() > 0:
            rep = np.sort(np.repeat(v[sel], w[sel].astype(np.int64)))
            out[k] = rep[int(np.ceil(w[sel].sum() / 2)) - 1]
    return out


def test_other_argument_types_go_to_numba_with_the_same_answer():
    """A call the module has no signature for (strided, another dtype) runs under numba; both
    paths agree with numpy."""
    from skewscope.analysis import stats
    k = stats.grouped_weighted_median
    keys = k.aot_keys()
    rng = np.random.default_rng(5)
    n, nkeys = 401, 7
    key = rng.integers(0, nkeys, size=n)
    v = rng.normal(size=n)
    w = rng.integers(1, 5, size=n).astype(np.float64)
    assert jit._call_key((key, v, w, nkeys)) in keys, f"precompiled for {keys}"
    vs = np.repeat(v, 2)[::2]            # same values, strided: layout 'A'
    assert jit._call_key((key, vs, w, nkeys)) not in keys
    assert jit._call_key((key.astype(np.int32), v, w, nkeys)) not in keys
    want = _grouped_truth(key, v, w, nkeys)
    np.testing.assert_array_equal(k(key, v, w, nkeys), want)
    np.testing.assert_array_equal(k(key, vs, w, nkeys), want)
    np.testing.assert_array_equal(k(key.astype(np.int32), v, w, nkeys), want)


def test_stale_or_mismatched_module_is_not_used(monkeypatch, tmp_path):
    assert aot.status()[0], aot.status()[1]
    name = "skewscope.analysis.stats:grouped_weighted_median"
    assert aot.functions_for(name)
    monkeypatch.setattr(aot, "sources_stats", lambda files: [])      # a file moved since the build ...
    monkeypatch.setattr(aot, "sources_digest", lambda files: "0" * 32)   # ... and its bytes changed
    monkeypatch.setattr(aot, "_state", None)
    assert aot.functions_for(name) == {}
    assert "stale" in aot.status()[1]
    monkeypatch.undo()
    # a manifest from another build than the module
    man = pickle.loads(aot.MANIFEST.read_bytes())
    man["build_id"] ^= 1
    other = tmp_path / "_aot.pkl"
    other.write_bytes(pickle.dumps(man))
    monkeypatch.setattr(aot, "MANIFEST", other)
    monkeypatch.setattr(aot, "_state", None)
    assert aot.functions_for(name) == {}
    assert "different builds" in aot.status()[1]
    monkeypatch.setenv("SKEWSCOPE_AOT", "0")
    monkeypatch.setattr(aot, "MANIFEST", aot.PKG / "_aot.pkl")
    monkeypatch.setattr(aot, "_state", None)
    assert aot.functions_for(name) == {} and "disabled" in aot.status()[1]
    monkeypatch.undo()
    monkeypatch.setattr(aot, "_state", None)
    assert aot.status()[0]


def _with_manifest(monkeypatch, tmp_path, **change):
    """aot's state from a copy of the built manifest with `change` applied (None: key removed)."""
    man = pickle.loads(aot.MANIFEST.read_bytes())
    for k, v in change.items():
        if v is None:
            man.pop(k, None)
        else:
            man[k] = v
    other = tmp_path / "_aot.pkl"
    other.write_bytes(pickle.dumps(man))
    monkeypatch.setattr(aot, "MANIFEST", other)
    monkeypatch.setattr(aot, "_state", None)
    return man


def test_unchanged_stats_skip_the_digest_and_moved_ones_fall_back_to_it(monkeypatch, tmp_path):
    """The check reads no file while every file's (mtime_ns, size) is the build's; when one
    moved (an edit, a checkout), or the manifest has no stats, the digest of the bytes decides."""
    assert aot.status()[0], aot.status()[1]
    man = pickle.loads(aot.MANIFEST.read_bytes())
    files = man["files"]
    now = [(os.stat(aot.PKG / f).st_mtime_ns, os.stat(aot.PKG / f).st_size) for f in files]
    moved = [(m + 1, n) for m, n in now[:1]] + now[1:]

    def no_read(files):
        raise AssertionError("the files were read although their stats are the build's")
    with monkeypatch.context() as mp:      # the stats as now, a digest of other bytes: current, nothing read
        mp.setattr(aot, "sources_digest", no_read)
        _with_manifest(mp, tmp_path, stats=now, digest="0" * 32)
        assert aot.status()[0], aot.status()[1]
    _with_manifest(monkeypatch, tmp_path, stats=moved)             # moved, same bytes: current
    assert aot.status()[0], aot.status()[1]
    _with_manifest(monkeypatch, tmp_path, stats=None)              # a manifest without stats: the digest
    assert aot.status()[0], aot.status()[1]
    _with_manifest(monkeypatch, tmp_path, stats=moved, digest="0" * 32)   # moved, other bytes: stale
    assert not aot.status()[0] and "stale" in aot.status()[1]
    missing = [None] + now[1:]      # a file gone: its stats are None, never the build's
    assert aot.sources_stats(["no/such/file.py"] + files[1:]) == missing
    monkeypatch.undo()
    monkeypatch.setattr(aot, "_state", None)
    assert aot.status()[0]
