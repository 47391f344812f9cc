"""The one address formatter (core.snapshot.ip_str): a RoCEv1 GID that maps an IPv4 address
is shown as that IPv4 address, as RoCEv2 over IPv4 is; every other address as IPv6. Checked
against tshark's reading of a real RoCEv1 capture and against Python's ipaddress."""
from __future__ import annotations

import ipaddress
import shutil
import subprocess

import numpy as np
import pytest
from frames import REAL_DATA

from skewscope.core.snapshot import ip_bytes, ip_str
from skewscope.sources.offline import parse_file

ROCEV1 = REAL_DATA / "scapy_roce_uts__3pkts_DERIVED.pcap"


def _b(s: str) -> np.ndarray:
    return np.frombuffer(ipaddress.ip_address(s).packed.rjust(16, b"\0"), dtype=np.uint8)


@pytest.mark.parametrize("addr,ipver,want", [
    ("::ffff:15.0.0.2", 6, "15.0.0.2"),          # RoCEv1 GID of an IPv4 host
    ("::ffff:10.0.0.1", 4, "10.0.0.1"),          # RoCEv2 IPv4 (stored mapped)
    ("fd00::1:2", 6, "fd00::1:2"),               # real IPv6
    ("fe80::ffff:f00:2", 6, "fe80::ffff:f00:2"),  # not the mapped prefix
    ("::1", 6, "::1"),
])
def test_ip_str(addr, ipver, want):
    assert ip_str(_b(addr), ipver) == want


def test_ip_bytes_round_trip():
    for s in ("10.1.2.3", "fd00::7"):
        b, v = ip_bytes(s)
        assert ip_str(np.frombuffer(b, np.uint8), v) == s


@pytest.mark.skipif(not ROCEV1.exists(), reason=f"{ROCEV1} not beside the checkout")
@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed (make setup installs it)")
def test_rocev1_capture_addresses_match_tshark():
    """The RoCEv1 frames of a real capture: tshark's GRH GIDs, as IPv4 when mapped, are the
    addresses skewscope reports."""
    out = subprocess.run(["tshark", "-r", str(ROCEV1), "-Y", "infiniband.grh", "-T", "fields",
                          "-e", "infiniband.grh.sgid", "-e", "infiniband.grh.dgid"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    want = set()
    for line in out.split("\n"):
        if line.strip():
            s, d = (ipaddress.ip_address(x) for x in line.split("\t"))
            want.add(tuple(str(a.ipv4_mapped or a) for a in (s, d)))
    assert want, "tshark found no RoCEv1 frame"
    snap = parse_file(str(ROCEV1))
    v1 = snap.flows[snap.flows["roce"] == 1]
    got = {(ip_str(f["src"], f["ipver"]), ip_str(f["dst"], f["ipver"])) for f in v1}
    assert got == want
    assert all("::" not in a for pair in got for a in pair)
