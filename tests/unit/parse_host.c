/*
 * parse_host.c -- ebpf/parse.h (the data plane's packet parser) built with the host C
 * compiler, for tests/unit/test_parse_host.py (no root, no BPF): an executable that parses
 * every frame of a pcap exactly as the BPF program's ss_parse does and
 * returns, per frame, the category and the parsed packet.
 *
 * The BPF bits parse.h relies on are stubbed here: the integer types, __always_inline, and
 * its two hooks: SS_PARSE_OPINFO looks the opcode up in a table handed in by the caller (the
 * program's op_table map is filled from the same skewscope/core/layout.py:OPCODE_TABLE),
 * SS_PARSE_COUNT adds to a per-frame counter array (SS_G_DECAP, SS_G_PFC_*). The "xdp_md"
 * cursor is the frame's bytes: data = the first byte, data_end = cap_end = one past the
 * last captured byte (what BPF_PROG_TEST_RUN replay gives the program: bytes past the
 * captured length are never parsed), wire_len = the original length.
 *
 * Build: gcc -std=gnu11 -O1 -g -fsanitize=address,undefined -fno-sanitize=alignment \
 *            -I ebpf -o parse_host parse_host.c
 * (-DSS_NO_FAST_PARSE: without parse.h's fast path for the common frame, every frame through
 * the general parser; the test builds both and requires the same answers.)
 * (alignment: parse.h reads its naturally aligned header structs at 2-byte packet offsets on
 * purpose, which the architectures the program runs on allow, see its wire headers.)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef uint8_t __u8;
typedef uint16_t __u16;
typedef uint32_t __u32;
typedef uint64_t __u64;
typedef uint16_t __be16;
typedef uint32_t __be32;

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif
#define SEC(name)

static const __u32 *host_optable;   /* 256 entries: layout.OPCODE_TABLE */
static __u64 *host_counts;          /* SS_G_N entries, the frame's non-category counters */

static __always_inline __u32 host_opinfo(__u32 op)
{
	return host_optable[op & 0xFF];
}
#define SS_PARSE_OPINFO(op) host_opinfo(op)
#define SS_PARSE_COUNT(idx, n) (host_counts[(idx)] += (n))

#include "parse.h"

/* One frame's result. Fields after `cat` are meaningful only for cat == SS_G_ACCOUNTED. */
struct ss_host_out {
	__u32 cat;
	__u32 opinfo;
	struct ss_flow_key key;  /* dest_qp included */
	__u64 wire_len;          /* bytes accounted (inner Ethernet frame when decapsulated) */
	__u64 payload;
	__u32 psn;
	__u32 reth_len;
	__u16 sport;
	__u8  opcode;
	__u8  tclass;
	__u8  ecn_valid;
	__u8  fb;
	__u8  syndrome;
	__u8  _pad;
	__u64 counts[SS_G_N];    /* SS_PARSE_COUNT calls of this frame */
};

/* Usage: parse_host IN.pcap OUT.bin OPTABLE.bin -- every record of a classic pcap (Ethernet,
 * either byte order, us or ns) through ss_parse; OUT gets one struct ss_host_out per record. Each
 * record is copied into a buffer of exactly its captured length, so a read past the bounds
 * checks is a heap overflow for AddressSanitizer (the test builds with it when it can).
 * Prints "sizeof(struct ss_host_out) SS_G_N records" on stdout. Exit 2 on a bad input. */
static __u32 rd32(const __u8 *b, int big)
{
	return big ? ((__u32)b[0] << 24 | (__u32)b[1] << 16 | (__u32)b[2] << 8 | b[3])
		   : ((__u32)b[3] << 24 | (__u32)b[2] << 16 | (__u32)b[1] << 8 | b[0]);
}

int main(int argc, char **argv)
{
	static __u32 optable[256];
	__u8 gh[24], rh[16];
	FILE *in, *out;
	__u32 magic, nrec = 0;
	int big;

	if (argc != 4)
		return 2;
	/* argv[3]: the opcode table, 256 little-endian u32 (layout.OPCODE_TABLE) */
	in = fopen(argv[3], "rb");
	if (!in || fread(optable, 4, 256, in) != 256)
		return 2;
	fclose(in);
	host_optable = optable;
	in = fopen(argv[1], "rb");
	out = fopen(argv[2], "wb");
	if (!in || !out || fread(gh, 1, 24, in) != 24)
		return 2;
	magic = rd32(gh, 0);
	if (magic == 0xA1B2C3D4 || magic == 0xA1B23C4D)
		big = 0;
	else if (magic == 0xD4C3B2A1 || magic == 0x4D3CB2A1)
		big = 1;
	else
		return 2;
	if (rd32(gh + 20, big) != 1)   /* LINKTYPE_ETHERNET */
		return 2;
	while (fread(rh, 1, 16, in) == 16) {
		__u32 caplen = rd32(rh + 8, big), orig = rd32(rh + 12, big);
		struct ss_host_out o;
		struct ss_flow_key key;
		struct ss_pkt p;
		__u8 *frame;

		if (caplen > (1u << 20))
			return 2;
		frame = malloc(caplen ? caplen : 1);
		if (!frame || fread(frame, 1, caplen, in) != caplen)
			return 2;
		memset(&o, 0, sizeof(o));
		/* garbage, not zeros: the program's key and parsed packet are not zero-filled
		 * either, so a field the parser leaves unwritten on an accounted frame shows up as a
		 * difference from the offline parser */
		memset(&key, 0xA5, sizeof(key));
		memset(&p, 0xA5, sizeof(p));
		host_counts = o.counts;
		/* the replay convention: bytes past caplen are never parsed, the wire length is the
		 * original length */
		o.cat = ss_parse(frame, frame + caplen, frame + caplen, orig > caplen ? orig : caplen,
				 0, &key, &p);
		if (o.cat == SS_G_ACCOUNTED) {
			o.opinfo = p.opinfo;
			o.key = key;
			o.wire_len = p.wire_len;
			o.payload = p.payload;
			o.psn = p.psn;
			o.reth_len = p.reth_len;
			o.sport = p.sport;
			o.opcode = p.opcode;
			o.tclass = p.tclass;
			o.ecn_valid = p.ecn_valid;
			o.fb = p.fb;
			o.syndrome = p.syndrome;
		}
		free(frame);
		if (fwrite(&o, sizeof(o), 1, out) != 1)
			return 2;
		nrec++;
	}
	if (fclose(out) != 0)
		return 2;
	printf("%zu %d %u\n", sizeof(struct ss_host_out), SS_G_N, nrec);
	return 0;
}
