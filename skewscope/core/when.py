"""When a finding's condition held, in words and on the wall clock: the one formatter of a
finding's `since` / `until` (s, on the snapshot's clock: meta first_ts/last_ts ns / 1e9)
for diagnose, report, top, watch and the HTML page. Light: no numpy, no analysis import.

    Clock.of(meta, wall_end=None)      the snapshot's clock: first/last (s), and how to put a
                                       time on the wall clock (pcap time is unix time; a
                                       monotonic capture maps through meta started_at, or
                                       through the wall time of its last read: wall_end)
    clock.wall(t)                      unix s of a time on the snapshot's clock, or None
    clock.text(since, until)           "since 14:02:03.120 UTC (+12.3 s into the capture), still
                                       at its end" / "from ... to ..." / "" when since is None

An SRE reads an incident as "when did it start, is it still going": the clock time says
when (UTC, the capture's own clock), the offset says where in the capture; "the capture's
start" means it was already there when the capture began.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone

#: an onset within this share of the capture's span of its first packet is "the capture's
#: start" (a condition the capture found already there)
START_SHARE = 0.01


def rel(s: float) -> str:
    """A duration / offset in seconds, short: 850 us, 12.3 ms, 4.56 s, 3 min 05 s."""
    a = abs(s)
    if a < 1e-3:
        return f"{s * 1e6:.0f} us"
    if a < 1:
        return f"{s * 1e3:.3g} ms" if a < 0.1 else f"{s * 1e3:.0f} ms"
    if a < 120:
        return f"{s:.3g} s" if a < 10 else f"{s:.1f} s"
    m, sec = divmod(int(round(a)), 60)
    h, m = divmod(m, 60)
    return (f"{h} h {m:02d} min" if h else f"{m} min {sec:02d} s")


@dataclass
class Clock:
    first: float | None               # s, snapshot clock: the capture's first packet
    last: float | None
    monotonic: bool = False
    offset: float | None = None       # wall = t + offset (None: no wall clock)

    @classmethod
    def of(cls, meta: dict | None, wall_end: float | None = None) -> "Clock":
        """The clock of a snapshot's meta (or a diagnose document's "capture" section:
        first_s/last_s/clock/started_at). wall_end: the unix time of meta last_ts (a live
        window: the wall time of the read it ends with)."""
        m = meta or {}
        if "first_s" in m:
            first, last = m.get("first_s"), m.get("last_s")
        else:
            f, la = m.get("first_ts"), m.get("last_ts")
            first = float(f) / 1e9 if f is not None else None
            last = float(la) / 1e9 if la is not None else None
        mono = m.get("clock") == "monotonic"
        off = None
        if not mono:
            off = 0.0
        elif wall_end is not None and last is not None:
            off = float(wall_end) - last
        elif m.get("started_at") and first is not None:
            off = float(m["started_at"]) - first
        return cls(first, last, mono, off)

    def wall(self, t: float | None) -> float | None:
        if t is None or self.offset is None or not math.isfinite(float(t)):
            return None
        return float(t) + self.offset

    def _at(self, t: float) -> str:
        w = self.wall(t)
        if w is None:
            return ""
        span = (self.last - self.first) if self.first is not None and self.last is not None else 0.0
        d = datetime.fromtimestamp(w, timezone.utc)
        return d.strftime("%H:%M:%S.") + (f"{d.microsecond // 1000:03d}" if span >= 10 else f"{d.microsecond:06d}")

    def _off(self, t: float, dur: float | None = None) -> str:
        """+offset into the capture; next to a duration much shorter than the offset, with
        enough digits to tell the two ends apart (+87.812 s to +87.834 s)."""
        if self.first is None:
            return ""
        o = t - self.first
        if dur is not None and o >= 1 and dur < 0.1 * o:
            d = min(6, max(1, math.ceil(-math.log10(max(dur, 1e-6))) + 1))
            return f"+{o:.{d}f} s"
        return f"+{rel(o)}"

    def text(self, since: float | None, until: float | None = None) -> str:
        """One phrase for a finding's since/until ("" without since)."""
        if since is None:
            return ""
        span = (self.last - self.first) if self.first is not None and self.last is not None else 0.0
        at_start = self.first is not None and since - self.first <= max(START_SHARE * span, 1e-9)
        utc = " UTC" if self.offset is not None else ""
        if until is None:
            if at_start:
                return (f"since the capture's start ({self._at(since)}{utc}), still holding at the end of the data" if utc
                        else "since the capture's start, still holding at the end of the data")
            a = self._at(since)
            return (f"since {a}{utc} ({self._off(since)} into the capture), still holding at the end of the data" if a
                    else f"since {self._off(since)} into the capture, still holding at the end of the data")
        d_s = max(0.0, until - since)
        dur = rel(d_s)
        if at_start:
            return (f"from the capture's start to {self._at(until)}{utc} ({self._off(until)}; {dur})" if utc
                    else f"from the capture's start to {self._off(until)} ({dur})")
        a, b = self._off(since, d_s), self._off(until, d_s)
        if utc:
            return f"from {self._at(since)} to {self._at(until)}{utc} ({a} to {b}; {dur})"
        return f"from {a} to {b} into the capture ({dur})"


def finding_text(f: dict, clock: Clock) -> str:
    """The when-phrase of a finding dict (its "since"/"until"), "" when unknown."""
    return clock.text(f.get("since"), f.get("until"))
