"""The pcap record walk of one run (offline.run._Run): scanner calls over the read buffer
until the file ends, refills sized to the next record, damage reported as _Stop."""
from __future__ import annotations

from skewscope.sources.offline import kernel as K
from skewscope.sources.offline.formats import _u32
from skewscope.sources.offline.streams import _Stop
from skewscope.sources.offline.tables import _NO_IF


class _PcapWalk:
    """_Run's pcap part (the record walk; the file header is read by _Run._open)."""

    def _run_pcap(self):
        b = self.b
        while True:
            status = self._scan(K.FMT_PCAP, self.ts_mult, self.kind, _NO_IF, _NO_IF, _NO_IF, 0)
            if status == K.S_GROW:
                continue
            if status == K.S_FULL:
                if self.n:
                    yield self._take()
                continue
            if status == K.S_BAD_RECLEN:
                incl = _u32(b.buf, b.pos + 8, self.big)
                raise _Stop(f"record {int(self.st[K.ST_RECORDS]) + 1} (file offset {b.base + b.pos}) claims "
                            f"{incl} captured bytes, more than any capture holds: the file is corrupt there")
            # need data
            self._tick()
            if b.eof:
                if b.error is not None:
                    raise b.error
                if b.avail():
                    raise _Stop(f"the file ends inside record {int(self.st[K.ST_RECORDS]) + 1} "
                                f"({b.avail()} bytes of it present; capture cut short?)")
                return
            need = 16
            if b.avail() >= 16:
                need = 16 + _u32(b.buf, b.pos + 8, self.big)
            b.refill(need)
