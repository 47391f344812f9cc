"""The top screen's fixed-width cells: numbers, bit rates, message sizes and addresses in a
few characters (plain tables < 80 columns, the rich table and the matrix alike)."""
from __future__ import annotations

PLAIN_WIDTH = 79


def fmt_num(x: float, width: int = 6) -> str:
    """Compact non-negative number with about 3 significant digits: 0, 7.5, 950, 9.5K,
    12K, 630K, 3.8M, 1.2G. Never wider than max(width, 4)."""
    x = float(x)
    if x < 0:
        return "-" + fmt_num(-x, width - 1)
    if x < 1000:
        s = f"{x:.1f}" if (x < 9.95 and x != int(x)) else f"{x:.0f}"
        return s if len(s) <= width else f"{x / 1e3:.1f}K"
    for div, suf in ((1e3, "K"), (1e6, "M"), (1e9, "G"), (1e12, "T"), (1e15, "P")):
        v = x / div
        if v < 999.5:
            s = f"{v:.1f}{suf}" if v < 9.95 else f"{v:.0f}{suf}"
            return s
    return f"{x:.0e}"


def fmt_size(n: int) -> str:
    """Power-of-two message size bucket lower bound: 0, 64, 4K, 128K, 1M, 2G."""
    if n < 0:
        return "-"
    for div, suf in ((1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")):
        if n >= div:
            v = n / div
            return f"{v:.0f}{suf}" if v == int(v) else f"{v:.1f}{suf}"
    return str(int(n))


def fmt_bits(gbps: float, width: int = 6) -> str:
    """A rate given in Gb/s as bit/s with an SI suffix: 98.2G, 38.1M, 640K (readable at
    line rate and in a time-stretched demo alike)."""
    return fmt_num(gbps * 1e9, width)


def short_ip(s: str, width: int = 15) -> str:
    """IPv4 fits; a long IPv6 keeps its tail (the distinguishing part) behind an ellipsis."""
    return s if len(s) <= width else "…" + s[-(width - 1):]


