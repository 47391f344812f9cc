"""`skewscope mirror` without root: the exact tc rules it would install (--dry-run), and
the error paths. The rules themselves are exercised on real veths in
tests/integration/test_mirror.py."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from skewscope.cli import main
from skewscope.sources import mirror as M

runner = CliRunner()


def dry(*args):
    r = runner.invoke(main, ["mirror", "add", "--from", "p0", "--to", "mon0", "--dry-run", *args])
    assert r.exit_code == 0, r.output
    return r.output.strip().splitlines()


def test_dry_run_ingress_u32_rules():
    lines = dry()
    assert lines[0] == "tc qdisc add dev p0 clsact"
    assert len(lines) == 4
    v4, v6, v1 = lines[1:]
    assert "ingress prio 49376 protocol ip u32 match ip protocol 17 0xff match ip dport 4791 0xffff" in v4
    assert "ingress prio 49377 protocol ipv6 u32 match ip6 protocol 17 0xff match ip6 dport 4791 0xffff" in v6
    assert "ingress prio 49378 protocol 0x8915 u32 match u32 0 0" in v1
    for ln in lines[1:]:
        assert ln.endswith("action mirred egress mirror dev mon0 cookie 736b657773636f7065")


def test_dry_run_both_directions_use_distinct_priorities():
    lines = dry("--direction", "both")[1:]
    assert len(lines) == 6
    prios = [int(ln.split(" prio ")[1].split()[0]) for ln in lines]
    assert len(set(prios)) == 6
    assert all(" egress prio " in ln for ln, p in zip(lines, prios) if p >= 49379)


def test_dry_run_flower_skip_sw_to_ingress_netns():
    lines = dry("--flower", "--skip-sw", "--to-ingress", "--netns", "ssd-x-sw")
    assert lines[0].startswith("tc -n ssd-x-sw qdisc add dev p0 clsact")
    assert "protocol ip flower skip_sw ip_proto udp dst_port 4791" in lines[1]
    assert "protocol 0x8915 flower skip_sw action" in lines[3]
    assert all("mirred ingress mirror dev mon0" in ln for ln in lines[1:])
    assert all(int(ln.split(" prio ")[1].split()[0]) >= 49382 for ln in lines[1:])


def test_priority_encodes_direction_and_kind():
    for flower in (False, True):
        for d in ("ingress", "egress"):
            for _, off in M._PROTOS:
                p = M.prio(d, off, flower)
                assert M.PRIO_BASE <= p <= M.PRIO_MAX and M._prio_direction(p) == d


def test_cookie_spells_skewscope():
    assert bytes.fromhex(M.COOKIE) == b"skewscope"


@pytest.mark.parametrize("sub", [["add", "--from", "lo", "--to", "lo"], ["del", "--from", "lo"], ["list"]])
def test_not_root_is_exit_4(monkeypatch, sub):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    r = runner.invoke(main, ["mirror", *sub])
    assert r.exit_code == 4 and "needs root" in r.stderr and r.stderr.count("\n") == 1


def test_same_interface_is_a_usage_error(monkeypatch):
    monkeypatch.setattr("skewscope.bpf.loader.check_privileges", lambda: None)
    r = runner.invoke(main, ["mirror", "add", "--from", "lo", "--to", "lo"])
    assert r.exit_code == 2 and "loop" in r.stderr


@pytest.mark.parametrize("sub,name", [(["add", "--from", "ssu-nosuch0", "--to", "lo"], "ssu-nosuch0"),
                                      (["add", "--from", "lo", "--to", "ssu-nosuch1"], "ssu-nosuch1"),
                                      (["del", "--from", "ssu-nosuch2"], "ssu-nosuch2"),
                                      (["list", "--from", "ssu-nosuch3"], "ssu-nosuch3")])
def test_missing_interface_is_exit_6(monkeypatch, sub, name):
    monkeypatch.setattr("skewscope.bpf.loader.check_privileges", lambda: None)
    r = runner.invoke(main, ["mirror", *sub])
    assert r.exit_code == 6 and name in r.stderr and "does not exist" in r.stderr


def test_missing_tc_binary_is_one_line(monkeypatch):
    monkeypatch.setattr("skewscope.bpf.loader.check_privileges", lambda: None)
    monkeypatch.setattr("shutil.which", lambda name: None)
    monkeypatch.setattr("os.path.exists", lambda p: False)
    r = runner.invoke(main, ["mirror", "list", "--from", "lo"])
    assert r.exit_code == 3 and "iproute2" in r.stderr and r.stderr.count("\n") == 1


def test_required_options():
    r = runner.invoke(main, ["mirror", "add", "--from", "p0"])
    assert r.exit_code == 2 and "--to" in r.output
    r = runner.invoke(main, ["mirror", "add", "--from", "p0", "--to", "x", "--direction", "sideways"])
    assert r.exit_code == 2
