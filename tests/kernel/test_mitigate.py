"""Kernel tier: `skewscope mitigate` (issue 28, deliverables 1 and 5) on a real interface in a
network namespace, with the real tc and the real program.

What the program does to a packet is checked on frames built with scapy (tests/frames.py)
run through the attached program itself (BPF_PROG_TEST_RUN on the filter's program, found by
id as any other process would): the DSCP written, the ECN bits, the rest of the frame byte
for byte, the IPv4 checksum recomputed by scapy; policing against a token bucket worked out
by hand. Safety: a dry run changes nothing (tc qdiscs and filters of both hooks, compared
exactly), revert restores the exact state (also beside a clsact and a foreign filter that were
there before), a TTL ends the action with the applying process SIGKILLed, a foreign filter at
our priority is a one-line refusal, not root is exit 4."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import frames as F
import pytest
from mitharness import apply_then_sigkill, cli, tc_state
from scapy.layers.inet import IP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether

from skewscope.bpf import syscalls as bpfsys

ROCE_WRITE_MIDDLE = 0x07
PRIO = 49392


def prog_fd(ns: str, dev: str, hook: str = "ingress") -> int:
    j = json.loads(subprocess.run(["tc", "-n", ns, "-j", "filter", "show", "dev", dev, hook], capture_output=True,
                                  text=True).stdout or "[]")
    ids = [(f.get("options") or {}).get("prog", {}).get("id") for f in j if f.get("pref") == PRIO]
    ids = [i for i in ids if i]
    assert len(ids) == 1, j
    return bpfsys.prog_fd_by_id(int(ids[0]))


def run_frame(fd: int, frame: bytes) -> tuple[int, bytes]:
    ret, out = bpfsys.prog_test_run_out(fd, frame)
    return (ret if ret < 1 << 31 else ret - (1 << 32)), out


@pytest.fixture
def ns(netns_pair):
    return netns_pair.ns_a, netns_pair.if_a


def base(ns_dev):
    ns_, dev = ns_dev
    return ("-i", dev, "--netns", ns_)


def test_remark_ipv4_sets_dscp_keeps_ecn_and_every_other_byte(ns):
    ns_, dev = ns
    cli("apply", *base(ns), "--flow", "10.0.0.1,10.0.0.2", "--remark", "8", "--yes", "--ttl", "60")
    fd = prog_fd(ns_, dev)
    try:
        hit = F.roce(ROCE_WRITE_MIDDLE, src="10.0.0.1", dst="10.0.0.2", payload=256, tclass=(26 << 2) | 2).frame
        ret, out = run_frame(fd, hit)
        assert ret == -1                                         # TC_ACT_UNSPEC: passed on
        ip_in, ip_out = Ether(hit)[IP], Ether(out)[IP]
        assert ip_out.tos == (8 << 2) | 2                        # DSCP 8, ECN ECT(0) kept
        fixed = IP(bytes(ip_out))
        del fixed.chksum
        assert IP(bytes(fixed)).chksum == ip_out.chksum          # a valid header checksum
        assert out[:15] == hit[:15] and out[16:24] == hit[16:24] and out[26:] == hit[26:]   # only TOS + checksum
        miss = F.roce(ROCE_WRITE_MIDDLE, src="10.0.0.1", dst="10.0.0.3", payload=256, tclass=(26 << 2) | 2).frame
        assert run_frame(fd, miss) == (-1, miss)                 # no rule: untouched
        assert ip_in.tos != ip_out.tos
    finally:
        os.close(fd)
    st = json.loads(cli("status", *base(ns), "--json").stdout)["active"]
    assert len(st) == 1 and st[0]["counters"]["remarked"] == 1 and st[0]["counters"]["packets"] == 1


def test_remark_ipv6_and_qp_match(ns):
    ns_, dev = ns
    cli("apply", *base(ns), "--flow", "fd00::1,fd00::2,0x33", "--remark", "10", "--yes")
    fd = prog_fd(ns_, dev)
    try:
        hit = F.roce(ROCE_WRITE_MIDDLE, src="fd00::1", dst="fd00::2", qp=0x33, payload=64, tclass=(26 << 2) | 1,
                     flow_label=0xABCDE).frame
        _, out = run_frame(fd, hit)
        v6 = Ether(out)[IPv6]
        assert v6.tc == (10 << 2) | 1 and v6.fl == 0xABCDE and out[18:] == hit[18:]
        other_qp = F.roce(ROCE_WRITE_MIDDLE, src="fd00::1", dst="fd00::2", qp=0x34, payload=64).frame
        assert run_frame(fd, other_qp) == (-1, other_qp)
    finally:
        os.close(fd)


def test_police_passes_the_burst_then_drops(ns):
    ns_, dev = ns
    # 8 kbit/s refills 1 byte per ms: the few ms the test runs add < one packet
    cli("apply", *base(ns), "--flow", ",10.0.0.9", "--police", "8k", "--yes")
    fd = prog_fd(ns_, dev)
    try:
        pkt = F.roce(ROCE_WRITE_MIDDLE, src="10.0.0.5", dst="10.0.0.9", payload=1024).frame
        # the default burst: max(64 KiB, 10 ms at the rate) = 65,536 bytes
        fits = 65536 // len(pkt)
        rets = [run_frame(fd, pkt)[0] for _ in range(fits + 3)]
    finally:
        os.close(fd)
    assert rets[:fits] == [-1] * fits and rets[fits:] == [2] * 3      # TC_ACT_SHOT beyond the bucket
    c = json.loads(cli("status", *base(ns), "--json").stdout)["active"][0]["counters"]
    assert c["dropped"] == 3 and c["packets"] == fits + 3


def test_dry_run_changes_nothing_and_revert_restores_exactly(ns):
    ns_, dev = ns
    # someone else's clsact and filter were there first
    subprocess.run(["tc", "-n", ns_, "qdisc", "add", "dev", dev, "clsact"], check=True)
    subprocess.run(["tc", "-n", ns_, "filter", "add", "dev", dev, "ingress", "prio", "7", "protocol", "ip", "u32",
                    "match", "ip", "dst", "10.9.9.9/32", "action", "mirred", "egress", "mirror", "dev", dev],
                   check=True)
    before = tc_state(ns_, dev)
    r = cli("apply", *base(ns), "--flow", "10.0.0.1,10.0.0.2", "--remark", "8")
    assert "dry run" in r.stdout and tc_state(ns_, dev) == before
    cli("apply", *base(ns), "--flow", "10.0.0.1,10.0.0.2", "--remark", "8", "--yes")
    assert tc_state(ns_, dev) != before
    cli("revert", *base(ns), "--all")
    assert tc_state(ns_, dev) == before                      # their clsact and filter untouched


def test_revert_one_keeps_the_others_and_the_last_removes_everything(ns):
    ns_, dev = ns
    before = tc_state(ns_, dev)
    cli("apply", *base(ns), "--flow", "10.0.0.1,10.0.0.2", "--flow", "10.0.0.3,10.0.0.4", "--remark", "8", "--yes")
    ids = [a["id"] for a in json.loads(cli("status", *base(ns), "--json").stdout)["active"]]
    assert ids == [1, 2]
    cli("revert", *base(ns), "1")
    assert [a["id"] for a in json.loads(cli("status", *base(ns), "--json").stdout)["active"]] == [2]
    r = cli("revert", *base(ns), "9", ok=(2,))
    assert len(r.stderr.strip().splitlines()) == 1 and "9" in r.stderr
    cli("revert", *base(ns), "2")
    assert tc_state(ns_, dev) == before


def test_ttl_ends_the_action_after_sigkill_of_the_applying_process(ns):
    ns_, dev = ns
    before = tc_state(ns_, dev)
    # apply, then SIGKILL the process that applied it as soon as the rule is in
    apply_then_sigkill([], f"""
from skewscope.core.netns import in_netns
from skewscope.mitigate.software import Software
from skewscope.mitigate.rules import Rule
with in_netns({ns_!r}):
    Software({dev!r}).apply([Rule("remark", src="10.0.0.1", dst="10.0.0.2", dscp=8, ttl=2, note="t")])
""")
    fd = prog_fd(ns_, dev)
    try:
        hit = F.roce(ROCE_WRITE_MIDDLE, src="10.0.0.1", dst="10.0.0.2", payload=64, tclass=0).frame
        assert Ether(run_frame(fd, hit)[1])[IP].tos == 8 << 2          # active while the TTL runs
        time.sleep(2.3)
        assert run_frame(fd, hit) == (-1, hit)                          # the program ended it by itself
    finally:
        os.close(fd)
    r = cli("status", *base(ns))
    assert "no skewscope mitigation active" in r.stdout and "expired and cleared" in r.stderr
    assert tc_state(ns_, dev) == before                                 # and the next command cleaned up


def test_foreign_filter_at_our_priority_is_refused(ns):
    ns_, dev = ns
    subprocess.run(["tc", "-n", ns_, "qdisc", "add", "dev", dev, "clsact"], check=True)
    subprocess.run(["tc", "-n", ns_, "filter", "add", "dev", dev, "ingress", "prio", str(PRIO), "protocol", "ip",
                    "u32", "match", "ip", "dst", "10.9.9.9/32", "action", "mirred", "egress", "mirror", "dev", dev],
                   check=True)
    before = tc_state(ns_, dev)
    r = cli("apply", *base(ns), "--flow", "10.0.0.1,10.0.0.2", "--remark", "8", "--yes", ok=(7,))
    assert len(r.stderr.strip().splitlines()) == 1 and "not skewscope's" in r.stderr
    assert tc_state(ns_, dev) == before
    assert "no skewscope mitigation" in cli("status", *base(ns)).stdout
    cli("revert", *base(ns), "--all")
    assert tc_state(ns_, dev) == before


def test_bad_input_is_one_line(ns, tmp_path):
    bad = tmp_path / "d.json"
    bad.write_text('{"findings": [\n  {"kind": 1,\n')
    for args, code, word in ((("apply", *base(ns), "--from", bad, "--yes"), 2, "d.json:3"),
                             (("apply", "-i", "nope0", "--flow", "10.0.0.1,", "--remark", "8", "--yes"), 6, "nope0"),
                             (("apply", *base(ns), "--flow", "10.0.0.1,10.0.0.999", "--remark", "8"), 2, "10.0.0.999"),
                             (("apply", *base(ns), "--flow", ",", "--remark", "8"), 2, "source or a destination"),
                             (("plan", "--flow", "10.0.0.1,", "--police", "fast"), 2, "fast")):
        r = cli(*args, ok=(code,))
        assert len(r.stderr.strip().splitlines()) == 1 and word in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_not_root_is_exit_4(ns):
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                        "skewscope.cli", "mitigate", "apply", "-i", "lo", "--flow", "10.0.0.1,", "--remark", "8",
                        "--yes"], capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert r.returncode == 4 and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_plan_from_diagnose_names_the_truths_kv_bulk(tmp_path):
    """The plan for a generated prefill-interference capture re-marks exactly the truth's KV
    flows: from its prefill nodes to its decode receivers."""
    pcap = tmp_path / "pi.pcap"
    subprocess.run([sys.executable, "-m", "skewscope.cli", "gen", "prefill-interference", "-o", pcap, "--seed", "7"],
                   check=True, capture_output=True)
    truth = json.loads((tmp_path / "pi.truth.json").read_text())
    kv = next(g for g in truth["groups"] if g["kind"] == "kv_transfer")
    pairs = {tuple(k.split("->")) for k in kv["details"]["pair_bytes"]}
    d = subprocess.run([sys.executable, "-m", "skewscope.cli", "diagnose", pcap, "--json"], capture_output=True,
                       text=True)
    (tmp_path / "d.json").write_text(d.stdout)
    acts = json.loads(cli("plan", "--from", tmp_path / "d.json", "--json").stdout)["actions"]
    assert {a["action"] for a in acts} == {"remark"} and all(a["dscp"] == 8 for a in acts)
    assert {(a["src"], a["dst"]) for a in acts} == pairs           # the KV bulk, and nothing of decode


def _pi_pcap(tmp_path):
    pcap = tmp_path / "pi.pcap"
    if not pcap.exists():
        subprocess.run([sys.executable, "-m", "skewscope.cli", "gen", "prefill-interference", "-o", pcap, "--seed",
                        "7"], check=True, capture_output=True)
    return pcap


def test_watch_closed_loop_applies_and_reverts_when_it_stops(ns, tmp_path):
    ns_, dev = ns
    before = tc_state(ns_, dev)
    pol = tmp_path / "pol.yaml"
    pol.write_text(f"interface: {dev}\nttl_s: 120\nkinds:\n  prefill_interference: {{action: remark, dscp: 8}}\n")
    r = subprocess.run(["ip", "netns", "exec", ns_, sys.executable, "-m", "skewscope.cli", "watch", "--from",
                        _pi_pcap(tmp_path), "--mitigate", pol, "--json"], capture_output=True, text=True, timeout=180)
    assert r.returncode == 2, r.stderr                     # critical finding: watch's exit code
    evs = [json.loads(x) for x in r.stdout.splitlines()]
    steps = [(e["step"], e.get("reason")) for e in evs if e.get("event") == "mitigation"]
    assert steps == [("planned", None), ("applied", None), ("reverted", "watch stopped")], steps
    applied = next(e for e in evs if e.get("step") == "applied")
    assert applied["finding_id"] == next(e["id"] for e in evs if e.get("event") == "opened")
    assert all(a["id"] for a in applied["actions"]) and applied["headline"]["name"] == "impact.share"
    assert tc_state(ns_, dev) == before


def test_v1_mitigations_lists_what_the_kernel_holds_and_plan_reads_v1_findings(ns, tmp_path):
    ns_, dev = ns
    subprocess.run(["ip", "-n", ns_, "link", "set", "lo", "up"], check=True)
    cli("apply", *base(ns), "--flow", "10.0.0.1,10.0.0.2", "--remark", "8", "--yes", "--ttl", "90")
    tok = tmp_path / "tok"
    tok.write_text("s3cret-token-for-tests\n")
    tok.chmod(0o600)
    port = 19000 + os.getpid() % 1000          # the namespace is fresh: nothing else listens there
    p = subprocess.Popen(["ip", "netns", "exec", ns_, sys.executable, "-m", "skewscope.cli", "export", "--from",
                          _pi_pcap(tmp_path), "--listen", f"127.0.0.1:{port}", "--token-file", tok],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def get(token=None):
            hdr = ["-H", f"Authorization: Bearer {token}"] if token else []
            r = subprocess.run(["ip", "netns", "exec", ns_, "curl", "-s", "-w", "\n%{http_code}", *hdr,
                                f"http://127.0.0.1:{port}/v1/mitigations"], capture_output=True, text=True)
            body, _, code = r.stdout.rpartition("\n")
            return int(code or 0), body
        for _ in range(240):
            code, body = get("s3cret-token-for-tests")
            if code or p.poll() is not None:
                break
            time.sleep(0.25)
        assert code == 200, (code, body, p.stderr.read() if p.poll() is not None else "")
        ms = json.loads(body)["mitigations"]
        assert [(m["interface"], m["direction"], m["src"], m["dst"], m["dscp"]) for m in ms] == \
            [(dev, "ingress", "10.0.0.1", "10.0.0.2", 8)]
        assert 0 < ms[0]["expires_in"] <= 90
        assert get()[0] == 401
        # plan from the running exporter's /v1/findings (its analysis of the capture)
        for _ in range(240):
            r = subprocess.run(["ip", "netns", "exec", ns_, sys.executable, "-m", "skewscope.cli", "mitigate", "plan",
                                "--from", f"http://127.0.0.1:{port}", "--token-file", tok, "--json"],
                               capture_output=True, text=True, timeout=120)
            if r.returncode == 0:
                break
            time.sleep(0.5)                              # 503 while the analysis runs
        assert r.returncode == 0, r.stderr
        truth = json.loads((tmp_path / "pi.truth.json").read_text())
        kv = next(g for g in truth["groups"] if g["kind"] == "kv_transfer")["details"]["pair_bytes"]
        acts = json.loads(r.stdout)["actions"]
        assert {(a["src"], a["dst"]) for a in acts} == {tuple(k.split("->")) for k in kv}
        r = subprocess.run(["ip", "netns", "exec", ns_, sys.executable, "-m", "skewscope.cli", "mitigate", "plan",
                            "--from", f"http://127.0.0.1:{port}"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 3 and "401" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    finally:
        p.terminate()
        p.wait(timeout=30)
        cli("revert", *base(ns), "--all")


def test_flower_rules_pass_iproute2s_own_parser(ns):
    """`plan --flower` prints rules for a BlueField eSwitch. This kernel has no cls_flower /
    act_pedit / act_police, but tc parses every option and action in user space before it asks
    the kernel: each printed rule must get as far as the kernel (its refusal, or success where
    the kernel has them), never a parse error -- checked against a deliberately broken rule."""
    from skewscope.mitigate.flower import commands
    from skewscope.mitigate.rules import Rule
    ns_, dev = ns
    subprocess.run(["tc", "-n", ns_, "qdisc", "add", "dev", dev, "clsact"], check=True)
    rules = [Rule("remark", src="10.0.0.1", dst="10.0.0.5", dscp=8), Rule("remark", src="fd00::1", dst="fd00::2", dscp=8),
             Rule("police", dst="10.0.0.9", rate_bps=10e9), Rule("remark", src="10.0.0.1", sport=49152, dscp=10)]

    def tc(c):
        return subprocess.run(["tc", "-n", ns_, *c], capture_output=True, text=True)
    for k, r in enumerate(rules):
        c = commands(r, dev, slot=k, rid=k + 1)[1]
        p = tc(c)
        parsed = p.returncode == 0 or "error talking to the kernel" in p.stderr
        assert parsed, (c, p.stderr)
    broken = commands(rules[0], dev)[1]
    broken[broken.index("dsfield")] = "dsfeld"
    p = tc(broken)
    assert p.returncode != 0 and "error talking to the kernel" not in p.stderr and "bad pedit" in p.stderr
    out = cli("plan", "--flow", "10.0.0.1,10.0.0.5", "--remark", "8", "--flower", "pf0hpf").stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("tc filter add dev pf0hpf"))
    assert "skip_sw" in line and "src_ip 10.0.0.1 dst_ip 10.0.0.5" in line and "dsfield set 32 retain 0xfc" in line
