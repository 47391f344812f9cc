"""Entering a network namespace for a block of code (setns)."""
from __future__ import annotations

import contextlib
import ctypes
import os

_CLONE_NEWNET = 0x40000000


@contextlib.contextmanager
def in_netns_fd(fd: int):
    """Run the block in the network namespace of fd (if it is not the current one)."""
    if fd < 0 or os.fstat(fd).st_ino == os.stat("/proc/thread-self/ns/net").st_ino:
        yield
        return
    libc = ctypes.CDLL(None, use_errno=True)
    here = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns")
        try:
            yield
        finally:
            libc.setns(here, _CLONE_NEWNET)
    finally:
        os.close(here)

