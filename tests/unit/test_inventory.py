"""The inventory file (issue 27 deliverable 1a): CSV/TSV/YAML forms read exactly, one-line
errors naming the line, 1,000 hosts well under a second (timed loosely: a bound, not a
benchmark), and the CLI-style error contract (SkewscopeError with exit 3, could not run: an invalid file).
Ground truth: the rows written by the test itself, and Python's ipaddress for normalisation."""
from __future__ import annotations

import ipaddress
import time

import pytest

from skewscope.core.errors import EXIT_NOT_RUN
from skewscope.core.inventory import InventoryError, dumps_csv, load, parse

CSV = """# GPU hosts of job llama-70b
ip,host,gpu,rank,job,pod,namespace,instance,rail,rack
10.0.0.1,gpu-01,0,0,llama-70b,train-0,ml,,rail0,r1
10.0.0.2,gpu-01,1,1,llama-70b,train-0,ml,,rail1,r1

fd00::0002,gpu-02,0,2,llama-70b,train-1,ml,,rail0,r2
"""


def test_csv_reads_every_column_and_keeps_extra_labels(tmp_path):
    p = tmp_path / "inv.csv"
    p.write_text(CSV)
    inv = load(p)
    assert len(inv) == 3
    e = inv.get("10.0.0.2")
    assert (e.host, e.gpu, e.rank, e.job, e.pod, e.namespace, e.rail) == ("gpu-01", 1, 1, "llama-70b", "train-0",
                                                                          "ml", "rail1")
    assert e.instance is None and e.extra == {"rack": "r1"}
    # IPv6 normalised as ipaddress does: any spelling finds it
    assert inv.get("fd00::2").host == "gpu-02" and inv.get("FD00:0:0::2").host == "gpu-02"
    assert inv.name("10.0.0.1") == "gpu-01/gpu0" and inv.name("10.9.9.9") == "10.9.9.9"
    assert inv.hosts() == {"gpu-01": ["10.0.0.1", "10.0.0.2"], "gpu-02": [str(ipaddress.ip_address("fd00::2"))]}


def test_tsv_and_yaml_forms_read_the_same(tmp_path):
    csv_inv = parse(CSV, "a.csv", "csv")
    tsv = "\n".join(ln.replace(",", "\t") for ln in CSV.splitlines())
    (tmp_path / "inv.tsv").write_text(tsv)
    yml = tmp_path / "inv.yaml"
    yml.write_text("hosts:\n" + "".join(
        f"  - {{ip: '{e.ip}', host: {e.host}, gpu: {e.gpu}, rank: {e.rank}, job: {e.job}, pod: {e.pod}, "
        f"namespace: {e.namespace}, rail: {e.rail}, rack: {e.extra['rack']}}}\n" for e in csv_inv.entries.values()))
    for other in (load(tmp_path / "inv.tsv"), load(yml)):
        assert other.entries == csv_inv.entries
    # and the CSV writer round-trips (extra labels aside)
    back = parse(dumps_csv(csv_inv), "b.csv")
    assert {k: (v.host, v.gpu, v.rank, v.rail) for k, v in back.entries.items()} == \
        {k: (v.host, v.gpu, v.rank, v.rail) for k, v in csv_inv.entries.items()}


@pytest.mark.parametrize("text, where, words", [
    ("host,gpu\ngpu-01,0\n", "x.csv:1", "no 'ip' column"),
    ("ip,host\n10.0.0.1,\n", "x.csv:2", "no 'host' value"),
    ("ip,host\n10.0.0.1,a\n10.0.0.300,b\n", "x.csv:3", "not an IPv4 or IPv6 address"),
    ("ip,host\n10.0.0.1,a\n# c\n10.0.0.1,b\n", "x.csv:4", "listed twice (first on line 2)"),
    ("ip,host,gpu\n10.0.0.1,a,-1\n", "x.csv:2", "gpu '-1' is not a non-negative integer"),
    ("ip,host\n10.0.0.1,a,extra\n", "x.csv:2", "3 fields, the header has 2"),
    ("ip,host,ip\n", "x.csv:1", "appears twice"),
    ("", "x.csv", "empty inventory"),
])
def test_bad_rows_are_one_line_errors_naming_the_line(tmp_path, text, where, words):
    p = tmp_path / "x.csv"
    p.write_text(text)
    with pytest.raises(InventoryError) as ei:
        load(p)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith(str(tmp_path / where)) and words in msg, msg
    assert ei.value.code == EXIT_NOT_RUN


def test_bad_files(tmp_path):
    with pytest.raises(InventoryError, match="cannot read"):
        load(tmp_path / "missing.csv")
    (tmp_path / "b.yaml").write_text("hosts: [ {ip: 10.0.0.1, host: a}\n")
    with pytest.raises(InventoryError, match="not valid YAML"):
        load(tmp_path / "b.yaml")
    (tmp_path / "c.yaml").write_text("just: a mapping\n")
    with pytest.raises(InventoryError, match="list of entries"):
        load(tmp_path / "c.yaml")
    (tmp_path / "d.csv").write_bytes(b"ip,host\n10.0.0.1,\xff\xfe\n")
    with pytest.raises(InventoryError, match="not UTF-8"):
        load(tmp_path / "d.csv")


def test_thousand_hosts_load_fast(tmp_path):
    rows = ["ip,host,gpu,rank,job"]
    for h in range(1000):
        for g in range(8):
            rows.append(f"10.{h // 250}.{h % 250}.{g + 1},gpu-{h:04d},{g},{h * 8 + g},job-{h % 7}")
    p = tmp_path / "big.csv"
    p.write_text("\n".join(rows) + "\n")
    t = time.perf_counter()
    inv = load(p)
    dt = time.perf_counter() - t
    assert len(inv) == 8000 and inv.get("10.3.249.8").rank == 999 * 8 + 7
    assert dt < 1.0, dt          # 8,000 addresses of 1,000 hosts: well under a second
