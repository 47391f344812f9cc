"""The capture formats the offline reader knows: pcap and pcapng magic numbers, the link
types it reads (and the names of some it refuses), the kernel's view of each link type
(link_view kinds), the refusal of an unsupported one, and the byte readers of the
format headers (docs/offline.md "What it reads")."""
from __future__ import annotations

import numpy as np

from skewscope.core.errors import PcapError
from skewscope.sources.offline import kernel as K

LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
LINKTYPE_LINUX_SLL = 113
LINKTYPE_LINUX_SLL2 = 276
LINKTYPE_ERF = 197
DLT_RAW_ALIASES = (12, 14)
SUPPORTED_LINKTYPES = {LINKTYPE_ETHERNET: "Ethernet", LINKTYPE_RAW: "raw IP", 12: "raw IP", 14: "raw IP",
                       LINKTYPE_LINUX_SLL: "Linux cooked v1", LINKTYPE_LINUX_SLL2: "Linux cooked v2"}
LINKTYPE_NAMES = {LINKTYPE_ERF: "ERF (native InfiniBand/DAG)", 247: "InfiniBand", 105: "802.11",
                  127: "802.11 radiotap", 0: "BSD loopback", 113: "Linux cooked v1"}

PCAP_MAGIC_US = 0xA1B2C3D4
PCAP_MAGIC_NS = 0xA1B23C4D
PCAPNG_SHB = 0x0A0D0D0A


def _check_linktype(path: str, lt: int) -> None:
    if lt not in SUPPORTED_LINKTYPES:
        name = LINKTYPE_NAMES.get(lt, f"link type {lt}")
        raise PcapError(f"{path}: unsupported link type {lt} ({name}); skewscope reads Ethernet, "
                        "Linux cooked (v1/v2) and raw IP captures of RoCE")


_KIND = {LINKTYPE_ETHERNET: K.K_ETHERNET, LINKTYPE_RAW: K.K_RAW, LINKTYPE_LINUX_SLL: K.K_SLL,
         LINKTYPE_LINUX_SLL2: K.K_SLL2, **{a: K.K_RAW for a in DLT_RAW_ALIASES}}


def _u32(b: np.ndarray, o: int, big: bool) -> int:
    return int.from_bytes(b[o:o + 4].tobytes(), "big" if big else "little")


def _u16(b: np.ndarray, o: int, big: bool) -> int:
    return int.from_bytes(b[o:o + 2].tobytes(), "big" if big else "little")
