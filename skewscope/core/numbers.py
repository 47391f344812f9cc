"""Small number helpers shared by light modules (no numpy)."""
from __future__ import annotations

import math


def finite(x) -> float | None:
    """x as a finite float, or None (None, text that is no number, NaN, inf)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None
