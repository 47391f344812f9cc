"""The base error of skewscope and the exit codes every command documents (README "Exit codes").

Every error a user can cause is a SkewscopeError (or a subclass) carrying its exit code; the
CLI prints it as one line on stderr and exits with that code, never with a traceback.
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_WARNING = 1    # diagnose/watch: warnings found
EXIT_CRITICAL = 2   # diagnose/watch: critical findings
EXIT_USAGE = 2      # bad arguments (click's usage errors too)
EXIT_NOT_RUN = 3    # could not run: unreadable/invalid file, unreachable server, internal error
EXIT_NO_PRIV = 4    # not root / no CAP_BPF
EXIT_NO_BCC = 5     # bcc (python3-bpfcc) missing
EXIT_NO_IFACE = 6   # no such interface (or it went away during a capture)
EXIT_BUSY = 7       # interface busy: another XDP program, or ours held by a running skewscope
EXIT_KERNEL = 8     # the kernel refused: compile, verify or attach
EXIT_INTERRUPTED = 130


class SkewscopeError(Exception):
    """One-line, user-facing error with an exit code."""

    def __init__(self, msg: str, code: int = EXIT_NOT_RUN):
        super().__init__(msg)
        self.code = code


class DataplaneError(SkewscopeError):
    """The data plane could not be compiled, loaded, attached or read."""


class PcapError(SkewscopeError):
    """A capture file that cannot be read: not a capture, unsupported link type, unreadable
    (one-line message)."""
