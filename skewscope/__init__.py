"""skewscope: skews and pathologies in RoCEv2 traffic of multi-GPU LLM jobs, seen with eBPF."""
import os

__version__ = "0.1.0"


def _numba_cache_dir() -> None:
    """numba's cache=True raises at import ("no locator available") when neither the package
    directory nor the user's cache directory is writable -- e.g. `skewscope report` by a user
    without a home on a root-owned install. Point numba at a writable directory then."""
    if os.environ.get("NUMBA_CACHE_DIR") or os.access(os.path.dirname(os.path.abspath(__file__)), os.W_OK):
        return
    import tempfile  # rare (an unwritable install): not loaded by every command's start
    for d in (os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "skewscope-numba"),
              os.path.join(tempfile.gettempdir(), f"skewscope-numba-{os.getuid()}")):
        try:
            os.makedirs(d, mode=0o700, exist_ok=True)
        except OSError:
            continue
        if os.access(d, os.W_OK):
            os.environ["NUMBA_CACHE_DIR"] = d
            return


_numba_cache_dir()
