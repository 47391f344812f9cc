"""Python mirror of ebpf/skewscope.h: constants, numpy dtypes, the opcode table.

The C header is the source of truth; tests/unit/test_layout.py compiles the header with gcc
and compares every struct size/offset and every #define used here, so the two cannot drift.
Both the kernel path (via the op_table map) and the offline numba parser use OPCODE_TABLE
below, so "which opcode carries which header" is defined exactly once.
"""
from __future__ import annotations

import numpy as np

LAYOUT_VERSION = 4

ROCE_UDP_PORT = 4791
ETH_P_ROCEV1 = 0x8915
ETH_P_MACCTL = 0x8808
MACCTL_PAUSE = 0x0001
MACCTL_PFC = 0x0101
MAX_VLAN = 2
IPPROTO_GRE = 47
VXLAN_UDP_PORT = 4789
GRE_P_TEB = 0x6558
GRE_P_ERSPAN2 = 0x88BE
GRE_P_ERSPAN3 = 0x22EB
OPCODE_CNP = 0x81
PSN_MASK = 0xFFFFFF
PSN_HALF = 0x800000

# opcode classes
OPC_SEND, OPC_WRITE, OPC_READ_REQ, OPC_READ_RESP, OPC_ACK, OPC_ATOMIC, OPC_ATOMIC_ACK, OPC_CNP = range(8)
N_OPCLASS = 8
OPCLASS_NAMES = ("send", "write", "read_request", "read_response", "ack", "atomic", "atomic_ack", "cnp")

# opcode-table bits
OPT_EXTLEN_MASK = 0x000000FF
OPT_CLASS_SHIFT = 8
OPT_CLASS_MASK = 0x00000F00
OPT_VALID = 1 << 12
OPT_REQUEST = 1 << 13
OPT_FIRST = 1 << 14
OPT_LAST = 1 << 15
OPT_RETH = 1 << 16
OPT_AETH = 1 << 17
OPT_PREFIX_SHIFT = 18
OPT_PREFIX_MASK = 0x003C0000
OPT_CNP = 1 << 22
OPT_ACKNOWLEDGE = 1 << 23

MSG_SLOTS = 34
GAP_SLOTS = 40

# global counters: categories (each frame in exactly one) ...
G_ACCOUNTED = 0
G_NON_ROCE = 1
G_PFC = 2
G_PAUSE = 3
G_FRAGMENT = 4
G_UNKNOWN_OPCODE = 5
G_TRUNC_ETH = 6
G_TRUNC_VLAN = 7
G_VLAN_DEPTH = 8
G_TRUNC_IP = 9
G_TRUNC_UDP = 10
G_TRUNC_GRH = 11
G_TRUNC_BTH = 12
G_TRUNC_EXT = 13
G_TRUNC_MACCTL = 14
G_BAD_LENGTH = 15
G_SAMPLED_OUT = 16
G_NO_FLOW_SLOT = 17
G_NCAT = 18
# ... and other counters
G_FRAMES = 18
G_FLOWS_CREATED = 19
G_MSG_PARTIAL = 20
G_DECAP = 21
G_PFC_PAUSE = 24
G_PFC_XON = 32
G_PFC_QUANTA = 40
G_N = 48

#: user-facing names of the categories, index = G_* value
CATEGORY_NAMES = (
    "accounted", "non_roce", "pfc", "pause", "fragment", "unknown_opcode",
    "truncated_eth", "truncated_vlan", "vlan_too_deep", "truncated_ip", "truncated_udp",
    "truncated_grh", "truncated_bth", "truncated_ext", "truncated_macctl", "bad_length",
    "sampled_out", "no_flow_slot",
)
#: categories that mean "malformed or truncated" (JSON totals.malformed_packets)
MALFORMED_CATEGORIES = (
    G_TRUNC_ETH, G_TRUNC_VLAN, G_VLAN_DEPTH, G_TRUNC_IP, G_TRUNC_UDP, G_TRUNC_GRH,
    G_TRUNC_BTH, G_TRUNC_EXT, G_TRUNC_MACCTL, G_BAD_LENGTH,
)

FF_PSN_VALID = 0x01
FF_AFTER_READ = 0x02
FF_MSG_OPEN = 0x04
FF_MSG_STARTED = 0x08

# ---- struct mirrors (names, order and types exactly as in the header) ----
FLOW_KEY_FIELDS = [
    ("src", "u1", (16,)),
    ("dst", "u1", (16,)),
    ("dest_qp", "<u4"),
    ("ipver", "u1"),
    ("roce", "u1"),
    ("_pad", "u1", (2,)),
]
FLOW_STATS_FIELDS = [
    ("packets", "<u8"),
    ("bytes", "<u8"),
    ("payload_bytes", "<u8"),
    ("messages", "<u8"),
    ("msg_bytes", "<u8"),
    ("first_ts", "<u8"),
    ("last_ts", "<u8"),
    ("op", "<u8", (N_OPCLASS,)),
    ("ecn_capable", "<u8"),
    ("ce", "<u8"),
    ("fecn", "<u8"),
    ("becn", "<u8"),
    ("cnp", "<u8"),
    ("acks", "<u8"),
    ("nak_seq", "<u8"),
    ("nak_rnr", "<u8"),
    ("nak_other", "<u8"),
    ("psn_gaps", "<u8"),
    ("psn_skipped", "<u8"),
    ("retransmissions", "<u8"),
    ("msg_start_ts", "<u8"),
    ("msg_cur_bytes", "<u8"),
    ("last_msg_ts", "<u8"),
    ("next_psn", "<u4"),
    ("sport", "<u2"),
    ("flags", "u1"),
    ("tclass", "u1"),
    ("msg_class", "u1"),
    ("last_opcode", "u1"),
    ("owner", "<u2"),
    ("_pad", "u1", (4,)),
    ("msg_hist", "<u8", (MSG_SLOTS,)),
    ("gap_hist", "<u8", (GAP_SLOTS,)),
]
MSG_REC_FIELDS = [
    ("key", FLOW_KEY_FIELDS),
    ("start_ts", "<u8"),
    ("end_ts", "<u8"),
    ("bytes", "<u8"),
    ("opclass", "u1"),
    ("_pad", "u1", (7,)),
    ("seq", "<u8"),
]

FLOW_KEY_DTYPE = np.dtype(FLOW_KEY_FIELDS, align=True)
FLOW_STATS_DTYPE = np.dtype(FLOW_STATS_FIELDS, align=True)
MSG_REC_DTYPE = np.dtype([(n, np.dtype(t, align=True) if isinstance(t, list) else t, *rest)
                          for n, t, *rest in MSG_REC_FIELDS], align=True)

REPLAY_FIELDS = [("ts", "<u8"), ("caplen", "<u4"), ("wire_len", "<u4")]
REPLAY_DTYPE = np.dtype(REPLAY_FIELDS, align=True)

#: The Snapshot's flow table: key fields then stats fields (without padding/private state).
_PRIVATE = {"_pad", "msg_start_ts", "msg_cur_bytes", "last_msg_ts", "next_psn", "flags", "msg_class", "owner"}
FLOW_DTYPE = np.dtype(
    [f if len(f) == 3 else (f[0], f[1]) for f in FLOW_KEY_FIELDS if f[0] != "_pad"]
    + [f if len(f) == 3 else (f[0], f[1]) for f in FLOW_STATS_FIELDS if f[0] not in _PRIVATE]
)
#: The Snapshot's message-record table. flow = index into the flow table (-1: flow evicted).
EVENT_DTYPE = np.dtype([
    ("flow", "<i4"),
    ("opclass", "u1"),
    ("start_ts", "<u8"),
    ("end_ts", "<u8"),
    ("bytes", "<u8"),
])


def slot_lower_bound(slot: int) -> int:
    """Lower bound of a log2 histogram slot: 0 for slot 0, else 2**(slot-1)."""
    return 0 if slot == 0 else 1 << (slot - 1)


# ---- the opcode table ---------------------------------------------------------------
# (name, class, ext_len, flags) for the RC opcodes (low 5 bits); UC/XRC/UD derive from it.
_F, _L, _R, _RE, _AE = OPT_FIRST, OPT_LAST, OPT_REQUEST, OPT_RETH, OPT_AETH
RC_OPS = {
    0x00: ("SEND_FIRST", OPC_SEND, 0, _F | _R),
    0x01: ("SEND_MIDDLE", OPC_SEND, 0, _R),
    0x02: ("SEND_LAST", OPC_SEND, 0, _L | _R),
    0x03: ("SEND_LAST_WITH_IMMEDIATE", OPC_SEND, 4, _L | _R),
    0x04: ("SEND_ONLY", OPC_SEND, 0, _F | _L | _R),
    0x05: ("SEND_ONLY_WITH_IMMEDIATE", OPC_SEND, 4, _F | _L | _R),
    0x06: ("RDMA_WRITE_FIRST", OPC_WRITE, 16, _F | _R | _RE),
    0x07: ("RDMA_WRITE_MIDDLE", OPC_WRITE, 0, _R),
    0x08: ("RDMA_WRITE_LAST", OPC_WRITE, 0, _L | _R),
    0x09: ("RDMA_WRITE_LAST_WITH_IMMEDIATE", OPC_WRITE, 4, _L | _R),
    0x0A: ("RDMA_WRITE_ONLY", OPC_WRITE, 16, _F | _L | _R | _RE),
    0x0B: ("RDMA_WRITE_ONLY_WITH_IMMEDIATE", OPC_WRITE, 20, _F | _L | _R | _RE),
    0x0C: ("RDMA_READ_REQUEST", OPC_READ_REQ, 16, _F | _R | _RE),
    0x0D: ("RDMA_READ_RESPONSE_FIRST", OPC_READ_RESP, 4, _AE),
    0x0E: ("RDMA_READ_RESPONSE_MIDDLE", OPC_READ_RESP, 0, 0),
    0x0F: ("RDMA_READ_RESPONSE_LAST", OPC_READ_RESP, 4, _AE),
    0x10: ("RDMA_READ_RESPONSE_ONLY", OPC_READ_RESP, 4, _AE),
    0x11: ("ACKNOWLEDGE", OPC_ACK, 4, _AE | OPT_ACKNOWLEDGE),
    0x12: ("ATOMIC_ACKNOWLEDGE", OPC_ATOMIC_ACK, 12, _AE),
    0x13: ("COMPARE_SWAP", OPC_ATOMIC, 28, _F | _R),
    0x14: ("FETCH_ADD", OPC_ATOMIC, 28, _F | _R),
    0x16: ("SEND_LAST_WITH_INVALIDATE", OPC_SEND, 4, _L | _R),
    0x17: ("SEND_ONLY_WITH_INVALIDATE", OPC_SEND, 4, _F | _L | _R),
    0x1C: ("FLUSH", OPC_WRITE, 20, _F | _L | _R | _RE),          # RETH + FETH (IBA 1.5)
    0x1D: ("ATOMIC_WRITE", OPC_ATOMIC, 16, _F | _L | _R | _RE),  # RETH + 8-byte payload
}
# ATOMIC ops are not messages in NCCL's sense but are request starts; count them as messages
# is not what the definition says (SEND/WRITE/READ only), so clear FIRST/LAST for atomics.
for _op in (0x13, 0x14, 0x1D):
    _n, _c, _e, _fl = RC_OPS[_op]
    RC_OPS[_op] = (_n, _c, _e, _fl & ~(_F | _L))
# FLUSH carries a RETH but moves no data: not a message start either.
RC_OPS[0x1C] = ("FLUSH", OPC_WRITE, 20, _R | _RE)


def _build_opcode_table():
    table = np.zeros(256, dtype=np.uint32)
    names = {}

    def put(op, name, cls, ext, flags, prefix=0):
        table[op] = (ext & 0xFF) | (cls << OPT_CLASS_SHIFT) | OPT_VALID | flags | (prefix << OPT_PREFIX_SHIFT)
        names[op] = name

    for low, (name, cls, ext, flags) in RC_OPS.items():
        # FLUSH: the FETH (4 bytes) comes before its RETH (rxe_opcode.c)
        put(low, "RC_" + name, cls, ext, flags, prefix=4 if low == 0x1C else 0)
        # XRC (0xA0 | low): XRCETH (4 bytes) precedes the RC extension headers of *requests*;
        # responses, ACKs and atomic ACKs carry none (IBA 9.2; rxe_opcode.c, Wireshark agree).
        if low <= 0x17:
            req = bool(flags & OPT_REQUEST)
            put(0xA0 | low, "XRC_" + name, cls, ext + (4 if req else 0), flags, prefix=4 if req else 0)
        # UC: the SEND and WRITE subset (0x00..0x0B).
        if low <= 0x0B:
            put(0x20 | low, "UC_" + name, cls, ext, flags)
    # UD: SEND_ONLY (+DETH 8), SEND_ONLY_WITH_IMMEDIATE (+DETH 8 + ImmDt 4)
    # (not PSN-tracked: UD is unreliable and many source QPs share one dest QP, e.g. QP1)
    put(0x64, "UD_SEND_ONLY", OPC_SEND, 8, _F | _L)
    put(0x65, "UD_SEND_ONLY_WITH_IMMEDIATE", OPC_SEND, 12, _F | _L)
    # CNP: 16 reserved bytes count as header
    put(OPCODE_CNP, "CNP", OPC_CNP, 16, OPT_CNP)
    return table, names


OPCODE_TABLE, OPCODE_NAMES = _build_opcode_table()


