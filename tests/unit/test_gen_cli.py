"""Scenario files, presets, the `gen` command and its error handling."""
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from skewscope import gen as skewgen
from skewscope.cli.gen import gen
from skewscope.gen import ScenarioError, load_scenario, pcapio
from skewscope.gen.scenario import parse_size

SCEN = {
    "nodes": 4, "iterations": 2, "period_ms": 2,
    "workloads": [{"kind": "ring_allreduce", "bytes": "1MiB", "channels": 1}],
    "pathologies": [{"kind": "straggler", "node": 1, "rate_factor": 0.5}],
}
YAML = """\
# a small scenario
nodes: 4
iterations: 2
period_ms: 2
workloads:
  - kind: ring_allreduce
    bytes: 1MiB
    channels: 1
pathologies:
  - {kind: straggler, node: 1, rate_factor: 0.5}
"""


def run(*args):
    return subprocess.run([sys.executable, "-m", "skewscope.gen", *args], capture_output=True,
                          text=True, timeout=120)


def test_yaml_and_json_files_load_the_same(tmp_path):
    y = tmp_path / "s.yaml"
    y.write_text(YAML)
    j = tmp_path / "s.json"
    j.write_text(json.dumps(SCEN))
    a, b = load_scenario(str(y)), load_scenario(str(j))
    a.pop("name"), b.pop("name")
    assert a == b
    c1, c2 = skewgen.generate(str(y), seed=3), skewgen.generate(SCEN, seed=3)
    assert (c1.pkts["ts"] == c2.pkts["ts"]).all() and len(c1) == len(c2)


def test_parse_size():
    assert parse_size("1MiB") == 1 << 20 and parse_size("64k") == 64000
    assert parse_size(4096) == 4096 and parse_size("512 KiB") == 512 * 1024
    with pytest.raises(ScenarioError):
        parse_size("lots")


@pytest.mark.parametrize("bad, msg", [
    ({"nodes": 4, "workloads": []}, "workloads"),
    ({"nodes": 4, "workloads": [{"kind": "ring"}]}, "kind must be one of"),
    ({"nodes": 4, "workloads": [{"kind": "ring_allreduce", "byts": 1}]}, "unknown key"),
    ({"nodes": 4, "workloads": [{"kind": "ring_allreduce", "members": [0, 9]}]}, "node must be"),
    ({"nodes": 4, "mtu": 1500, "workloads": [{"kind": "ring_allreduce"}]}, "mtu"),
    ({"nodes": 4, "workloads": [{"kind": "ring_allreduce"}],
      "pathologies": [{"kind": "loss"}]}, "pairs, into or from"),
    ({"nodes": 4, "workloads": [{"kind": "ring_allreduce", "bytes": "huge"}]}, "not a size"),
])
def test_bad_scenarios(bad, msg):
    with pytest.raises(ScenarioError, match=msg):
        skewgen.generate(bad)


def test_list_presets():
    r = CliRunner().invoke(gen, ["--list-presets"])
    assert r.exit_code == 0
    lines = r.output.strip().splitlines()
    assert [ln.split()[0] for ln in lines] == list(skewgen.PRESETS)
    assert all(len(ln.split(None, 1)) == 2 for ln in lines)
    required = {"ring-healthy", "ring-straggler", "tree-healthy", "alltoall-healthy",
                "moe-hot-expert", "incast", "congestion", "loss", "pfc", "pipeline-bubbles",
                "slow-link", "tp-decode", "tp-decode-prefill", "moe-decode", "ipv6-ring",
                "vlan-alltoall", "demo-mix", "mixed"}
    assert required <= set(skewgen.PRESETS)


def test_python_dash_m_list_presets():
    r = run("--list-presets")
    assert r.returncode == 0 and r.stdout.startswith("ring-healthy")


def test_gen_writes_pcap_and_truth(tmp_path):
    out = tmp_path / "t.pcap"
    r = CliRunner().invoke(gen, ["tp-decode", "-o", str(out), "--seed", "5", "--snaplen", "96"])
    assert r.exit_code == 0, r.output
    t = json.loads((tmp_path / "t.truth.json").read_text())
    assert t["seed"] == 5 and t["frames"] > 0
    raw = out.read_bytes()
    assert raw[:4] == bytes.fromhex("4d3cb2a1")  # 0xa1b23c4d little-endian
    assert int.from_bytes(raw[20:24], "little") == 1
    assert "wrote" in r.output and str(t["frames"]) in r.output


def test_library_write(tmp_path):
    cap = skewgen.write("loss", tmp_path / "x.pcap", seed=2)
    assert (tmp_path / "x.pcap").exists() and (tmp_path / "x.truth.json").exists()
    assert json.loads((tmp_path / "x.truth.json").read_text())["frames"] == len(cap)


@pytest.mark.parametrize("args, needle", [
    (["no-such-preset", "-o", "{d}/a.pcap"], "no preset or scenario file"),
    (["{d}/bad.yaml", "-o", "{d}/a.pcap"], "bad YAML"),
    (["{d}/bad.json", "-o", "{d}/a.pcap"], "bad JSON"),
    (["{d}/unknown.yaml", "-o", "{d}/a.pcap"], "unknown key"),
    (["loss", "-o", "{d}/missing/a.pcap"], "does not exist"),
    (["loss", "-o", "{d}"], "is a directory"),
    (["loss"], "give -o"),
    (["loss", "--send", "sgt-no-such-if0"], "send failed"),
])
def test_bad_input_one_line_no_traceback(tmp_path, args, needle):
    (tmp_path / "bad.yaml").write_text("nodes: [\n")
    (tmp_path / "bad.json").write_text("{nodes: 4")
    (tmp_path / "unknown.yaml").write_text("nodes: 4\nwokloads: []\n")
    r = run(*[a.format(d=tmp_path) for a in args])
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    assert needle in r.stderr, r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("Error")]
    assert len(err) == 1
    assert not (tmp_path / "a.pcap").exists()


def test_no_half_written_pcap(tmp_path, monkeypatch):
    cap = skewgen.generate("ring-healthy")
    src = cap._source()
    calls = {"n": 0}
    orig = pcapio.FrameSource.fill

    def boom(self, *a, **k):
        calls["n"] += 1
        if calls["n"] > 1:
            raise OSError(28, "No space left on device")
        return orig(self, *a, **k)

    monkeypatch.setattr(pcapio.FrameSource, "fill", boom)
    out = tmp_path / "x.pcap"
    out.write_bytes(b"old")
    with pytest.raises(OSError):
        pcapio.write_pcap(src, str(out), chunk_bytes=1 << 20)
    assert out.read_bytes() == b"old"  # untouched
    assert os.listdir(tmp_path) == ["x.pcap"]  # temp file removed
