"""Atomic file output: every file skewscope writes appears complete or not at all.

AtomicFile writes into a temp file beside the target and renames it over the target on
commit(); abort() (or an exception in a `with` block) removes the temp file, so a previous
file at the path survives. The file gets the mode a plain open() would give (0666 & ~umask),
so a colleague can read what root wrote. Used by snapshots, capture's pcap tap, the
generator's pcap and truth files, the test fabric's state file.
"""
from __future__ import annotations

import os


def _umask() -> int:
    um = os.umask(0)
    os.umask(um)
    return um


class AtomicFile:
    """A temp file in the target's directory (fd / fh), renamed over `path` by commit()."""

    def __init__(self, path: str | os.PathLike, suffix: str = ".tmp", prefix: str = ".skewscope-",
                 fsync: bool = True, text: bool = False):
        self.path = os.fspath(path)
        self._fsync = fsync
        d = os.path.dirname(os.path.abspath(self.path))
        import tempfile  # only when a file is written (1 ms: random, shutil): not by report --json
        self.fd, self.tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=d)
        self.fh = os.fdopen(self.fd, "w" if text else "wb", **({"encoding": "utf-8"} if text else {}))
        self.done = False

    def commit(self) -> None:
        if self.done:
            return
        try:
            self.fh.flush()
            if self._fsync:
                os.fsync(self.fd)
            os.fchmod(self.fd, 0o666 & ~_umask())
            self.fh.close()
            os.replace(self.tmp, self.path)
        except BaseException:
            self.abort()
            raise
        self.done = True

    def abort(self) -> None:
        if self.done:
            return
        self.done = True
        try:
            self.fh.close()
        except OSError:
            pass
        try:
            os.unlink(self.tmp)
        except OSError:
            pass

    def __enter__(self) -> "AtomicFile":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


def atomic_write(path: str | os.PathLike, writer, fsync: bool = True, text: bool = False,
                 suffix: str = ".tmp") -> None:
    """writer(fh) fills the file; on any failure nothing is left behind and a previous file
    at `path` survives."""
    with AtomicFile(path, suffix=suffix, fsync=fsync, text=text) as f:
        writer(f.fh)


def atomic_write_text(path: str | os.PathLike, text: str, fsync: bool = False) -> None:
    atomic_write(path, lambda fh: fh.write(text), fsync=fsync, text=True)
