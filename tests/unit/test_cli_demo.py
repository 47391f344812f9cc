"""`skewscope demo` without root: it says so and falls back to the offline report of the
same generated traffic. (The live demo is tests/integration/test_demo.py.)"""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from skewscope.cli import main


@pytest.fixture
def not_root(monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 1000)


def test_without_root_falls_back_to_the_offline_report(not_root):
    from skewscope import gen as skewgen
    sg = skewgen
    truth = sg.generate("moe-hot-expert", seed=1).truth      # seed 1: what demo uses for the 1st scenario
    r = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["demo", "--scenario", "moe-hot-expert"])
    assert r.exit_code == 0, r.output
    assert "needs root" in r.stderr and r.stderr.count("\n") <= 2
    out = r.stdout
    assert "=== moe-hot-expert" in out
    # the report is of the generated traffic: the same frame count as the generator's truth
    assert f"frames {truth['frames']}" in out
    # and its biggest flow goes to the hot expert (node 5 = 10.0.0.6 in the truth)
    biggest = max(truth["flows"], key=lambda f: f["bytes"])
    assert biggest["dst"] == "10.0.0.6"
    # the flow table's first row (the report's box has no vertical rules since 19606bd), in the
    # demo inventory's names: node i (10.0.0.i+1) is gpu-(i+1)
    first_row = next(ln for ln in out.splitlines() if ln.split()[:1] and ln.split()[0].startswith("gpu-"))
    assert first_row.split()[1] == "gpu-06/gpu0"
    assert "gpu-06/gpu0 (10.0.0.6)" in out          # the hot expert's findings name it


def test_unknown_scenario_is_a_usage_error(not_root):
    r = CliRunner().invoke(main, ["demo", "--scenario", "no-such-preset"])
    assert r.exit_code == 2 and "no-such-preset" in r.stderr


def test_cleanup_needs_root(not_root):
    r = CliRunner().invoke(main, ["demo", "--cleanup"])
    assert r.exit_code == 4 and "root" in r.stderr


def test_help_has_examples():
    r = CliRunner().invoke(main, ["demo", "--help"])
    assert r.exit_code == 0 and "Examples:" in r.output and "--no-top" in r.output
