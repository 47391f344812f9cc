"""What every offline kernel module shares: the constants frozen into the compiled code
(from skewscope/core/layout.py only, the mirror of ebpf/skewscope.h), the indices of the
scalar state and of the per-packet dissection rows, and `borrow` (the byte readers, ld8,
be16, ...: core/jit.py's `unaligned`)."""
from __future__ import annotations

import numpy as np

from skewscope.core import layout as L
from skewscope.core.jit import intrinsic


@intrinsic
def borrow(typingctx, arr):
    """The same array without its meminfo: numba's reference counting becomes a no-op on it
    (the caller keeps the real array alive for the duration of the call)."""
    from numba.core import types  # heavy: typing runs only under numba

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, value=args[0])
        ary.meminfo = context.get_constant_null(types.MemInfoPointer(sig.args[0].dtype))
        return ary._getvalue()
    return arr(arr), codegen


# ---- constants frozen into the compiled code (from layout.py only) ----------------------
G_N = L.G_N
G_ACCOUNTED = L.G_ACCOUNTED
G_NON_ROCE = L.G_NON_ROCE
G_PFC = L.G_PFC
G_PAUSE = L.G_PAUSE
G_FRAGMENT = L.G_FRAGMENT
G_UNKNOWN_OPCODE = L.G_UNKNOWN_OPCODE
G_TRUNC_ETH = L.G_TRUNC_ETH
G_TRUNC_VLAN = L.G_TRUNC_VLAN
G_VLAN_DEPTH = L.G_VLAN_DEPTH
G_TRUNC_IP = L.G_TRUNC_IP
G_TRUNC_UDP = L.G_TRUNC_UDP
G_TRUNC_GRH = L.G_TRUNC_GRH
G_TRUNC_BTH = L.G_TRUNC_BTH
G_TRUNC_EXT = L.G_TRUNC_EXT
G_TRUNC_MACCTL = L.G_TRUNC_MACCTL
G_BAD_LENGTH = L.G_BAD_LENGTH
G_FRAMES = L.G_FRAMES
G_FLOWS_CREATED = L.G_FLOWS_CREATED
G_MSG_PARTIAL = L.G_MSG_PARTIAL
G_DECAP = L.G_DECAP
G_PFC_PAUSE = L.G_PFC_PAUSE
G_PFC_XON = L.G_PFC_XON
G_PFC_QUANTA = L.G_PFC_QUANTA

ROCE_UDP_PORT = L.ROCE_UDP_PORT
ETH_P_ROCEV1 = L.ETH_P_ROCEV1
ETH_P_MACCTL = L.ETH_P_MACCTL
MACCTL_PAUSE = L.MACCTL_PAUSE
MACCTL_PFC = L.MACCTL_PFC
MAX_VLAN = L.MAX_VLAN
IPPROTO_GRE = L.IPPROTO_GRE
VXLAN_UDP_PORT = L.VXLAN_UDP_PORT
GRE_P_TEB = L.GRE_P_TEB
GRE_P_ERSPAN2 = L.GRE_P_ERSPAN2
GRE_P_ERSPAN3 = L.GRE_P_ERSPAN3
PSN_MASK = L.PSN_MASK
PSN_HALF = L.PSN_HALF

OPC_SEND = L.OPC_SEND
OPC_READ_REQ = L.OPC_READ_REQ
N_OPCLASS = L.N_OPCLASS
# classes of "middle" packets (skewscope.bpf.c SS_MID_CLASSES): no clock read, last_ts kept
MID_CLASSES = (1 << L.OPC_SEND) | (1 << L.OPC_WRITE) | (1 << L.OPC_READ_RESP)

OPT_EXTLEN_MASK = L.OPT_EXTLEN_MASK
OPT_CLASS_SHIFT = L.OPT_CLASS_SHIFT
OPT_CLASS_MASK = L.OPT_CLASS_MASK
OPT_VALID = L.OPT_VALID
OPT_REQUEST = L.OPT_REQUEST
OPT_FIRST = L.OPT_FIRST
OPT_LAST = L.OPT_LAST
OPT_RETH = L.OPT_RETH
OPT_AETH = L.OPT_AETH
OPT_PREFIX_SHIFT = L.OPT_PREFIX_SHIFT
OPT_PREFIX_MASK = L.OPT_PREFIX_MASK
OPT_CNP = L.OPT_CNP
OPT_ACKNOWLEDGE = L.OPT_ACKNOWLEDGE

FF_PSN_VALID = L.FF_PSN_VALID
FF_AFTER_READ = L.FF_AFTER_READ
FF_MSG_OPEN = L.FF_MSG_OPEN
FF_MSG_STARTED = L.FF_MSG_STARTED

MSG_SLOTS = L.MSG_SLOTS
GAP_SLOTS = L.GAP_SLOTS

# ---- scalar state indices ------------------------------------------------------------
ST_NUSED = 0       # slots in use (== live flows)
ST_HEAD = 1        # LRU head slot (most recent), -1 if none
ST_TAIL = 2        # LRU tail slot (least recent)
ST_MAXF = 3        # max_flows
ST_CAP = 4         # allocated slots (grows by doubling up to max_flows)
ST_HMASK = 5       # hidx size - 1
ST_EVN = 6
ST_EVCAP = 7
ST_INSTN = 8
ST_INSTCAP = 9
ST_FIRST_TS = 10   # -1 until the first record
ST_LAST_TS = 11
ST_CUT = 12        # records with caplen < original length (snaplen)
ST_RECORDS = 13    # records handed to process (== G_FRAMES)
ST_PKN = 14
ST_PKCAP = 15
ST_SKIP_LT = 16    # pcapng records on interfaces with an unsupported link type
ST_STOP_IF = 17    # pcapng: interface id of the offending record (corrupt stop)
ST_UNKNOWN_BLOCKS = 18  # pcapng blocks of a type the spec does not define (skipped)
ST_UNKNOWN_TYPE = 19    # the last such block type
ST_EVMAX = 20      # max_events: message records kept at most
ST_EVLOST = 21     # message records not kept (beyond max_events)
ST_LRU = 22        # 1 once the LRU list (lprev/lnext, ST_HEAD/ST_TAIL) is kept: from the first eviction
ST_N = 24

# per-packet dissection columns
PK_TS, PK_CAT, PK_OPCODE, PK_QP, PK_PSN, PK_RETH, PK_PAYLOAD, PK_WIRE, PK_SYND, PK_FB, \
    PK_SPORT, PK_TCLASS, PK_IPVER, PK_ROCE, PK_W0, PK_W1, PK_W2, PK_W3 = range(18)
PK_N = 18
