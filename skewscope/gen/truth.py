"""Ground truth from the model's own packet table (not from parsing the pcap).

Per flow = (src IP, dst IP, destination QP), counted per frame of the capture, with the
definitions of ``skewscope report --json`` (docs/generator.md repeats them)."""
from __future__ import annotations

import numpy as np

from skewscope.gen import frames as F
from skewscope.gen.engine import EPOCH_NS
from skewscope.gen import model as M
from skewscope.gen import pathologies as P

# opcodes that start a message: SEND_FIRST, SEND_ONLY*, WRITE_FIRST, WRITE_ONLY*, READ_REQUEST
# (RC and UC forms) and UD SEND_ONLY*.
MSG_START = np.zeros(256, dtype=bool)
for _tr in (0x00, 0x20):
    for _low in (0x00, 0x04, 0x05, 0x06, 0x0A, 0x0B, 0x17):
        MSG_START[_tr | _low] = True
MSG_START[0x0C] = True
MSG_START[0x64] = MSG_START[0x65] = True
RETH_SIZE = np.zeros(256, dtype=bool)   # WRITE_FIRST / WRITE_ONLY* / READ_REQUEST
for _op in (0x06, 0x0A, 0x0B, 0x0C, 0x26, 0x2A, 0x2B):
    RETH_SIZE[_op] = True


def _public(d):
    if isinstance(d, dict):
        return {k: _public(v) for k, v in d.items() if not str(k).startswith("_")}
    if isinstance(d, list):
        return [_public(v) for v in d]
    return d


def compute(job, pkts: dict) -> dict:
    ft = pkts["ftype"]
    roce = np.nonzero(ft == F.FT_ROCE)[0]
    path = pkts["path"][roce].astype(np.int64)
    op = pkts["opcode"][roce]
    tos = pkts["tos"][roce]
    aeth_syn = (pkts["aeth"][roce] >> 24) & 0xFF
    ts = pkts["ts"][roce]
    flen = F.frame_lengths(ft[roce], op, pkts["plen"][roce], job.hdr_len)
    npath = len(job.p_src)
    bc = lambda w=None: np.bincount(path, weights=w, minlength=npath)  # noqa: E731
    packets = bc()
    nbytes = bc(flen.astype(np.float64))
    payload = bc(pkts["plen"][roce].astype(np.float64))
    messages = bc(MSG_START[op].astype(np.float64))
    ce = bc(((tos & 3) == 3).astype(np.float64))
    ect = bc(((tos & 3) != 0).astype(np.float64))
    cnp = bc((op == F.CNP).astype(np.float64))
    is_ack = op == F.ACKNOWLEDGE
    acks = bc((is_ack & ((aeth_syn & 0xE0) == 0)).astype(np.float64))
    naks = bc((is_ack & (((aeth_syn & 0xE0) == 0x60) | ((aeth_syn & 0xE0) == 0x20))).astype(np.float64))
    order = np.lexsort((np.arange(path.shape[0]), path))
    scan = M.psn_scan(order, path, pkts["psn"][roce], op)
    gaps = bc((scan == 1).astype(np.float64))
    retx = bc((scan == 2).astype(np.float64))
    first = np.full(npath, np.iinfo(np.int64).max)
    last = np.full(npath, -1, dtype=np.int64)
    np.minimum.at(first, path, ts)
    np.maximum.at(last, path, ts)
    # message sizes
    sz_sel = RETH_SIZE[op]
    sizes = pkts["reth"][roce][sz_sel].astype(np.int64)
    spath = path[sz_sel]
    bucket = np.where(sizes > 0, 1 << np.floor(np.log2(np.maximum(sizes, 1))).astype(np.int64), 0)
    hist = {}
    if sizes.size:
        keys, cnts = np.unique(np.stack([spath, bucket]), axis=1, return_counts=True)
        for (p, b), c in zip(keys.T, cnts):
            hist.setdefault(int(p), []).append([int(b), int(c)])
    okeys, ocnts = np.unique(path * 256 + op, return_counts=True)
    opcodes = {}
    for k, c in zip(okeys, ocnts):
        opcodes.setdefault(int(k // 256), {})[F.OP_NAME.get(int(k % 256), hex(int(k % 256)))] = int(c)
    flows = []
    for p in range(npath):
        if packets[p] == 0:
            continue
        rev = job.p_rev[p]
        role = job.p_role[p]
        if role == "cts" and not any(o == "RDMA_WRITE_ONLY" or o.startswith("SEND") or o == "RDMA_READ_REQUEST"
                                     for o in opcodes.get(p, {})):
            role = "cnp" if set(opcodes.get(p, {})) == {"CNP"} else "ack"
        gk = job.p_group[p]
        flows.append({
            "src": job.ip_str[job.p_src[p]], "dst": job.ip_str[job.p_dst[p]],
            "dest_qp": int(job.p_dqp[p]), "packets": int(packets[p]), "bytes": int(nbytes[p]),
            "payload_bytes": int(payload[p]), "messages": int(messages[p]),
            "ce_packets": int(ce[p]), "ecn_capable_packets": int(ect[p]),
            "cnp_packets": int(cnp[p]), "acks": int(acks[p]), "naks": int(naks[p]),
            "psn_gaps": int(gaps[p]), "retransmissions": int(retx[p]),
            "first_ts": int(first[p]), "last_ts": int(last[p]),
            "msg_size_hist": sorted(hist.get(p, [])),
            "opcodes": opcodes.get(p, {}), "udp_sport": int(job.p_sport[p]),
            "src_qp": int(job.p_sqp[p]), "role": role, "group": int(gk),
            "channel": int(job.p_channel[p]),
            "_reverse": [job.ip_str[job.p_src[rev]], job.ip_str[job.p_dst[rev]], int(job.p_dqp[rev])],
        })
    pfc_idx = np.nonzero(ft == F.FT_PFC)[0]
    per_prio = [0] * 8
    for m in pkts["psn"][pfc_idx]:
        for b in range(8):
            if (int(m) >> b) & 1:
                per_prio[b] += 1
    P.measure(job, {(f["src"], f["dst"], f["dest_qp"]): f for f in flows})
    for f in flows:
        f["reverse_flow"] = f.pop("_reverse")
    all_ops = np.bincount(op, minlength=256)
    out = {
        "generator": "skewgen", "version": 1, "seed": int(job.seed),
        "scenario": _public(job.sc), "frames": int(ft.shape[0]),
        "period_s": job.period_s, "flows": flows, "groups": _public(job.groups),
        "pathologies": job.pathologies,
        "pfc": {"pause_frames": int(pfc_idx.size), "per_priority": per_prio},
        "non_roce_frames": int((ft != F.FT_ROCE).sum()),
        "roce_frames": int(roce.size),
        "opcodes": {F.OP_NAME.get(i, hex(i)): int(c) for i, c in enumerate(all_ops) if c},
        "model": {
            "observer": "mirror of every node's downlink (switch egress); frames dropped in the "
                        "fabric are not in the capture; PFC frames seen where the switch receives them",
            "dropped_frames": int(job.stats.get("dropped", 0)),
            "max_downlink_queue_us": round(job.stats.get("max_queue_us", 0.0), 3),
            "epoch_ns": int(EPOCH_NS),
            "nodes": [{"ip": job.ip_str[i], "mac": F.node_mac(i).hex(":"),
                       "link_gbps": float(job.link_bps[i] / 1e9)} for i in range(job.n)],
        },
    }
    if job.inference:  # inference workloads only (older scenarios keep their exact truth)
        out["inference"] = _public(job.inference)
    return out
