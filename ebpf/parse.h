/* SPDX-License-Identifier: (GPL-2.0 OR Apache-2.0) */
/*
 * parse.h -- the data plane's packet parser, header-only: one frame's bytes into the
 * "parsed packet" (struct ss_flow_key + struct ss_pkt) and its category (SS_G_*).
 *
 * Ethernet, up to SS_MAX_VLAN 802.1Q/802.1ad tags, MAC control (PAUSE, PFC), IPv4 (options
 * skipped), IPv6, UDP, the RoCEv1 GRH, the BTH and the extension headers its opcode carries,
 * and one level of decapsulation (GRE: ERSPAN I/II/III, TEB, IP; VXLAN), as docs/datapath.md
 * "What is parsed" describes. No maps, no BPF helpers, no accounting: the includer
 * (ebpf/skewscope.bpf.c) does those. What the parser needs from its environment comes in
 * through two macros the includer defines before including this file:
 *
 *   SS_PARSE_OPINFO(op)     __u32: the opcode table entry of BTH opcode op (__u32); 0 or
 *                           an entry without SS_OPT_VALID: unknown opcode (the program:
 *                           its op_table map, behind compile-time constants for the
 *                           commonest opcodes)
 *   SS_PARSE_COUNT(idx, n)  add n to global counter idx, for the counters that are not the
 *                           frame's category: SS_G_DECAP, SS_G_PFC_* (the program: gcount)
 *
 * plus the integer types (__u8 .. __u64, __be16, __be32: linux/types.h) and
 * __always_inline. Packet pointers are plain C pointers bounded by data_end and cap_end (see
 * OOB), so this file also builds with the host C compiler: tests/unit/test_parse_host.py
 * compiles it with gcc (tests/unit/parse_host.c) and checks it frame by frame against the
 * offline parser (skewscope/sources/offline/kernel/parse.py), without root; the kernel tier
 * (tests/kernel) checks the compiled BPF program against the same parser.
 *
 * Every header is bounds-checked before it is read; every frame gets exactly one category.
 */
#ifndef SKEWSCOPE_PARSE_H
#define SKEWSCOPE_PARSE_H

#include "skewscope.h"

#ifndef SS_PARSE_OPINFO
#error "define SS_PARSE_OPINFO(op) (the opcode table lookup) before including parse.h"
#endif
#ifndef SS_PARSE_COUNT
#error "define SS_PARSE_COUNT(idx, n) (a global counter add) before including parse.h"
#endif

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define ss_ntohs(x) __builtin_bswap16(x)
#define ss_ntohl(x) __builtin_bswap32(x)
#else
#define ss_ntohs(x) (x)
#define ss_ntohl(x) (x)
#endif

/* The flow key as five 64-bit words, each written with one whole-word store: a key built
 * from byte and half-word stores and then read as words by the flow cache's hash and compare
 * costs a store-forwarding stall per word on x86. Words 0-1: source address, 2-3:
 * destination (IPv4 as ::ffff:a.b.c.d), 4: dest_qp, ipver, roce, padding (0). */
#define SS_KW(key) ((__u64 *)(key))
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define SS_V4MAPPED(a32) (0xFFFF0000ull | (__u64)(a32) << 32)
#define SS_KEY_W4(qp, ipver, roce) ((__u64)(qp) | (__u64)(ipver) << 32 | (__u64)(roce) << 40)
#else
#define SS_V4MAPPED(a32) (0x0000FFFF00000000ull | (__u64)(a32))
#define SS_KEY_W4(qp, ipver, roce) ((__u64)(qp) << 32 | (__u64)(ipver) << 24 | (__u64)(roce) << 16)
#endif

/* Bounds check against both the real end of the packet and, in replay, the end of the
 * captured bytes (a snaplen-cut record is padded back to its original length so that
 * lengths are right, but the padding must never be parsed as headers). Live, cap_end ==
 * data_end and the compiler folds the two tests into one. */
#define OOB(p) ((void *)(p) > data_end || (void *)(p) > cap_end)

/* Longest header chain the parser reads: Ethernet, 2 VLAN tags, IPv4 with 40 bytes of
 * options, UDP, BTH, the longest extension headers (XRCETH + AtomicETH), behind at most one
 * encapsulation. The TC entry pulls this much into the linear part of a non-linear skb when
 * a header was cut there. */
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
	__u8 ttl; __u8 protocol; __be16 check; __be32 saddr; __be32 daddr;
};
struct ss_ipv6 {  /* also the RoCEv1 GRH: same layout, next header 0x1B */
	__be32 vtcfl; __be16 payload_len; __u8 nexthdr; __u8 hop_limit;
	__u8 saddr[16]; __u8 daddr[16];
};
struct ss_udp { __be16 source; __be16 dest; __be16 len; __be16 check; };
struct ss_bth {  /* words: one 32-bit load (+ byte swap) for each pair of 8- and 24-bit fields */
	__u8 opcode; __u8 se_m_pad_tver; __be16 pkey;
	__be32 fb_dqpn;   /* FECN, BECN, reserved (8 bits) | DestQP (24) */
	__be32 ack_psn;   /* AckReq, reserved (8 bits) | PSN (24) */
};
struct ss_macctl { __be16 opcode; __be16 class_enable; __be16 time[8]; };

/* The parsed packet, with its struct ss_flow_key: everything the parser learned about one
 * RoCE packet (the accounting reads nothing else from the frame). */
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
	__u8  ipver;     /* the key's: 4 or 6 */
	__u8  roce;      /* the key's: 2 (RoCEv2) or 1 (RoCEv1) */
};

/* An IPv4 RoCEv2 packet's key addresses (::ffff:a.b.c.d, whole words) and its IP and UDP
 * fields, for the general parser and the fast path alike. */
static __always_inline void ss_v4_fields(struct ss_ipv4 *ip, struct ss_udp *udp, struct ss_flow_key *key,
					 struct ss_pkt *p)
{
	__u32 sa = ip->saddr, da = ip->daddr;  /* network order, as the key holds them */

	SS_KW(key)[0] = 0;
	SS_KW(key)[1] = SS_V4MAPPED(sa);
	SS_KW(key)[2] = 0;
	SS_KW(key)[3] = SS_V4MAPPED(da);
	p->ipver = 4;
	p->roce = 2;
	p->tclass = ip->tos;
	p->ecn_valid = 1;
	p->sport = ss_ntohs(udp->source);
}

/* Parse BTH + extension headers at bth; fills p. Returns a category (SS_G_ACCOUNTED
 * when the packet is good to account). avail = bytes the transport may span (UDP length
 * - 8 for RoCEv2, GRH payload length for RoCEv1). */
static __always_inline __u32 parse_bth(void *bth_p, void *data_end, void *cap_end, __u32 avail,
					 struct ss_pkt *p)
{
	struct ss_bth *bth = bth_p;
	__u32 oi, op, ext, prefix, pad, need;

	if (OOB(bth + 1))
		return SS_G_TRUNC_BTH;
	op = bth->opcode;
	oi = SS_PARSE_OPINFO(op);
	if (!(oi & SS_OPT_VALID))
		return SS_G_UNKNOWN_OPCODE;
	p->opinfo = oi;
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
	{
		__u32 fq = ss_ntohl(bth->fb_dqpn);

		p->fb = fq >> 24;
		p->dest_qp = fq & 0xFFFFFF;
	}
	p->psn = ss_ntohl(bth->ack_psn) & 0xFFFFFF;
	if (OOB((void *)(bth + 1) + ext))
		return SS_G_TRUNC_EXT;
	if (p->opinfo & SS_OPT_RETH) {
		__be32 *r = (void *)(bth + 1) + (prefix & 0xF);  /* VA (8), R_Key (4), DMA length (4) */
		if (OOB(r + 4))
			return SS_G_TRUNC_EXT;
		p->reth_len = ss_ntohl(r[3]);
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
				SS_PARSE_COUNT(SS_G_PFC_PAUSE + i, 1);
				SS_PARSE_COUNT(SS_G_PFC_QUANTA + i, t);
			} else {
				SS_PARSE_COUNT(SS_G_PFC_XON + i, 1);
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

/* VXLAN at the outer frame's UDP header udp (IPv4 or IPv6): the inner Ethernet frame
 * follows the 8-byte VXLAN header (SS_DECAP, *iproto = 0 as parse_gre's TEB); l3end = where
 * the outer IP header says the packet ends. */
static __always_inline __u32 parse_vxlan(struct ss_udp *udp, void *data_end, void *cap_end, __u64 l3end,
					 __u64 *l3end_out, void **inner, __u16 *iproto)
{
	if (OOB((void *)(udp + 1) + 8))
		return SS_G_TRUNC_UDP;
	*l3end_out = l3end;
	*inner = (void *)(udp + 1) + 8;
	*iproto = 0;
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
			if (outer && ss_ntohs(udp->dest) == SS_VXLAN_UDP_PORT)
				return parse_vxlan(udp, data_end, cap_end, l3off + ss_ntohs(ip->tot_len),
						   l3end, inner, iproto);
			return SS_G_NON_ROCE;
		}
		tot = ss_ntohs(ip->tot_len);
		ulen = ss_ntohs(udp->len);
		if (ulen < 8 || tot < ihl + ulen)
			return SS_G_BAD_LENGTH;
		ss_v4_fields(ip, udp, key, p);
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
			if (outer && ss_ntohs(udp->dest) == SS_VXLAN_UDP_PORT)
				return parse_vxlan(udp, data_end, cap_end,
						   l3off + sizeof(*ip6) + ss_ntohs(ip6->payload_len),
						   l3end, inner, iproto);
			return SS_G_NON_ROCE;
		}
		plen = ss_ntohs(ip6->payload_len);
		ulen = ss_ntohs(udp->len);
		if (ulen < 8 || plen < ulen)
			return SS_G_BAD_LENGTH;
		__builtin_memcpy(key, ip6->saddr, 32);  /* saddr, daddr: adjacent */
		p->ipver = 6;
		p->roce = 2;
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
		__builtin_memcpy(key, grh->saddr, 32);
		p->ipver = 6;
		p->roce = 1;
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

/* internal result of ss_parse_fast: not the common frame, parse it the general way */
#define SS_FAST_MISS 0xFE

/* The common frame, the bulk of RoCEv2 traffic: Ethernet with at most one VLAN tag in the
 * data, IPv4 without options, not a fragment, UDP to 4791. One bounds check covers the
 * headers up to the BTH and the checks are the general path's for this layout, in its
 * order; anything else (another layout, a length the general path would call bad, a wire
 * length shorter than the IP length) returns SS_FAST_MISS and the frame goes through the
 * general parser, which gives the same answer (tests/unit/test_parse_host.py runs both
 * builds over the fuzz corpus and every preset). Two steps, so that the program can branch
 * on the opcode between them (ebpf/skewscope.bpf.c: process): ss_fast_l3, the headers up
 * to the BTH (SS_G_ACCOUNTED: *bthp is a BTH inside the bounds checked, *availp the bytes
 * the UDP length gives it), and ss_fast_l4, the BTH on. ss_parse_fast is both. */
static __always_inline __u32 ss_fast_l3(void *data, void *data_end, void *cap_end, __u64 wire_len,
					__u32 pre_tags, struct ss_flow_key *key, struct ss_pkt *p,
					void **bthp, __u32 *availp)
{
	struct ss_eth *eth = data;
	struct ss_ipv4 *ip = data + sizeof(*eth);
	struct ss_udp *udp;
	__u32 tot, ulen;
	__u64 l3off = sizeof(*eth);  /* where the IP header is (a constant on each branch) */
	__be16 proto;

	if (OOB((void *)(ip + 1) + sizeof(*udp) + sizeof(struct ss_bth)))
		return SS_FAST_MISS;
	proto = eth->proto;
	if (proto == ss_ntohs(0x8100) || proto == ss_ntohs(0x88A8)) {
		proto = ((struct ss_vlan *)ip)->proto;
		ip = (void *)ip + sizeof(struct ss_vlan);
		l3off += sizeof(struct ss_vlan);
		if (OOB((void *)(ip + 1) + sizeof(*udp) + sizeof(struct ss_bth)))
			return SS_FAST_MISS;
	}
	udp = (void *)(ip + 1);
	if (proto != ss_ntohs(0x0800) || ip->ver_ihl != 0x45 || (ip->frag_off & ss_ntohs(0x3FFF)) ||
	    ip->protocol != 17 || udp->dest != ss_ntohs(SS_ROCE_UDP_PORT))
		return SS_FAST_MISS;
	tot = ss_ntohs(ip->tot_len);
	ulen = ss_ntohs(udp->len);
	if (ulen < 8 || tot < sizeof(*ip) + ulen || l3off + 4 * pre_tags + tot > wire_len)
		return SS_FAST_MISS;
	ss_v4_fields(ip, udp, key, p);
	*bthp = udp + 1;
	*availp = ulen - 8;
	return SS_G_ACCOUNTED;
}

static __always_inline __u32 ss_fast_l4(void *bth, void *data_end, void *cap_end, __u32 avail,
					__u64 wire_len, struct ss_flow_key *key, struct ss_pkt *p)
{
	__u32 cat = parse_bth(bth, data_end, cap_end, avail, p);

	if (cat != SS_G_ACCOUNTED)
		return cat;
	p->wire_len = wire_len;
	SS_KW(key)[4] = SS_KEY_W4(p->dest_qp, p->ipver, p->roce);
	return SS_G_ACCOUNTED;
}

static __always_inline __u32 ss_parse_fast(void *data, void *data_end, void *cap_end, __u64 wire_len,
					   __u32 pre_tags, struct ss_flow_key *key, struct ss_pkt *p)
{
	void *bth;
	__u32 avail, cat = ss_fast_l3(data, data_end, cap_end, wire_len, pre_tags, key, p, &bth, &avail);

	if (cat != SS_G_ACCOUNTED)
		return cat;
	return ss_fast_l4(bth, data_end, cap_end, avail, wire_len, key, p);
}

/* The general parser: every layout, every category, one level of decapsulation (see
 * ss_parse). */
static __always_inline __u32 ss_parse_general(void *data, void *data_end, void *cap_end, __u64 wire_len,
					      __u32 pre_tags, struct ss_flow_key *key, struct ss_pkt *p)
{
	void *cur = data, *inner = data;
	__u16 proto = 0, iproto = 0;
	__u32 cat;
	__u64 l3end = 0;

	cat = parse_l2(&cur, &proto, data_end, cap_end, pre_tags);
	if (cat != SS_G_ACCOUNTED)
		return cat;
	/* where L3 starts on the wire (an accelerated tag is in wire_len, not in data);
	 * l3end = where its length field says it ends (checked last) */
	cat = parse_l3(cur, proto, data_end, cap_end, cur - data + 4 * pre_tags, 1, key, p,
		       &l3end, &inner, &iproto);
	if (__builtin_expect(cat == SS_DECAP, 0)) {
		__u64 outer_end = l3end, frame_len = wire_len, ioff = inner - data, l3off = 14;

		/* keep clang from folding the pointer difference into scalar arithmetic the
		 * verifier refuses (scalar - pointer) */
		asm volatile("" : "+r"(ioff));
		ioff += 4 * pre_tags;

		SS_PARSE_COUNT(SS_G_DECAP, 1);
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
		cat = parse_l3(cur, proto, data_end, cap_end, l3off, 0, key, p, &l3end, &inner,
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
	p->wire_len = wire_len;
	SS_KW(key)[4] = SS_KEY_W4(p->dest_qp, p->ipver, p->roce);
	return SS_G_ACCOUNTED;
}

/* Parse one frame [data, data_end) whose full wire length is wire_len into the parsed
 * packet (*key, *p); returns its category: SS_G_ACCOUNTED when the packet is RoCE and good
 * to account (key and p are then complete, key->dest_qp and p->wire_len included), else the
 * category the frame lands in (key and p partly written: not to be used). pre_tags: VLAN tags already taken out of
 * the frame into skb metadata (TC; they count against SS_MAX_VLAN and are in wire_len).
 *
 * One level of decapsulation: when the outer frame is GRE (ERSPAN, TEB, IP) or VXLAN, the
 * inner frame is parsed exactly like a top-level one (its own VLAN tags, the same
 * categories) and accounted with the inner addresses; its bytes are the inner Ethernet
 * frame's: the wire length minus everything before the inner Ethernet header (GRE carrying
 * IP directly: + 14 for a synthesised Ethernet header, as for raw-IP captures). */
static __always_inline __u32 ss_parse(void *data, void *data_end, void *cap_end, __u64 wire_len,
				      __u32 pre_tags, struct ss_flow_key *key, struct ss_pkt *p)
{
#ifndef SS_NO_FAST_PARSE
	__u32 cat = ss_parse_fast(data, data_end, cap_end, wire_len, pre_tags, key, p);

	if (cat != SS_FAST_MISS)
		return cat;
#endif
	return ss_parse_general(data, data_end, cap_end, wire_len, pre_tags, key, p);
}

#endif /* SKEWSCOPE_PARSE_H */
