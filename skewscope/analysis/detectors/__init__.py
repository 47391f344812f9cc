"""Detectors: metrics -> findings an SRE can act on, one module per family, each kind and
threshold declared once in the registry (registry.py; docs/metrics.md "Findings").

    detect(ctx, groups, results, th, checks, extra, evidence) -> [finding dict]   analyze()
    live_findings(ctx, th, congestion, pfc, stalls) -> [finding dict]            live_metrics()
    analyze_matrix(fm, thresholds) (fleet.py)                                     skewscope cluster

Families (FAMILIES: the kinds' declaration order = DEFAULTS / docs order): alltoall, incast,
rings (rates_and_lags), stalls, pipeline, congestion, loss, pfc, periods, decode, ownview (one DPU's
view of a ring), kv, instances, caveats;
fleet (needs="fleet"). Run order: Detector.stage (ties: that order).
"""
from __future__ import annotations

from skewscope.analysis.detectors import (
    alltoall,
    caveats,
    congestion,
    decode,
    fleet,
    incast,
    instances,
    kv,
    loss,
    ownview,
    periods,
    pfc,
    pipeline,
    rings,
    stalls,
)
from skewscope.analysis.detectors.common import Emitter, impact_key
from skewscope.analysis.detectors.evidence import GroupEvidence, GroupInput, Inputs
from skewscope.analysis.detectors.registry import (  # noqa: F401 (the public names)
    PARAMETERS,
    REGISTRY,
    SEV_RANK,
    SEVERITIES,
    Detector,
    Entities,
    Finding,
    Kind,
    Parameters,
    Threshold,
    ThresholdError,
    defaults,
    detectors,
    kinds,
    kinds_table,
    list_checks_lines,
    markdown_tables,
    onset_table,
    param_sections,
    parameters,
    register,
    register_onset,
    resolve_checks,
    resolve_thresholds,
)

#: the family modules, in the kinds' declaration order (DEFAULTS, docs/metrics.md,
#: --list-checks); each declares DETECTORS (and PARAMETERS); a new family adds one entry
FAMILIES = (alltoall, incast, rings, stalls, pipeline, congestion, loss, pfc, periods, decode, ownview, kv, instances, caveats,
            fleet)
for _m in FAMILIES:
    for _d in getattr(_m, "DETECTORS", ()):
        register(_d)
    for _p in getattr(_m, "PARAMETERS", ()):
        parameters(_p)
    for _k, (_fn, _doc) in getattr(_m, "ONSET_FNS", {}).items():
        register_onset(_k, _fn, _doc)


def _run(dets, inp, em) -> list[dict]:
    for d in dets:
        d.fn(inp, em)
    em.fill_flows()
    em.fill_onsets(inp)
    # severity, then the estimated time lost (impact), then kind
    em.out.sort(key=lambda f: (-SEV_RANK[f.severity], -impact_key(f), f.kind))
    return [f.to_dict() for f in em.out]


def detect(ctx, groups, results, th, checks, extra, evidence=None) -> list[dict]:
    """Every single-node detector (stage order) over a Context, its collective groups and
    their metrics; extra: {"congestion", "pfc", "stalls", "incast", "incast_senders"};
    evidence: a GroupEvidence per group (default: taken from the results' private keys)."""
    if evidence is None:
        evidence = [GroupEvidence.of(r) for r in results]
    inp = Inputs(ctx, th, extra["congestion"], extra["pfc"], extra["stalls"],
                 groups=[GroupInput(i, g, r, ev) for i, (g, r, ev) in enumerate(zip(groups, results, evidence))],
                 incast=extra.get("incast"), incast_senders=extra.get("incast_senders") or {})
    # the full analysis always reads the message records (the caveats' batched-timestamp
    # check reports on them only then): compute the stall evidence up front
    inp.stall_culprits
    return _run(detectors("node"), inp, Emitter(ctx, checks))


def live_findings(ctx, th, cong, pfc_summary, node_stalls) -> list[dict]:
    """The live per-interval subset: the detectors registered with live=True (flow-table
    counters only), all their kinds."""
    dets = detectors("node", live=True)
    checks = {k for d in dets for k in d.all_kinds}
    return _run(dets, Inputs(ctx, th, cong, pfc_summary, node_stalls), Emitter(ctx, checks))
