"""The shipped alert rules carry the labels Alertmanager routes on (docs/fleet.md "Routing
alerts to a controller"): `kind` = a finding kind of the detector registry (or
exporter_down, the exporter itself) and, where the alert is about a node, `ip` = a label
its expression keeps (dst or src). The real chain: tests/integration/test_alertmanager.py."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from skewscope.analysis.detectors import REGISTRY

yaml = pytest.importorskip("yaml", reason="PyYAML (a test dependency) is needed to read the rule files")

ALERTS = Path(__file__).resolve().parents[2] / "docs" / "prometheus" / "skewscope-alerts.yml"
KINDS = {k.name for d in REGISTRY for k in d.kinds} | {"exporter_down"}


def rules():
    doc = yaml.safe_load(ALERTS.read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


@pytest.mark.parametrize("rule", rules(), ids=lambda r: r["alert"])
def test_every_alert_has_a_kind_and_its_ip(rule):
    labels = rule["labels"]
    assert labels.get("kind") in KINDS, (rule["alert"], labels.get("kind"))
    assert labels.get("severity") in ("info", "warning", "critical")
    expr = rule["expr"]
    by_node = re.match(r"\s*(src_dst|src|dst):", expr)
    if by_node:                               # a per-node or per-pair series: it names the node
        m = re.fullmatch(r"\{\{ \$labels\.(src|dst) \}\}", labels.get("ip", ""))
        assert m, (rule["alert"], labels.get("ip"))
        assert m.group(1) in by_node.group(1).split("_"), (rule["alert"], expr)
    else:
        assert "ip" not in labels, rule["alert"]


def test_kinds_match_the_alerts_question():
    by = {r["alert"]: r["labels"]["kind"] for r in rules()}
    assert by["SkewscopeHotDestination"] == "hot_destination"
    assert by["SkewscopeRingStraggler"] == "ring_straggler"
    assert by["SkewscopeExporterDown"] == "exporter_down"
