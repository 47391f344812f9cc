"""The live per-interval rates of a flow table (`top`'s columns): bit/s, packets/s, CNP/s,
CE%, retransmits, NAKs and the most frequent message size, from an interval's counter
differences (sources/live.py flow_delta). The analysis' rates over a flow's active time are
analysis/flows.py flow_event_stats."""
from __future__ import annotations

import numpy as np


def flow_rates(flows: np.ndarray, dt: float, sample_n: int = 1) -> dict[str, np.ndarray]:
    """The live per-interval rates of a delta flow table over dt seconds, scaled by the sampling factor (with
    1-in-N sampling the counters are of sampled packets; N times them is the unbiased
    estimate). Definitions (README "Counters"/"Live rates"):
      gbps      wire bytes (Ethernet frame without FCS) * 8 / dt / 1e9
      pps       packets / dt
      cnp_ps    CNP packets / dt
      ce_pct    100 * CE packets / ECN-capable packets (0 when none is ECN-capable)
      retx, naks  counts in the interval (scaled)
      msg_mode  lower bound (bytes) of the most frequent message-size bucket, -1 if none
    """
    dt = max(float(dt), 1e-9)
    k = float(max(1, int(sample_n)))
    pk = flows["packets"].astype(np.float64)
    ecn = flows["ecn_capable"].astype(np.float64)
    ce = flows["ce"].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ce_pct = np.where(ecn > 0, 100.0 * ce / np.maximum(ecn, 1), 0.0)
    hist = flows["msg_hist"]
    has = hist.sum(axis=1) > 0 if len(flows) else np.zeros(0, bool)
    mode_slot = np.argmax(hist, axis=1) if len(flows) else np.zeros(0, np.int64)
    lb = np.where(mode_slot == 0, 0, np.left_shift(np.int64(1), np.maximum(mode_slot - 1, 0)))
    return {
        "gbps": flows["bytes"].astype(np.float64) * 8.0 / dt / 1e9 * k,
        "pps": pk / dt * k,
        "cnp_ps": flows["cnp"].astype(np.float64) / dt * k,
        "ce_pct": ce_pct,
        "retx": flows["retransmissions"].astype(np.float64) * k,
        "naks": (flows["nak_seq"] + flows["nak_rnr"] + flows["nak_other"]).astype(np.float64) * k,
        "msg_mode": np.where(has, lb, -1),
    }
