"""DCGM series written the way dcgm-exporter writes them (metric names = DCGM field names,
labels gpu, UUID, pci_bus_id, device, modelName, Hostname, DCGM_FI_DRIVER_VERSION in the
exporter's order, HELP texts of its etc/default-counters.csv), for the GPU-cause tests: a
text exposition (a scrape) and OpenMetrics with timestamps (a Prometheus backfill).

A GPU's values are a dict field -> number; HEALTHY and THROTTLED are the two states the
tests use (an H100-like GPU at 1,980 MHz, or held at 1,215 MHz by HW thermal slowdown).
"""
from __future__ import annotations

HELP = {
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz)."),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("gauge", "Power management limit (in W)."),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("counter", "Total number of PCIe retries."),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered."),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("gauge", "Current clock event reasons (bitmask)."),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("gauge", "Current clock throttle reasons (bitmask)."),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": ("counter", "Total number of NVLink flow-control CRC errors."),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
}
HEALTHY = {"DCGM_FI_DEV_SM_CLOCK": 1980, "DCGM_FI_DEV_GPU_TEMP": 61, "DCGM_FI_DEV_POWER_USAGE": 540.25,
           "DCGM_FI_DEV_POWER_MGMT_LIMIT": 700, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 3, "DCGM_FI_DEV_XID_ERRORS": 0,
           "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 0, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 0,
           "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.62}
THROTTLED = {**HEALTHY, "DCGM_FI_DEV_SM_CLOCK": 1215, "DCGM_FI_DEV_GPU_TEMP": 91, "DCGM_FI_DEV_POWER_USAGE": 689.5,
             "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 0x40, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.71}


def labels(host: str, gpu: int) -> str:
    n = sum(map(ord, host)) % 251
    return (f'gpu="{gpu}",UUID="GPU-{n:08x}-5f1c-4e2b-9a7d-{gpu:012x}",pci_bus_id="00000000:{0x18 + 0x10 * gpu:02X}:00.0",'
            f'device="nvidia{gpu}",modelName="NVIDIA H100 80GB HBM3",Hostname="{host}",'
            f'DCGM_FI_DRIVER_VERSION="550.90.07"')


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(int(v))


def exposition(gpus) -> str:
    """A scrape: gpus = [(host, gpu, values)], one HELP/TYPE block per field."""
    names = [n for n in HELP if any(n in v for _, _, v in gpus)]
    out = []
    for n in names:
        typ, text = HELP[n]
        out += [f"# HELP {n} {text}", f"# TYPE {n} {typ}"]
        out += [f"{n}{{{labels(h, g)}}} {_fmt(v[n])}" for h, g, v in gpus if n in v]
    return "\n".join(out) + "\n"


def openmetrics(samples) -> str:
    """A backfill: samples = [(unix s, host, gpu, values)]. OpenMetrics wants a counter's
    samples named *_total; the exporter's counter names do not all end so, and Prometheus
    stores no type, so every field is declared `unknown` and keeps its exporter name."""
    names = [n for n in HELP if any(n in v for _, _, _, v in samples)]
    out = []
    for n in names:
        out.append(f"# TYPE {n} unknown")
        for t, h, g, v in sorted(samples, key=lambda s: (s[1], s[2], s[0])):
            if n in v:
                out.append(f"{n}{{{labels(h, g)}}} {_fmt(v[n])} {t:.3f}")
    return "\n".join(out) + "\n# EOF\n"
