"""Parser fuzzing through the real BPF program (BPF_PROG_TEST_RUN), issue 8.

One mutation corpus (tests/fuzzcorpus.py: random bytes + valid RoCE frames mutated at every
header field and length) goes through the XDP and the TC entry point, with the global
counters read after every frame. Invariants:

- the verdict is always pass (XDP_PASS = 2; TC_ACT_UNSPEC = -1, u32 0xFFFFFFFF: TCX_NEXT);
- every frame moves exactly one category by one and FRAMES by one, so at the end the
  categories add up to FRAMES and to the frames sent;
- only accounted frames create flows; a malformed (any not-accounted) frame never creates or
  changes a flow: the flow table after the accounted frames is byte-identical after all the
  others have gone through too;
- no flow ever counts more payload than wire bytes (a length lie cannot inflate a flow);
- unmutated RoCE templates (built independently with struct) are all accounted;
- the offline numba parser puts every frame in the same category, and builds the same
  flow counters from the accounted ones.

Size: SKEWSCOPE_FUZZ_FRAMES (default 1,000,000, all of it in CI: ~15 s per entry point on
2 cores). tools/reliability.py runs the same with more frames and prints the figures.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import fuzzcorpus as fc

from skewscope.core import layout as L

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root for BPF_PROG_TEST_RUN (CI runs as root)"),
    pytest.mark.timeout(600),
]

N = int(os.environ.get("SKEWSCOPE_FUZZ_FRAMES", "1000000"))
MAX_FLOWS = 1 << 17

# categories a test run can never produce (the kernel refuses < 14 bytes; no sampling;
# the flows map is large enough for the corpus)
UNREACHABLE = {L.G_TRUNC_ETH, L.G_SAMPLED_OUT, L.G_NO_FLOW_SLOT}
STAT_FIELDS = ("packets", "bytes", "payload_bytes", "messages", "msg_bytes", "op", "ecn_capable", "ce", "fecn",
               "becn", "cnp", "acks", "nak_seq", "nak_rnr", "nak_other", "psn_gaps", "psn_skipped",
               "retransmissions", "sport", "tclass", "last_opcode", "msg_hist")


def _dataplane():
    from skewscope.bpf.loader import Config, Dataplane
    return Dataplane(Config(max_flows=MAX_FLOWS, ev_per_cpu=1 << 10))


@pytest.fixture(scope="module")
def corpus():
    return fc.make_corpus(N, seed=8)


@pytest.fixture(scope="module")
def xdp_run(corpus):
    dp = _dataplane()
    try:
        run = fc.run_kernel(dp, "xdp", corpus)
        yield run, dp.read_globals(), dp.read_flows()
    finally:
        dp.close()


def _ethertype(corpus):
    p = corpus.off + 12
    return (corpus.data[p].astype(np.int64) << 8) | corpus.data[p + 1]


def _check_run(corpus, run, glob, flows, refused_ok):
    n = len(corpus)
    ran = run.verdict >= 0
    # frames the kernel would not run at all moved no counter
    assert not np.abs(run.delta[~ran]).any()
    assert np.array_equal(~ran, refused_ok), "test run refused frames it should have run"
    cat = run.category
    # exactly one category per frame, FRAMES + 1
    bad = np.nonzero(ran & ~run.one_category)[0]
    assert len(bad) == 0, f"{len(bad)} frames not in exactly one category, e.g. #{bad[0]}: " \
                          f"kind {fc.KINDS[corpus.kind[bad[0]]]} {corpus.frame(bad[0]).hex()}"
    assert int(glob[L.G_FRAMES]) == int(ran.sum())
    assert int(glob[:L.G_NCAT].sum()) == int(glob[L.G_FRAMES])
    assert np.array_equal(np.bincount(cat[ran], minlength=L.G_NCAT), glob[:L.G_NCAT].astype(np.int64))
    # only accounted frames create flows
    created = run.delta[:, L.G_FLOWS_CREATED]
    assert not created[ran & (cat != L.G_ACCOUNTED)].any()
    assert int(created.sum()) == int(glob[L.G_FLOWS_CREATED]) == len(flows), "no eviction expected"
    # the corpus reaches every parser outcome a test run can produce
    hit = set(np.unique(cat[ran]).tolist())
    assert hit >= set(range(L.G_NCAT)) - UNREACHABLE, \
        f"not reached: {[L.CATEGORY_NAMES[c] for c in set(range(L.G_NCAT)) - UNREACHABLE - hit]}"
    # a length lie cannot inflate a flow
    over = flows[flows["payload_bytes"] > flows["bytes"]]
    assert len(over) == 0, f"{len(over)} flows with payload_bytes > bytes"
    assert int(flows["packets"].sum()) == int(glob[L.G_ACCOUNTED])
    # unmutated RoCE templates are all accounted (ground truth: they were built with struct)
    T = fc.build_templates(seed=8 + 1)
    valid_roce = (corpus.kind == fc.K["valid"]) & np.isin(T.family[np.maximum(corpus.template, 0)],
                                                          (fc.FAM_V4, fc.FAM_V6, fc.FAM_V1, fc.FAM_ENCAP))
    assert valid_roce.sum() > 0 and (cat[valid_roce & ran] == L.G_ACCOUNTED).all()
    assert n == len(run.verdict)


def test_xdp_fuzz_verdict_and_categories(corpus, xdp_run):
    run, glob, flows = xdp_run
    assert (run.verdict == 2).all(), f"verdicts seen: {np.unique(run.verdict)}"
    _check_run(corpus, run, glob, flows, refused_ok=np.zeros(len(corpus), bool))


def test_tc_fuzz_verdict_and_categories(corpus, xdp_run):
    dp = _dataplane()
    try:
        run = fc.run_kernel(dp, "tc", corpus)
        glob, flows = dp.read_globals(), dp.read_flows()
    finally:
        dp.close()
    # BPF_PROG_TEST_RUN for skb programs refuses (EINVAL, program not run) an IPv4/IPv6
    # EtherType frame shorter than the IP header: exactly those, nothing else.
    et = _ethertype(corpus)
    refused = ((et == 0x0800) & (corpus.length < 34)) | ((et == 0x86DD) & (corpus.length < 54))
    assert (run.verdict[run.verdict < 0] == -22).all()
    assert (run.verdict[run.verdict >= 0] == 0xFFFFFFFF).all(), f"verdicts seen: {np.unique(run.verdict)}"
    _check_run(corpus, run, glob, flows, refused_ok=refused)
    # XDP and TC put every frame both ran in the same category
    xrun = xdp_run[0]
    both = run.verdict >= 0
    diff = np.nonzero(both & (run.category != xrun.category))[0]
    assert len(diff) == 0, f"XDP and TC disagree on {len(diff)} frames, e.g. {corpus.frame(diff[0]).hex()}"


def test_malformed_frames_never_create_or_change_flows(corpus, xdp_run):
    run = xdp_run[0]
    acc = np.nonzero(run.category == L.G_ACCOUNTED)[0]
    rest = np.nonzero(run.category != L.G_ACCOUNTED)[0]
    assert len(acc) > 1000 and len(rest) > len(acc)
    dp = _dataplane()
    try:
        r1 = fc.run_kernel(dp, "xdp", corpus.subset(acc))
        assert (r1.category == L.G_ACCOUNTED).all()
        f1, g1 = dp.read_flows(), dp.read_globals()
        r2 = fc.run_kernel(dp, "xdp", corpus.subset(rest))
        f2, g2 = dp.read_flows(), dp.read_globals()
    finally:
        dp.close()
    assert (r2.category != L.G_ACCOUNTED).all()
    assert not r2.delta[:, L.G_FLOWS_CREATED].any()
    assert g2[L.G_FLOWS_CREATED] == g1[L.G_FLOWS_CREATED] == len(f1)
    assert g2[L.G_ACCOUNTED] == g1[L.G_ACCOUNTED] == len(acc)
    assert f1.tobytes() == f2.tobytes(), "a not-accounted frame changed the flow table"


def _offline():
    try:
        from skewscope.sources import offline
    except ImportError:
        return None
    return offline if hasattr(offline, "parse_file") else None


def _cmp_flows(a, b):
    assert len(a) == len(b)
    for k in ("src", "dst", "dest_qp", "ipver", "roce") + STAT_FIELDS:
        assert np.array_equal(a[k], b[k]), f"flow field {k} differs between kernel and offline"


@pytest.mark.skipif(_offline() is None, reason="skewscope.sources.offline.parse_file is not in this tree yet (issue 4)")
def test_offline_parser_same_category_per_frame(corpus, xdp_run, tmp_path):
    """Per frame: the frames the kernel put in category c, parsed offline as one capture,
    all land in c (one parse per category, so per-frame equality costs 18 parses)."""
    offline = _offline()
    run, glob, kflows = xdp_run
    cat = run.category
    for c in np.unique(cat):
        idx = np.nonzero(cat == c)[0]
        p = tmp_path / f"cat{c}.pcap"
        corpus.subset(idx).write_pcap(str(p))
        snap = offline.parse_file(str(p))
        got = snap.globals[:L.G_NCAT].astype(np.int64)
        want = np.zeros(L.G_NCAT, np.int64)
        want[c] = len(idx)
        assert np.array_equal(got, want), \
            f"kernel category {L.CATEGORY_NAMES[c]} ({len(idx)} frames): offline says " \
            f"{ {L.CATEGORY_NAMES[i]: int(v) for i, v in enumerate(got) if v} }"
        assert int(snap.globals[L.G_FRAMES]) == len(idx)
        if c == L.G_ACCOUNTED:
            _cmp_flows(kflows, snap.flows)
        p.unlink()
