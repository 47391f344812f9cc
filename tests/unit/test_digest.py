"""core/digest.py: the same digests as hashlib (OpenSSL's sha256, an independent
implementation; the published test vectors), without loading OpenSSL."""
import hashlib
import subprocess
import sys

import pytest

from skewscope.core.digest import blake2b, sha256

# FIPS 180-2 (sha256) and RFC 7693 appendix A (blake2b-512) vectors for b"abc"
SHA256_ABC = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
BLAKE2B_ABC = ("ba80a53f981c4d0d6a2797b69f12f6e94c212f14685ac4b74b12bb6fdbffa2d1"
               "7d87c5392aab792dc252d5de4533cc9518d38aa8dbf1925ab92386edd4009923")


def test_published_vectors():
    assert sha256(b"abc").hexdigest() == SHA256_ABC
    assert blake2b(b"abc").hexdigest() == BLAKE2B_ABC


@pytest.mark.parametrize("n", [0, 1, 55, 56, 63, 64, 65, 127, 128, 129, 1000, 1 << 16])
def test_same_digests_as_hashlib(n):
    data = bytes((i * 131 + n) & 0xFF for i in range(n))
    assert sha256(data).hexdigest() == hashlib.new("sha256", data).hexdigest()
    for size in (8, 16, 64):
        assert blake2b(data, digest_size=size).hexdigest() == hashlib.blake2b(data, digest_size=size).hexdigest()
    h = blake2b(digest_size=16)      # fed in pieces, as core.aot digests its files
    for k in range(0, n, 7):
        h.update(data[k:k + 7])
    assert h.hexdigest() == hashlib.blake2b(data, digest_size=16).hexdigest()


def test_loads_no_openssl():
    code = "import sys, skewscope.core.digest; print(sorted({'hashlib', '_hashlib'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
