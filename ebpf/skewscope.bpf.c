// SPDX-License-Identifier: GPL-2.0
/*
 * skewscope.bpf.c -- RoCE parser and per-QP accounting, one source for XDP and TC.
 *
 * Compiled by bcc (skewscope/dataplane.py) with these -D settings (all numeric, validated
 * in Python before they become flags):
 *   SS_MAX_FLOWS    flows LRU hash size (default 65536)
 *   SS_NCPUS        possible CPUs (message-record regions)
 *   SS_EV_PER_CPU   message-record slots per CPU (power of two)
 *   SS_SAMPLE_N     1-in-N random packet sampling of RoCE packets (1 = off)
 *   SS_XDP_FRAGS    XDP program is loaded with BPF_F_XDP_HAS_FRAGS (jumbo frames); set by
 *                   user space only when the kernel supports it (probed, Linux >= 5.18)
 *   SS_REPLAY_CLOCK time comes from the clock map (BPF_PROG_TEST_RUN replay), not ktime
 *
 * Invariants: the program never changes or drops a packet (XDP_PASS / TC_ACT_OK always);
 * every frame is counted in exactly one category of skewscope.h's SS_G_* list; headers are
 * only used after a bounds check; only UAPI headers are used (we declare the wire headers
 * here ourselves), so any kernel's headers let bcc build it.
 */
#include <uapi/linux/bpf.h>
#include "skewscope.h"

#ifndef SS_MAX_FLOWS
#define SS_MAX_FLOWS 65536
#endif
#ifndef SS_NCPUS
#define SS_NCPUS 64
#endif
#ifndef SS_EV_PER_CPU
#define SS_EV_PER_CPU 65536
#endif
#ifndef SS_SAMPLE_N
#define SS_SAMPLE_N 1
#endif

#ifdef SS_XDP_FRAGS
/* BPF_FUNC_xdp_get_buff_len (Linux 5.18, with BPF_F_XDP_HAS_FRAGS), by its stable helper
 * number so that neither bcc's helper list nor the kernel headers need to know it. */
static __u64 (*ss_xdp_get_buff_len)(struct xdp_md *ctx) = (void *)188;
#endif

#ifdef SS_XDP_KCTX
/* The XDP wire length without a helper call (a call costs 5-15 ns on CPUs with return-
 * thunk mitigations): the same arithmetic as the kernel's xdp_get_buff_len(), on the
 * kernel's struct xdp_buff reached through two kfuncs that the verifier turns into plain
 * register moves (bpf_cast_to_kern_ctx, Linux 6.2; bpf_rdonly_cast, 6.3). bcc cannot emit
 * kfunc calls, so the source calls two out-of-range helper numbers that user space
 * (dataplane.Dataplane.prog_fd) rewrites into the kfunc calls, by BTF id; offsets and ids
 * come from the running kernel's BTF as -D flags (dataplane.xdp_kctx_layout), and user
 * space checks the result against bpf_xdp_get_buff_len once at load (skewscope_lenprobe)
 * and builds without this when anything is missing or differs. */
static void *(*ss_cast_to_kern_ctx)(void *ctx) = (void *)SS_KF_CAST_KCTX;
static void *(*ss_rdonly_cast)(__u64 p, __u32 btf_id) = (void *)SS_KF_RDONLY_CAST;

static __always_inline __u64 ss_xdp_len(struct xdp_md *ctx, void *data, void *data_end)
{
	void *kx = ss_cast_to_kern_ctx(ctx);
	__u64 len = data_end - data;

	if (__builtin_expect(*(__u32 *)(kx + SS_KX_FLAGS_OFF) & SS_KX_HAS_FRAGS, 0)) {
		/* skb_shared_info sits at the end of the frame's first buffer */
		__u64 hard = *(__u64 *)(kx + SS_KX_HARD_OFF);
		__u32 fsz = *(__u32 *)(kx + SS_KX_FRAMESZ_OFF);
		void *si = ss_rdonly_cast(hard + fsz - SS_KX_SINFO_ALIGNED, SS_KX_SINFO_ID);
		len += *(__u32 *)(si + SS_KX_FRAGS_SIZE_OFF);
	}
	return len;
}

/* Load-time check (user space test-runs it on a linear and on a multi-buffer frame):
 * returns 1 when ss_xdp_len agrees with bpf_xdp_get_buff_len, else 0. */
int skewscope_lenprobe(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u64 a = ss_xdp_len(ctx, data, data_end);

	return a == ss_xdp_get_buff_len(ctx) ? 1 : 0;
}
#endif

/* The two seq stores of a message record: atomic exchanges (BPF_XCHG, Linux >= 5.12) are
 * fully ordered in the BPF memory model, so on weakly ordered CPUs (arm64 DPUs) a record is
 * never visible with a valid seq before its fields. Older kernels: plain stores behind a
 * compiler barrier (ordered on x86). User space sets SS_ORDERED_SEQ by kernel version. */
#ifdef SS_ORDERED_SEQ
#define SS_SEQ_STORE(field, v) __sync_lock_test_and_set(&(field), (v))
#else
#define SS_SEQ_STORE(field, v) do { asm volatile("" ::: "memory"); (field) = (v); \
				    asm volatile("" ::: "memory"); } while (0)
#endif

#define SS_XDP_PASS 2
#define SS_TC_ACT_OK 0

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define ss_ntohs(x) __builtin_bswap16(x)
#define ss_ntohl(x) __builtin_bswap32(x)
#else
#define ss_ntohs(x) (x)
#define ss_ntohl(x) (x)
#endif

/* Bounds check against both the real end of the packet and, in replay, the end of the
 * captured bytes (a snaplen-cut record is padded back to its original length so that
 * lengths are right, but the padding must never be parsed as headers). Live, cap_end ==
 * data_end and the compiler folds the two tests into one. */
#define OOB(p) ((void *)(p) > data_end || (void *)(p) > cap_end)

/* "now" for the packet being accounted: the capture's timestamp in replay builds (set in
 * the clock map by user space), else CLOCK_MONOTONIC. */
#ifdef SS_REPLAY_CLOCK
#define SS_NOW(rts) (rts)
#else
#define SS_NOW(rts) bpf_ktime_get_ns()
#endif

/* Longest header chain the parser reads: Ethernet, 2 VLAN tags, IPv4 with 40 bytes of
 * options, UDP, BTH, the longest extension headers (XRCETH + AtomicETH), behind at most one
 * encapsulation. The TC entry pulls
 * this much into the linear part of a non-linear skb when a header was cut there. */
#define SS_HDR_MAX_PLAIN (14 + 4 * SS_MAX_VLAN + 60 + 8 + 12 + 32)
/* + an encapsulation in front: outer Ethernet, 2 tags, IPv4 with options, GRE with C/K/S,
 * ERSPAN III with its platform subheader (VXLAN and IPv6 outers are shorter) */
#define SS_HDR_MAX (14 + 4 * SS_MAX_VLAN + 60 + 16 + 20 + SS_HDR_MAX_PLAIN)

/* Wire headers, declared here so only UAPI headers are needed. Not packed: every field is
 * naturally aligned within its header, so clang emits whole-word loads (packed structs cost
 * byte-by-byte loads); the headers themselves may sit at 2-byte-aligned packet offsets,
 * which the verifier allows on architectures with efficient unaligned access (x86-64,
 * arm64), where XDP/TC programs like this one run. */
struct ss_eth { __u8 dst[6]; __u8 src[6]; __be16 proto; };
struct ss_vlan { __be16 tci; __be16 proto; };
struct ss_ipv4 {
	__u8 ver_ihl; __u8 tos; __be16 tot_len; __be16 id; __be16 frag_off;
	__u8 ttl; __u8 protocol; __be16 check; __u8 saddr[4]; __u8 daddr[4];
};
struct ss_ipv6 {  /* also the RoCEv1 GRH: same layout, next header 0x1B */
	__be32 vtcfl; __be16 payload_len; __u8 nexthdr; __u8 hop_limit;
	__u8 saddr[16]; __u8 daddr[16];
};
struct ss_udp { __be16 source; __be16 dest; __be16 len; __be16 check; };
struct ss_bth {
	__u8 opcode; __u8 se_m_pad_tver; __be16 pkey; __u8 fb_resv; __u8 dqpn[3];
	__u8 ack_resv; __u8 psn[3];
};
struct ss_macctl { __be16 opcode; __be16 class_enable; __be16 time[8]; };

BPF_TABLE("lru_hash", struct ss_flow_key, struct ss_flow_stats, flows, SS_MAX_FLOWS);
BPF_PERCPU_ARRAY(globals, __u64, SS_G_N);
BPF_ARRAY(op_table, __u32, 256);
BPF_ARRAY(zero_stats, struct ss_flow_stats, 1);  /* never written: template for inserts */
BPF_F_TABLE("array", __u32, struct ss_msg_rec, msg_events, SS_NCPUS * SS_EV_PER_CPU, BPF_F_MMAPABLE);
BPF_PERCPU_ARRAY(ev_head, __u64, 1);
#ifdef SS_REPLAY_CLOCK
BPF_PERCPU_ARRAY(clock, struct ss_replay, 1);
#endif

static __always_inline void gcount(__u32 idx, __u64 n)
{
	__u64 *v = globals.lookup(&idx);
	if (v)
		*v += n;  /* per-CPU: no atomics needed */
}

/* floor(log2(v)) for v > 0 (branch-free, as in libbpf-tools bits.bpf.h) */
static __always_inline __u32 ss_log2(__u32 v)
{
	__u32 r, shift;
	r = (v > 0xFFFF) << 4; v >>= r;
	shift = (v > 0xFF) << 3; v >>= shift; r |= shift;
	shift = (v > 0xF) << 2; v >>= shift; r |= shift;
	shift = (v > 0x3) << 1; v >>= shift; r |= shift;
	r |= (v >> 1);
	return r;
}

static __always_inline __u32 ss_log2l(__u64 v)
{
	__u32 hi = v >> 32;
	return hi ? ss_log2(hi) + 32 : ss_log2((__u32)v);
}

/* slot 0 for 0, else floor(log2 v) + 1, clamped to the last slot */
static __always_inline __u32 ss_slot(__u64 v, __u32 nslots)
{
	__u32 s;
	if (v == 0)
		return 0;
	s = ss_log2l(v) + 1;
	return s < nslots ? s : nslots - 1;
}

static __always_inline void emit_record(struct ss_flow_key *key, __u64 start, __u64 end,
					__u64 bytes, __u8 opclass)
{
#if SS_SAMPLE_N <= 1
	__u32 z = 0, cpu, idx;
	__u64 *head, seq;
	struct ss_msg_rec *r;

	cpu = bpf_get_smp_processor_id();
	if (cpu >= SS_NCPUS)
		return;
	head = ev_head.lookup(&z);
	if (!head)
		return;
	seq = *head;
	idx = cpu * SS_EV_PER_CPU + (__u32)(seq & (SS_EV_PER_CPU - 1));
	r = msg_events.lookup(&idx);
	if (!r)
		return;
	/* seqlock-style slot protocol (user space: dataplane.read_new_records): seq = 0, record,
	 * seq = sequence + 1. */
	SS_SEQ_STORE(r->seq, 0);
	__builtin_memcpy(&r->key, key, sizeof(*key));
	r->start_ts = start;
	r->end_ts = end;
	r->bytes = bytes;
	r->opclass = opclass;
	SS_SEQ_STORE(r->seq, seq + 1);
	*head = seq + 1;
#endif
}

/* Everything the parser learned about one RoCE packet. */
struct ss_pkt {
	__u64 wire_len;
	__u64 payload;
	__u32 opinfo;
	__u32 dest_qp;
	__u32 psn;
	__u32 reth_len;
	__u16 sport;
	__u8  opcode;
	__u8  tclass;
	__u8  ecn_valid;
	__u8  fb;        /* BTH byte 4: FECN bit 7, BECN bit 6 */
	__u8  syndrome;
};

/* Account one parsed RoCE packet to its flow. Returns the frame's category: accounted,
 * sampled_out or no_flow_slot. The clock is read only here, after the flow lookup: frames
 * that are not accounted never pay for it. */
static __always_inline __u32 account(struct ss_flow_key *key, struct ss_pkt *p, __u64 rts)
{
	struct ss_flow_stats *f;
	__u32 opinfo = p->opinfo, cls = (opinfo & SS_OPT_CLASS_MASK) >> SS_OPT_CLASS_SHIFT;
	__u32 z = 0;
	__u64 ts;

#if SS_SAMPLE_N > 1
	if (bpf_get_prandom_u32() % SS_SAMPLE_N)
		return SS_G_SAMPLED_OUT;
#endif
	f = flows.lookup(key);
	if (!f) {
		struct ss_flow_stats *zero = zero_stats.lookup(&z);
		if (!zero || flows.insert(key, zero) != 0) {
			/* insert can race with another CPU inserting the same key: retry lookup */
			f = flows.lookup(key);
			if (!f)
				return SS_G_NO_FLOW_SLOT;
		} else {
			gcount(SS_G_FLOWS_CREATED, 1);
			f = flows.lookup(key);
			if (!f)
				return SS_G_NO_FLOW_SLOT;
		}
	}
	ts = SS_NOW(rts);

	/* Plain (non-atomic) updates: a flow's packets are processed by one CPU at a time
	 * (RSS hashes the UDP 5-tuple, constant per QP), see docs/datapath.md. */
	if (f->packets == 0)
		f->first_ts = ts;
	f->packets += 1;
	f->bytes += p->wire_len;
	f->payload_bytes += p->payload;
	f->last_ts = ts;
	if (cls < SS_N_OPCLASS)
		f->op[cls & (SS_N_OPCLASS - 1)] += 1;
	if (p->ecn_valid) {
		__u8 ecn = p->tclass & 3;
		if (ecn) {
			f->ecn_capable += 1;
			f->ce += ecn == 3;
		}
	}
	if (__builtin_expect(p->fb & 0xC0, 0)) {
		f->fecn += p->fb >> 7;
		f->becn += (p->fb >> 6) & 1;
	}
	f->sport = p->sport;
	f->tclass = p->tclass;
	f->last_opcode = p->opcode;

	if (__builtin_expect(opinfo & (SS_OPT_CNP | SS_OPT_ACKNOWLEDGE), 0)) {
		if (opinfo & SS_OPT_CNP)
			f->cnp += 1;
		if (opinfo & SS_OPT_ACKNOWLEDGE) {
			__u8 s = p->syndrome >> 5;
			if (s == 0)
				f->acks += 1;
			else if (s == 1)
				f->nak_rnr += 1;
			else if (s == 3 && (p->syndrome & 0x1F) == 0)
				f->nak_seq += 1;
			else
				f->nak_other += 1;
		}
	}

#if SS_SAMPLE_N <= 1
	/* PSN tracking on request packets (24-bit serial arithmetic). */
	if (opinfo & SS_OPT_REQUEST) {
		if (!(f->flags & SS_FF_PSN_VALID)) {
			f->flags |= SS_FF_PSN_VALID;
			f->next_psn = (p->psn + 1) & SS_PSN_MASK;
		} else {
			__u32 d = (p->psn - f->next_psn) & SS_PSN_MASK;
			if (d >= SS_PSN_HALF) {
				f->retransmissions += 1;
			} else {
				if (d != 0 && !(f->flags & SS_FF_AFTER_READ)) {
					f->psn_gaps += 1;
					f->psn_skipped += d;
				}
				f->next_psn = (p->psn + 1) & SS_PSN_MASK;
				f->flags &= ~SS_FF_AFTER_READ;
			}
		}
		if (cls == SS_OPC_READ_REQ)
			f->flags |= SS_FF_AFTER_READ;
	}
#endif

	/* Hot path: a packet that neither starts nor ends a message and is not a SEND (WRITE
	 * MIDDLE, READ_RESPONSE, ACK, CNP) is done. */
	if (!(opinfo & (SS_OPT_FIRST | SS_OPT_LAST)) && cls != SS_OPC_SEND)
		return SS_G_ACCOUNTED;

	/* Messages: starts, sizes, gaps, records. */
	if (opinfo & SS_OPT_FIRST) {
		f->messages += 1;
		if (opinfo & SS_OPT_RETH) {
			f->msg_hist[ss_slot(p->reth_len, SS_MSG_SLOTS)] += 1;
			f->msg_bytes += p->reth_len;
		}
#if SS_SAMPLE_N <= 1
		if (f->flags & SS_FF_MSG_STARTED) {
			__u64 gap = ts >= f->last_msg_ts ? ts - f->last_msg_ts : 0;
			f->gap_hist[ss_slot(gap, SS_GAP_SLOTS)] += 1;
		}
		f->last_msg_ts = ts;
		f->flags |= SS_FF_MSG_STARTED | SS_FF_MSG_OPEN;
		f->msg_start_ts = ts;
		f->msg_class = cls;
		f->msg_cur_bytes = (cls == SS_OPC_SEND) ? 0 : p->reth_len;
		if (cls == SS_OPC_READ_REQ) {
			emit_record(key, ts, ts, p->reth_len, SS_OPC_READ_REQ);
			f->flags &= ~SS_FF_MSG_OPEN;
		}
#endif
	}
#if SS_SAMPLE_N <= 1
	if (cls == SS_OPC_SEND && (f->flags & SS_FF_MSG_OPEN) && f->msg_class == SS_OPC_SEND)
		f->msg_cur_bytes += p->payload;
	if (opinfo & SS_OPT_LAST) {
		if ((f->flags & SS_FF_MSG_OPEN) && f->msg_class == cls) {
			if (cls == SS_OPC_SEND) {
				f->msg_hist[ss_slot(f->msg_cur_bytes, SS_MSG_SLOTS)] += 1;
				f->msg_bytes += f->msg_cur_bytes;
			}
			emit_record(key, f->msg_start_ts, ts, f->msg_cur_bytes, cls);
			f->flags &= ~SS_FF_MSG_OPEN;
		} else {
			gcount(SS_G_MSG_PARTIAL, 1);
		}
	}
#else
	/* counters-only sampling: SEND sizes need every packet; count ONLY sends only */
	if (cls == SS_OPC_SEND && (opinfo & SS_OPT_FIRST) && (opinfo & SS_OPT_LAST)) {
		f->msg_hist[ss_slot(p->payload, SS_MSG_SLOTS)] += 1;
		f->msg_bytes += p->payload;
	}
#endif
	return SS_G_ACCOUNTED;
}

/* Parse BTH + extension headers at bth; fills p. Returns a category (SS_G_ACCOUNTED
 * when the packet is good to account). avail = bytes the transport may span (UDP length
 * - 8 for RoCEv2, GRH payload length for RoCEv1). */
static __always_inline __u32 parse_bth(void *bth_p, void *data_end, void *cap_end, __u32 avail,
					 struct ss_pkt *p)
{
	struct ss_bth *bth = bth_p;
	__u32 *oi, op, ext, prefix, pad, need;

	if (OOB(bth + 1))
		return SS_G_TRUNC_BTH;
	op = bth->opcode;
	oi = op_table.lookup(&op);
	if (!oi || !(*oi & SS_OPT_VALID))
		return SS_G_UNKNOWN_OPCODE;
	p->opinfo = *oi;
	p->opcode = op;
	p->reth_len = 0;
	p->syndrome = 0;
	ext = p->opinfo & SS_OPT_EXTLEN_MASK;
	prefix = (p->opinfo & SS_OPT_PREFIX_MASK) >> SS_OPT_PREFIX_SHIFT;
	pad = (bth->se_m_pad_tver >> 4) & 3;
	need = sizeof(*bth) + ext + pad + 4;  /* + ICRC */
	if (avail < need)
		return SS_G_BAD_LENGTH;
	p->payload = avail - need;
	p->fb = bth->fb_resv;
	p->dest_qp = ((__u32)bth->dqpn[0] << 16) | ((__u32)bth->dqpn[1] << 8) | bth->dqpn[2];
	p->psn = ((__u32)bth->psn[0] << 16) | ((__u32)bth->psn[1] << 8) | bth->psn[2];
	if (OOB((void *)(bth + 1) + ext))
		return SS_G_TRUNC_EXT;
	if (p->opinfo & SS_OPT_RETH) {
		__u8 *r = (__u8 *)(bth + 1) + (prefix & 0xF);
		if (OOB(r + 16))
			return SS_G_TRUNC_EXT;
		p->reth_len = ((__u32)r[12] << 24) | ((__u32)r[13] << 16) | ((__u32)r[14] << 8) | r[15];
	}
	if (p->opinfo & SS_OPT_AETH) {
		__u8 *a = (__u8 *)(bth + 1) + (prefix & 0xF);
		if (OOB(a + 4))
			return SS_G_TRUNC_EXT;
		p->syndrome = a[0];
	}
	return SS_G_ACCOUNTED;
}

static __always_inline __u32 handle_macctl(void *cur, void *data_end, void *cap_end)
{
	struct ss_macctl *m = cur;
	__u16 opc, en;

	if (OOB(m + 1)) {
		/* a global pause needs only opcode + 1 time */
		if (!OOB((void *)m + 4) && ss_ntohs(m->opcode) == SS_MACCTL_PAUSE)
			return SS_G_PAUSE;
		return SS_G_TRUNC_MACCTL;
	}
	opc = ss_ntohs(m->opcode);
	if (opc == SS_MACCTL_PAUSE)
		return SS_G_PAUSE;
	if (opc != SS_MACCTL_PFC)
		return SS_G_NON_ROCE;
	en = ss_ntohs(m->class_enable);
#pragma unroll
	for (int i = 0; i < 8; i++) {
		if (en & (1 << i)) {
			__u16 t = ss_ntohs(m->time[i]);
			if (t) {
				gcount(SS_G_PFC_PAUSE + i, 1);
				gcount(SS_G_PFC_QUANTA + i, t);
			} else {
				gcount(SS_G_PFC_XON + i, 1);
			}
		}
	}
	return SS_G_PFC;
}

/* Ethernet header + up to SS_MAX_VLAN tags at *curp; on success (SS_G_ACCOUNTED) *curp is the
 * L3 header and *protop its EtherType. pre_tags: VLAN tags already taken out of the frame
 * into skb metadata (TC; they count against SS_MAX_VLAN). Used for the outer and the inner
 * (decapsulated) frame alike. */
static __always_inline __u32 parse_l2(void **curp, __u16 *protop, void *data_end, void *cap_end,
				      __u32 pre_tags)
{
	struct ss_eth *eth = *curp;
	void *cur;
	__u16 proto;

	if (OOB(eth + 1))
		return SS_G_TRUNC_ETH;
	cur = eth + 1;
	proto = ss_ntohs(eth->proto);
#pragma unroll
	for (int i = 0; i < SS_MAX_VLAN; i++) {
		if (proto != 0x8100 && proto != 0x88A8)
			break;
		if (i + pre_tags >= SS_MAX_VLAN)
			return SS_G_VLAN_DEPTH;
		struct ss_vlan *v = cur;
		if (OOB(v + 1))
			return SS_G_TRUNC_VLAN;
		proto = ss_ntohs(v->proto);
		cur = v + 1;
	}
	if (proto == 0x8100 || proto == 0x88A8)
		return SS_G_VLAN_DEPTH;
	*curp = cur;
	*protop = proto;
	return SS_G_ACCOUNTED;
}

/* internal result of parse_l3 on an outer frame: an encapsulation was found (never a
 * category: the inner frame is parsed and lands in one) */
#define SS_DECAP 0xFF

/* GRE header (RFC 2784/2890) at g, inside an outer IP packet; on success the inner frame
 * starts at *inner: an Ethernet header (*iproto = 0: TEB, ERSPAN I/II/III) or an IP header
 * (*iproto = its EtherType). Cut inside GRE/ERSPAN headers, or the routing bit (obsolete
 * RFC 1701 source routes, which receivers must discard): truncated_ip, like the IP header
 * that carries it. GRE version != 0 (PPTP) and other protocols: non_roce. */
static __always_inline __u32 parse_gre(void *g, void *data_end, void *cap_end, void **inner,
				       __u16 *iproto)
{
	__u16 flags, gp;
	void *cur;

	if (OOB(g + 4))
		return SS_G_TRUNC_IP;
	flags = ss_ntohs(*(__be16 *)g);
	gp = ss_ntohs(*(__be16 *)(g + 2));
	if (flags & 0x0007)
		return SS_G_NON_ROCE;
	if (flags & 0x4000)
		return SS_G_TRUNC_IP;
	/* C, K, S: checksum(+reserved), key, sequence number: 4 bytes each */
	cur = g + 4 + ((flags >> 13) & 4) + ((flags >> 11) & 4) + ((flags >> 10) & 4);
	*iproto = 0;
	if (gp == SS_GRE_P_TEB) {
	} else if (gp == SS_GRE_P_ERSPAN2) {
		if (flags & 0x1000)        /* type II; type I (no sequence) has no header */
			cur += 8;
	} else if (gp == SS_GRE_P_ERSPAN3) {
		__u8 *e = cur;
		if (OOB(e + 12))
			return SS_G_TRUNC_IP;
		cur += (e[11] & 1) ? 20 : 12;  /* O bit: 8-byte platform-specific subheader */
	} else if (gp == 0x0800 || gp == 0x86DD) {
		*iproto = gp;
	} else {
		return SS_G_NON_ROCE;
	}
	if (OOB(cur))
		return SS_G_TRUNC_IP;
	*inner = cur;
	return SS_DECAP;
}

/* L3 (IPv4/IPv6 + UDP, RoCEv1 GRH, MAC control) at cur with EtherType proto, then the BTH;
 * fills key and p. l3off = where cur is on the wire (relative to the frame's Ethernet
 * header); *l3end = where the IP/GRH length says it ends. outer: the top-level frame, where
 * GRE and VXLAN are recognised (SS_DECAP, *inner / *iproto as parse_gre); the inner frame
 * is parsed with outer = 0, so an encapsulation inside it is non_roce (one level only). */
static __always_inline __u32 parse_l3(void *cur, __u16 proto, void *data_end, void *cap_end,
				      __u64 l3off, const int outer, struct ss_flow_key *key,
				      struct ss_pkt *p, __u64 *l3end, void **inner, __u16 *iproto)
{
	if (proto == 0x0800) {
		struct ss_ipv4 *ip = cur;
		struct ss_udp *udp;
		__u32 ihl, tot, ulen;

		if (OOB(ip + 1))
			return SS_G_TRUNC_IP;
		ihl = (ip->ver_ihl & 0xF) * 4;
		if ((ip->ver_ihl >> 4) != 4 || ihl < 20)
			return SS_G_TRUNC_IP;
		if (ss_ntohs(ip->frag_off) & 0x3FFF)
			return SS_G_FRAGMENT;
		if (ip->protocol != 17) {
			if (outer && ip->protocol == SS_IPPROTO_GRE) {
				*l3end = l3off + ss_ntohs(ip->tot_len);
				return parse_gre((void *)ip + ihl, data_end, cap_end, inner, iproto);
			}
			return SS_G_NON_ROCE;
		}
		udp = (void *)ip + ihl;
		if (OOB(udp + 1)) {
			/* options may push the UDP header out of a short capture */
			return OOB((void *)ip + ihl) ? SS_G_TRUNC_IP : SS_G_TRUNC_UDP;
		}
		if (ss_ntohs(udp->dest) != SS_ROCE_UDP_PORT) {
			if (outer && ss_ntohs(udp->dest) == SS_VXLAN_UDP_PORT) {
				if (OOB((void *)(udp + 1) + 8))
					return SS_G_TRUNC_UDP;
				*l3end = l3off + ss_ntohs(ip->tot_len);
				*inner = (void *)(udp + 1) + 8;
				*iproto = 0;
				return SS_DECAP;
			}
			return SS_G_NON_ROCE;
		}
		tot = ss_ntohs(ip->tot_len);
		ulen = ss_ntohs(udp->len);
		if (ulen < 8 || tot < ihl + ulen)
			return SS_G_BAD_LENGTH;
		key->src[10] = 0xff; key->src[11] = 0xff;
		key->dst[10] = 0xff; key->dst[11] = 0xff;
		__builtin_memcpy(&key->src[12], ip->saddr, 4);
		__builtin_memcpy(&key->dst[12], ip->daddr, 4);
		key->ipver = 4;
		key->roce = 2;
		p->tclass = ip->tos;
		p->ecn_valid = 1;
		p->sport = ss_ntohs(udp->source);
		*l3end = l3off + tot;
		return parse_bth(udp + 1, data_end, cap_end, ulen - 8, p);
	} else if (proto == 0x86DD) {
		struct ss_ipv6 *ip6 = cur;
		struct ss_udp *udp;
		__u32 plen, ulen, vtcfl;

		if (OOB(ip6 + 1))
			return SS_G_TRUNC_IP;
		vtcfl = ss_ntohl(ip6->vtcfl);
		if ((vtcfl >> 28) != 6)
			return SS_G_TRUNC_IP;
		if (ip6->nexthdr == 44)
			return SS_G_FRAGMENT;
		if (ip6->nexthdr != 17) {
			if (outer && ip6->nexthdr == SS_IPPROTO_GRE) {
				*l3end = l3off + sizeof(*ip6) + ss_ntohs(ip6->payload_len);
				return parse_gre(ip6 + 1, data_end, cap_end, inner, iproto);
			}
			return SS_G_NON_ROCE;
		}
		udp = (void *)(ip6 + 1);
		if (OOB(udp + 1))
			return SS_G_TRUNC_UDP;
		if (ss_ntohs(udp->dest) != SS_ROCE_UDP_PORT) {
			if (outer && ss_ntohs(udp->dest) == SS_VXLAN_UDP_PORT) {
				if (OOB((void *)(udp + 1) + 8))
					return SS_G_TRUNC_UDP;
				*l3end = l3off + sizeof(*ip6) + ss_ntohs(ip6->payload_len);
				*inner = (void *)(udp + 1) + 8;
				*iproto = 0;
				return SS_DECAP;
			}
			return SS_G_NON_ROCE;
		}
		plen = ss_ntohs(ip6->payload_len);
		ulen = ss_ntohs(udp->len);
		if (ulen < 8 || plen < ulen)
			return SS_G_BAD_LENGTH;
		__builtin_memcpy(key->src, ip6->saddr, 16);
		__builtin_memcpy(key->dst, ip6->daddr, 16);
		key->ipver = 6;
		key->roce = 2;
		p->tclass = (vtcfl >> 20) & 0xFF;
		p->ecn_valid = 1;
		p->sport = ss_ntohs(udp->source);
		*l3end = l3off + sizeof(*ip6) + plen;
		return parse_bth(udp + 1, data_end, cap_end, ulen - 8, p);
	} else if (proto == SS_ETH_P_ROCEV1) {
		struct ss_ipv6 *grh = cur;
		__u32 vtcfl;

		if (OOB(grh + 1))
			return SS_G_TRUNC_GRH;
		vtcfl = ss_ntohl(grh->vtcfl);
		if ((vtcfl >> 28) != 6)
			return SS_G_TRUNC_GRH;
		__builtin_memcpy(key->src, grh->saddr, 16);
		__builtin_memcpy(key->dst, grh->daddr, 16);
		key->ipver = 6;
		key->roce = 1;
		p->tclass = (vtcfl >> 20) & 0xFF;
		p->ecn_valid = 0;
		p->sport = 0;
		*l3end = l3off + sizeof(*grh) + ss_ntohs(grh->payload_len);
		return parse_bth(grh + 1, data_end, cap_end, ss_ntohs(grh->payload_len), p);
	} else if (proto == SS_ETH_P_MACCTL) {
		return handle_macctl(cur, data_end, cap_end);
	}
	return SS_G_NON_ROCE;
}

/* Parse one frame [data, data_end) whose full wire length is wire_len and account it;
 * returns its category (the caller counts it). pre_tags: VLAN tags already taken out of
 * the frame into skb metadata (TC; they count against SS_MAX_VLAN and are in wire_len).
 * rts: the replay timestamp (replay builds).
 *
 * One level of decapsulation: when the outer frame is GRE (ERSPAN, TEB, IP) or VXLAN, the
 * inner frame is parsed exactly like a top-level one (its own VLAN tags, the same
 * categories) and accounted with the inner addresses; its bytes are the inner Ethernet
 * frame's: the wire length minus everything before the inner Ethernet header (GRE carrying
 * IP directly: + 14 for a synthesised Ethernet header, as for raw-IP captures). */
static __always_inline __u32 process(void *data, void *data_end, void *cap_end, __u64 wire_len,
				     __u32 pre_tags, __u64 rts)
{
	struct ss_flow_key key = {};
	struct ss_pkt p;  /* every field is set by the parser before it is used */
	void *cur = data, *inner = data;
	__u16 proto = 0, iproto = 0;
	__u32 cat;
	__u64 l3end = 0;

	cat = parse_l2(&cur, &proto, data_end, cap_end, pre_tags);
	if (cat != SS_G_ACCOUNTED)
		return cat;
	/* where L3 starts on the wire (an accelerated tag is in wire_len, not in data);
	 * l3end = where its length field says it ends (checked last) */
	cat = parse_l3(cur, proto, data_end, cap_end, cur - data + 4 * pre_tags, 1, &key, &p,
		       &l3end, &inner, &iproto);
	if (__builtin_expect(cat == SS_DECAP, 0)) {
		__u64 outer_end = l3end, frame_len = wire_len, ioff = inner - data, l3off = 14;

		/* keep clang from folding the pointer difference into scalar arithmetic the
		 * verifier refuses (scalar - pointer) */
		asm volatile("" : "+r"(ioff));
		ioff += 4 * pre_tags;

		gcount(SS_G_DECAP, 1);
		wire_len = wire_len > ioff ? wire_len - ioff : 0;
		cur = inner;
		if (iproto) {
			wire_len += 14;  /* GRE carrying IP: synthesised Ethernet header */
			proto = iproto;
		} else {
			cat = parse_l2(&cur, &proto, data_end, cap_end, 0);
			if (cat != SS_G_ACCOUNTED)
				return cat;
			l3off = cur - inner;
			asm volatile("" : "+r"(l3off));
		}
		cat = parse_l3(cur, proto, data_end, cap_end, l3off, 0, &key, &p, &l3end, &inner,
			       &iproto);
		/* the outer IP length lies about the frame: as for a plain frame */
		if (cat == SS_G_ACCOUNTED && outer_end > frame_len)
			cat = SS_G_BAD_LENGTH;
	}
	/* Headers all present, but the IP/GRH length claims more bytes than the frame has: a
	 * length lie (Linux's ip_rcv drops these as truncated). Accounting it would add up to
	 * 64 KiB of payload that never existed. Checked after the header parse so a frame cut
	 * inside a header still counts as truncated_<that header>. */
	if (cat == SS_G_ACCOUNTED && l3end > wire_len)
		cat = SS_G_BAD_LENGTH;
	if (cat != SS_G_ACCOUNTED)
		return cat;
	p.wire_len = wire_len;
	key.dest_qp = p.dest_qp;
	return account(&key, &p, rts);
}

static __always_inline int ss_truncated(__u32 cat)
{
	return cat >= SS_G_TRUNC_VLAN && cat <= SS_G_TRUNC_MACCTL && cat != SS_G_VLAN_DEPTH;
}

/* Replay builds (BPF_PROG_TEST_RUN): the record's timestamp, captured length and (when user
 * space had to cut the frame, e.g. TC test runs take < 4 KiB) original length come from the
 * clock map. Live builds: the end of the data, the real length, the clock. */
#ifdef SS_REPLAY_CLOCK
static __always_inline int replay_in(struct ss_replay *out)
{
	__u32 z = 0;
	struct ss_replay *r = clock.lookup(&z);

	if (!r)
		return 0;
	*out = *r;
	return 1;
}
#define SS_REPLAY_PROLOGUE(len, verdict)				\
	struct ss_replay rin;						\
	if (!replay_in(&rin))						\
		return (verdict);					\
	__u64 rts = rin.ts;						\
	__u32 caplen = rin.caplen & 0xFFFF;				\
	if (rin.wire_len)						\
		len = rin.wire_len;
#define SS_CAP_END(data, data_end) ((data) + caplen)
#else
#define SS_REPLAY_PROLOGUE(len, verdict) __u64 rts = 0;
#define SS_CAP_END(data, data_end) (data_end)
#endif

int skewscope_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 cat;
#if defined(SS_XDP_KCTX)
	/* frags: data_end ends the linear part (headers are there with every driver we know
	 * of); the wire length is the whole multi-buffer frame */
	__u64 len = ss_xdp_len(ctx, data, data_end);
#elif defined(SS_XDP_FRAGS)
	__u64 len = ss_xdp_get_buff_len(ctx);
#else
	__u64 len = data_end - data;
#endif
	SS_REPLAY_PROLOGUE(len, SS_XDP_PASS)

	gcount(SS_G_FRAMES, 1);
	cat = process(data, data_end, SS_CAP_END(data, data_end), len, 0, rts);
	gcount(cat, 1);
	return SS_XDP_PASS;
}

int skewscope_tc(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	/* A VLAN tag in skb metadata (always the outer tag on ingress, where the stack untags
	 * before TC; on egress with tx VLAN offload) is not in the data: it counts in the wire
	 * length and against the tag depth, so TC and XDP agree. */
	__u32 tags = skb->vlan_present ? 1 : 0;
	__u64 len = skb->len + 4 * tags;
	__u32 cat;
	SS_REPLAY_PROLOGUE(len, SS_TC_ACT_OK)

	gcount(SS_G_FRAMES, 1);
	cat = process(data, data_end, SS_CAP_END(data, data_end), len, tags, rts);
	/* A header cut at the end of the linear part of a non-linear skb (drivers that copy
	 * only up to the UDP header, AF_PACKET senders, GRO): pull the header bytes in and
	 * parse again. Only then: other traffic is never touched. The pull may reallocate the
	 * skb head; the packet's bytes do not change. */
	if (ss_truncated(cat) && skb->len > (__u32)(data_end - data)) {
		if (bpf_skb_pull_data(skb, skb->len < SS_HDR_MAX ? skb->len : SS_HDR_MAX) == 0) {
			data = (void *)(long)skb->data;
			data_end = (void *)(long)skb->data_end;
			cat = process(data, data_end, SS_CAP_END(data, data_end), len, tags, rts);
		}
	}
	gcount(cat, 1);
	return SS_TC_ACT_OK;
}
