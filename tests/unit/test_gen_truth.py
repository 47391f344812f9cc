"""Ground truth vs an independent recount of the written pcap, for every preset."""
import json

import pytest
from test_gen_common import BIG, capture, pcap_file, recount

from skewscope import gen as skewgen

SMALL = [p for p in skewgen.PRESETS if p not in BIG]
FIELDS = ["packets", "bytes", "payload_bytes", "messages", "ce_packets", "ecn_capable_packets",
          "cnp_packets", "acks", "naks", "psn_gaps", "retransmissions", "first_ts", "last_ts",
          "msg_size_hist"]


@pytest.mark.parametrize("name", SMALL)
def test_truth_matches_independent_recount(name):
    cap = capture(name)
    truth = cap.truth
    rc = recount(pcap_file(name, 0, 128))  # headers only: lengths come from orig_len / UDP
    assert truth["frames"] == rc["frames"] == len(cap)
    assert truth["non_roce_frames"] == rc["non_roce"]
    assert truth["pfc"]["pause_frames"] == rc["pfc"][0]
    assert truth["pfc"]["per_priority"] == rc["pfc"][1]
    tf = {(f["src"], f["dst"], f["dest_qp"]): f for f in truth["flows"]}
    assert set(tf) == set(rc["flows"])
    for k, f in rc["flows"].items():
        for fld in FIELDS:
            assert tf[k][fld] == f[fld], (k, fld, tf[k][fld], f[fld])


def test_truth_schema_and_json():
    t = capture("mixed").truth
    assert t["generator"] == "skewgen" and t["version"] == 1 and t["seed"] == 0
    for key in ("scenario", "frames", "period_s", "flows", "groups", "pathologies", "pfc",
                "non_roce_frames"):
        assert key in t
    json.loads(json.dumps(t))  # serialisable
    assert len(t["pfc"]["per_priority"]) == 8
    kinds = {g["kind"] for g in t["groups"]}
    assert {"ring_allreduce", "all_to_all", "p2p"} <= kinds
    for g in t["groups"]:
        assert set(g) == {"id", "kind", "members", "details"}
    for p in t["pathologies"]:
        assert set(p) == {"kind", "entities", "magnitude"}
        assert set(p["entities"]) == {"ips", "qps", "flows"}
    for f in t["flows"]:
        assert f["role"] in ("data", "cts", "ack", "cnp")
        assert f["msg_size_hist"] == sorted(f["msg_size_hist"])
        assert all(c > 0 for _, c in f["msg_size_hist"])


def test_big_preset_truth_consistent_with_snaplen_pcap():
    """ring-32 (2M frames): write headers only; recount still sees orig lengths."""
    cap = capture("ring-32")
    assert len(cap) > 1_000_000
    t = cap.truth
    assert sum(f["packets"] for f in t["flows"]) == t["frames"]
    assert t["groups"][0]["kind"] == "ring_allreduce" and len(t["groups"][0]["members"]) == 32
