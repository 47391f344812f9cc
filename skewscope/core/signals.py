"""SIGTERM/SIGHUP as an exception, so that whatever attached detaches."""
from __future__ import annotations

import contextlib
import signal
import threading


# ---- signals: a process that attached always detaches ---------------------------------------
class Terminated(SystemExit):
    """SIGTERM/SIGHUP as an exception: `finally` blocks, `with` exits and atexit hooks (which
    detach) run, and the process exits with status 128 + signal number, without a traceback."""

    def __init__(self, signum: int):
        super().__init__(128 + int(signum))
        self.signum = int(signum)


EXIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def exit_on_signals(signums=EXIT_SIGNALS, only_if_default: bool = False):
    """Within the block, SIGTERM/SIGHUP raise Terminated in the main thread (Ctrl-C already
    raises KeyboardInterrupt), so the cleanup of an attach runs. With only_if_default, a
    signal whose handler the application has set already is left alone. Previous handlers
    are restored on exit. Use it around anything that attaches (top, capture, export, ...)."""
    old = install_exit_handlers(signums, only_if_default)
    try:
        yield
    finally:
        restore_handlers(old)


def _raise_terminated(signum, frame):
    raise Terminated(signum)


def install_exit_handlers(signums, only_if_default: bool) -> dict:
    old: dict = {}
    if threading.current_thread() is not threading.main_thread():
        return old  # signal handlers can only be set from the main thread
    for sig in signums:
        try:
            cur = signal.getsignal(sig)
            if only_if_default and cur is not signal.SIG_DFL:
                continue
            old[sig] = signal.signal(sig, _raise_terminated)
        except (ValueError, OSError):
            pass
    return old


def restore_handlers(old: dict) -> None:
    for sig, h in old.items():
        try:
            if signal.getsignal(sig) is _raise_terminated:
                signal.signal(sig, h if h is not None else signal.SIG_DFL)
        except (ValueError, OSError):
            pass


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event, signums=(signal.SIGTERM, signal.SIGINT, signal.SIGHUP)):
    """Within the block SIGTERM/SIGINT/SIGHUP set `stop` (a serving or polling loop then leaves
    its wait and cleans up in order); yields {"sig": the last signal number, 0 if none}. The
    previous handlers come back on exit."""
    got = {"sig": 0}

    def on_sig(signum, _frame):
        got["sig"] = signum
        stop.set()
    old = {s: signal.signal(s, on_sig) for s in signums}
    try:
        yield got
    finally:
        for s, h in old.items():
            signal.signal(s, h)
