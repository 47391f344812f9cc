"""A capture's records as Ethernet frames (read_frames, what `skewscope replay` hands the
kernel): FrameBatch and the batch sizes."""
from __future__ import annotations

import numpy as np

FRAME_BATCH = 8192           # records per FrameBatch at most
FRAME_BYTES = 4 << 20        # and frame bytes per batch (grows for a larger single frame)


class FrameBatch:
    """Consecutive records of a capture as Ethernet frames (read_frames): numpy int64 arrays
    ts (ns), orig_len (the Ethernet frame's length on the wire, >= caplen), caplen (bytes
    captured) and offset (of each frame in data, uint8, the frames back to back). A record
    too short for its link-layer header is an empty frame (a too short Ethernet record keeps
    its bytes); every record is there, none dropped."""

    __slots__ = ("ts", "orig_len", "caplen", "offset", "data")

    def __init__(self, ts, orig_len, caplen, offset, data):
        self.ts, self.orig_len, self.caplen, self.offset, self.data = ts, orig_len, caplen, offset, data

    def __len__(self) -> int:
        return len(self.ts)

    def frame(self, i: int) -> np.ndarray:
        """The captured bytes of record i (a view into data)."""
        o = int(self.offset[i])
        return self.data[o:o + int(self.caplen[i])]

    def __iter__(self):
        """(ts_ns, orig_len, frame bytes) per record: convenient, not fast."""
        for i, (ts, orig) in enumerate(zip(self.ts.tolist(), self.orig_len.tolist())):
            yield ts, orig, self.frame(i).tobytes()
