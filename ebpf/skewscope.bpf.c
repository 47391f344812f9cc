// SPDX-License-Identifier: GPL-2.0
/*
 * skewscope.bpf.c -- the data plane program: maps, per-QP accounting and the entry points
 * skewscope_xdp / skewscope_tc, one source for XDP and TC. Three files:
 *   skewscope.h   the ABI: constants, map key/value structs, message record, global counter
 *                 indices, opcode table layout (mirrored by skewscope/core/layout.py)
 *   parse.h       the packet parser (header-only: no maps, no helpers; also built with the
 *                 host C compiler by tests/unit/test_parse_host.py)
 *   this file     maps, accounting, entry points
 *
 * Compiled by bcc (skewscope/bpf/loader.py, with -I of this directory) with these -D settings (all numeric, validated
 * in Python before they become flags):
 *   SS_MAX_FLOWS    flows LRU hash size (default 65536)
 *   SS_NCPUS        possible CPUs (message-record regions)
 *   SS_EV_PER_CPU   message-record slots per CPU (power of two)
 *   SS_SAMPLE_N     1-in-N random packet sampling of RoCE packets (1 = off)
 *   SS_XDP_FRAGS    XDP program is loaded with BPF_F_XDP_HAS_FRAGS (jumbo frames); set by
 *                   user space only when the kernel supports it (probed, Linux >= 5.18)
 *   SS_REPLAY_CLOCK time comes from the clock map (BPF_PROG_TEST_RUN replay), not ktime
 *   SS_FC_SLOTS     flow cache slots per CPU (power of two; 0 = no cache, every packet looks
 *                   up the LRU hash)
 *   SS_BENCH_FLOOR  benchmark build only: stop after the flow lookup (bench_dataplane.py)
 *   SS_CTL_CLOCK    control packets take the per-CPU control clock (jiffies-checked reuse of
 *                   the last clock read; bpf_jiffies64, Linux >= 5.5), not a clock read each
 *
 * Invariants: the program never changes or drops a packet (XDP_PASS / TC_ACT_UNSPEC always);
 * every frame is counted in exactly one category of skewscope.h's SS_G_* list; headers are
 * only used after a bounds check; only UAPI headers are used (parse.h declares the wire
 * headers itself), so any kernel's headers let bcc build it.
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
#ifndef SS_FC_SLOTS
#define SS_FC_SLOTS 0
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
 * (skewscope/bpf/loader.py: Dataplane._load_xdp) rewrites into the kfunc calls, by BTF id; offsets and ids
 * come from the running kernel's BTF as -D flags (loader.xdp_kctx_layout), and user
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

/* opcode classes whose packets without FIRST/LAST/RETH/AETH are "middle" packets (no clock
 * read, see account()): SEND, WRITE and READ_RESPONSE MIDDLE */
#define SS_MID_CLASSES ((1u << SS_OPC_SEND) | (1u << SS_OPC_WRITE) | (1u << SS_OPC_READ_RESP))

#define SS_XDP_PASS 2
/* TC: TC_ACT_UNSPEC (-1), which for a tcx link is TCX_NEXT: "go on". TC_ACT_OK would end the
 * hook: through tcx it skips every classic tc filter on the device (a firewall's drop, a
 * mirred mirror, OVS's tc rules), and as a cls_bpf filter the filters after ours. */
#define SS_TC_VERDICT (-1)

/* "now" for the packet being accounted: the capture's timestamp in replay builds (set in
 * the clock map by user space), else CLOCK_MONOTONIC. */
#ifdef SS_REPLAY_CLOCK
#define SS_NOW(rts) (rts)
#else
#define SS_NOW(rts) bpf_ktime_get_ns()
#endif

BPF_TABLE("lru_hash", struct ss_flow_key, struct ss_flow_stats, flows, SS_MAX_FLOWS);
/* The global counters: one per-CPU entry holding all of them, so a frame pays one lookup for
 * its two counts (frames, and its category). */
struct ss_globals {
	__u64 c[SS_G_N];
};
BPF_PERCPU_ARRAY(globals, struct ss_globals, 1);
BPF_ARRAY(op_table, __u32, 256);
BPF_ARRAY(zero_stats, struct ss_flow_stats, 1);  /* never written: template for inserts */
BPF_F_TABLE("array", __u32, struct ss_msg_rec, msg_events, SS_NCPUS * SS_EV_PER_CPU, BPF_F_MMAPABLE);
BPF_PERCPU_ARRAY(ev_head, __u64, 1);
#ifdef SS_REPLAY_CLOCK
BPF_PERCPU_ARRAY(clock, struct ss_replay, 1);
#endif
#if defined(SS_CTL_CLOCK) && !defined(SS_REPLAY_CLOCK)
/* The control-packet clock (live builds): per CPU, the last bpf_ktime_get_ns() reading and
 * the jiffies value read just before it. A control packet (ACK, CNP, READ response
 * FIRST/LAST/ONLY, atomics, FLUSH: no message boundary) takes that reading while jiffies
 * has not moved, else reads the clock and refreshes it; so its time is at most one kernel
 * tick (1/HZ) early, and a clock read costs the CPU at most one per tick for control
 * packets. bpf_jiffies64 (helper 118, Linux 5.5) is a plain load: the verifier inlines it
 * on 64-bit JITs. Message boundaries (FIRST/LAST/ONLY, READ_REQUEST) and a flow's first
 * packet always read the clock, and refresh this. See docs/datapath.md "Time". */
static __u64 (*ss_jiffies64)(void) = (void *)118;
struct ss_ctl_clock {
	__u64 ns;
	__u64 jiffies;
};
BPF_PERCPU_ARRAY(ctl_clock, struct ss_ctl_clock, 1);

/* read the clock and keep the reading as this CPU's, with jiffies j read before it */
static __always_inline __u64 ss_clock_read(struct ss_ctl_clock *c, __u64 j)
{
	__u64 ns = bpf_ktime_get_ns();

	if (c) {
		c->ns = ns;
		c->jiffies = j;
	}
	return ns;
}

static __always_inline __u64 ss_now_fine(void)
{
	__u32 z = 0;
	struct ss_ctl_clock *c = ctl_clock.lookup(&z);

	return ss_clock_read(c, ss_jiffies64());
}

static __always_inline __u64 ss_now_ctl(void)
{
	__u32 z = 0;
	struct ss_ctl_clock *c = ctl_clock.lookup(&z);
	__u64 j = ss_jiffies64();

	if (c && c->jiffies == j && c->ns)
		return c->ns;
	return ss_clock_read(c, j);
}
#define SS_NOW_FINE(rts) ss_now_fine()
#define SS_NOW_CTL(rts) ss_now_ctl()
#define SS_CTL_MONOTONE 1
#else
#define SS_NOW_FINE(rts) SS_NOW(rts)
#define SS_NOW_CTL(rts) SS_NOW(rts)
#endif

#if SS_FC_SLOTS > 0
/* The flow cache: SS_FC_SLOTS direct-mapped slots per CPU (CPU c owns entries
 * c*SS_FC_SLOTS ..), in front of the flows LRU hash. A slot holds the *current* copy of its
 * flow (key.roce == 0: empty); the LRU entry of a cached flow is stale and names the CPU
 * holding it (stats.owner = cpu + 1). An array lookup is inlined by the verifier (no helper
 * call) and a slot is only ever written by its CPU (no atomics). On a miss the slot's flow
 * is written back into its LRU entry and the new flow's LRU entry copied in (taken over from
 * another CPU's slot when its owner is another CPU: the flow moved CPUs). Hits refresh the
 * LRU entry's recency every SS_FC_REFRESH packets (so a hot cached flow is not the LRU's
 * first victim) and notice there when it was evicted. User space (loader.read_flows) reads
 * the slots first, then the LRU, and takes a slot's copy for every LRU entry owned by that
 * slot's CPU. Layout: struct ss_flow_key then struct ss_flow_stats, no padding. */
struct ss_fc_entry {
	struct ss_flow_key key;
	struct ss_flow_stats stats;
};
_Static_assert(sizeof(struct ss_fc_entry) == sizeof(struct ss_flow_key) + sizeof(struct ss_flow_stats),
	       "flow cache entry: key then stats, no padding");
BPF_ARRAY(fcache, struct ss_fc_entry, SS_NCPUS * SS_FC_SLOTS);
#define SS_FC_REFRESH 64
#endif

static __always_inline struct ss_globals *gtable(void)
{
	__u32 z = 0;

	return globals.lookup(&z);
}

static __always_inline void gadd(struct ss_globals *g, __u32 idx, __u64 n)
{
	if (g && idx < SS_G_N)
		g->c[idx] += n;  /* per-CPU: no atomics needed */
}

/* A frame's two counts, frames and its category, with one lookup after the frame is
 * processed (no pointer kept across the parse and accounting). */
static __always_inline void count_frame(__u32 cat)
{
	struct ss_globals *g = gtable();

	if (g) {
		g->c[SS_G_FRAMES] += 1;
		if (cat < SS_G_NCAT)
			g->c[cat] += 1;
	}
}

static __always_inline void gcount(__u32 idx, __u64 n)
{
	gadd(gtable(), idx, n);
}

/* The parser (parse.h) reaches the opcode table and the global counters only through these
 * two hooks. The commonest opcodes' entries are compile-time constants (SS_HOT_OP_x /
 * SS_HOT_INFO_x, which user space sets from the same table it fills op_table with): the
 * map lookup takes the opcode through the stack (the inlined lookup reads its key from
 * memory), a store-to-load round trip on the path everything after the BTH depends on,
 * where a compare with a constant is predicted and costs nothing. */
static __always_inline __u32 ss_opinfo(__u32 op)
{
	__u32 *oi;

#ifdef SS_HOT_OP_A
	if (op == SS_HOT_OP_A)
		return SS_HOT_INFO_A;
#endif
#ifdef SS_HOT_OP_B
	if (op == SS_HOT_OP_B)
		return SS_HOT_INFO_B;
#endif
	oi = op_table.lookup(&op);
	return oi ? *oi : 0;
}
#define SS_PARSE_OPINFO(op) ss_opinfo(op)
#define SS_PARSE_COUNT(idx, n) gcount((idx), (n))
#include "parse.h"

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
	/* seqlock-style slot protocol (user space: loader.Dataplane.read_new_records): seq = 0, record,
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

/* The flow's LRU entry, inserted (zeroed, counted in flows_created) when absent. */
static __always_inline struct ss_flow_stats *flow_lru(struct ss_flow_key *key)
{
	struct ss_flow_stats *f = flows.lookup(key);
	__u32 z = 0;

	if (!f) {
		struct ss_flow_stats *zero = zero_stats.lookup(&z);
		if (zero && flows.insert(key, zero) == 0)
			gcount(SS_G_FLOWS_CREATED, 1);
		/* else: insert can race with another CPU inserting the same key: look up again */
		f = flows.lookup(key);
	}
	return f;
}

#if SS_FC_SLOTS > 0
static __always_inline int ss_key_eq(const struct ss_flow_key *a, const struct ss_flow_key *b)
{
	const __u64 *x = (const __u64 *)a, *y = (const __u64 *)b;

	return ((x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2]) | (x[3] ^ y[3]) | (x[4] ^ y[4])) == 0;
}

/* cache slot of a key (0 .. SS_FC_SLOTS-1): the top bits of a multiplicative hash of its
 * five words (three independent multiplies: short latency) */
static __always_inline __u32 ss_fc_slot(const struct ss_flow_key *k)
{
	const __u64 *w = (const __u64 *)k;
	__u64 h = ((w[0] ^ w[1]) * 0x9E3779B97F4A7C15ull) ^ ((w[2] ^ w[3]) * 0xC2B2AE3D27D4EB4Full) ^
		  (w[4] * 0x165667B19E3779F9ull);

#if SS_FC_SLOTS > 1
	return (__u32)(h >> (64 - __builtin_ctz(SS_FC_SLOTS))) & (SS_FC_SLOTS - 1);
#else
	(void)h;  /* one slot (the tests' build): a shift by 64 would be undefined */
	return 0;
#endif
}

/* Miss: write the slot's flow back, bring `key`'s flow in. */
static __always_inline struct ss_flow_stats *fc_fill(struct ss_fc_entry *e, struct ss_flow_key *key,
						     __u32 cpu, __u32 slot)
{
	struct ss_flow_stats *fl;

	if (e->key.roce) {
		fl = flows.lookup(&e->key);
		/* still ours: write back (owner 0). Absent (evicted from the LRU while cached) or
		 * taken over by another CPU: nothing to write. */
		if (fl && fl->owner == cpu + 1) {
			e->stats.owner = 0;
			__builtin_memcpy(fl, &e->stats, sizeof(*fl));
		}
		e->key.roce = 0;
	}
	fl = flow_lru(key);
	if (!fl)
		return 0;
	if (fl->owner && fl->owner != cpu + 1) {
		/* another CPU's slot holds the current copy (the flow moved CPUs): take it over */
		__u32 o = (__u32)(fl->owner - 1) * SS_FC_SLOTS + slot;
		struct ss_fc_entry *oe = fcache.lookup(&o);
		if (oe && ss_key_eq(&oe->key, key)) {
			__builtin_memcpy(fl, &oe->stats, sizeof(*fl));
			oe->key.roce = 0;
		}
	}
	fl->owner = cpu + 1;
	__builtin_memcpy(&e->stats, fl, sizeof(*fl));
	__builtin_memcpy(&e->key, key, sizeof(*key));
	return &e->stats;
}
#endif

/* The flow's current counters: its flow-cache slot, else its LRU entry (NULL: no slot). */
static __always_inline struct ss_flow_stats *flow_get(struct ss_flow_key *key, __u32 cpu)
{
#if SS_FC_SLOTS > 0
	__u32 slot = ss_fc_slot(key), idx;
	struct ss_fc_entry *e;

	if (cpu >= SS_NCPUS)
		return 0;
	idx = cpu * SS_FC_SLOTS + slot;
	e = fcache.lookup(&idx);
	if (!e)
		return 0;
	if (ss_key_eq(&e->key, key)) {
		if (__builtin_expect((e->stats.packets & (SS_FC_REFRESH - 1)) == SS_FC_REFRESH - 1, 0)) {
			/* keep the LRU entry recent; evicted meanwhile: the flow starts again from zero
			 * in a new entry, as without the cache */
			struct ss_flow_stats *fl = flows.lookup(key);
			if (!fl || fl->owner != cpu + 1) {
				e->key.roce = 0;
				return fc_fill(e, key, cpu, slot);
			}
		}
		return &e->stats;
	}
	return fc_fill(e, key, cpu, slot);
#else
	return flow_lru(key);
#endif
}

/* The counters every accounted packet updates. Plain (non-atomic) updates: a flow's packets
 * are processed by one CPU at a time (RSS hashes the UDP 5-tuple, constant per QP), see
 * docs/datapath.md. */
static __always_inline void count_packet(struct ss_flow_stats *f, struct ss_pkt *p, __u32 cls)
{
	f->packets += 1;
	f->bytes += p->wire_len;
	f->payload_bytes += p->payload;
	if (cls < SS_N_OPCLASS)
		f->op[cls & (SS_N_OPCLASS - 1)] += 1;
	if (p->ecn_valid) {
		__u8 ecn = p->tclass & 3;
		if (ecn) {
			f->ecn_capable += 1;
			if (ecn == 3)
				f->ce += 1;
		}
	}
	if (__builtin_expect(p->fb & 0xC0, 0)) {
		f->fecn += p->fb >> 7;
		f->becn += (p->fb >> 6) & 1;
	}
}

/* The flow's "last seen" fields, stored after every other access to the flow in the packet:
 * they share a 64-bit word with flags and next_psn, and on x86 a load behind a narrow store
 * into the same word can wait for the store. */
static __always_inline void note_last(struct ss_flow_stats *f, struct ss_pkt *p)
{
	f->sport = p->sport;
	f->tclass = p->tclass;
	f->last_opcode = p->opcode;
}

/* PSN tracking on request packets (24-bit serial arithmetic). */
static __always_inline void track_psn(struct ss_flow_stats *f, struct ss_pkt *p, __u32 cls)
{
#if SS_SAMPLE_N <= 1
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
			if (f->flags & SS_FF_AFTER_READ)
				f->flags &= ~SS_FF_AFTER_READ;
		}
	}
	if (cls == SS_OPC_READ_REQ)
		f->flags |= SS_FF_AFTER_READ;
#endif
}

/* A SEND packet inside an open SEND message adds its payload to the message's size. */
static __always_inline void send_bytes(struct ss_flow_stats *f, struct ss_pkt *p, __u32 cls)
{
#if SS_SAMPLE_N <= 1
	if (cls == SS_OPC_SEND && (f->flags & SS_FF_MSG_OPEN) && f->msg_class == SS_OPC_SEND)
		f->msg_cur_bytes += p->payload;
#endif
}

/* The message part of a packet that starts or ends a message, or is a SEND: starts, sizes,
 * gaps, records. ts: the packet's time (message boundaries read the clock). */
static __always_inline void account_message(struct ss_flow_key *key, struct ss_flow_stats *f,
					    struct ss_pkt *p, __u32 opinfo, __u32 cls, __u64 ts)
{
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
	send_bytes(f, p, cls);
#if SS_SAMPLE_N <= 1
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
}

/* Account one parsed RoCE packet to its flow. Returns the frame's category: accounted,
 * sampled_out or no_flow_slot. The clock is read only here, after the flow lookup, and not
 * for middle packets: frames that are not accounted never pay for it. */
static __always_inline __u32 account(struct ss_flow_key *key, struct ss_pkt *p, __u64 rts, __u32 cpu)
{
	struct ss_flow_stats *f;
	__u32 opinfo = p->opinfo, cls = (opinfo & SS_OPT_CLASS_MASK) >> SS_OPT_CLASS_SHIFT;
	__u64 ts;

#if SS_SAMPLE_N > 1
	if (bpf_get_prandom_u32() % SS_SAMPLE_N)
		return SS_G_SAMPLED_OUT;
#endif
	f = flow_get(key, cpu);
	if (!f)
		return SS_G_NO_FLOW_SLOT;
#ifdef SS_BENCH_FLOOR
	/* tools/bench/bench_dataplane.py only: parse + flow lookup + one count, the floor under
	 * any per-flow accounting (never built otherwise) */
	f->packets += 1;
	return SS_G_ACCOUNTED;
#endif
	/* The middle lane, the bulk of RDMA traffic: a SEND/WRITE/READ_RESPONSE MIDDLE packet
	 * (no FIRST/LAST flag, no RETH/AETH) of a flow already seen: no clock, no message
	 * boundary, only the counters (the same helpers as below, so the two lanes cannot
	 * drift). */
	if (__builtin_expect(!(opinfo & (SS_OPT_FIRST | SS_OPT_LAST | SS_OPT_RETH | SS_OPT_AETH)) &&
			     ((1u << cls) & SS_MID_CLASSES) && f->packets, 1)) {
		if (opinfo & SS_OPT_REQUEST)
			track_psn(f, p, cls);
		send_bytes(f, p, cls);
		count_packet(f, p, cls);
		note_last(f, p);
		return SS_G_ACCOUNTED;
	}
	/* Time is taken only on packets that carry a time we keep: the flow's first packet and
	 * message boundaries (FIRST/LAST/ONLY, READ_REQUEST) read the clock; control packets
	 * (ACK, CNP, atomics, READ_RESPONSE FIRST/LAST/ONLY, FLUSH) take the CPU's control
	 * clock (live: to within a kernel tick, see ss_now_ctl; replay: exact). A middle packet
	 * (SEND/WRITE/READ_RESPONSE MIDDLE: no FIRST/LAST flag, no RETH/AETH) leaves last_ts at
	 * the last such packet, so last_ts is the time of the flow's last message boundary or
	 * control packet (the same definition in the offline parser; docs/datapath.md "Time").
	 * ts is used below only by message boundaries. */
	ts = 0;
	if (f->packets == 0) {
		ts = SS_NOW_FINE(rts);
		f->first_ts = ts;
		f->last_ts = ts;
	} else if (opinfo & (SS_OPT_FIRST | SS_OPT_LAST)) {
		ts = SS_NOW_FINE(rts);
		f->last_ts = ts;
	} else if ((opinfo & (SS_OPT_RETH | SS_OPT_AETH)) || !((1u << cls) & SS_MID_CLASSES)) {
		__u64 t = SS_NOW_CTL(rts);
#ifdef SS_CTL_MONOTONE
		/* the control clock may be up to a tick behind a boundary this flow had on another
		 * CPU: last_ts never goes back */
		if (t > f->last_ts)
#endif
			f->last_ts = t;
	}

	count_packet(f, p, cls);
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
	if (opinfo & SS_OPT_REQUEST)
		track_psn(f, p, cls);

	/* A packet that neither starts nor ends a message and is not a SEND (READ_RESPONSE
	 * FIRST/LAST/ONLY, ACK, CNP, atomics) has no message part. */
	if ((opinfo & (SS_OPT_FIRST | SS_OPT_LAST)) || cls == SS_OPC_SEND)
		account_message(key, f, p, opinfo, cls, ts);
	note_last(f, p);
	return SS_G_ACCOUNTED;
}

/* Parse one frame (parse.h) and account it; returns its category (the caller counts it).
 * rts: the replay timestamp (replay builds). The common frame's BTH opcode is checked
 * against the commonest opcode (SS_HOT_OP_A, RDMA WRITE MIDDLE) before the BTH is parsed:
 * on that branch the opcode table entry is a constant, and the compiler folds the BTH
 * parse and the accounting for it (no RETH/AETH, no message boundary: the middle lane
 * only) into a copy of their own. Same functions, same result. */
static __always_inline __u32 process(void *data, void *data_end, void *cap_end, __u64 wire_len,
				     __u32 pre_tags, __u64 rts)
{
	/* written whole by the parser (five 64-bit words) before it returns SS_G_ACCOUNTED */
	struct ss_flow_key key __attribute__((aligned(8)));
	struct ss_pkt p;  /* every field is set by the parser before it is used */
	void *bth;
#if SS_FC_SLOTS > 0
	__u32 cpu = bpf_get_smp_processor_id();
#else
	__u32 cpu = 0;
#endif
	__u32 avail, cat = ss_fast_l3(data, data_end, cap_end, wire_len, pre_tags, &key, &p, &bth,
				      &avail);

	if (cat == SS_G_ACCOUNTED) {
#ifdef SS_HOT_OP_A
		if (((struct ss_bth *)bth)->opcode == SS_HOT_OP_A) {
			cat = ss_fast_l4(bth, data_end, cap_end, avail, wire_len, &key, &p);
			if (cat != SS_G_ACCOUNTED)
				return cat;
			return account(&key, &p, rts, cpu);
		}
#endif
		cat = ss_fast_l4(bth, data_end, cap_end, avail, wire_len, &key, &p);
	} else {
		cat = ss_parse_general(data, data_end, cap_end, wire_len, pre_tags, &key, &p);
	}
	if (cat != SS_G_ACCOUNTED)
		return cat;
	return account(&key, &p, rts, cpu);
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

	cat = process(data, data_end, SS_CAP_END(data, data_end), len, 0, rts);
	count_frame(cat);
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
	SS_REPLAY_PROLOGUE(len, SS_TC_VERDICT)

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
	count_frame(cat);
	return SS_TC_VERDICT;
}
