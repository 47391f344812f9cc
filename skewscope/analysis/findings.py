"""The findings' public names (kept for callers): the detectors and their registry live in
skewscope.analysis.detectors (one module per family, registry.py declares every kind and
threshold once; docs/metrics.md "Findings")."""
from __future__ import annotations

from skewscope.analysis.detectors import (  # noqa: F401 (re-exported)
    REGISTRY,
    SEV_RANK,
    SEVERITIES,
    Finding,
    ThresholdError,
    defaults,
    detect,
    kinds,
    live_findings,
    param_sections,
    resolve_checks,
    resolve_thresholds,
)

#: default thresholds, per finding kind and parameter section (from the registry)
DEFAULTS: dict[str, dict[str, float]] = defaults("node")
PARAM_SECTIONS = param_sections()
KINDS = kinds("node")
