"""The pcapng block walk of one run (offline.run._Run): scanner calls over the read buffer,
section headers and interface descriptions (link type, snaplen, if_tsresol) read here in
Python between them, damage reported as _Stop."""
from __future__ import annotations

import numpy as np

from skewscope.core.errors import PcapError
from skewscope.sources.offline import kernel as K
from skewscope.sources.offline.formats import _KIND, PCAPNG_SHB, _u16, _u32
from skewscope.sources.offline.streams import _Stop


class _PcapngWalk:
    """_Run's pcapng part: the block walk and the blocks read in Python (SHB, IDB)."""

    def _run_pcapng(self):
        b = self.b
        self.big = False
        self.ifaces: list[tuple[int, int, int, int]] = []  # (link type, kind, tsresol, snaplen)
        self._if_arrays()
        while True:
            status = self._scan(K.FMT_PCAPNG, 1, 0, self.if_kind, self.if_res, self.if_snap, len(self.ifaces))
            if status == K.S_GROW:
                continue
            if status == K.S_FULL:
                if self.n:
                    yield self._take()
                continue
            if status == K.S_PYBLOCK:
                self._py_block()
                continue
            if status == K.S_BAD_BLOCK:
                raise _Stop(f"corrupt pcapng block at file offset {b.base + b.pos}")
            if status == K.S_BAD_IFACE:
                raise _Stop(f"packet block at file offset {b.base + b.pos} refers to interface "
                            f"{int(self.st[K.ST_STOP_IF])}, which the file never declared: corrupt")
            self._tick()
            if b.eof:
                if b.error is not None:
                    raise b.error
                if b.avail():
                    raise _Stop(f"the file ends inside a pcapng block at offset {b.base + b.pos} "
                                f"({b.avail()} bytes of it present; capture cut short?)")
                return
            need = 12
            if b.avail() >= 8:
                blen = _u32(b.buf, b.pos + 4, self.big)
                if 12 <= blen <= K.MAX_BLOCK:
                    need = blen
            b.refill(need)

    def _if_arrays(self):
        n = max(1, len(self.ifaces))
        self.if_kind = np.full(n, K.K_UNSUPPORTED, np.int64)
        self.if_res = np.zeros(n, np.int64)
        self.if_snap = np.zeros(n, np.int64)
        for i, (_lt, kind, res, snap) in enumerate(self.ifaces):
            self.if_kind[i] = kind
            self.if_res[i] = res
            self.if_snap[i] = snap

    def _py_block(self) -> None:
        """SHB or IDB at b.pos (whole block made available here)."""
        b = self.b
        if not b.ensure(12):
            raise b.error or _Stop(f"the file ends inside a pcapng block header at offset {b.base + b.pos}")
        btype = _u32(b.buf, b.pos, False)
        if btype == PCAPNG_SHB:
            bom = b.buf[b.pos + 8:b.pos + 12].tobytes()
            if bom == b"\x4d\x3c\x2b\x1a":
                big = False
            elif bom == b"\x1a\x2b\x3c\x4d":
                big = True
            else:
                if self.sections == 0:
                    raise PcapError(f"{self.path}: bad pcapng byte-order magic")
                raise _Stop(f"bad pcapng byte-order magic in the section header at offset {b.base + b.pos}")
            self.big = big
        blen = _u32(b.buf, b.pos + 4, self.big)
        if blen < 12 or blen % 4 or blen > K.MAX_BLOCK:
            if self.sections == 0 and btype == PCAPNG_SHB:
                raise PcapError(f"{self.path}: corrupt pcapng section header (block length {blen})")
            raise _Stop(f"corrupt pcapng block length {blen} at file offset {b.base + b.pos}")
        if not b.ensure(blen):
            raise b.error or _Stop(f"the file ends inside a pcapng block at offset {b.base + b.pos}")
        o = b.pos
        if _u32(b.buf, o + blen - 4, self.big) != blen:
            raise _Stop(f"corrupt pcapng block at file offset {b.base + o} (trailing length mismatch)")
        body, end = o + 8, o + blen - 4
        if btype == PCAPNG_SHB:
            self.sections += 1
            self.ifaces = []
        else:  # IDB
            if body + 8 > end:
                raise _Stop(f"truncated interface description block at file offset {b.base + o}")
            lt = _u16(b.buf, body, self.big)
            snap = _u32(b.buf, body + 4, self.big)
            res = 6
            p = body + 8
            while p + 4 <= end:
                code = _u16(b.buf, p, self.big)
                olen = _u16(b.buf, p + 2, self.big)
                if code == 0:
                    break
                if code == 9 and olen >= 1 and p + 5 <= end:
                    res = int(b.buf[p + 4])
                p += 4 + ((olen + 3) & ~3)
            kind = _KIND.get(lt, K.K_UNSUPPORTED)
            if kind == K.K_UNSUPPORTED:
                self.unsupported[lt] = self.unsupported.get(lt, 0) + 1
            else:
                self.linktypes.add(lt)
            self.ifaces.append((lt, kind, res, snap))
        self._if_arrays()
        b.pos = o + blen
