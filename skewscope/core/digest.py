"""sha256 and blake2b without `import hashlib`: hashlib loads OpenSSL (libcrypto) when it is
imported, ~4 ms of every command's start, for digests CPython also has built in. blake2b is
the very function hashlib returns (hashlib prefers the built-in blake2); sha256 is the
built-in implementation of the same standard (the same digest as OpenSSL's:
tests/unit/test_digest.py). Used by the AOT module's check (core/aot.py), numba's cache stamp
(core/jit.py) and the finding ids (analysis/detectors/registry.py)."""
from __future__ import annotations

try:
    from _blake2 import blake2b
except ImportError:     # an interpreter built without it: hashlib's (OpenSSL's)
    from hashlib import blake2b
try:
    from _sha2 import sha256        # CPython >= 3.12
except ImportError:
    try:
        from _sha256 import sha256  # CPython 3.11
    except ImportError:
        from hashlib import sha256

__all__ = ["blake2b", "sha256"]
