"""Job: the mutable state workload builders fill in, and ``Job.run`` which turns it into
the final packet table (see model.py for the pipeline and where the observer sits)."""
from __future__ import annotations

import ipaddress

import numpy as np

from skewscope.gen import frames as F
from skewscope.gen import model as M

EPOCH_NS = 1_735_689_600 * 10**9   # 2025-01-01T00:00:00Z: pcap time of model t = 0
WIRE_EXTRA = 24                    # preamble 8 + FCS 4 + IFG 12
DSCP_ROCE = 26
DSCP_CNP = 48


def window(pat: dict) -> tuple[float, float]:
    """(since, until) model ns of a pathology's `since_ms` / `until_ms` (-inf / +inf when
    null or absent): the pathology is active for sends ready in [since, until)."""
    a, b = pat.get("since_ms"), pat.get("until_ms")
    return (-np.inf if a is None else float(a) * 1e6, np.inf if b is None else float(b) * 1e6)


def timed(pat: dict) -> bool:
    """The pathology has an onset or an offset."""
    return pat.get("since_ms") is not None or pat.get("until_ms") is not None


def _merge(blocks):
    """Blocking windows (node, start, end) sorted, overlapping ones of a node merged."""
    out = []
    for n, a, b in sorted(blocks):
        if out and out[-1][0] == n and a <= out[-1][2]:
            out[-1] = (n, out[-1][1], max(out[-1][2], b))
        else:
            out.append((n, a, b))
    return out


class Job:
    def __init__(self, sc: dict, seed: int):
        self.sc = sc
        self.seed = seed
        self.rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5EED]))
        n = sc["nodes"]
        self.n = n
        self.ipv6 = sc["ip_version"] == 6
        self.ips = []
        for i in range(n):
            a = (ipaddress.IPv6Address(sc["ipv6_base"]) + (i + 1)) if self.ipv6 else \
                (ipaddress.IPv4Address(sc["ipv4_base"]) + (i + 1))
            self.ips.append(a)
        self.ip_str = [a.compressed for a in self.ips]
        self.link_bps = np.full(n, sc["link_gbps"] * 1e9, dtype=np.float64)
        self.rate_factor = np.ones(n)       # straggler: fraction of normal send rate
        self.lag_ns = np.zeros(n)           # straggler: late start of every step
        self.pair_rate = {}                 # (src, dst) -> extra factor (congestion)
        # pathologies with an onset/offset (since_ms/until_ms) or a lag on every send
        # (lag_per: send): [(since_ns, until_ns, ...)] in model time; empty = the default,
        # untimed behaviour above (byte-identical output)
        self.timed_lag = {}                 # node -> [(since, until, lag_ns, per_send)]
        self.timed_rate = []                # [(since, until, src or None, dst or None, factor)]
        self.mtu = sc["mtu"]
        self.hdr_len = (14 + (4 if sc["vlan"] is not None else 0) + (40 if self.ipv6 else 20) + 8)
        self.eff = sc["efficiency"]
        self.cts_lead_ns = sc["cts_lead_us"] * 1e3
        self.imm_le = sc["imm_endian"] == "le"
        ecn = {"ect0": 2, "ect1": 1, "none": 0}[sc["ecn"]]
        self.tos_data = (DSCP_ROCE << 2) | ecn
        # QPN allocation: a per-node base chosen by the seed, then sequential
        self.next_qpn = [int(x) for x in self.rng.integers(0x100, 0x8000, size=n)]
        # paths (one direction of a QP pair)
        self.p_src, self.p_dst, self.p_sqp, self.p_dqp = [], [], [], []
        self.p_sport, self.p_dport, self.p_group, self.p_rev, self.p_role = [], [], [], [], []
        self.p_channel, self.p_rkey, self.p_psn0 = [], [], []
        # messages
        self.m_path, self.m_t0, self.m_size, self.m_rate = [], [], [], []
        self.m_type, self.m_va = [], []
        self.m_cts = []         # index of the CTS message that enables this one, or -1
        # impairments
        self.up_blocks = []     # (node, start_ns, end_ns)
        self.down_blocks = []
        self.loss_specs = []    # (list of paths, prob, count, index into pathologies)
        self.ce_specs = []      # (list of paths, fraction, index)
        self.spec_windows = {}  # ("ce" | "loss", index) -> (since, until) model ns (timed)
        self.pfc_frames = []    # (t_ns, node, prio_mask, quanta)
        self.bg = []            # (t_ns, path, plen)
        self.groups = []
        self.pathologies = []
        self.period_s = None
        self.stats = {}
        self.inference = {}     # truth["inference"] (inference.py), only when used

    # ------------------------------------------------------------------ building
    def qpn(self, node: int) -> int:
        q = self.next_qpn[node]
        self.next_qpn[node] += 1 + int(self.rng.integers(0, 3))
        return q & 0xFFFFFF

    def _psn0(self) -> int:
        ps = self.sc["psn_start"]
        if ps == "random":
            return int(self.rng.integers(0, 1 << 24))
        return int(ps) & 0xFFFFFF

    def connect(self, a: int, b: int, group: int, channel: int = 0):
        """An NCCL connection a->b: one RC QP pair.  Returns (data path a->b, reverse)."""
        qa, qb = self.qpn(a), self.qpn(b)
        sport = F.mlx5_sport(qa, qb) if self.sc["sport"] == "mlx5" else int(self.sc["sport"])
        i = len(self.p_src)
        for (s, d, sq, dq, rev, role) in ((a, b, qa, qb, i + 1, "data"), (b, a, qb, qa, i, "cts")):
            self.p_src.append(s); self.p_dst.append(d); self.p_sqp.append(sq)
            self.p_dqp.append(dq); self.p_sport.append(sport); self.p_dport.append(F.ROCE_PORT)
            self.p_group.append(group); self.p_rev.append(rev); self.p_role.append(role)
            self.p_channel.append(channel)
            self.p_rkey.append(int(self.rng.integers(1, 1 << 32)))
            self.p_psn0.append(self._psn0())
        return i, i + 1

    def bg_path(self, a: int, b: int, sport: int, dport: int) -> int:
        i = len(self.p_src)
        self.p_src.append(a); self.p_dst.append(b); self.p_sqp.append(0); self.p_dqp.append(0)
        self.p_sport.append(sport); self.p_dport.append(dport); self.p_group.append(-1)
        self.p_rev.append(i); self.p_role.append("other"); self.p_channel.append(0)
        self.p_rkey.append(0); self.p_psn0.append(0)
        return i

    def add_group(self, kind: str, members, details: dict) -> int:
        gid = len(self.groups)
        self.groups.append({"id": gid, "kind": kind,
                            "members": [self.ip_str[m] for m in members],
                            "details": details})
        return gid

    def rate(self, src: int, dst: int, share: float = 1.0, t: float | None = None) -> float:
        """Pacing rate (bit/s) of one flow from src that gets `share` of src's link; `t`
        (model ns, the send's ready time): timed rate factors active then apply too."""
        r = self.link_bps[src] * self.eff * share * self.rate_factor[src]
        r = r * self.pair_rate.get((src, dst), 1.0)
        if t is not None and self.timed_rate:
            for a, b, s_, d_, f in self.timed_rate:
                if a <= t < b and (s_ is None or s_ == src) and (d_ is None or d_ == dst):
                    r = r * f
        return r

    def extra_lag(self, node: int, t: float, first: bool, sends: bool = True) -> float:
        """Timed / per-send lag (ns) of `node` for a send ready at model time t: the lags
        active at t that apply to every send (unless not `sends`), or (first piece of a
        step) to the step."""
        out = 0.0
        for a, b, lag, per_send in self.timed_lag.get(node, ()):
            if a <= t < b and ((first and not per_send) or (per_send and sends)):
                out += lag
        return out

    def wire_bytes(self, size: int) -> int:
        n = max(1, -(-size // self.mtu))
        return size + n * (self.hdr_len + 12 + 4 + WIRE_EXTRA) + 20

    def duration_ns(self, size: int, rate_bps: float) -> float:
        return self.wire_bytes(size) * 8.0 / rate_bps * 1e9

    def send(self, fwd: int, rev: int, t_ns: float, size: int, rate_bps: float,
             va: int = 0, cts: bool = True, mtype: int = M.MT_DATA) -> float:
        """An NCCL send on connection (fwd, rev): CTS on rev, then the WRITE chain on fwd.
        Returns the estimated end time of the data."""
        cts_idx = -1
        if cts:
            cts_idx = len(self.m_path)
            self.m_cts.append(-1)
            self.m_path.append(rev); self.m_t0.append(t_ns - self.cts_lead_ns)
            self.m_size.append(64); self.m_rate.append(self.link_bps[self.p_src[rev]] * self.eff)
            self.m_type.append(M.MT_CTS)
            self.m_va.append(0x7F0000000000 + (self.p_sqp[rev] << 12))
        self.m_cts.append(cts_idx)
        self.m_path.append(fwd); self.m_t0.append(t_ns); self.m_size.append(int(size))
        self.m_rate.append(rate_bps); self.m_type.append(mtype)
        self.m_va.append(0x7E0000000000 + (self.p_dqp[fwd] << 24) + va)
        return t_ns + self.duration_ns(size, rate_bps)

    def paths_between(self, src=None, dst=None, group=None, role="data"):
        out = []
        for i in range(len(self.p_src)):
            if self.p_role[i] != role:
                continue
            if src is not None and self.p_src[i] not in src:
                continue
            if dst is not None and self.p_dst[i] not in dst:
                continue
            if group is not None and self.p_group[i] not in group:
                continue
            out.append(i)
        return out

    def flow_key(self, p: int):
        return [self.ip_str[self.p_src[p]], self.ip_str[self.p_dst[p]], self.p_dqp[p]]

    # ------------------------------------------------------------------ running
    def path_arrays(self) -> dict:
        return {
            "src": np.array(self.p_src, dtype=np.int32), "dst": np.array(self.p_dst, dtype=np.int32),
            "sqp": np.array(self.p_sqp, dtype=np.int64), "dqp": np.array(self.p_dqp, dtype=np.int64),
            "sport": np.array(self.p_sport, dtype=np.int64), "dport": np.array(self.p_dport, dtype=np.int64),
            "group": np.array(self.p_group, dtype=np.int32), "rev": np.array(self.p_rev, dtype=np.int32),
            "rkey": np.array(self.p_rkey, dtype=np.int64), "psn0": np.array(self.p_psn0, dtype=np.int64),
            "channel": np.array(self.p_channel, dtype=np.int32),
        }

    def header_info(self) -> dict:
        sc = self.sc
        vlan = sc["vlan"]
        macs = np.array([list(F.node_mac(i)) for i in range(self.n)], dtype=np.uint8)
        hl = self.hdr_len
        tmpl = np.zeros((max(1, len(self.p_src)), hl), dtype=np.uint8)
        for i in range(len(self.p_src)):
            s, d = self.p_src[i], self.p_dst[i]
            t = F.l3_template(F.node_mac(s), F.node_mac(d), -1 if vlan is None else vlan,
                              sc["vlan_pcp"], self.ipv6, self.ips[s].packed, self.ips[d].packed,
                              self.p_sport[i], self.p_dport[i])
            tmpl[i] = np.frombuffer(t, dtype=np.uint8)
        return {"tmpl": tmpl, "hl": hl, "l2": hl - 8 - (40 if self.ipv6 else 20),
                "ipv6": self.ipv6, "pkey": sc["pkey"], "macs": macs}

    def run(self) -> dict:
        sc = self.sc
        pa = self.path_arrays()
        n_paths = len(self.p_src)
        nm = len(self.m_path)
        m_path = np.array(self.m_path, dtype=np.int64)
        m_t0 = np.array(self.m_t0, dtype=np.float64)
        order = np.lexsort((np.arange(nm), m_t0, m_path))
        m_path = m_path[order]
        m_t0 = m_t0[order]
        m_size = np.array(self.m_size, dtype=np.int64)[order]
        m_rate = np.array(self.m_rate, dtype=np.float64)[order]
        m_type = np.array(self.m_type, dtype=np.uint8)[order]
        m_va = np.array(self.m_va, dtype=np.uint64)[order]
        if self.imm_le:
            s32 = m_size.astype(np.uint32)
            m_imm = s32.byteswap()
        else:
            m_imm = m_size.astype(np.uint32)
        self.msg_arrays = {"path": m_path, "t0": m_t0, "size": m_size, "type": m_type}
        npk, opc, psn, plen, reth, imm, va, msg, flags = M.expand_messages(
            m_path, m_size, m_type, m_imm, m_va, pa["psn0"], self.mtu,
            int(sc["ackreq_every"]), max(1, n_paths))
        ng = opc.shape[0]
        flen = F.frame_lengths(np.zeros(ng, np.uint8), opc, plen, self.hdr_len)
        # ---- loss: choose dropped original packets
        drop = np.zeros(ng, dtype=np.uint8)
        pstart = np.searchsorted(m_path, np.arange(n_paths + 1))
        pkt_first = np.concatenate([[0], np.cumsum(npk)])
        for paths, prob, count, pidx in self.loss_specs:
            cand = []
            for p in paths:
                g0, g1 = pkt_first[pstart[p]], pkt_first[pstart[p + 1]]
                if g1 - g0 > 2:
                    cand.append(np.arange(g0 + 1, g1 - 1))
            if not cand:
                continue
            cand = np.concatenate(cand)
            win = self.spec_windows.get(("loss", pidx))
            if win is not None:   # timed: packets of messages that start in [since, until)
                ts_ = m_t0[msg[cand]]
                cand = cand[(ts_ >= win[0]) & (ts_ < win[1])]
                if not cand.size:
                    continue
            if count:
                k = min(count, cand.size)
                sel = np.sort(self.rng.choice(cand, size=k, replace=False))
            else:
                sel = cand[self.rng.random(cand.size) < prob]
            drop[sel] = 1
        max_out = ng * 2 + 16
        # The data of a message may not leave before its CTS has reached the sender: run
        # the timeline, push violating messages later, repeat (converges in a few rounds).
        m_cts = np.array(self.m_cts, dtype=np.int64)
        inv = np.empty(nm, dtype=np.int64)
        inv[order] = np.arange(nm)
        cts_sorted = np.where(m_cts[order] >= 0, inv[np.maximum(m_cts[order], 0)], -1)
        has_cts = np.nonzero(cts_sorted >= 0)[0]
        slack = float(sc["prop_ns"]) + 200.0
        for _round in range(30):
            tl = self._timeline(sc, pa, m_path, m_t0, m_rate, npk, flen, drop, max_out, opc,
                                psn, plen, reth, imm, va, flags, msg, order)
            req, t_up, t_obs, wire, mp, keep_first = tl
            # observed time of every (sorted) message's first transmission
            mk = inv[req["msg"]]
            first_obs = M.group_min(mk, t_obs, nm)
            first_up = M.group_min(mk, t_up, nm)
            need = first_obs[cts_sorted[has_cts]] + slack
            late = need > first_up[has_cts]
            if not late.any():
                break
            m_t0 = m_t0.copy()
            m_t0[has_cts[late]] = np.maximum(m_t0[has_cts[late]], need[late] + 1.0)
        self.stats["cts_rounds"] = _round + 1
        self.stats["cts_causal"] = not late.any() if has_cts.size else True
        nreq = mp.shape[0]
        # ---- responder
        is_last = np.isin(req["opcode"], np.array([F.WRITE_LAST, F.WRITE_LAST_IMM, F.WRITE_ONLY,
                                                    F.WRITE_ONLY_IMM], np.uint8))
        ro = np.argsort(mp, kind="stable")
        r_t, r_p, r_k, r_psn, r_aeth = M.responder(
            ro, req["path"], t_obs, req["psn"], req["flags"], req["opcode"], req["msg"],
            is_last, req["tos"], pa["rev"], float(sc["ack_coalesce_us"] * 1e3),
            float(sc["cnp_interval_us"] * 1e3), float(2 * sc["prop_ns"] + sc["resp_delay_ns"]),
            int(sc["ack_syndrome"]), n_paths)
        nr = r_t.shape[0]
        rsp = M.empty_pkts(nr)
        rsp["path"][:] = r_p
        rsp["opcode"][:] = np.where(r_k == 2, F.CNP, F.ACKNOWLEDGE).astype(np.uint8)
        rsp["psn"][:] = r_psn
        rsp["aeth"][:] = r_aeth
        rsp["tos"][:] = np.where(r_k == 2, DSCP_CNP << 2, self.tos_data).astype(np.uint8)
        rsp["flags"][:] = np.where(r_k == 2, M.FL_BECN, 0).astype(np.uint8)
        rsp["msg"][:] = -1
        # ---- PFC and background frames
        npf = len(self.pfc_frames)
        pfc = M.empty_pkts(npf)
        pf_t = np.array([f[0] for f in self.pfc_frames], dtype=np.float64)
        if npf:
            pfc["ftype"][:] = F.FT_PFC
            pfc["path"][:] = np.array([f[1] for f in self.pfc_frames], dtype=np.int32)
            pfc["psn"][:] = np.array([f[2] for f in self.pfc_frames], dtype=np.uint32)
            pfc["imm"][:] = np.array([f[3] for f in self.pfc_frames], dtype=np.uint32)
            pfc["msg"][:] = -1
        nbg = len(self.bg)
        bg = M.empty_pkts(nbg)
        bg_t = np.array([b[0] for b in self.bg], dtype=np.float64)
        if nbg:
            bg["ftype"][:] = F.FT_OTHER
            bg["path"][:] = np.array([b[1] for b in self.bg], dtype=np.int32)
            bg["plen"][:] = np.array([b[2] for b in self.bg], dtype=np.uint32)
            bg["msg"][:] = -1
        t_all = np.concatenate([t_obs, r_t, pf_t, bg_t])
        ts = np.floor(t_all).astype(np.int64)
        fo = np.argsort(ts, kind="stable")
        allp = M.take_concat_pkts([req, rsp, pfc, bg], fo)  # = take(concat(...), fo)
        allp["ts"] = ts[fo] + EPOCH_NS
        return allp

    def _timeline(self, sc, pa, m_path, m_t0, m_rate, npk, flen, drop, max_out, opc, psn, plen,
                  reth, imm, va, flags, msg, order):
        eg, et, er, ed = M.pace(m_path, m_t0, m_rate, npk, flen.astype(np.float64), drop,
                                float(sc["rtt_us"] * 1e3), max_out)
        # request packet table (incl. dropped, for the uplink)
        nreq = eg.shape[0]
        req = M.empty_pkts(nreq)
        mp = m_path[msg[eg]]
        req["path"][:] = mp.astype(np.int32)
        req["opcode"][:] = opc[eg]
        req["psn"][:] = psn[eg]
        req["plen"][:] = plen[eg]
        req["reth"][:] = reth[eg]
        req["imm"][:] = imm[eg]
        req["va"][:] = va[eg]
        req["flags"][:] = flags[eg]
        req["msg"][:] = order[msg[eg]]  # index into the builder's message list
        req["retx"][:] = er
        req["tos"][:] = self.tos_data
        wire = flen[eg].astype(np.float64) + WIRE_EXTRA
        # ---- uplink pass
        src = pa["src"][mp]
        o = M.node_time_order(src, et, self.n)  # = np.lexsort((et, src)), faster
        ub = _merge(self.up_blocks)
        link = self.link_bps.copy()
        t_up, _ = M.serialise(o, src, et, wire, link, np.array([b[0] for b in ub], np.int64),
                              np.array([b[1] for b in ub], np.float64),
                              np.array([b[2] for b in ub], np.float64))
        # ---- the fabric drops
        keep = ed == 0
        self.stats["dropped"] = int((~keep).sum())
        dropped_paths = mp[~keep]
        if self.stats["dropped"]:
            req = M.take_pkts(req, keep)
            t_up = t_up[keep]
            wire = wire[keep]
            mp = mp[keep]
        nreq = mp.shape[0]
        # ---- CE marks
        ce_count = {}
        data_op = (req["opcode"] != F.WRITE_ONLY) | (req["plen"] != 64)
        for paths, frac, pidx in self.ce_specs:
            sel = np.isin(mp, np.array(paths, dtype=np.int64)) & data_op
            win = self.spec_windows.get(("ce", pidx))
            if win is not None:   # timed: CE marks on packets sent in [since, until)
                sel &= (t_up >= win[0]) & (t_up < win[1])
            idx = np.nonzero(sel)[0]
            hit = idx[self.rng.random(idx.size) < frac]
            if sc["ecn"] != "none":
                req["tos"][hit] |= 3
            ce_count[pidx] = ce_count.get(pidx, 0) + int(hit.size)
        # ---- downlink pass (the observation point)
        dst = pa["dst"][mp]
        arr = t_up + sc["prop_ns"]
        o = M.node_time_order(dst, arr, self.n)  # = np.lexsort((arr, dst))
        db = _merge(self.down_blocks)
        t_obs, qd = M.serialise(o, dst, arr, wire, link, np.array([b[0] for b in db], np.int64),
                                np.array([b[1] for b in db], np.float64),
                                np.array([b[2] for b in db], np.float64))
        self.stats["max_queue_us"] = float(qd.max() / 1e3) if nreq else 0.0
        self.stats["ce_count"] = ce_count
        self.stats["dropped_paths"] = dropped_paths
        return req, t_up, t_obs, wire, mp, None
