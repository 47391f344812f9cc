"""Behaviour of the traffic model: NCCL shapes, causality, timing, pathologies."""
import collections
import hashlib

import numpy as np
import pytest
from test_gen_common import BIG, capture, pcap_file, read_pcap

from skewscope import gen as skewgen
from skewscope.gen import frames as F
from skewscope.gen import model as M

SMALL = [p for p in skewgen.PRESETS if p not in BIG]
HEALTHY = ["ring-healthy", "tree-healthy", "alltoall-healthy", "pipeline-healthy", "tp-decode",
           "tp-decode-prefill", "ipv6-ring", "vlan-alltoall", "ring-ll128"]


def _flows(name):
    return {(f["src"], f["dst"], f["dest_qp"]): f for f in capture(name).truth["flows"]}


@pytest.mark.parametrize("name", SMALL)
def test_timestamps_sorted_and_sizes_sane(name):
    cap = capture(name)
    ts = cap.timestamps
    assert np.all(np.diff(ts) >= 0)
    assert 1_000 <= len(cap) <= 150_000
    assert (ts[-1] - ts[0]) < 100e6  # tens of ms of simulated time


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_presets_have_no_pathology_counters(name):
    for f in capture(name).truth["flows"]:
        assert f["psn_gaps"] == f["retransmissions"] == f["naks"] == 0
        assert f["ce_packets"] == f["cnp_packets"] == 0
        assert f["ecn_capable_packets"] == f["packets"]  # ECT(0) on everything


@pytest.mark.parametrize("name", ["ring-healthy", "alltoall-healthy", "tp-decode-prefill",
                                  "ring-straggler", "loss", "moe-decode", "demo-mix"])
def test_cts_precedes_each_message_and_data_shape(name):
    cap = capture(name)
    p = cap.pkts
    job = cap.job
    roce = p["ftype"] == 0
    msg = p["msg"]
    first_ts = {}
    for i in np.nonzero(roce & (msg >= 0) & (p["retx"] == 0))[0]:
        first_ts.setdefault(int(msg[i]), int(p["ts"][i]))
    mt = job.m_type
    checked = 0
    for m, t in first_ts.items():
        if mt[m] == M.MT_DATA:
            assert mt[m - 1] == M.MT_CTS and job.m_path[m - 1] == job.p_rev[job.m_path[m]]
            assert first_ts[m - 1] < t, (m, first_ts[m - 1], t)
            checked += 1
    assert checked > 10
    assert job.stats["cts_causal"]
    # CTS are 64-byte WRITE_ONLY on the reverse path, data ends with an immediate = size
    cts = roce & (p["opcode"] == F.WRITE_ONLY)
    assert np.all(p["plen"][cts] == 64) and np.all(p["reth"][cts] == 64)
    last = roce & np.isin(p["opcode"], [F.WRITE_LAST_IMM, F.WRITE_ONLY_IMM])
    sizes = np.array(job.m_size)[msg[last]]
    imm = p["imm"][last]
    if job.sc["imm_endian"] == "le":
        imm = imm.byteswap()
    assert np.array_equal(imm, sizes.astype(np.uint32))


def test_little_endian_immediates():
    cap = capture("vlan-alltoall")
    p = cap.pkts
    last = p["opcode"] == F.WRITE_LAST_IMM
    sizes = np.array(cap.job.m_size)[p["msg"][last]]
    assert np.array_equal(p["imm"][last], sizes.astype(np.uint32).byteswap())


def test_acks_follow_the_packets_they_ack():
    cap = capture("ring-healthy")
    p = cap.pkts
    job = cap.job
    last_seen = {}
    n_ack = 0
    for i in range(len(cap)):
        path = int(p["path"][i])
        if p["opcode"][i] == F.ACKNOWLEDGE:
            data_path = job.p_rev[path]
            assert (data_path, int(p["psn"][i])) in last_seen
            assert last_seen[(data_path, int(p["psn"][i]))] <= p["ts"][i]
            n_ack += 1
        else:
            last_seen[(path, int(p["psn"][i]))] = p["ts"][i]
    assert n_ack > 100


def test_loss_go_back_n():
    cap = capture("loss")
    t = cap.truth
    pat = t["pathologies"][0]
    assert pat["kind"] == "loss" and pat["magnitude"]["dropped_packets"] == 6
    assert pat["magnitude"]["psn_gaps"] >= 1 and pat["magnitude"]["naks"] >= 1
    assert pat["magnitude"]["retransmissions"] >= 6
    p = cap.pkts
    job = cap.job
    # every NAK (0x60) names a PSN that is retransmitted afterwards on the data path
    naks = np.nonzero((p["opcode"] == F.ACKNOWLEDGE) & ((p["aeth"] >> 24) == 0x60))[0]
    assert naks.size >= 1
    for i in naks:
        data_path = job.p_rev[int(p["path"][i])]
        later = np.nonzero((p["path"] == data_path) & (p["psn"] == p["psn"][i])
                           & (p["retx"] == 1))[0]
        assert later.size and p["ts"][later[0]] > p["ts"][i]
    # flows outside the pathology are clean
    bad = {tuple(f) for f in pat["entities"]["flows"]}
    for f in t["flows"]:
        if (f["src"], f["dst"], f["dest_qp"]) not in bad:
            assert f["psn_gaps"] == f["retransmissions"] == 0


def test_psn_wrap():
    cap = capture("ipv6-ring")
    p = cap.pkts
    data = p["opcode"] == F.WRITE_MIDDLE
    assert (p["psn"][data] > (1 << 24) - 100).any() and (p["psn"][data] < 100).any()
    assert all(f["psn_gaps"] == 0 for f in cap.truth["flows"])
    assert p["plen"].max() == 1024  # IB MTU 1024
    assert cap.truth["flows"][0]["src"].startswith("fd00::")


def test_straggler_is_slower_and_late():
    cap = capture("ring-straggler")
    p = cap.pkts
    job = cap.job
    dur = collections.defaultdict(list)
    m_first, m_last = {}, {}
    for i in np.nonzero((p["msg"] >= 0) & (p["plen"] > 64))[0]:
        m = int(p["msg"][i])
        m_first.setdefault(m, p["ts"][i])
        m_last[m] = p["ts"][i]
    for m in m_first:
        dur[job.p_src[job.m_path[m]]].append(m_last[m] - m_first[m])
    med = {n: np.median(v) for n, v in dur.items()}
    others = np.median([v for n, v in med.items() if n != 3])
    assert med[3] > 2.0 * others  # rate factor 0.4 -> 2.5x longer messages
    ent = cap.truth["pathologies"][0]["entities"]
    assert ent["ips"] == ["10.0.0.4"] and all(f[0] == "10.0.0.4" for f in ent["flows"])


def test_hot_expert_destination_skew():
    fl = capture("moe-hot-expert").truth["flows"]
    into = collections.Counter()
    for f in fl:
        if f["role"] == "data":
            into[f["dst"]] += f["payload_bytes"]
    hot = into.pop("10.0.0.6")
    # dispatch: 4x into the hot node; combine (transpose): the hot node sends 4x back
    assert hot > 1.8 * max(into.values())
    mag = capture("moe-hot-expert").truth["pathologies"][0]["magnitude"]
    assert mag["dest_share"] == pytest.approx(4 / 11, abs=1e-3)


def test_congestion_ce_and_cnps_to_sender_qp():
    cap = capture("congestion")
    t = cap.truth
    pat = t["pathologies"][0]
    cong = {tuple(f) for f in pat["entities"]["flows"]}
    fl = _flows("congestion")
    for k, f in fl.items():
        if k in cong:
            assert f["ce_packets"] > 0
        else:
            assert f["ce_packets"] == 0
        if f["cnp_packets"]:
            # CNP flow = (receiver, data sender, data sender's QP) = reverse of a congested flow
            assert tuple(f["reverse_flow"]) in cong
            assert f["dest_qp"] in pat["entities"]["qps"]
    assert pat["magnitude"]["cnp_packets"] > 0 and pat["magnitude"]["ce_packets"] > 0


def test_downlink_serialised_at_link_rate():
    cap = capture("ring-healthy")
    p = cap.pkts
    job = cap.job
    lens = cap.frame_lengths()
    req = (p["msg"] >= 0)
    dst = np.array(job.p_dst)[p["path"]]
    for node in range(job.n):
        idx = np.nonzero(req & (dst == node))[0]
        gap = np.diff(p["ts"][idx])
        need = (lens[idx[:-1]] + 24) * 8 / (job.sc["link_gbps"])  # ns
        assert np.all(gap >= np.floor(need) - 1)


def test_pfc_pauses_the_downlink():
    cap = capture("pfc")
    p = cap.pkts
    job = cap.job
    t = cap.truth
    assert t["pfc"]["pause_frames"] == 40 and t["pfc"]["per_priority"][3] == 40
    pf = np.nonzero(p["ftype"] == F.FT_PFC)[0]
    pause_ns = 4096 * 512 / 100e9 * 1e9
    dst = np.array(job.p_dst)[p["path"]]
    req_to_4 = (p["ftype"] == 0) & (p["msg"] >= 0) & (dst == 4)
    for i in pf:
        t0 = p["ts"][i]
        inside = req_to_4 & (p["ts"] > t0 + 1) & (p["ts"] < t0 + pause_ns - 1)
        assert not inside.any()


def test_tp_decode_rate_and_sizes():
    t = capture("tp-decode").truth
    g = t["groups"][0]
    assert g["kind"] == "tp_decode_allreduce"
    assert g["details"]["collectives_per_s"] > 1000
    sizes = {b for f in t["flows"] for b, _ in f["msg_size_hist"]}
    assert sizes <= {64, 8192}  # CTS + LL messages of ceil(4096/8)*16 bytes
    assert t["period_s"] == pytest.approx(0.006)


def test_alltoall_delta_order_and_chunks():
    t = capture("alltoall-healthy").truth
    g = t["groups"][0]
    assert g["details"]["peer_order_delta"] == [1, 3, 6, 2, 7, 5, 4]
    sizes = {b for f in t["flows"] for b, _ in f["msg_size_hist"]}
    assert sizes == {64, 65536}  # 256 KiB per peer -> 64 KiB chunks


def test_zero_byte_message_and_explicit_matrix():
    m = [[0, 0, 4096, 200000], [1, 0, 0, 0], [0, 0, 0, 0], [5, 5, 5, 0]]
    sc = {"nodes": 4, "iterations": 1,
          "workloads": [{"kind": "all_to_all", "matrix": m, "channels": 1}]}
    cap = skewgen.generate(sc)
    p = cap.pkts
    z = (p["opcode"] == F.WRITE_ONLY_IMM) & (p["plen"] == 0)
    assert z.sum() == 6  # six zero entries off the diagonal
    assert np.all(p["reth"][z] == 0) and np.all(p["imm"][z] == 0)
    odd = (p["opcode"] == F.WRITE_ONLY_IMM) & (p["plen"] == 1)
    assert odd.sum() == 1


def test_determinism():
    a = hashlib.sha256(open(pcap_file("mixed", 0), "rb").read()).hexdigest()
    cap2 = skewgen.generate("mixed", seed=0)
    import os
    import shutil
    import tempfile
    d = tempfile.mkdtemp(prefix="sgt-det-")
    cap2.write_pcap(os.path.join(d, "b.pcap"))
    b = hashlib.sha256(open(os.path.join(d, "b.pcap"), "rb").read()).hexdigest()
    assert a == b
    cap3 = skewgen.generate("mixed", seed=1)
    cap3.write_pcap(os.path.join(d, "c.pcap"))
    c = hashlib.sha256(open(os.path.join(d, "c.pcap"), "rb").read()).hexdigest()
    assert c != a
    assert cap2.truth == capture("mixed", 0).truth
    shutil.rmtree(d)


def test_snaplen_records():
    cap = capture("alltoall-healthy")
    path = pcap_file("alltoall-healthy", 0, 128)
    lens = cap.frame_lengths()
    n = 0
    for i, (ts, orig, data) in enumerate(read_pcap(path)):
        assert orig == lens[i] and len(data) == min(128, orig)
        n += 1
    assert n == len(cap)
    full = pcap_file("alltoall-healthy", 0, 0)
    first = next(read_pcap(full))[2]
    assert next(read_pcap(path))[2] == first[:128]


def test_frames_iter_matches_pcap():
    cap = capture("tp-decode")
    it = cap.frames_iter()
    for (ts, orig, data), (ts2, fr) in zip(read_pcap(pcap_file("tp-decode")), it):
        assert ts == ts2 and data == fr


def test_mixed_has_everything():
    t = capture("mixed").truth
    assert t["non_roce_frames"] > t["pfc"]["pause_frames"] > 0
    assert any(f["cnp_packets"] for f in t["flows"])
    assert any(f["naks"] for f in t["flows"])
    assert len({f["udp_sport"] for f in t["flows"]}) > 10
