"""numba kernels of the offline path: record scanners (pcap, pcapng) and a line-by-line
mirror of ebpf/skewscope.bpf.c and ebpf/parse.h (`process`, `parse_l3`, `parse_gre`,
`parse_vxlan`, `parse_bth`, `handle_macctl`, `account`). One module per job:

  base.py        the constants frozen into the compiled code, the state and dissection
                 indices, `borrow`, the byte readers
  accounting.py  the flow table (open addressing, exact LRU), `account`, message records
  parse.py       the parser (C: parse.h) and `process` (one frame: parse, decapsulate, account)
  scanner.py     the pcap/pcapng record walk, the link-type conventions, and the entry points
                 `scan` (parse and account records) and `scan_frames` (records as frames)

This package re-exports their public names: the rest of offline/ and the tests use it as
`K` (K.scan, K.ST_*, K.PK_*, ...). `scan` inlines everything below it and numba keys its
on-disk cache by the source of a kernel's own module only, so offline/__init__ drops the
cache of this package whenever any of its modules (or layout.py) changed.

Keep these modules in lock-step with the C. Every constant comes from skewscope/core/layout.py
(the mirror of ebpf/skewscope.h, checked against it by tests/unit/test_layout.py); the opcode
table is passed in as data (layout.OPCODE_TABLE, the same array the kernel's op_table map is
filled from). Differences from the kernel are deliberate and listed in docs/offline.md
(flow-table eviction is exact LRU here).

State lives in numpy arrays owned by skewscope/sources/offline/tables.py and passed to every call:

  g      int64[G_N]              the global counters (same indices as the BPF array)
  st     int64[ST_N]             scalars: flow-table fill, LRU ends, event/instance fill...
  hidx   int32[hsize]            open-addressing index (linear probing): slot + 1, 0 = empty
  fhash  int64[cap]              hash of each slot's key
  keys   int64[cap, 5]           flow key as 5 little-endian words = struct ss_flow_key bytes
  S      int64[cap, NCOL]        struct ss_flow_stats fields, one column per scalar/array elem
                                 (STAT_COLS: the per-packet ones first, 64-byte rows on a 64-byte
                                 aligned base), and C_LRU: the packet number of the slot's last use
  lprev, lnext int32[cap]        LRU doubly-linked list (head = most recently used), kept once
                                 st[ST_LRU] is set: from the first eviction (lru_build)
  finst  int64[cap]              flow instance id of the slot (G_FLOWS_CREATED at insert - 1)
  ev     int64[ev_cap, 5]        message records: instance, opclass, start, end, bytes (at most
                                 max_events are kept; the others are counted as lost)
  ikeys  int64[inst_cap, 5]      key of every flow instance ever created
  pk     int64[pk_cap, PK_N]     optional per-packet dissection (pk_cap 0 = off)

All integers are int64 (the C's u64 counters never get near 2^63); the final tables are
reinterpreted as the layout's unsigned dtypes.
"""
from __future__ import annotations

from skewscope.sources.offline.kernel.accounting import *  # noqa: F401,F403
from skewscope.sources.offline.kernel.base import *  # noqa: F401,F403
from skewscope.sources.offline.kernel.parse import *  # noqa: F401,F403
from skewscope.sources.offline.kernel.scanner import *  # noqa: F401,F403
