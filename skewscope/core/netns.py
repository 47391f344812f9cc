"""Entering a network namespace for a block of code (setns), by name or by an open fd.

The calling thread moves; sockets and netlink handles opened inside stay bound to that
namespace after the block. This is the only setns in skewscope.
"""
from __future__ import annotations

import contextlib
import ctypes
import os

CLONE_NEWNET = 0x40000000
_SELF = "/proc/thread-self/ns/net"
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int, what: str) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"setns({what}): {os.strerror(e)}" + (" (needs root)" if e == 1 else ""))


@contextlib.contextmanager
def in_netns_fd(fd: int, what: str = "fd"):
    """Run the block in the network namespace of fd (nothing to do if fd < 0 or it is the
    current one); come back to the current namespace afterwards."""
    if fd < 0 or os.fstat(fd).st_ino == os.stat(_SELF).st_ino:
        yield
        return
    here = os.open(_SELF, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns(fd, what)
        try:
            yield
        finally:
            if _libc.setns(here, CLONE_NEWNET) != 0:  # pragma: no cover (only with a broken kernel)
                raise OSError(ctypes.get_errno(), "cannot return to the original network namespace")
    finally:
        os.close(here)


@contextlib.contextmanager
def in_netns(name: str | None):
    """Run the block in network namespace `name` (`ip netns` name, or a path to an ns file);
    None or "": stay where we are."""
    if not name:
        yield
        return
    path = name if name.startswith("/") else f"/run/netns/{name}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise OSError(e.errno, f"network namespace {name!r} not found ({path})") from None
    try:
        with in_netns_fd(fd, name):
            yield
    finally:
        os.close(fd)
