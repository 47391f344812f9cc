"""core/jit.unaligned, the one codegen of an integer read or written at any byte of a uint8
array: the row words (load_u64/store_u64) and the offline parser's field readers (ld8, be16,
be32, le32, le64, rd16, rd32) against Python's int.from_bytes/int.to_bytes, at every
alignment of a random buffer, no root."""
from __future__ import annotations

import numpy as np
import pytest

from skewscope.core import jit

# stores in the widths and orders no caller uses yet: the factory's other half
_store32le = jit.unaligned(32, store=True)
_store16be = jit.unaligned(16, "be", store=True)


@jit.njit
def _loads(b, o, big, out, out_u):
    out[0] = jit.ld8(b, o)
    out[1] = jit.be16(b, o)
    out[2] = jit.be32(b, o)
    out[3] = jit.le32(b, o)
    out[4] = jit.le64(b, o)
    out[5] = jit.rd16(b, o, big)
    out[6] = jit.rd32(b, o, big)
    out_u[0] = jit.load_u64(b, o)


@jit.njit
def _stores(b, o, v):
    jit.store_u64(b, o, v)
    _store32le(b, o + 8, v)
    _store16be(b, o + 12, v)


def _int(raw: bytes, order: str, signed: bool = False) -> int:
    return int.from_bytes(raw, order, signed=signed)


def test_loads_match_int_from_bytes_at_every_alignment():
    rng = np.random.default_rng(7)
    b = rng.integers(0, 256, 64, dtype=np.uint8)
    b[8:16] = 0xFF                                   # a word with its top bit set (le64 < 0)
    raw = b.tobytes()
    out, out_u = np.zeros(7, np.int64), np.zeros(1, np.uint64)
    for o in range(0, 56):
        for big in (False, True):
            _loads(b, o, big, out, out_u)
            order = "big" if big else "little"
            want = [raw[o], _int(raw[o:o + 2], "big"), _int(raw[o:o + 4], "big"), _int(raw[o:o + 4], "little"),
                    _int(raw[o:o + 8], "little", signed=True), _int(raw[o:o + 2], order), _int(raw[o:o + 4], order)]
            assert out.tolist() == want, (o, big)
            assert int(out_u[0]) == _int(raw[o:o + 8], "little"), o


def test_stores_write_only_their_bytes_in_their_order():
    rng = np.random.default_rng(8)
    v = 0x8123456789ABCDEF
    for o in range(0, 9):
        b = rng.integers(0, 256, 32, dtype=np.uint8)
        want = bytearray(b.tobytes())
        want[o:o + 8] = v.to_bytes(8, "little")
        want[o + 8:o + 12] = (v & 0xFFFFFFFF).to_bytes(4, "little")
        want[o + 12:o + 14] = (v & 0xFFFF).to_bytes(2, "big")
        _stores(b, o, np.uint64(v))
        assert b.tobytes() == bytes(want), o


def test_a_store_has_a_fixed_byte_order():
    with pytest.raises(ValueError):
        jit.unaligned(32, "arg", store=True)
