#!/usr/bin/env python3
"""Offline path throughput: packets/s of `skewscope report --json FILE.pcap` (end to end, the
CLI as a user runs it, analysis and JSON included) and of the parser alone
(`offline.parse_file`), next to tshark doing the same job (per-QP packet and byte counts via
`-T fields`, aggregated in Python) and a dpkt loop doing it, all measured in this run on the
same capture, with the ratios and each CLI run's peak memory (max RSS).

    .venv/bin/python tools/bench/bench_offline.py [--preset ring-32] [--scale 5] [--repeat 3]
                                                  [--workdir /tmp/skewscope-bench] [--keep] [--accounting]

Captures (generator, snaplen 128: the normal headers-only mirror-port capture): `ring-32`
(2.1 M frames, 32-node ring all-reduce, 4 iterations, 302 MB) and the same scenario with
--scale times the iterations (5: 10.6 M frames, 1.5 GB), which shows the rate once the fixed
start-up cost (Python, numba import, loading the cached kernels) is amortised; a gzip
(level 1) copy of the first shows the rate when decompression is in the loop. The big
files are deleted at the end unless --keep.

Timing: wall clock, best of --repeat for skewscope (tshark and dpkt once: they take
tens of seconds); CPU = user + system seconds of the measured process. The CLI runs like an
installed copy, with bytecode caches (PYTHONDONTWRITEBYTECODE dropped). numba compilation is
excluded: one warm-up run fills the on-disk cache (cache=True) first; the cold first-ever
run is printed separately. The per-QP results of tshark and dpkt are checked against
skewscope's, so all three did the same job. Peak memory: ru_maxrss of each CLI process
(under time(1)), of tshark, and of this process for the in-process parser rows.

The rows not marked "one core" run with SKEWSCOPE_OFFLINE_PIPELINE=auto, the default: captures
of 768 MiB or more are parsed on two cores (skewscope/sources/offline/pipeline.py: the records
parsed into row blocks on the reading thread, the rows accounted in file order on a second);
the "one core" rows run the same with SKEWSCOPE_OFFLINE_PIPELINE=0, for the comparison in the
same run.

Targets (issue 30): >= 100x tshark end to end on the 2 M-frame capture, >= 20 M packets/s
end to end on the 10 M-frame one (issue 16's were 100x and 10 M/s).
"""
from __future__ import annotations

import argparse
import gzip
import os
import resource
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

TARGET_X_TSHARK = 100.0
TARGET_PPS = 20e6
SKEWSCOPE = Path(sys.executable).parent / "skewscope"


def make_captures(work: Path, preset: str, scale: int) -> tuple[Path, Path, Path, int]:
    from skewscope import gen as skewgen
    from skewscope.gen.presets import PRESETS
    base = work / f"{preset}.s128.pcap"
    if not base.exists():
        print(f"generating {preset} (snaplen 128) -> {base} ...", flush=True)
        skewgen.write(preset, base, seed=0, snaplen=128)
    big = work / f"{preset}.s128.it{scale}x.pcap"
    if not big.exists():
        sc = dict(PRESETS[preset])
        sc["iterations"] = int(sc.get("iterations", 1)) * scale
        print(f"generating {preset} with {sc['iterations']} iterations (snaplen 128) -> {big} ...", flush=True)
        cap = skewgen.generate(sc, seed=0)
        cap.write_pcap(big, snaplen=128)
        del cap
    gz = work / f"{preset}.s128.pcap.gz"
    if not gz.exists():
        print(f"compressing -> {gz} ...", flush=True)
        tmp = gz.with_suffix(".tmp")
        with open(base, "rb") as fi, gzip.open(tmp, "wb", compresslevel=1) as fo:
            shutil.copyfileobj(fi, fo, 16 << 20)
        tmp.replace(gz)
    return base, big, gz, scale


def _cpu() -> float:
    """CPU seconds (user + system) of this process and its finished children."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


PEAK = {}


def best(fn, repeat: int) -> tuple[float, float]:
    """(wall, cpu) seconds of the fastest of `repeat` runs (by wall)."""
    runs = []
    for _ in range(repeat):
        t, c = time.perf_counter(), _cpu()
        fn()
        runs.append((time.perf_counter() - t, _cpu() - c))
    return min(runs)


TIME = shutil.which("time") or "/usr/bin/time"


def _timed_cmd(cmd: list, key) -> tuple[list, Path | None]:
    """cmd run under time(1) writing the child's max RSS (KB) to a file: a child forked
    from this big process inherits its RSS high-water mark in getrusage (Linux keeps the
    pre-exec one), so this process cannot read it from os.wait4."""
    if not os.path.exists(TIME):
        return cmd, None
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-offline-rss-{os.getpid()}-{abs(hash(key))}.txt"
    return [TIME, "-f", "%M", "-o", str(out)] + cmd, out


def _wait(p: subprocess.Popen, key, rss: Path | None) -> None:
    """Wait for a child; record its peak RSS (MB) under key."""
    p.wait()
    if rss is not None and rss.exists():
        kb = float(rss.read_text().split()[-1])
        rss.unlink()
        PEAK[key] = max(PEAK.get(key, 0.0), kb / 1024)
    if p.returncode:
        raise subprocess.CalledProcessError(p.returncode, p.args)


#: the CLI runs like an installed copy, as in bench_startup.py: bytecode caches on (a shell
#: or CI with PYTHONDONTWRITEBYTECODE=1 would otherwise compile every module on every run:
#: ~0.1 s of the fixed cost), in a private prefix that the warm-up run fills
CLI_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
CLI_ENV["SKEWSCOPE_OFFLINE_PIPELINE"] = os.environ["SKEWSCOPE_OFFLINE_PIPELINE"] = "auto"


def run_cli(path: Path, one_core: bool = False) -> None:
    key = ("cli", str(path), one_core)
    cmd, rss = _timed_cmd([str(SKEWSCOPE), "report", "--json", str(path)], key)
    env = dict(CLI_ENV, SKEWSCOPE_OFFLINE_PIPELINE="0") if one_core else CLI_ENV
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _wait(p, key, rss)


def cli_peak(path: Path, one_core: bool = False) -> float:
    return PEAK.get(("cli", str(path), one_core), float("nan"))


def one_core(fn):
    """fn() with the pipelined parser off (SKEWSCOPE_OFFLINE_PIPELINE=0) in this process."""
    def run():
        old = os.environ.get("SKEWSCOPE_OFFLINE_PIPELINE")
        os.environ["SKEWSCOPE_OFFLINE_PIPELINE"] = "0"
        try:
            return fn()
        finally:
            if old is None:
                del os.environ["SKEWSCOPE_OFFLINE_PIPELINE"]
            else:
                os.environ["SKEWSCOPE_OFFLINE_PIPELINE"] = old
    return run


def tshark_job(path: Path) -> dict:
    """Per (src, dst, dest QP): packets and wire bytes, from tshark's own RoCE dissector."""
    cmd = ["tshark", "-n", "-r", str(path), "-Y", "infiniband.bth.destqp", "-T", "fields", "-E", "separator=/t",
           "-E", "occurrence=f", "-e", "ip.src", "-e", "ip.dst", "-e", "infiniband.bth.destqp", "-e", "frame.len"]
    agg = defaultdict(lambda: [0, 0])
    cmd, rss = _timed_cmd(cmd, "tshark")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1 << 20)
    for line in p.stdout:
        s, d, q, n = line.rstrip("\n").split("\t")
        a = agg[(s, d, int(q, 16))]
        a[0] += 1
        a[1] += int(n)
    p.stdout.close()
    _wait(p, "tshark", rss)
    return dict(agg)


def dpkt_job(path: Path) -> dict:
    """The same with a dpkt loop (Ethernet/802.1Q/IPv4/UDP 4791/BTH)."""
    import socket
    import struct

    import dpkt
    agg = defaultdict(lambda: [0, 0])
    with open(path, "rb") as f:
        r = dpkt.pcap.Reader(f)
        hdr = struct.Struct("<IIII")
        # dpkt's iterator hides the original length: read record headers ourselves
        f.seek(24)
        while True:
            h = f.read(16)
            if len(h) < 16:
                break
            _, _, incl, orig = hdr.unpack(h)
            buf = f.read(incl)
            try:
                eth = dpkt.ethernet.Ethernet(buf)
            except (dpkt.NeedData, dpkt.UnpackError):
                continue
            ip = eth.data
            if not isinstance(ip, dpkt.ip.IP) or ip.p != 17:
                continue
            udp = ip.data
            if not isinstance(udp, dpkt.udp.UDP) or udp.dport != 4791:
                continue
            bth = bytes(udp.data)
            if len(bth) < 12:
                continue
            a = agg[(socket.inet_ntoa(ip.src), socket.inet_ntoa(ip.dst), int.from_bytes(bth[5:8], "big"))]
            a[0] += 1
            a[1] += orig
        del r
    return dict(agg)


def skewscope_agg(snap) -> dict:
    from skewscope.core.snapshot import ip_str
    return {(ip_str(f["src"], 4), ip_str(f["dst"], 4), int(f["dest_qp"])): [int(f["packets"]), int(f["bytes"])]
            for f in snap.flows}


def accounting_ns(path: Path, rows: int = 1 << 16, reps: int = 20, repeat: int = 5) -> float:
    """The pipelined parse's serial step alone, hot in cache: the first `rows` accounted frames
    of `path` parsed once (scan_rows), then accounted `reps` times (pipeline.account_block)
    into tables already holding their flows; thread CPU ns per row, best of `repeat`. Beside
    the pipeline's own per-row cost it tells compute from the rows' crossing between cores."""
    import numpy as np

    from skewscope.sources.offline import kernel as K
    from skewscope.sources.offline import pipeline
    from skewscope.sources.offline.tables import _NO_IF, _OPTAB, _Tables
    b = np.fromfile(path, np.uint8, count=64 << 20)
    g, st = np.zeros(64, np.int64), np.zeros(K.ST_N, np.int64)
    block = np.empty((rows, K.R_N), np.int64)
    ts_mult = 1 if int.from_bytes(b[:4].tobytes(), "little") == 0xA1B23C4D else 1000
    _, _, n = K.scan_rows(b, 24, len(b), K.FMT_PCAP, False, ts_mult, K.K_ETHERNET, _NO_IF, _NO_IF, _NO_IF, 0, g, st,
                          block, 0, _OPTAB)
    t = _Tables(65536)
    pipeline.account_block(t, block, int(n))
    out = float("inf")
    for _ in range(repeat):
        c = time.thread_time()
        for _ in range(reps):
            t.st[K.ST_EVN] = 0     # the message records stay within their first allocation
            pipeline.account_block(t, block, int(n))
        out = min(out, (time.thread_time() - c) / (reps * int(n)) * 1e9)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="ring-32")
    ap.add_argument("--scale", type=int, default=5, help="the large capture: this many times the preset's iterations")
    ap.add_argument("--keep", action="store_true", help="keep the large capture and the gzip copy in --workdir")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir", default="/tmp/skewscope-bench")
    ap.add_argument("--no-tshark", action="store_true")
    ap.add_argument("--skip-cold", action="store_true", help="do not time the first-ever run (a fresh numba compile)")
    ap.add_argument("--accounting", action="store_true",
                    help="only the accounting's hot per-row cost on the base capture (accounting_ns), then exit")
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    base, big, gz, k = make_captures(work, args.preset, args.scale)
    if args.accounting:
        ns = accounting_ns(base)
        print(f"accounting, hot: {ns:.2f} ns/row (65,536 rows of {base.name}; load {os.getloadavg()[0]:.2f})")
        return 0

    from skewscope.sources import offline
    tiny = work / "tiny.pcap"
    if not tiny.exists():                 # the first 10 records (little-endian pcap)
        with open(base, "rb") as f:
            data = f.read(24 + 10 * (16 + 65536))
        end = 24
        for _ in range(10):
            end += 16 + int.from_bytes(data[end + 8:end + 12], "little")
        tiny.write_bytes(data[:end])

    # cold: a fresh numba cache dir, first ever run (compile) -- measured once, reported apart
    cold = float("nan")
    if not args.skip_cold:
        cold_dir = work / "numba-cold"
        shutil.rmtree(cold_dir, ignore_errors=True)
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", f"from skewscope.sources import offline; offline.parse_file({str(tiny)!r})"],
                       check=True, env=dict(os.environ, NUMBA_CACHE_DIR=str(cold_dir)))
        cold = time.perf_counter() - t
        shutil.rmtree(cold_dir, ignore_errors=True)

    offline.parse_file(tiny)          # warm: load (or build) the on-disk cache in this process
    offline.parse_file(gz)            # ... and the gzip path's
    CLI_ENV["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    run_cli(tiny)                     # ... and for the CLI (analysis kernels too; its bytecode)
    snap = offline.parse_file(base)
    n = int(snap.meta["frames"])
    size = base.stat().st_size

    rows = []   # (name, frames, wall, cpu, peak MB or None)
    w_, c_ = best(lambda: offline.parse_file(base), args.repeat)
    rows.append(("skewscope parser (parse_file, in process)", n, w_, c_, None))
    big_snap = {}
    w_, c_ = best(lambda: big_snap.update(s=offline.parse_file(big)), args.repeat)
    n_big = int(big_snap.pop("s").meta["frames"])
    rows.append((f"skewscope parser, {k}x iterations", n_big, w_, c_, None))
    rows.append((f"skewscope parser, {k}x iterations, one core", n_big,
                 *best(one_core(lambda: offline.parse_file(big)), args.repeat), None))
    rows.append(("skewscope parser, .pcap.gz (zlib level 1)", n, *best(lambda: offline.parse_file(gz), 1), None))
    tiny_w, tiny_c = best(lambda: run_cli(tiny), args.repeat)
    cli = best(lambda: run_cli(base), args.repeat)
    rows.append(("skewscope report --json (CLI, end to end)", n, *cli, cli_peak(base)))
    cli_big = best(lambda: run_cli(big), args.repeat)
    rows.append((f"skewscope report --json, {k}x iterations", n_big, *cli_big, cli_peak(big)))
    rows.append(("skewscope report --json, one core", n, *best(lambda: run_cli(base, True), args.repeat),
                 cli_peak(base, True)))
    rows.append((f"skewscope report --json, {k}x it., one core", n_big,
                 *best(lambda: run_cli(big, True), args.repeat), cli_peak(big, True)))

    dp = {}
    rows.append(("dpkt loop (per-QP packets + bytes)", n, *best(lambda: dp.update(dpkt_job(base)), 1), None))
    ours = skewscope_agg(snap)
    assert dp == ours, "dpkt and skewscope disagree on per-QP packets/bytes"
    tshark = None
    if not args.no_tshark and shutil.which("tshark"):
        ts = {}
        tshark = best(lambda: ts.update(tshark_job(base)), 1)
        rows.append(("tshark -T fields (per-QP packets + bytes)", n, *tshark, PEAK.get("tshark")))
        assert ts == ours, "tshark and skewscope disagree on per-QP packets/bytes"
    dpkt_row = rows[-2] if tshark else rows[-1]
    cpus = len(os.sched_getaffinity(0))
    self_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    print()
    print(f"capture: skewgen {args.preset}, snaplen 128: {n:,} frames, {size / 1e6:.0f} MB ({len(snap.flows)} flows); "
          f"{k}x iterations: {n_big:,} frames, {big.stat().st_size / 1e6:.0f} MB")
    print(f"host: {cpus} CPUs for this process ({os.cpu_count()} online), load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end (wall clock suffers from other load; "
          f"CPU = user + system seconds of the measured process)")
    print(f"{'':46s} {'frames':>10s} {'wall s':>7s} {'cpu s':>7s} {'Mpkt/s':>7s} {'Mpkt/cpu-s':>10s} "
          f"{'x tshark':>8s} {'x dpkt':>6s} {'peak MB':>8s}")
    for name, frames, wall, cpu, peak in rows:
        pps = frames / wall
        xt = f"{pps / (n / tshark[0]):8.0f}" if tshark else f"{'-':>8s}"
        pk = f"{peak:8.0f}" if peak is not None else f"{'-':>8s}"
        print(f"{name:46s} {frames:10,d} {wall:7.2f} {cpu:7.2f} {pps / 1e6:7.2f} {frames / cpu / 1e6:10.2f} "
              f"{xt} {pps / (n / dpkt_row[2]):6.0f} {pk}")
    steady_w = (n_big - n) / max(cli_big[0] - cli[0], 1e-9)
    steady_c = (n_big - n) / max(cli_big[1] - cli[1], 1e-9)
    print(f"\nCLI fixed cost (a 10-frame capture): {tiny_w:.2f} s wall, {tiny_c:.2f} s CPU (Python, numpy and click "
          f"imports, loading the kernels (precompiled module, else numba's cache), analysis, report)")
    print(f"CLI steady state (difference of the two capture sizes): {steady_w / 1e6:.1f} M packets/s wall, "
          f"{steady_c / 1e6:.1f} M packets/CPU-second")
    print(f"first run ever (numba compiles the parser into its cache): {cold:.1f} s")
    print(f"parser alone: {rows[1][3] / n_big * 1e9:.0f} ns CPU per packet")
    tshark_mb = f"; tshark {PEAK['tshark']:.0f} MB" if "tshark" in PEAK else ""
    print(f"peak memory (max RSS): report --json {cli_peak(base):.0f} MB on the {n / 1e6:.1f} M-frame capture, "
          f"{cli_peak(big):.0f} MB on the {n_big / 1e6:.1f} M-frame one (the capture is mapped, not read into "
          f"memory){tshark_mb}; "
          f"this process (in-process parser rows) {self_peak:.0f} MB")
    print(f"tshark on the {n / 1e6:.1f} M-frame capture, this run: "
          + (f"{tshark[0]:.1f} s wall, {tshark[1]:.1f} s CPU" if tshark else "not run"))
    if tshark:
        x2 = (n / cli[0]) / (n / tshark[0])
        xb = (n_big / cli_big[0]) / (n / tshark[0])
        x2c = (n / cli[1]) / (n / tshark[1])
        print(f"target >= {TARGET_X_TSHARK:.0f}x tshark end to end on the {n / 1e6:.1f} M-frame capture, {cpus} CPUs: "
              f"{x2:.0f}x wall "
              f"({x2c:.0f}x CPU) -> {'met' if x2 >= TARGET_X_TSHARK else 'NOT met'}; {xb:.0f}x on the "
              f"{n_big / 1e6:.1f} M-frame one (tshark's rate is per packet, measured on the {n / 1e6:.1f} M-frame "
              f"capture)")
    pb = n_big / cli_big[0]
    print(f"target >= {TARGET_PPS / 1e6:.0f} M packets/s end to end on the {n_big / 1e6:.1f} M-frame capture, "
          f"{cpus} CPUs: "
          f"{pb / 1e6:.1f} M/s wall, {n_big / cli_big[1] / 1e6:.1f} M/CPU-s -> {'met' if pb >= TARGET_PPS else 'NOT met'}"
          f" (fixed cost included); {n / cli[0] / 1e6:.1f} M/s wall on the {n / 1e6:.1f} M-frame capture")
    if not args.keep:
        for f in (big, gz):
            f.unlink(missing_ok=True)
        print(f"(deleted {big.name} and {gz.name}; --keep keeps them)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
