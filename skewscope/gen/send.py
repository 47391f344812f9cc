"""Send mode: replay a capture's frames on an interface over AF_PACKET, optionally from
inside a named network namespace (/var/run/netns/NAME, as made by `ip netns add`),
paced to a frame rate and bounded by a frame count and a wall-clock limit."""
from __future__ import annotations

import errno
import socket
import time

from skewscope.core.netns import in_netns


def open_socket(iface: str, netns: str | None = None) -> socket.socket:
    with in_netns(netns):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        try:
            s.bind((iface, 0))
        except OSError as e:
            s.close()
            raise OSError(e.errno, f"cannot bind to interface {iface!r}: {e.strerror}") from None
    return s


def send_capture(cap, iface: str, netns: str | None = None, rate_pps: float = 100_000.0,
                 max_frames: int | None = None, max_seconds: float = 30.0) -> dict:
    """Send frames in capture order at `rate_pps` (0 = as fast as possible).  Stops after
    max_frames or max_seconds, whichever first.  Returns counts and timing."""
    limit = len(cap) if max_frames is None else min(int(max_frames), len(cap))
    sock = open_socket(iface, netns)
    sent = dropped_retries = 0
    t0 = time.monotonic()
    deadline = t0 + max_seconds
    try:
        for ts, buf, offs, lens in cap.frame_chunks(chunk_bytes=4 << 20):
            mv = memoryview(buf)
            for k in range(ts.shape[0]):
                if sent >= limit:
                    break
                if rate_pps > 0 and (sent & 31) == 0:
                    ahead = t0 + sent / rate_pps - time.monotonic()
                    if ahead > 0:
                        time.sleep(ahead)
                if (sent & 255) == 0 and time.monotonic() > deadline:
                    limit = sent
                    break
                o = int(offs[k])
                frame = mv[o:o + int(lens[k])]
                ok = False
                while not ok:
                    try:
                        sock.send(frame)
                        ok = True
                    except OSError as e:
                        if e.errno == errno.EMSGSIZE:
                            raise OSError(e.errno, f"{iface}: frame of {len(frame)} bytes exceeds "
                                          "the interface MTU (raise it, e.g. `ip link set IFACE mtu "
                                          "9000`, or use a scenario with a smaller IB mtu)") from None
                        if e.errno not in (errno.ENOBUFS, errno.EAGAIN):
                            raise
                        dropped_retries += 1
                        time.sleep(0.0005)
                        if time.monotonic() > deadline:
                            break
                if not ok:
                    limit = sent
                    break
                sent += 1
            if sent >= limit:
                break
    finally:
        sock.close()
    el = time.monotonic() - t0
    return {"sent": sent, "seconds": el, "pps": sent / el if el > 0 else 0.0,
            "retries": dropped_retries, "iface": iface, "netns": netns}
