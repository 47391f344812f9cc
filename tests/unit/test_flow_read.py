"""The live map read's user-space half: the key order of a read (core.snapshot._key_order, a
radix sort of the bits that differ), its rows (flows_from_raw) and the reused result
buffers (core.pool.ArrayPool). Ground truth: Python's own byte-string sort and numpy's
field-by-field copy; reuse is seen in the buffers' addresses."""
import gc

import numpy as np
import pytest

from skewscope.core import layout as L
from skewscope.core import snapshot as S
from skewscope.core.pool import ArrayPool

KZ, VZ = L.FLOW_KEY_DTYPE.itemsize, L.FLOW_STATS_DTYPE.itemsize


def _python_order(keys: np.ndarray) -> list[int]:
    # stable: rows with equal keys keep their order
    return sorted(range(len(keys)), key=lambda i: keys[i].tobytes())


def _keys(kind: str, n: int, rng) -> np.ndarray:
    k = np.zeros((n, KZ), np.uint8)
    if kind == "random":
        return rng.integers(0, 256, (n, KZ), dtype=np.uint8)
    if kind == "ipv4":            # ::ffff:10.0.x.y pairs, 24-bit QPs, RoCEv2 (one packed word)
        k[:, 10:12] = k[:, 26:28] = 0xFF
        k[:, 12] = k[:, 28] = 10
        k[:, 14:16] = rng.integers(0, 256, (n, 2))
        k[:, 30:32] = rng.integers(0, 256, (n, 2))
        k[:, 32:35] = rng.integers(0, 256, (n, 3))
        k[:, 36], k[:, 37] = 4, 2
    elif kind == "wide":          # 20 random bytes and a few others: three packed words
        k[:, :20] = rng.integers(0, 256, (n, 20))
        k[:, 37] = rng.integers(1, 3, n)
    elif kind == "ties":          # few distinct keys: the order of equal rows is kept
        k[:, 15] = rng.integers(0, 3, n)
        k[:, 32] = rng.choice([0x10, 0x30, 0x90], n)   # varying bits 4..7 only
        k[:, 39] = rng.integers(0, 2, n) << 7
    elif kind == "equal":
        k[:] = rng.integers(0, 256, KZ, dtype=np.uint8)
    return k


@pytest.mark.parametrize("kind", ["random", "ipv4", "wide", "ties", "equal"])
@pytest.mark.parametrize("n", [0, 1, 2, 9, 5000])
def test_key_order_is_pythons_byte_order(kind, n):
    keys = _keys(kind, n, np.random.default_rng(n))
    assert S._key_order(keys).tolist() == _python_order(keys)


def _fieldwise(keys: np.ndarray, vals: np.ndarray) -> np.ndarray:
    n = len(keys)
    order = _python_order(keys)
    k = keys.view(L.FLOW_KEY_DTYPE).reshape(n)
    v = vals.view(L.FLOW_STATS_DTYPE).reshape(n)
    want = np.zeros(n, dtype=L.FLOW_DTYPE)
    for name in L.FLOW_DTYPE.names:
        want[name] = (k if name in L.FLOW_KEY_DTYPE.names else v)[name][order]
    return want


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_reads_into_a_pool_reuse_only_tables_nothing_refers_to():
    """Read after read, as the live loop does (the previous table held while the next is
    made): every table equals the field-by-field conversion of its own entries, tables still
    held keep their contents, and a buffer comes back only once nothing refers to it."""
    rng = np.random.default_rng(7)
    pool = ArrayPool(L.FLOW_DTYPE)
    reads = []
    for r in range(6):
        n = 3000 + 50 * r
        keys, vals = _keys("ipv4", n, rng), rng.integers(0, 256, (n, VZ), dtype=np.uint8)
        reads.append((keys, vals))
    prev = S.flows_from_raw(*reads[0], pool=pool)
    view0 = prev["packets"]                          # from the next read on, all that holds it
    addrs = {_addr(prev)}
    for keys, vals in reads[1:]:
        cur = S.flows_from_raw(keys, vals, pool=pool)
        assert cur.tobytes() == _fieldwise(keys, vals).tobytes()
        assert _addr(cur) != _addr(prev)
        prev = cur
        addrs.add(_addr(cur))
    # the first table (held through a field view only) was never written over
    assert view0.tobytes() == _fieldwise(*reads[0])["packets"].tobytes()
    # the reads in between alternated between two buffers: the one before the previous came back
    assert pool.reused >= 3 and len(addrs) <= 3


@pytest.mark.parametrize("keep", ["array", "slice", "bytes view", "frombuffer", "field"])
def test_a_buffer_with_any_view_alive_is_not_reused(keep):
    pool = ArrayPool(L.FLOW_DTYPE)
    a = pool.take(100)
    a["packets"] = np.arange(100)
    held = {"array": lambda: a, "slice": lambda: a[10:20], "bytes view": lambda: a.view(np.uint8),
            "frombuffer": lambda: np.frombuffer(a, dtype=np.uint8), "field": lambda: a["packets"][5:]}[keep]()
    before, addr = held.tobytes(), _addr(a)
    del a
    gc.collect()
    b = pool.take(100)
    assert _addr(b) != addr and pool.reused == 0
    b[:] = np.zeros(1, L.FLOW_DTYPE)
    assert held.tobytes() == before                  # untouched by the new table's writes
    addr_b = _addr(b)
    del held, b
    c = pool.take(100)
    assert pool.reused == 1 and _addr(c) in (addr, addr_b)


def test_a_buffer_is_reused_only_when_it_fits():
    pool = ArrayPool(L.FLOW_DTYPE)
    a = pool.take(10_000)
    addr = _addr(a)
    del a
    assert _addr(pool.take(10_500)) == addr           # room to grow by an eighth
    pool2 = ArrayPool(L.FLOW_DTYPE)
    del pool
    a = pool2.take(10_000)
    addr = _addr(a)
    del a
    b = pool2.take(20_000)                            # larger than the buffer: a new one
    assert _addr(b) != addr and pool2.reused == 0
    del b
    c = pool2.take(100)                               # far smaller: not kept for it
    assert pool2.reused == 0 and len(c) == 100
    # unused buffers not taken are let go: only the one handed out is followed
    assert len(pool2._bufs) == 1


def test_a_pool_of_fixed_rows_reuses_for_any_table_up_to_them():
    """A map reader's pool (rows = max_entries): a table that grows or shrinks between reads
    still gets the unused buffer; one beyond the rows gets its own."""
    pool = ArrayPool(L.FLOW_DTYPE, rows=4096)
    a = pool.take(100)
    addr = _addr(a)
    del a
    b = pool.take(4096)
    assert _addr(b) == addr and len(b) == 4096
    del b
    c = pool.take(7)
    assert _addr(c) == addr and pool.reused == 2
    del c
    d = pool.take(5000)
    assert _addr(d) != addr and len(d) == 5000 and pool.allocated == 2
