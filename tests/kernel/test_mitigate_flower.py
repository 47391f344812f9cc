"""Kernel tier: the flower backend of `skewscope mitigate` (issue 28, the BlueField form) -- its
management code for real, on a veth in a network namespace.

This kernel has no cls_flower / act_pedit / act_police, so the rules carry the test body
(flower.mirror_body: a u32 match + `mirred egress mirror`, with skewscope's action cookie):
everything but the flower match/action -- priorities, cookies, what is ours, the clsact we made,
the state file, revert, reap, the scheduled reaper -- is the code a BlueField runs. Ground
truth is what `tc` itself shows, compared exactly, and the cookie decoded here by hand."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import frames as F
import pytest
from mitharness import apply_then_sigkill, cli, tc_state

PRIOS = range(49400, 49432)


def cookies(ns: str, dev: str, hook: str = "ingress") -> dict[int, tuple[int, int, int]]:
    """{prio: (id, deadline, flags)} decoded from tc's own JSON: b"ssmt", then three u32."""
    j = json.loads(subprocess.run(["tc", "-n", ns, "-j", "filter", "show", "dev", dev, hook], capture_output=True,
                                  text=True).stdout or "[]")
    out = {}
    for f in j:
        for a in (f.get("options") or {}).get("actions") or []:
            raw = bytes.fromhex(a.get("cookie", ""))
            if raw[:4] == b"ssmt":
                out[f["pref"]] = tuple(int.from_bytes(raw[k:k + 4], "big") for k in (4, 8, 12))
    return out


@pytest.fixture
def pair(netns_pair):
    yield netns_pair
    # a test's detached reapers (TTL up to 60 s here) would outlive it: end them by pid
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if b"reap" in cmd and netns_pair.ns_a.encode() in cmd:
                try:                     # its group (its own session): the shell and its sleep
                    if os.getpgid(int(pid)) != os.getpgid(0):
                        os.killpg(os.getpgid(int(pid)), signal.SIGKILL)
                except ProcessLookupError:
                    pass


def B(p, *more):
    return ("-i", p.if_a, "--netns", p.ns_a, "--backend", "flower", "--flower-body", f"mirror:{p.if_a}", *more)


def foreign_u32(p, prio, hook="ingress", cookie=None):
    ck = ["cookie", cookie] if cookie else []
    subprocess.run(["tc", "-n", p.ns_a, "filter", "add", "dev", p.if_a, hook, "prio", str(prio), "protocol", "ip",
                    "u32", "match", "ip", "dst", "10.9.9.9/32", "action", "mirred", "egress", "mirror", "dev", p.if_a,
                    *ck], check=True)


def test_this_kernel_shows_an_act_cookie_on_mirred(pair):
    """The premise of the test body: act cookies are generic and `tc -j` shows them."""
    subprocess.run(["tc", "-n", pair.ns_a, "qdisc", "add", "dev", pair.if_a, "clsact"], check=True)
    foreign_u32(pair, 5, cookie="73736d74" + "00000007" + "00000009" + "00000001")
    assert cookies(pair.ns_a, pair.if_a) == {5: (7, 9, 1)}


def test_dry_run_changes_nothing_status_lists_ours_and_revert_all_restores_exactly(pair):
    ns_, dev = pair.ns_a, pair.if_a
    subprocess.run(["tc", "-n", ns_, "qdisc", "add", "dev", dev, "clsact"], check=True)
    foreign_u32(pair, 7)                                   # someone else's, outside our range
    # our range, but the other hook (not a priority we take: u32's hash tables are shared by the
    # qdisc's two hooks, so a u32 dump at one priority shows the other hook's too; flower's are not)
    foreign_u32(pair, 49420, hook="egress")
    before = tc_state(ns_, dev)
    r = cli("apply", *B(pair), "--flow", "10.0.0.1,10.0.0.2", "--flow", "10.0.0.3,10.0.0.4", "--remark", "8")
    assert "dry run" in r.stdout and tc_state(ns_, dev) == before
    t0 = time.time()
    cli("apply", *B(pair), "--flow", "10.0.0.1,10.0.0.2", "--flow", "10.0.0.3,10.0.0.4", "--remark", "8", "--yes",
        "--ttl", "60")
    ck = cookies(ns_, dev)
    assert sorted(ck) == [49400, 49401] and [c[0] for c in ck.values()] == [1, 2]
    assert all(t0 + 60 <= c[1] <= t0 + 62 and c[2] == 0 for c in ck.values())   # clsact was not ours
    st = json.loads(cli("status", *B(pair), "--json").stdout)["active"]
    assert [(a["id"], a["src"], a["dst"], a["dscp"]) for a in st] == [(1, "10.0.0.1", "10.0.0.2", 8),
                                                                      (2, "10.0.0.3", "10.0.0.4", 8)]
    assert all(58 < a["expires_in"] <= 62 for a in st)
    # the same action again renews its TTL, it is not added twice
    cli("apply", *B(pair), "--flow", "10.0.0.1,10.0.0.2", "--remark", "8", "--yes", "--ttl", "120")
    ck = cookies(ns_, dev)
    assert sorted(c[0] for c in ck.values()) == [1, 2] and max(c[1] for c in ck.values()) >= t0 + 120
    r = cli("revert", *B(pair), "--all")
    assert r.stdout.count("reverted") == 2
    assert tc_state(ns_, dev) == before                    # theirs untouched, their clsact kept


def test_bare_interface_clsact_made_and_removed_by_us_and_counters_are_the_kernels(pair):
    ns_, dev = pair.ns_a, pair.if_a
    before = tc_state(ns_, dev)
    cli("apply", *B(pair), "--flow", f"{pair.ip_b},{pair.ip_a}", "--remark", "8", "--yes", "--ttl", "60")
    cli("apply", *B(pair), "--flow", "10.0.0.3,10.0.0.4", "--police", "1G", "--yes", "--ttl", "60")
    assert [c[2] for c in cookies(ns_, dev).values()] == [1, 1]     # both carry "we made the clsact"
    hit = F.roce(0x07, src=pair.ip_b, dst=pair.ip_a, payload=64).frame
    miss = F.roce(0x07, src=pair.ip_b, dst="10.0.0.99", payload=64).frame
    assert pair.send("b", [hit, miss, hit, miss, hit]) == 5
    st = {a["id"]: a for a in json.loads(cli("status", *B(pair), "--json").stdout)["active"]}
    assert st[1]["counters"]["packets"] == 3 and st[2]["counters"]["packets"] == 0
    cli("revert", *B(pair), "1")
    assert list(cookies(ns_, dev)) == [49401]
    r = cli("revert", *B(pair), "9", ok=(2,))
    assert len(r.stderr.strip().splitlines()) == 1 and "id 9" in r.stderr
    cli("revert", *B(pair), "2")
    assert tc_state(ns_, dev) == before                    # the clsact we made went with the last


@pytest.mark.parametrize("cookie", [None, "deadbeef", "73736d74"])
def test_foreign_filter_in_our_range_is_a_one_line_refusal_and_untouched(pair, cookie):
    ns_, dev = pair.ns_a, pair.if_a
    subprocess.run(["tc", "-n", ns_, "qdisc", "add", "dev", dev, "clsact"], check=True)
    foreign_u32(pair, 49405, cookie=cookie)
    before = tc_state(ns_, dev)
    r = cli("apply", *B(pair), "--flow", "10.0.0.1,10.0.0.2", "--remark", "8", "--yes", ok=(7,))
    assert len(r.stderr.strip().splitlines()) == 1 and "49405" in r.stderr and "not skewscope's" in r.stderr
    assert tc_state(ns_, dev) == before
    assert "no skewscope mitigation" in cli("status", *B(pair)).stdout
    cli("revert", *B(pair), "--all")
    cli("reap", "-i", dev, "--netns", ns_, "--backend", "flower")
    assert tc_state(ns_, dev) == before


def test_revert_all_and_reap_leave_a_foreign_filter_added_after_ours(pair):
    ns_, dev = pair.ns_a, pair.if_a
    before = tc_state(ns_, dev)
    cli("apply", *B(pair), "--flow", "10.0.0.1,10.0.0.2", "--remark", "8", "--yes", "--ttl", "60")
    foreign_u32(pair, 49410)                                # appears in our range meanwhile
    foreign_u32(pair, 100)
    theirs = {49410, 100}
    cli("revert", *B(pair), "--all")
    j = json.loads(subprocess.run(["tc", "-n", ns_, "-j", "filter", "show", "dev", dev, "ingress"],
                                  capture_output=True, text=True).stdout)
    assert {f["pref"] for f in j} == theirs and not cookies(ns_, dev)
    assert "clsact" in tc_state(ns_, dev)                   # theirs live on it: it stays
    for prio in theirs:
        subprocess.run(["tc", "-n", ns_, "filter", "del", "dev", dev, "ingress", "prio", str(prio)], check=True)
    subprocess.run(["tc", "-n", ns_, "qdisc", "del", "dev", dev, "clsact"], check=True)
    assert tc_state(ns_, dev) == before


def test_reap_removes_only_what_expired(pair):
    ns_, dev = pair.ns_a, pair.if_a
    subprocess.run(["ip", "netns", "exec", ns_, sys.executable, "-c", f"""
from skewscope.mitigate.flower import Flower, mirror_body
from skewscope.mitigate.rules import Rule
f = Flower({dev!r}, body=mirror_body({dev!r}), schedule=False)
f.apply([Rule("remark", src="10.0.0.1", dst="10.0.0.2", dscp=8, ttl=1, note="short")])
f.apply([Rule("remark", src="10.0.0.3", dst="10.0.0.4", dscp=8, ttl=60, note="long")])
"""], check=True, timeout=60)
    assert sorted(c[0] for c in cookies(ns_, dev).values()) == [1, 2]
    time.sleep(2.1)
    assert sorted(c[0] for c in cookies(ns_, dev).values()) == [1, 2]      # nothing expires by itself
    r = cli("reap", "-i", dev, "--netns", ns_, "--backend", "flower")
    assert r.stdout.strip().splitlines() == [f"reaped {dev} ingress 1: re-mark DSCP to 8: RoCEv2 10.0.0.1 -> "
                                             f"10.0.0.2, for 1 s (short)"]
    assert [c[0] for c in cookies(ns_, dev).values()] == [2]
    assert cli("reap", "--netns", ns_, "--backend", "flower").stdout.strip() == "nothing expired"
    cli("revert", *B(pair), "--all")


def test_ttl_holds_after_sigkill_of_the_applying_process(pair):
    """No skewscope command is run after the apply: the detached reaper alone removes the rule
    (and the clsact it made), not before the deadline."""
    ns_, dev = pair.ns_a, pair.if_a
    before = tc_state(ns_, dev)
    apply_then_sigkill(["ip", "netns", "exec", ns_], f"""
from skewscope.mitigate.flower import Flower, mirror_body
from skewscope.mitigate.rules import Rule
Flower({dev!r}, body=mirror_body({dev!r}), netns={ns_!r}).apply(
    [Rule("remark", src="10.0.0.1", dst="10.0.0.2", dscp=8, ttl=2, note="t")])
""")
    (prio, (rid, deadline, flags)), = cookies(ns_, dev).items()
    assert prio == 49400 and rid == 1 and flags == 1
    gone_at = None
    while time.time() < deadline + 20:              # the reaper is a fresh Python: slow on a busy machine
        if tc_state(ns_, dev) == before:
            gone_at = time.time()
            break
        time.sleep(0.1)
    assert gone_at is not None, tc_state(ns_, dev)
    assert gone_at >= deadline                              # not before its time


def test_flower_body_passes_iproute2s_own_parser(pair):
    """The real body (cookies on every action) parses in tc's user space: each rule gets as far
    as the kernel, which lacks cls_flower here; a misspelt one does not."""
    from skewscope.mitigate.flower import cookie, filter_args, flower_body
    from skewscope.mitigate.rules import Rule
    ns_, dev = pair.ns_a, pair.if_a
    subprocess.run(["tc", "-n", ns_, "qdisc", "add", "dev", dev, "clsact"], check=True)
    for k, r in enumerate([Rule("remark", src="10.0.0.1", dst="10.0.0.5", dscp=8),
                           Rule("remark", src="fd00::1", dst="fd00::2", dscp=8),
                           Rule("police", dst="10.0.0.9", rate_bps=10e9), Rule("remark", src="10.0.0.1", sport=49152,
                                                                               dscp=10)]):
        c = filter_args(r, dev, "ingress", 49400 + k, cookie(k + 1, time.time() + 60, 1), flower_body)
        assert c.count("cookie") == c.count("action") >= 1
        p = subprocess.run(["tc", "-n", ns_, *c], capture_output=True, text=True)
        assert p.returncode == 0 or "error talking to the kernel" in p.stderr, (c, p.stderr)
        bad = [("cookei" if x == "cookie" else x) for x in c]
        p = subprocess.run(["tc", "-n", ns_, *bad], capture_output=True, text=True)
        assert p.returncode != 0 and "error talking to the kernel" not in p.stderr, (bad, p.stderr)


def test_v1_mitigations_source_lists_flower_rules_with_their_backend(pair):
    """software.list_all (the exporter's /v1/mitigations) reads both backends from the kernel."""
    ns_, dev = pair.ns_a, pair.if_a
    cli("apply", *B(pair), "--flow", "10.0.0.1,10.0.0.2", "--remark", "8", "--yes", "--ttl", "60")
    r = subprocess.run(["ip", "netns", "exec", ns_, sys.executable, "-c",
                        "import json; from skewscope.mitigate.software import list_all; print(json.dumps(list_all()))"],
                       capture_output=True, text=True, timeout=60, check=True)
    ms = json.loads(r.stdout)
    assert [(m["interface"], m["direction"], m["backend"], m["id"], m["src"], m["dst"]) for m in ms] == \
        [(dev, "ingress", "flower", 1, "10.0.0.1", "10.0.0.2")]
    cli("revert", *B(pair), "--all")


def test_detach_removes_both_backends_rules_and_leaves_a_foreign_filter(pair):
    """`skewscope detach` takes skewscope's mitigations off too (issue 28: revert --all and
    detach remove exactly ours): a software rule and a flower rule on one interface, a foreign
    u32 filter beside them; afterwards tc shows the foreign filter and nothing of ours."""
    ns_, dev = pair.ns_a, pair.if_a
    subprocess.run(["tc", "-n", ns_, "qdisc", "add", "dev", dev, "clsact"], check=True)
    foreign_u32(pair, 100)
    before = tc_state(ns_, dev)
    cli("apply", *B(pair), "--flow", "10.0.0.1,10.0.0.2", "--remark", "8", "--yes", "--ttl", "60")
    cli("apply", "-i", dev, "--netns", ns_, "--flow", "10.0.0.3,10.0.0.4", "--remark", "8", "--yes", "--ttl", "60")
    assert cookies(ns_, dev) and "49392" in tc_state(ns_, dev)
    r = subprocess.run(["ip", "netns", "exec", ns_, sys.executable, "-m", "skewscope.cli", "detach", "-i", dev],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-1500:]
    assert "software mitigation rule" in r.stdout and "flower mitigation rule" in r.stdout, r.stdout
    assert tc_state(ns_, dev) == before
