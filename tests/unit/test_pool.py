"""core.pool.ArrayPool from several threads at once (the live loop's analysis runner and the
screen take from one pool), no root. The threads are made to switch at every line of
core/pool.py (a trace function that yields the GIL there), so any window between a buffer
found unused and handed out is hit. The check is independent of the pool's bookkeeping:
every array a thread holds is registered by its memory range, a new one must overlap none
held by any thread, and each holder finds its stamp on its array's ends intact when it lets
it go. Without the pool's lock this fails in every run (memory handed out twice, or the
pool's own list indexed past its end)."""
from __future__ import annotations

import sys
import threading
import time

import numpy as np

from skewscope.core import pool as pool_module
from skewscope.core.pool import ArrayPool

THREADS, TAKES = 4, 250


def _switch_in_pool(frame, event, arg):
    """threading.settrace hook: yield the GIL before every line of core/pool.py."""
    if frame.f_code.co_filename != pool_module.__file__:
        return None

    def line(frame, event, arg):
        if event == "line":
            time.sleep(0)
        return line
    return line


def test_no_array_is_handed_out_twice_while_held():
    pool = ArrayPool(np.int64, limit=6)
    held: dict[int, tuple[int, int]] = {}      # stamp -> memory range of every thread's live arrays
    check = threading.Lock()
    errors: list[str] = []

    def let_go(mine):
        stamp, a = mine.pop(0)
        if a[0] != stamp or a[-1] != stamp:
            errors.append(f"array {stamp} written by another holder")
        with check:
            del held[stamp]

    def hammer(t: int):
        try:
            sizes = np.random.default_rng(t).integers(500, 3000, TAKES)
            mine: list[tuple[int, np.ndarray]] = []
            for it in range(TAKES):
                a = pool.take(int(sizes[it]))
                stamp = t * TAKES + it
                lo = a.__array_interface__["data"][0]
                hi = lo + a.nbytes
                with check:
                    if any(lo < h and l < hi for l, h in held.values()):
                        errors.append(f"thread {t} take {it}: memory another array holds")
                    held[stamp] = (lo, hi)
                a[0] = a[-1] = stamp
                mine.append((stamp, a))
                del a
                if len(mine) > 1:
                    let_go(mine)
            while mine:
                let_go(mine)
        except Exception as e:  # noqa: BLE001 -- a thread's exception would be lost
            errors.append(f"thread {t}: {e!r}")

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    threading.settrace(_switch_in_pool)
    try:
        threads = [threading.Thread(target=hammer, args=(t,)) for t in range(THREADS)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        threading.settrace(None)
        sys.setswitchinterval(old)
    assert not errors, (len(errors), errors[:5])
    assert pool.reused > THREADS * TAKES // 2     # the buffers did come back (else nothing was tested)
    assert pool.reused + pool.allocated == THREADS * TAKES
