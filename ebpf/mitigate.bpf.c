// SPDX-License-Identifier: GPL-2.0
/*
 * mitigate.bpf.c -- `skewscope mitigate` in software: a TC (cls_bpf, direct action) program
 * that re-marks the DSCP of chosen RoCEv2 flows and polices chosen flows to a rate, each rule
 * with a deadline the program itself enforces. The software twin of the tc flower rules a
 * BlueField offloads (skewscope/mitigate/flower.py); used where flower/pedit/police are not
 * there (this project's test kernels) and where no NIC offload is wanted.
 *
 * Rules live in `mt_rules` (written by user space, docs/mitigation.md): a rule matches plain
 * RoCEv2 frames (Ethernet, at most one VLAN tag in the data, IPv4 or IPv6, UDP to 4791) by
 * source/destination address (all-zero = any), UDP source port (0 = any: RoCE NICs pick it
 * per QP) and BTH destination QP (0xFFFFFFFF = any). A rule whose `expires_ns` (CLOCK_BOOTTIME,
 * bpf_ktime_get_boot_ns) has passed matches nothing: the TTL holds with no process alive.
 * The rule's counters and token bucket live in `mt_state` (written by this program only).
 *
 * It parses its own few headers (not parse.h): it needs the IP header's offset to rewrite
 * it, and acts on the data path's plain frames only (an encapsulated mirror copy is never
 * the traffic to act on). The ICRC does not cover the IP TOS / traffic class (RoCEv2 masks
 * those bits to 1 when computing it), so re-marking keeps RoCE packets valid; the IPv4
 * header checksum is updated (bpf_l3_csum_replace).
 *
 * Verdicts: TC_ACT_SHOT for a packet over a police rule's rate, else TC_ACT_UNSPEC (the next
 * filter, or the default action): this program never redirects and never touches a frame no
 * rule matches.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>

#define MT_MAX_RULES 32
#define MT_ROCE_PORT 4791
#define MT_ANY_QP 0xFFFFFFFFu
#define MT_NO_DSCP 0xFF

struct mt_rule {
	__u8  src[16];     /* IPv4 as ::ffff:a.b.c.d; all zero = any */
	__u8  dst[16];
	__u32 id;          /* 0 = empty slot */
	__u32 dest_qp;     /* MT_ANY_QP = any */
	__u16 sport;       /* 0 = any */
	__u8  ipver;       /* 4 or 6; 0 = either */
	__u8  dscp;        /* MT_NO_DSCP = no re-mark */
	__u32 _pad;
	__u64 expires_ns;  /* CLOCK_BOOTTIME deadline */
	__u64 rate_bps;    /* bytes per second; 0 = no policing */
	__u64 burst;       /* bytes */
	__u64 created_ns;  /* CLOCK_REALTIME at apply (for status) */
	char  note[48];    /* what asked for it: the finding id */
};

struct mt_state {
	struct bpf_spin_lock lock;
	__u32 _pad;
	__u64 tokens;
	__u64 last_ns;
	__u64 packets;     /* matched */
	__u64 bytes;
	__u64 dropped;     /* over the rate */
	__u64 remarked;
};

BPF_ARRAY(mt_rules, struct mt_rule, MT_MAX_RULES);
BPF_ARRAY(mt_state, struct mt_state, MT_MAX_RULES);
/* [0]: flags for user space (MT_META_CREATED_CLSACT: remove the clsact qdisc with the last
 * rule); read here so that it is one of the program's maps (reached through its map ids) */
BPF_ARRAY(mt_meta, __u64, 1);
#define MT_META_CREATED_CLSACT 1

struct mt_eth { __u8 dst[6]; __u8 src[6]; __be16 proto; };

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define mt_ntohs(x) __builtin_bswap16(x)
#define mt_ntohl(x) __builtin_bswap32(x)
#else
#define mt_ntohs(x) (x)
#define mt_ntohl(x) (x)
#endif

static __always_inline int mt_addr_match(const __u8 *want, const __u8 *got)
{
	__u64 w0, w1, g0, g1;

	__builtin_memcpy(&w0, want, 8);
	__builtin_memcpy(&w1, want + 8, 8);
	if ((w0 | w1) == 0)
		return 1;
	__builtin_memcpy(&g0, got, 8);
	__builtin_memcpy(&g1, got + 8, 8);
	return w0 == g0 && w1 == g1;
}

int ss_mitigate(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *data_end = (void *)(long)skb->data_end;
	struct mt_eth *eth = data;
	__u8 src[16] = {}, dst[16] = {};
	__u32 l3off = sizeof(*eth), dqpn, i;
	__u16 proto, sport, tosword = 0;
	__u8 ipver, *l3, *udp;

	__u32 zero = 0;
	__u64 *meta = mt_meta.lookup(&zero);

	if (!meta || (void *)(eth + 1) > data_end)
		return TC_ACT_UNSPEC;
	proto = eth->proto;
	if (proto == mt_ntohs(0x8100) || proto == mt_ntohs(0x88A8)) {
		if (data + l3off + 4 > data_end)
			return TC_ACT_UNSPEC;
		proto = *(__be16 *)(data + l3off + 2);
		l3off += 4;
	}
	l3 = data + l3off;
	if (proto == mt_ntohs(0x0800)) {
		__u32 ihl;

		if ((void *)(l3 + 20) > data_end || (l3[0] >> 4) != 4 || l3[9] != 17)
			return TC_ACT_UNSPEC;
		if (*(__be16 *)(l3 + 6) & mt_ntohs(0x3FFF))          /* a fragment */
			return TC_ACT_UNSPEC;
		ihl = (l3[0] & 0xF) * 4;
		if (ihl < 20 || ihl > 60)
			return TC_ACT_UNSPEC;
		udp = l3 + ihl;
		src[10] = src[11] = dst[10] = dst[11] = 0xFF;
		__builtin_memcpy(src + 12, l3 + 12, 4);
		__builtin_memcpy(dst + 12, l3 + 16, 4);
		ipver = 4;
	} else if (proto == mt_ntohs(0x86DD)) {
		if ((void *)(l3 + 40) > data_end || l3[6] != 17)
			return TC_ACT_UNSPEC;
		udp = l3 + 40;
		__builtin_memcpy(src, l3 + 8, 16);
		__builtin_memcpy(dst, l3 + 24, 16);
		ipver = 6;
	} else {
		return TC_ACT_UNSPEC;
	}
	/* UDP header + BTH (12 bytes) */
	if ((void *)(udp + 8 + 12) > data_end || *(__be16 *)(udp + 2) != mt_ntohs(MT_ROCE_PORT))
		return TC_ACT_UNSPEC;
	sport = mt_ntohs(*(__be16 *)udp);
	dqpn = mt_ntohl(*(__be32 *)(udp + 8 + 4)) & 0xFFFFFF;
	tosword = mt_ntohs(*(__be16 *)l3);   /* IPv4: ver/ihl + TOS; IPv6: ver + traffic class + FL bits */

	__u64 now = bpf_ktime_get_boot_ns();
	__u32 len = skb->len;
	__u8 dscp = MT_NO_DSCP;

	for (i = 0; i < MT_MAX_RULES; i++) {
		__u32 k = i;
		struct mt_rule *r = mt_rules.lookup(&k);
		struct mt_state *s;

		if (!r || !r->id || now >= r->expires_ns)
			continue;
		if ((r->ipver && r->ipver != ipver) || (r->sport && r->sport != sport) ||
		    (r->dest_qp != MT_ANY_QP && r->dest_qp != dqpn) ||
		    !mt_addr_match(r->src, src) || !mt_addr_match(r->dst, dst))
			continue;
		s = mt_state.lookup(&k);
		if (!s)
			continue;
		if (r->rate_bps) {
			int drop = 0;

			bpf_spin_lock(&s->lock);
			if (s->last_ns == 0 || now < s->last_ns) {
				s->tokens = r->burst;
			} else {
				__u64 add = (now - s->last_ns) * r->rate_bps / 1000000000ull;

				s->tokens = s->tokens + add > r->burst ? r->burst : s->tokens + add;
			}
			s->last_ns = now;
			s->packets += 1;
			s->bytes += len;
			if (s->tokens < len) {
				s->dropped += 1;
				drop = 1;
			} else {
				s->tokens -= len;
			}
			bpf_spin_unlock(&s->lock);
			if (drop)
				return TC_ACT_SHOT;
		} else {
			__sync_fetch_and_add(&s->packets, 1);
			__sync_fetch_and_add(&s->bytes, len);
		}
		if (r->dscp != MT_NO_DSCP && dscp == MT_NO_DSCP) {
			dscp = r->dscp;
			__sync_fetch_and_add(&s->remarked, 1);
		}
	}
	if (dscp == MT_NO_DSCP)
		return TC_ACT_UNSPEC;
	if (ipver == 4) {
		__u16 neww = (tosword & 0xFF03) | ((__u16)dscp << 2);
		__be16 oldb = mt_ntohs(tosword), newb = mt_ntohs(neww);

		if (neww != tosword) {
			bpf_l3_csum_replace(skb, l3off + 10, oldb, newb, 2);
			bpf_skb_store_bytes(skb, l3off, &newb, 2, 0);
		}
	} else {
		/* version (4) | traffic class (8) | flow label's top 4: the class's DSCP bits are
		 * bits 11..6 of this word */
		__u16 neww = (tosword & 0xF03F) | ((__u16)dscp << 6);
		__be16 newb = mt_ntohs(neww);

		if (neww != tosword)
			bpf_skb_store_bytes(skb, l3off, &newb, 2, 0);
	}
	return TC_ACT_UNSPEC;
}
