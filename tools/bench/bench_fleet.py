"""`skewscope cluster` on a real Prometheus holding N DPUs' series (issue 29; docs/fleet.md
"Measured at scale").

Exporting 1,000 generated views is too slow, so the fleet is built from a few template
groups: each is generated (`skewscope gen PRESET --views DIR`: one pcap per node, with its
ground truth) and each of its views exported once (`skewscope export --from VIEW --once
--format openmetrics --node dpuK --node-ip IP`: the exporter's exact text). Instance g of a
template is that text with every 10.0.0.x address rewritten to 10.(g>>8).(g&255).x and
node="dpuK" to node="gG-K". Templates: an 8-node TP decode group with a slow shard, an
8-node EP decode all-to-all with a hot expert, an incast (each exactly once in the fleet),
then healthy TP decode, EP decode and training-ring groups until N nodes.

Each DPU's text is written --samples times, --step s apart, counters and histograms scaled
by (k+1)/samples (a steady rate), gauges as they are and the last-read gauge = the sample's
time; `promtool tsdb create-blocks-from openmetrics` builds the TSDB; Prometheus (the OS
package) serves it; `skewscope cluster --window samples*step --at T --json --stats` runs
as a user runs it (the raw increase() queries). Then the recording-rules path: the rules
`cluster` reads (docs/prometheus/skewscope-rules.yml's first group) are evaluated over the
backfilled samples by `promtool tsdb create-blocks-from rules` against that Prometheus,
their blocks moved into its TSDB, Prometheus restarted, and `cluster --window 5m` reads
the recorded series (--no-rules skips this). --baseline CHECKOUT runs that checkout's
`cluster` on the same Prometheus too and says whether the documents are the same (minus
meta.query_seconds; metrics.traffic_matrix compared as its nonzero pairs).

Per N, one line per path:
  N nodes: D DPUs, S series, Q queries, R samples, wall S s, cpu S s, peak M MiB,
           prometheus peak M MiB (cpu S s; queries S s of the wall), named yes|no (...), other findings K,
           wall per node X the first row's
  N nodes, recording rules (--window 5m): the same figures; rule backfill S s
  N nodes, same document as CHECKOUT: raw yes|NO, rules yes|NO          (--baseline)
Run under `flock /work/.heavy.lock` on a shared machine.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PY = [sys.executable, "-m"]
sys.path.insert(0, str(ROOT))
from skewscope.testbed.prometheus import PrometheusError, Server  # noqa: E402

T0 = 1_790_000_000            # the last sample's time (the fleet's "now"; --at)
RULE_WINDOW = "5m"            # the recording rules' window (outputs/cluster.py RULE_WINDOW)
TPD = {"kind": "decode_tp", "layers": 8, "allreduces_per_layer": 2, "tokens": 5, "hidden": 8192,
       "batch": 1, "dtype_bytes": 2, "compute_gap_us": 2000, "layer_compute_us": 10}
# name, preset or scenario, seed, the finding kinds that name its pathology (None: healthy)
TEMPLATES = (
    ("tp-slow", {"nodes": 8, "workloads": [dict(TPD, step_sync="dataflow")],
                 "pathologies": [{"kind": "slow_tp_shard", "node": 4, "lag_us": 80}]}, 5, ("slow_tp_shard",)),
    ("ep-hot", "ep-decode-hot-expert", 1, ("hot_destination", "alltoall_destination_skew")),
    ("incast", "incast", 1, ("incast",)),
    ("tp-healthy", {"nodes": 8, "workloads": [dict(TPD, step_sync="barrier")]}, 2, None),
    ("ep-healthy", "ep-decode-healthy", 1, None),
    ("ring-healthy", "ring-healthy", 1, None),
)
HEALTHY = [t[0] for t in TEMPLATES if t[3] is None]
IP = re.compile(r"\b10\.0\.0\.(\d+)\b")
NODE = re.compile(r'node="dpu(\d+)"')


def sh(*args, timeout=600) -> str:
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    if r.returncode != 0:
        sys.exit(f"{' '.join(map(str, args[:6]))}... exited {r.returncode}: {r.stderr[-1500:]}")
    return r.stdout


class Template:
    """One generated group: per node, the exposition parsed once into (series, value, kind)."""

    def __init__(self, name, source, seed, kinds, work: Path):
        self.name, self.kinds = name, kinds
        d = work / name
        if isinstance(source, dict):
            f = work / f"{name}.yaml"
            f.write_text(json.dumps(source))                     # JSON is YAML
            source = str(f)
        sh(*PY, "skewscope.gen", source, "--views", str(d), "--seed", str(seed), "--snaplen", "128",
           "--clock-skew", "5000")
        truth = json.loads((d / "truth.json").read_text())
        self.truth = truth["pathologies"][0]["entities"]["ips"][0] if kinds else None
        self.nodes = []
        for k, p in enumerate(sorted(d.glob("*.pcap"), key=lambda p: tuple(map(int, p.stem.split("."))))):
            om = sh(*PY, "skewscope.cli", "export", "--from", str(p), "--once", "--format", "openmetrics",
                    "--timestamp", str(T0), "--node", f"dpu{k}", "--node-ip", p.stem)
            self.nodes.append(parse(om))

    def size(self) -> int:
        return len(self.nodes)


def parse(om: str):
    """-> [(header or series text, value, kind)]; kind: 'h' header line, 'c' scaled
    (counter/histogram sample), 'g' gauge, 't' the last-read timestamp gauge."""
    out, ftype = [], "gauge"
    for ln in om.splitlines():
        if not ln or ln == "# EOF":
            continue
        if ln.startswith("#"):
            if ln.startswith("# TYPE "):
                ftype = ln.split()[3]
            out.append((ln, 0.0, "h"))
            continue
        series, value, _ts = ln.rsplit(" ", 2)
        kind = "c" if ftype in ("counter", "histogram", "summary") else "g"
        if series.startswith("skewscope_last_read_timestamp_seconds"):
            kind = "t"
        out.append((series, float(value), kind))
    return out


def remap(text: str, g: int) -> str:
    text = IP.sub(lambda m: f"10.{g >> 8}.{g & 255}.{m.group(1)}", text)
    return NODE.sub(lambda m: f'node="g{g}-{m.group(1)}"', text)


def fleet(templates: dict, n: int):
    """[(template, instance g)] until n nodes: the three pathologies once, then healthy groups."""
    out, total, g = [], 0, 0
    order = [t for t in templates.values() if t.kinds]
    while total < n:
        t = order[g] if g < len(order) else templates[HEALTHY[(g - len(order)) % len(HEALTHY)]]
        out.append((t, g))
        total += t.size()
        g += 1
    return out, total


def write_om(path: Path, groups, samples: int, step: float) -> int:
    """The backfill file; returns the number of series."""
    series = 0
    with open(path, "w") as f:
        for t, g in groups:
            for node in t.nodes:
                lines = [(remap(s, g), v, k) for s, v, k in node]
                series += sum(1 for _, _, k in lines if k != "h")
                for i in range(samples):
                    ts = T0 - (samples - 1 - i) * step
                    scale = (i + 1) / samples
                    buf = []
                    for s, v, k in lines:
                        if k == "h":
                            if i == 0:
                                buf.append(s)
                        elif k == "c":
                            buf.append(f"{s} {v * scale!r} {ts}")
                        elif k == "t":
                            buf.append(f"{s} {float(ts)!r} {ts}")
                        else:
                            buf.append(f"{s} {v!r} {ts}")
                    f.write("\n".join(buf) + "\n")
        f.write("# EOF\n")
    return series


def proc_status(pid: int, key: str) -> float:
    """A /proc/PID/status field in MiB (VmHWM: the peak resident set)."""
    for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
        if ln.startswith(key + ":"):
            return int(ln.split()[1]) / 1024
    return float("nan")


def proc_cpu(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def matrix_rules(path: Path) -> None:
    """The rules `cluster --window 5m` reads (docs/prometheus/skewscope-rules.yml's first
    group, over the raw series): the others read these rules' own results, which a
    backfill of one pass would not hold yet."""
    text = (ROOT / "docs" / "prometheus" / "skewscope-rules.yml").read_text()
    rest = text.split("groups:\n", 1)[1]
    first = rest.split("\n\n  - name:", 1)[0]
    path.write_text("groups:\n" + first + "\n")


class Prometheus(Server):
    """The OS package's Prometheus serving a TSDB directory (no scraping)."""

    def __init__(self, d: Path):
        super().__init__(d, tsdb=d / "tsdb", args=("--storage.tsdb.retention.time=100y", "--log.level=warn"))

    def start(self):
        try:
            super().start(ready_timeout=300)
        except PrometheusError as e:
            sys.exit(str(e))


def cluster(root: Path, prom: Prometheus, window: str, out: Path) -> dict:
    """`skewscope cluster` of the checkout `root` as a user runs it: its document, wall time,
    rusage (CPU, peak RSS) and Prometheus' CPU and peak RSS meanwhile."""
    pcpu0 = proc_cpu(prom.proc.pid)
    t = time.monotonic()
    with open(out, "w") as fo, open(out.with_suffix(".err"), "w") as fe:
        child = subprocess.Popen([*PY, "skewscope.cli", "cluster", "--prometheus", prom.url, "--window", window,
                                  "--at", str(T0), "--json", "--stats", "--timeout", "300"],
                                 stdout=fo, stderr=fe, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
        _, status, ru = os.wait4(child.pid, 0)     # this child's own rusage (CPU, peak RSS)
    wall = time.monotonic() - t
    rc = os.waitstatus_to_exitcode(status)
    if rc != 0:
        sys.exit(f"cluster ({root}) exited {rc}: {out.with_suffix('.err').read_text()[-2000:]}")
    return {"doc": json.loads(out.read_text()), "wall": wall, "ru": ru, "prom_cpu": proc_cpu(prom.proc.pid) - pcpu0,
            "prom_peak": proc_status(prom.proc.pid, "VmHWM")}


def comparable(doc: dict) -> str:
    """The document without its timing field (meta.query_seconds), metrics.traffic_matrix
    as its data-carrying pairs (a checkout before issue 29 wrote the dense n x n list)."""
    doc = json.loads(json.dumps(doc))
    doc["meta"].pop("query_seconds", None)
    tm = (doc.get("metrics") or {}).get("traffic_matrix")
    if tm and tm.get("data_bytes") and isinstance(tm["data_bytes"][0], list):
        nz = [(i, j, v) for i, row in enumerate(tm["data_bytes"]) for j, v in enumerate(row) if v > 0]
        doc["metrics"]["traffic_matrix"] = {"ips": tm["ips"], "src": [i for i, _, _ in nz],
                                            "dst": [j for _, j, _ in nz], "data_bytes": [v for _, _, v in nz]}
    return json.dumps(doc, sort_keys=True)


def run_n(templates: dict, n: int, work: Path, samples: int, step: float, rules: bool,
          baseline: Path | None) -> dict:
    """One fleet: backfill, `cluster` on the raw series; with rules, the recording rules'
    results backfilled too (promtool tsdb create-blocks-from rules over the running
    Prometheus, then a restart) and `cluster --window 5m` on them; with baseline, the same
    runs of that checkout's `cluster` and whether its documents are the same."""
    d = work / f"n{n}"
    d.mkdir()
    groups, nodes = fleet(templates, n)
    om = d / "fleet.om"
    t = time.monotonic()
    series = write_om(om, groups, samples, step)
    t_write = time.monotonic() - t
    t = time.monotonic()
    sh("promtool", "tsdb", "create-blocks-from", "openmetrics", str(om), str(d / "tsdb"), timeout=3600)
    t_backfill = time.monotonic() - t
    om.unlink()
    prom = Prometheus(d)
    out = {"n": nodes, "series": series, "groups": groups, "t_write": t_write, "t_backfill": t_backfill,
           "same": {}}
    try:
        prom.start()
        window = f"{int(samples * step)}s"
        out["raw"] = cluster(ROOT, prom, window, d / "raw.json")
        if baseline:
            out["same"]["raw"] = comparable(cluster(baseline, prom, window, d / "raw-base.json")["doc"]) \
                == comparable(out["raw"]["doc"])
        if rules:
            matrix_rules(d / "rules.yml")
            t = time.monotonic()
            sh("promtool", "tsdb", "create-blocks-from", "rules", "--quiet", f"--url={prom.url}",
               f"--start={T0 - 120}", f"--end={T0 + 1}", f"--output-dir={d / 'rule-blocks'}", str(d / "rules.yml"),
               timeout=3600)
            out["t_rules"] = time.monotonic() - t
            prom.stop()
            for b in (d / "rule-blocks").iterdir():
                b.rename(d / "tsdb" / b.name)
            prom.start()
            out["rules"] = cluster(ROOT, prom, RULE_WINDOW, d / "rules.json")
            if not out["rules"]["doc"]["meta"]["via_recording_rules"]:
                sys.exit("cluster --window 5m did not read the backfilled recording rules")
            if baseline:
                out["same"]["rules"] = comparable(cluster(baseline, prom, RULE_WINDOW, d / "rules-base.json")["doc"]) \
                    == comparable(out["rules"]["doc"])
    finally:
        prom.stop()
    return out


def verdict(r: dict, groups):
    """(named, detail, other): each injected entity named by a finding of its kinds (its
    instance's remapped truth address first), and the warning/critical findings blaming
    anyone else."""
    blamed = [(f["kind"], f["entities"]["ips"][0]) for f in r["doc"]["findings"]
              if f["severity"] in ("warning", "critical") and f["entities"]["ips"]]
    want, detail = set(), []
    for t, g in groups:
        if t.kinds:
            ip = remap(t.truth, g)
            want.add(ip)
            hit = any(k in t.kinds and b == ip for k, b in blamed)
            detail.append(f"{t.name} {ip} {'yes' if hit else 'no'}")
    named = all(d.endswith("yes") for d in detail)
    other = sum(1 for _, b in blamed if b not in want)
    return named, detail, other


def line(label: str, r: dict, groups, series: int | None = None) -> str:
    ru = r["ru"]
    named, detail, other = verdict(r, groups)
    m = r["doc"]["meta"]
    return (f"{label}: {len(m['dpus'])} DPUs, {'' if series is None else f'{series:,} series, '}{m['queries']} queries, {m['samples_returned']:,} samples, "
            f"wall {r['wall']:.2f} s, cpu {ru.ru_utime + ru.ru_stime:.2f} s, peak {ru.ru_maxrss / 1024:.0f} MiB, "
            f"prometheus peak {r['prom_peak']:.0f} MiB (cpu {r['prom_cpu']:.2f} s; queries {m['query_seconds']:.2f} s "
            f"of the wall), "
            f"named {'yes' if named else 'no'} ({'; '.join(detail)}), other findings {other}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="100,300,1000", help="comma-separated fleet sizes")
    ap.add_argument("--samples", type=int, default=4, help="samples per series (counters rise steadily)")
    ap.add_argument("--step", type=float, default=15.0, help="seconds between samples (a scrape interval)")
    ap.add_argument("--no-rules", action="store_true", help="skip the recording-rules path (--window 5m)")
    ap.add_argument("--baseline", type=Path, help="another checkout: run its cluster on the same Prometheus "
                                                   "and say whether its documents are the same")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    a = ap.parse_args()
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not found (Debian package prometheus; make setup installs it)")
    work = Path(tempfile.mkdtemp(prefix="bench_fleet."))
    try:
        t = time.monotonic()
        templates = {name: Template(name, src, seed, kinds, work) for name, src, seed, kinds in TEMPLATES}
        print(f"templates: {', '.join(f'{t.name} ({t.size()} nodes)' for t in templates.values())}; "
              f"generated and exported in {time.monotonic() - t:.1f} s; {a.samples} samples {a.step:g} s apart",
              flush=True)
        base = None
        for n in [int(x) for x in a.nodes.split(",")]:
            r = run_n(templates, n, work, a.samples, a.step, not a.no_rules, a.baseline)
            per_node = r["raw"]["wall"] / r["n"]
            if base is None:
                base = per_node
            n_ = r["n"]
            print(f"{line(f'{n_} nodes', r['raw'], r['groups'], r['series'])}, "
                  f"wall per node {per_node / base:.2f}x the first row's; "
                  f"backfill {r['t_write']:.0f} s write + {r['t_backfill']:.0f} s promtool", flush=True)
            if "rules" in r:
                print(f"{line(f'{n_} nodes, recording rules (--window {RULE_WINDOW})', r['rules'], r['groups'])}; "
                      f"rule backfill {r['t_rules']:.0f} s", flush=True)
            if a.baseline:
                print(f"{r['n']} nodes, same document as {a.baseline}: "
                      + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in r["same"].items()), flush=True)
            if not a.keep:
                shutil.rmtree(work / f"n{n}", ignore_errors=True)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
