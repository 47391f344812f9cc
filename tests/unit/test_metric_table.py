"""The metric table (skewscope/outputs/metrics.py) against everything that names a metric.

- the exposition of a real `skewscope export --from FILE --once` (a generated capture
  with every kind of traffic): every family is in the table with its type, labels (names
  and order) and help, every table row is emitted, and the node counters equal the
  generator's ground truth;
- the recording rules, the alerts and the Grafana dashboard (docs/prometheus/): every
  metric their PromQL names is a table series (counters `_total`, histograms
  `_bucket/_sum/_count`) or a recording rule defined in skewscope-rules.yml;
- `skewscope cluster`: every query it sends names only table series or recorded series
  that the rules file defines; neither it nor the exporter spells a metric name itself;
- docs/fleet.md: its generated list is the table.
"""
from __future__ import annotations

import ast
import collections
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from skewscope.outputs import cluster as C
from skewscope.outputs import metrics as M

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "docs" / "prometheus"
RULES = PROM / "skewscope-rules.yml"
ALERTS = PROM / "skewscope-alerts.yml"
DASHBOARD = PROM / "skewscope-grafana.json"
# metrics Prometheus itself makes (not the exporter's)
PROMETHEUS_OWN = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}


# ---- a small PromQL scanner: the metric names an expression reads ------------------------------
PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
                   "unless", "offset", "inf", "nan"}


def promql_metrics(expr: str) -> set:
    """Metric names (incl. recorded `level:metric:ops` names) read by a PromQL expression:
    identifiers that are not functions, keywords, label names in by/on/... lists, label
    matchers, strings or durations."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)         # strings
    e = re.sub(r"\{[^}]*\}", "", e)                                          # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)                                         # ranges, subqueries
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", e)  # label lists
    out = set()
    for m in re.finditer(r"(?<![\w:.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\(|\s+(?:by|without)\b)?", e):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in PROMQL_KEYWORDS:   # a function or an aggregation
            continue
        out.add(name)
    return out


def test_promql_scanner_on_known_expressions():
    """The scanner itself, on expressions whose metrics are known by hand."""
    e = ('sum by (src, dst) (rate(foo_bytes_total{src!="_overflow", a=~"x|y"}[5m])) / on (src) group_left () '
         '(bar:baz:rate5m > 0) and on () count(up{job="skewscope"}) >= 3 or histogram_quantile(0.5, '
         'sum by (le) (rate(h_bucket[5m]))) unless scalar(avg(q)) * 8')
    assert promql_metrics(e) == {"foo_bytes_total", "bar:baz:rate5m", "up", "h_bucket", "q"}
    assert promql_metrics('x{a="sum(b)"} offset 5m') == {"x"}


def recorded_rules() -> dict:
    """record name -> expr, from the rules file."""
    doc = yaml.safe_load(RULES.read_text())
    return {r["record"]: r["expr"] for g in doc["groups"] for r in g["rules"] if "record" in r}


def alert_exprs() -> dict:
    doc = yaml.safe_load(ALERTS.read_text())
    return {r["alert"]: r["expr"] for g in doc["groups"] for r in g["rules"] if "alert" in r}


def dashboard_exprs() -> list:
    out = []

    def walk(o, where):
        if isinstance(o, dict):
            if isinstance(o.get("expr"), str):
                out.append((where, o["expr"]))
            for k, v in o.items():
                walk(v, o.get("title", where) if isinstance(o.get("title"), str) else where)
        elif isinstance(o, list):
            for v in o:
                walk(v, where)

    walk(json.loads(DASHBOARD.read_text()), "dashboard")
    return out


def unknown(names: set, recorded: set) -> set:
    return {n for n in names if n not in M.series_names() and n not in recorded and n not in PROMETHEUS_OWN}


# ---- the exposition -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def exposition(tmp_path_factory):
    """`skewscope export --from FILE --once` of the generator's `mixed` preset (ring,
    all-to-all, pipeline, loss, PFC, CNPs, background UDP) and its ground truth."""
    d = tmp_path_factory.mktemp("ssp-mt")
    pcap = d / "mixed.pcap"
    r = subprocess.run([sys.executable, "-m", "skewscope.cli", "gen", "mixed", "-o", str(pcap), "--snaplen", "128"],
                       capture_output=True, text=True, timeout=300, cwd=d)
    assert r.returncode == 0, r.stderr
    truth = json.loads((d / "mixed.truth.json").read_text())
    # an inventory of the truth's nodes: skewscope_inventory_info is emitted too
    ips = sorted({x for fl in truth["flows"] for x in (fl["src"], fl["dst"])})
    (d / "inv.csv").write_text("ip,host\n" + "".join(f"{ip},host-{k}\n" for k, ip in enumerate(ips)))
    r = subprocess.run([sys.executable, "-m", "skewscope.cli", "export", "--from", str(pcap), "--once",
                        "--node", "dpu-mt", "--inventory", str(d / "inv.csv")],
                       capture_output=True, text=True, timeout=300, cwd=d)
    assert r.returncode == 0, r.stderr
    return r.stdout, truth


def test_every_emitted_family_is_a_table_row_with_its_type_labels_and_help(exposition):
    text, _ = exposition
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    ours = {n: f for n, f in fams.items() if n.startswith("skewscope_")}
    other = set(fams) - set(ours)
    assert other and all(n.startswith("process_") for n in other), other   # ProcessCollector only
    # the parser names a counter family without _total
    want = {m.base: m for m in M.METRICS}
    assert set(ours) == set(want), (set(ours) ^ set(want))
    for name, fam in ours.items():
        spec = want[name]
        assert fam.type == spec.type, name
        assert fam.documentation == spec.help, name
        assert fam.samples, f"{name}: no series in a capture that has every kind of traffic"
        for s in fam.samples:
            assert s.name in spec.series_names(), (name, s.name)
            assert set(s.labels) - {"le"} == set(spec.labels), (s.name, s.labels)


def test_node_counters_equal_the_generators_truth(exposition):
    """The values behind the table's node rows, against the generator (not the exporter)."""
    text, truth = exposition
    s = collections.defaultdict(dict)
    for fam in text_string_to_metric_families(text):
        for x in fam.samples:
            s[x.name][frozenset(x.labels.items())] = x.value
    frames = {dict(k)["category"]: v for k, v in s[M.FRAMES.name].items()}
    assert sum(frames.values()) == truth["frames"]
    assert frames["accounted"] == truth["roce_frames"]
    pause = {int(dict(k)["priority"]): v for k, v in s[M.PFC_PAUSE_FRAMES.name].items()}
    assert [pause[p] for p in range(8)] == truth["pfc"]["per_priority"]
    pairs = collections.defaultdict(int)
    for f in truth["flows"]:
        pairs[(f["src"], f["dst"])] += f["bytes"]
    got = collections.defaultdict(float)
    for k, v in s[M.PEER_BYTES.name].items():
        d = dict(k)
        got[(d["src"], d["dst"])] += v
    assert {k: int(v) for k, v in got.items()} == dict(pairs)
    assert s[M.FLOWS.name][frozenset({("node", "dpu-mt")})] == len(truth["flows"])


# ---- rules, alerts, dashboard ----------------------------------------------------------------
def test_rules_read_only_table_metrics_or_earlier_rules():
    rec = recorded_rules()
    assert len(rec) >= 20
    used = set()
    for name, expr in rec.items():
        names = promql_metrics(expr)
        assert names, (name, expr)
        assert not unknown(names, set(rec)), (name, unknown(names, set(rec)))
        used |= names
    # the matrix rules cover every per-pair counter cluster reads
    assert {spec.name for _, spec in C.PAIR_SERIES} | {M.PEER_NAKS.name, M.DESTINATION_BUSY_SECONDS.name} <= used


def test_alerts_read_only_table_metrics_or_recorded_series():
    rec = set(recorded_rules())
    alerts = alert_exprs()
    assert len(alerts) >= 5
    for name, expr in alerts.items():
        names = promql_metrics(expr)
        assert names, name
        assert not unknown(names, rec), (name, unknown(names, rec))


def test_dashboard_reads_only_table_metrics_or_recorded_series():
    rec = set(recorded_rules())
    exprs = dashboard_exprs()
    assert len(exprs) >= 5
    for where, expr in exprs:
        names = promql_metrics(expr)
        assert names, where
        assert not unknown(names, rec), (where, unknown(names, rec))


def test_a_misspelt_metric_is_caught():
    rec = set(recorded_rules())
    assert unknown(promql_metrics("rate(skewscope_peer_byte_total[5m])"), rec) == {"skewscope_peer_byte_total"}
    assert unknown(promql_metrics("dst:skewscope_nope:rate5m"), rec) == {"dst:skewscope_nope:rate5m"}
    assert not unknown(promql_metrics("rate(skewscope_message_size_bytes_count[5m])"), rec)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing (Debian package prometheus)")
def test_rule_files_pass_promtool():
    r = subprocess.run(["promtool", "check", "rules", str(RULES), str(ALERTS)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout + r.stderr


# ---- cluster and the exporter's source ---------------------------------------------------------
class _RecordingPrometheus(C.Prometheus):
    """Answers every query with one plausible sample and keeps the expressions."""

    def __init__(self):
        super().__init__("http://127.0.0.1:1")
        self.exprs = []

    def query(self, expr, at=None):
        self.exprs.append(expr)
        if expr.startswith("count("):
            return [({}, 3.0)]
        return [({"node": "dpu-1", "src": "10.0.0.1", "dst": "10.0.0.2", "class": "bulk", "syndrome": "rnr",
                  "category": "accounted", "priority": "3"}, time.time())]


@pytest.mark.parametrize("window,selector,rules", [("5m", "", True), ("5m", "", False), ("all", "", True),
                                                   ("15m", 'job="dpus"', True)])
def test_cluster_queries_name_only_table_or_recorded_series(window, selector, rules):
    prom = _RecordingPrometheus()
    f = C.Fetcher(prom, window, selector=selector, use_rules=rules)
    f.fetch()
    f.observers("10.0.0.1", "10.0.0.2")
    rec = set(recorded_rules())
    names = set()
    for e in prom.exprs:
        names |= promql_metrics(e)
    assert not unknown(names, rec), unknown(names, rec)
    recorded_used = names & rec
    if window == "5m" and rules and not selector:
        assert f.via_rules
        # every recorded series cluster reads in rule mode exists in the rules file
        assert {n for n in names if ":" in n} == recorded_used and len(recorded_used) >= 13
    else:
        assert not recorded_used
        assert {spec.name for _, spec in C.PAIR_SERIES} <= names


@pytest.mark.parametrize("module", ["skewscope/outputs/exporter.py", "skewscope/outputs/cluster.py"])
def test_no_metric_name_is_spelt_outside_the_table(module):
    tree = ast.parse((ROOT / module).read_text())
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    hits = [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
            and re.search(r"skewscope_[a-z]", n.value)]
    assert not hits, hits


# ---- docs -------------------------------------------------------------------------------------
def test_fleet_docs_list_is_the_table():
    doc = (ROOT / "docs" / "fleet.md").read_text()
    m = re.search(r"<!-- metric-table:[^\n]*-->\n(.*?)<!-- end metric-table -->", doc, re.S)
    assert m, "docs/fleet.md lost its metric-table markers"
    assert m.group(1) == M.markdown(), "regenerate the list: python -m skewscope.outputs.metrics"
    # and no other metric name in the page is one the table (or the rules) lacks
    rec = set(recorded_rules())
    # (a name followed by `*` or `{` is a pattern: src_dst_class:skewscope_peer_*:rate5m)
    named = set(re.findall(r"[\w:]*skewscope_[\w:]*(?![\w:*{])", doc)) - {""}
    assert len(named) >= len(M.METRICS), sorted(named)
    named -= set(M.BY_NAME)                 # a histogram's family name is fine in prose
    assert not unknown(named, rec), unknown(named, rec)
