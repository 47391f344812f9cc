/* SPDX-License-Identifier: (GPL-2.0 OR Apache-2.0) */
/*
 * skewscope.h -- the single source of truth for what the data plane records.
 *
 * The ABI of the data plane: used by ebpf/parse.h (the parser) and ebpf/skewscope.bpf.c
 * (maps, accounting, entry points), mirrored by skewscope/core/layout.py (user side: numpy
 * dtypes, constants). tests/unit/test_layout.py parses this file and fails when the two
 * drift (names, sizes, offsets, constant values). Parser-internal definitions (wire
 * headers, struct ss_pkt) live in parse.h, not here.
 *
 * Rules for editing: every struct field is explicitly sized and naturally aligned; no
 * implicit padding (add _pad fields); histogram arrays go last; bump SS_LAYOUT_VERSION
 * when anything here changes.
 */
#ifndef SKEWSCOPE_H
#define SKEWSCOPE_H

#define SS_LAYOUT_VERSION 4

/* ---- protocol constants -------------------------------------------------------- */
#define SS_ROCE_UDP_PORT   4791
#define SS_ETH_P_ROCEV1    0x8915
#define SS_ETH_P_MACCTL    0x8808
#define SS_MACCTL_PAUSE    0x0001
#define SS_MACCTL_PFC      0x0101
#define SS_MAX_VLAN        2      /* 802.1Q / 802.1ad tags parsed; a 3rd is "vlan_too_deep" */
/* one level of decapsulation (remote mirrors, overlays): GRE (IP protocol 47) carrying
 * ERSPAN I/II/III, transparent Ethernet bridging or IPv4/IPv6, and VXLAN (UDP 4789) */
#define SS_IPPROTO_GRE     47
#define SS_VXLAN_UDP_PORT  4789
#define SS_GRE_P_TEB       0x6558
#define SS_GRE_P_ERSPAN2   0x88BE /* type II with the S bit (8-byte header); type I without */
#define SS_GRE_P_ERSPAN3   0x22EB /* 12-byte header, + 8-byte platform subheader if O bit */
#define SS_OPCODE_CNP      0x81
#define SS_PSN_MASK        0xFFFFFF
#define SS_PSN_HALF        0x800000

/* ---- opcode classes (per-flow op[] counters) -------------------------------------- */
#define SS_OPC_SEND        0
#define SS_OPC_WRITE       1
#define SS_OPC_READ_REQ    2
#define SS_OPC_READ_RESP   3
#define SS_OPC_ACK         4
#define SS_OPC_ATOMIC      5
#define SS_OPC_ATOMIC_ACK  6
#define SS_OPC_CNP         7
#define SS_N_OPCLASS       8

/*
 * Opcode table entry (u32), one per BTH opcode value, filled by user space from
 * skewscope/layout.py:OPCODE_TABLE (the same table drives the offline parser).
 */
#define SS_OPT_EXTLEN_MASK  0x000000FFu /* bytes of extension headers after the BTH */
#define SS_OPT_CLASS_SHIFT  8           /* 4 bits: SS_OPC_* */
#define SS_OPT_CLASS_MASK   0x00000F00u
#define SS_OPT_VALID        (1u << 12)
#define SS_OPT_REQUEST      (1u << 13)  /* PSN-tracked request packet */
#define SS_OPT_FIRST        (1u << 14)  /* starts a message (FIRST or ONLY) */
#define SS_OPT_LAST         (1u << 15)  /* ends a message (LAST or ONLY) */
#define SS_OPT_RETH         (1u << 16)  /* carries a RETH */
#define SS_OPT_AETH         (1u << 17)  /* carries an AETH */
#define SS_OPT_PREFIX_SHIFT 18          /* 4 bits: bytes before RETH/AETH (XRCETH=4) */
#define SS_OPT_PREFIX_MASK  0x003C0000u
#define SS_OPT_CNP          (1u << 22)
#define SS_OPT_ACKNOWLEDGE  (1u << 23)  /* opcode ACKNOWLEDGE: acks/naks counted */

/* ---- per-flow histograms ------------------------------------------------------- */
/* slot 0: value 0; slot i >= 1: [2^(i-1), 2^i); the last slot also takes everything above */
#define SS_MSG_SLOTS       34   /* message sizes in bytes, up to >= 2^32 */
#define SS_GAP_SLOTS       40   /* inter-message-start gaps in ns, up to >= 2^38 (~275 s) */

/* ---- global counters (per-CPU array, summed by user space) ------------------------ */
/* Categories: every frame the program sees is counted in exactly one of 0..SS_G_NCAT-1. */
#define SS_G_ACCOUNTED       0  /* RoCE packet accounted to a flow */
#define SS_G_NON_ROCE        1  /* not RoCE: other EtherType, not UDP, UDP port != 4791 */
#define SS_G_PFC             2  /* PFC pause frame (802.1Qbb) */
#define SS_G_PAUSE           3  /* 802.3x global pause frame */
#define SS_G_FRAGMENT        4  /* IPv4 fragment / IPv6 fragment header: counted, not parsed */
#define SS_G_UNKNOWN_OPCODE  5  /* UDP 4791 / RoCEv1 with a BTH opcode we do not know */
#define SS_G_TRUNC_ETH       6  /* shorter than an Ethernet header */
#define SS_G_TRUNC_VLAN      7  /* cut inside a VLAN tag */
#define SS_G_VLAN_DEPTH      8  /* more than SS_MAX_VLAN tags */
#define SS_G_TRUNC_IP        9  /* IP header cut, or invalid (version, IHL < 5) */
#define SS_G_TRUNC_UDP      10  /* UDP header cut */
#define SS_G_TRUNC_GRH      11  /* RoCEv1 GRH cut or invalid (IPVer != 6) */
#define SS_G_TRUNC_BTH      12  /* BTH cut */
#define SS_G_TRUNC_EXT      13  /* extension header cut */
#define SS_G_TRUNC_MACCTL   14  /* MAC control (pause/PFC) frame cut */
#define SS_G_BAD_LENGTH     15  /* UDP/IP/GRH length inconsistent with the headers it must hold,
                                   or longer than the frame (a length lie: Linux drops these too) */
#define SS_G_SAMPLED_OUT    16  /* skipped by 1-in-N sampling */
#define SS_G_NO_FLOW_SLOT   17  /* flow insert failed (map update error) */
#define SS_G_NCAT           18
/* Other counters */
#define SS_G_FRAMES         18  /* every frame seen (== sum of the categories) */
#define SS_G_FLOWS_CREATED  19  /* flow entries inserted (evicted = created - present) */
#define SS_G_MSG_PARTIAL    20  /* message ends (LAST) without a seen start: no record */
#define SS_G_DECAP          21  /* frames decapsulated (GRE/ERSPAN/VXLAN headers parsed, the
                                   inner frame then lands in a category like any frame) */
#define SS_G_PFC_PAUSE      24  /* +prio (8): PFC frames pausing priority p (enabled, time > 0) */
#define SS_G_PFC_XON        32  /* +prio (8): PFC frames resuming priority p (enabled, time 0) */
#define SS_G_PFC_QUANTA     40  /* +prio (8): sum of pause quanta requested for priority p */
#define SS_G_N              48

/* ---- flow key -------------------------------------------------------------------- */
struct ss_flow_key {
	__u8  src[16];    /* IPv4 as ::ffff:a.b.c.d; RoCEv1: GRH SGID */
	__u8  dst[16];    /* IPv4 as ::ffff:a.b.c.d; RoCEv1: GRH DGID */
	__u32 dest_qp;    /* BTH DestQP (24 bits) */
	__u8  ipver;      /* 4 or 6 (RoCEv1: 6, the GIDs) */
	__u8  roce;       /* 2 = RoCEv2 (UDP), 1 = RoCEv1 (GRH) */
	__u8  _pad[2];
};

/* flow flags */
#define SS_FF_PSN_VALID   0x01  /* next_psn holds one past the highest request PSN */
#define SS_FF_AFTER_READ  0x02  /* last request was a READ_REQUEST: next forward jump is no gap */
#define SS_FF_MSG_OPEN    0x04  /* a message is in progress (FIRST seen, LAST not yet) */
#define SS_FF_MSG_STARTED 0x08  /* at least one message start seen (last_msg_ts valid) */

/* ---- per-flow state/counters (value of the flows LRU hash) -------------------------- */
struct ss_flow_stats {
	__u64 packets;
	__u64 bytes;            /* Ethernet frame length without FCS, VLAN tags included */
	__u64 payload_bytes;
	__u64 messages;         /* message starts (FIRST/ONLY/READ_REQUEST), retransmits included */
	__u64 msg_bytes;        /* sum of message sizes (RETH length / SEND payload) */
	__u64 first_ts;         /* ns */
	__u64 last_ts;          /* ns */
	__u64 op[SS_N_OPCLASS]; /* packets per opcode class */
	__u64 ecn_capable;      /* ECN != 00 */
	__u64 ce;               /* ECN == 11 */
	__u64 fecn;
	__u64 becn;
	__u64 cnp;              /* CNPs (opcode 0x81) to this dest QP */
	__u64 acks;             /* ACKNOWLEDGE with ACK syndrome */
	__u64 nak_seq;          /* ACKNOWLEDGE with NAK PSN sequence error (0x60) */
	__u64 nak_rnr;          /* ACKNOWLEDGE with RNR NAK (0b001xxxxx) */
	__u64 nak_other;        /* ACKNOWLEDGE with another NAK code (0x61..0x64, ...) */
	__u64 psn_gaps;         /* request packets ahead of the expected PSN */
	__u64 psn_skipped;      /* sum of PSNs skipped by those gaps */
	__u64 retransmissions;  /* request packets behind the expected PSN */
	__u64 msg_start_ts;     /* in-progress message: start ts */
	__u64 msg_cur_bytes;    /* in-progress message: RETH length (WRITE) / summed payload (SEND) */
	__u64 last_msg_ts;      /* start ts of the previous message (gap histogram) */
	__u32 next_psn;         /* one past the highest request PSN */
	__u16 sport;            /* last UDP source port (RoCEv1: 0) */
	__u8  flags;            /* SS_FF_* */
	__u8  tclass;           /* last IPv4 TOS / IPv6 traffic class (DSCP << 2 | ECN) */
	__u8  msg_class;        /* in-progress message: SS_OPC_* */
	__u8  last_opcode;
	__u16 owner;            /* flow cache: CPU + 1 whose cache holds the current copy, 0 none */
	__u8  _pad[4];
	__u64 msg_hist[SS_MSG_SLOTS];
	__u64 gap_hist[SS_GAP_SLOTS];
};

/* ---- message records (mmapable array, one region of SS_EV_PER_CPU slots per CPU) --- */
struct ss_msg_rec {
	struct ss_flow_key key;
	__u64 start_ts;
	__u64 end_ts;
	__u64 bytes;            /* RETH DMA length (WRITE, READ_REQUEST) or SEND payload sum */
	__u8  opclass;          /* SS_OPC_SEND / SS_OPC_WRITE / SS_OPC_READ_REQ */
	__u8  _pad[7];
	__u64 seq;              /* written last: per-CPU sequence + 1; a reader sees a slot as
	                           complete when seq == its expected sequence + 1 */
};

/* Replay (BPF_PROG_TEST_RUN): when compiled with -DSS_REPLAY_CLOCK the program takes
 * "now", the captured length of the record and (if not 0) its original wire length from
 * clock[0] (set by user space before each test run) instead of bpf_ktime_get_ns(), the end
 * of the data and the packet length. Bytes past caplen (the zero padding of a snaplen-cut
 * record) are never parsed; wire_len lets user space hand the TC entry a frame cut to what
 * its test run accepts (< 4 KiB) and still account the original length. Live programs do
 * not have it. */
struct ss_replay {
	__u64 ts;
	__u32 caplen;
	__u32 wire_len;   /* 0: the length of the data given to the test run */
};

#endif /* SKEWSCOPE_H */
