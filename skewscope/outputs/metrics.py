"""The exporter's metric table: the one place a skewscope metric name is written down.

Every family `skewscope export` emits is a `MetricSpec` here (name, type, labels, help,
source), in emission order; `outputs.exporter` builds each family from its spec
(`family`), `outputs.cluster` takes every name it queries from here, and
tests/unit/test_metric_table.py fails when the exposition, the recording rules, the alerts
or the Grafana dashboard (docs/prometheus/) name a metric this table lacks, or when the
list in docs/fleet.md differs from `markdown()` (regenerate it with
`python -m skewscope.outputs.metrics`).

`name` is the name Prometheus stores and queries: counters end in `_total`; a histogram
`x` is queried as `x_bucket`, `x_sum`, `x_count`. `source` says where the value comes
from; "flows.<column>" (a FLOW_DTYPE column) is also what the exporter reads for the
per-pair and per-flow counters.

Light module (no prometheus_client at import): `outputs.cluster` and so `skewscope.cli`
import it.
"""
from __future__ import annotations

from dataclasses import dataclass

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
TYPES = (COUNTER, GAUGE, HISTOGRAM)

# label vocabularies
CLASSES = ("bulk", "chunk", "control")              # `class`: exporter.flow_class
SYNDROMES = ("psn_sequence_error", "rnr", "other")  # `syndrome` of the NAK counters
OVERFLOW_LABEL = "_overflow"                        # src/dst of the pair past --max-peers

TIMING_ROLES = ("ring", "tp_decode", "alltoall", "kv_transfer")   # `role`: analysis.nodeview.ROLES

PEER_LABELS = ("node", "src", "dst", "class")
TIMING_LABELS = ("node", "ip", "role")
TIMING_PEER_LABELS = ("node", "ip", "role", "peer")
FLOW_LABELS = ("node", "src", "dst", "qp")
NODE_LABELS = ("node",)


@dataclass(frozen=True)
class MetricSpec:
    name: str                 # as stored in Prometheus (counters: ..._total)
    type: str                 # counter | gauge | histogram
    labels: tuple             # label names, in exposition order
    help: str
    source: str               # where the value comes from (docs/fleet.md)

    @property
    def base(self) -> str:
        """The name without `_total` (the metric part of a recording rule's name)."""
        return self.name[:-len("_total")] if self.type == COUNTER else self.name

    @property
    def column(self) -> str:
        """The FLOW_DTYPE column of a "flows.<column>" source."""
        kind, _, col = self.source.partition(".")
        if kind != "flows" or not col.isidentifier():
            raise ValueError(f"{self.name}: source {self.source!r} is not one flow-table column")
        return col

    def series_names(self) -> tuple:
        """Every sample name Prometheus stores for this family."""
        if self.type == HISTOGRAM:
            return (self.name + "_bucket", self.name + "_sum", self.name + "_count")
        return (self.name,)


def _m(name, type_, labels, help_, source) -> MetricSpec:
    assert type_ in TYPES and name.startswith("skewscope_"), name
    assert (type_ == COUNTER) == name.endswith("_total"), name
    return MetricSpec(name, type_, tuple(labels), help_, source)


# ---- per peer pair and traffic class -----------------------------------------------------
PEER_BYTES = _m("skewscope_peer_bytes_total", COUNTER, PEER_LABELS,
                "Wire bytes (Ethernet frame, no FCS) of RoCE packets from src to dst.", "flows.bytes")
PEER_PACKETS = _m("skewscope_peer_packets_total", COUNTER, PEER_LABELS,
                  "RoCE packets from src to dst.", "flows.packets")
PEER_MESSAGES = _m("skewscope_peer_messages_total", COUNTER, PEER_LABELS,
                   "RDMA messages started (SEND/WRITE first or only, READ request) from src to dst.",
                   "flows.messages")
PEER_MESSAGE_BYTES = _m("skewscope_peer_message_bytes_total", COUNTER, PEER_LABELS,
                        "Sum of the sizes of the messages from src to dst (RETH length, or summed SEND "
                        "payload).", "flows.msg_bytes")
PEER_CE_PACKETS = _m("skewscope_peer_ce_packets_total", COUNTER, PEER_LABELS,
                     "Packets from src to dst with ECN Congestion Experienced.", "flows.ce")
PEER_CNP_PACKETS = _m("skewscope_peer_cnp_packets_total", COUNTER, PEER_LABELS,
                      "Congestion Notification Packets sent by src to dst (dst's traffic to src was "
                      "CE-marked).", "flows.cnp")
PEER_RETRANSMITTED_PACKETS = _m("skewscope_peer_retransmitted_packets_total", COUNTER, PEER_LABELS,
                                "Packets from src to dst whose PSN went backwards (retransmissions).",
                                "flows.retransmissions")
PEER_PSN_GAPS = _m("skewscope_peer_psn_gaps_total", COUNTER, PEER_LABELS,
                   "Forward PSN jumps (missing packets) seen on src to dst.", "flows.psn_gaps")
PEER_NAKS = _m("skewscope_peer_naks_total", COUNTER, PEER_LABELS + ("syndrome",),
               "NAKs sent by src to dst, by AETH syndrome class.",
               "flow table: nak_seq, nak_rnr, nak_other (syndrome psn_sequence_error, rnr, other)")
PEER_BUSY_SECONDS = _m("skewscope_peer_busy_seconds_total", COUNTER, PEER_LABELS,
                       "Time src->dst had a message in transfer: measure of the union of the "
                       "[first packet, last packet] intervals of its messages.",
                       "message records: union of [start, end + packet time] per pair")
PEER_TIMED_MESSAGE_BYTES = _m("skewscope_peer_timed_message_bytes_total", COUNTER, PEER_LABELS,
                              "Bytes of the multi-packet WRITE/SEND messages from src to dst (the ones that "
                              "carry timing). Rate over active time = 8 * this / "
                              "skewscope_peer_message_wire_seconds_total.",
                              "message records: analysis.flows.flow_event_stats")
PEER_MESSAGE_WIRE_SECONDS = _m("skewscope_peer_message_wire_seconds_total", COUNTER, PEER_LABELS,
                               "On-wire time of those messages (first to last packet, plus one packet time): "
                               "analysis.flows definition.", "message records: analysis.flows.flow_event_stats")
DESTINATION_BUSY_SECONDS = _m("skewscope_destination_busy_seconds_total", COUNTER, ("node", "dst"),
                              "Time dst was receiving at least one message from anyone: measure of the union "
                              "of the intervals of every incoming message. Mean concurrent senders (incast "
                              "degree) = sum of skewscope_peer_busy_seconds_total into dst / this.",
                              "message records: union per destination")
SOURCE_BUSY_SECONDS = _m("skewscope_source_busy_seconds_total", COUNTER, ("node", "src"),
                         "Time src was sending at least one data message (class bulk or chunk) to anyone: "
                         "measure of the union of the intervals of its outgoing data messages. A member's send "
                         "rate over active time = 8 * its data message bytes / this (the fleet's straggler "
                         "rate of an all-to-all member).",
                         "message records: union per source, data classes")
PEER_QPS = _m("skewscope_peer_qps", GAUGE, PEER_LABELS,
              "Flows (destination QPs) of the pair and class in the flow table now.",
              "flow table: rows of the pair and class at the last read")

# ---- per flow (top K by bytes) -------------------------------------------------------------
FLOW_BYTES = _m("skewscope_flow_bytes_total", COUNTER, FLOW_LABELS,
                "Wire bytes of this flow (top K flows by bytes only).", "flows.bytes")
FLOW_PACKETS = _m("skewscope_flow_packets_total", COUNTER, FLOW_LABELS, "Packets of this flow.", "flows.packets")
FLOW_MESSAGES = _m("skewscope_flow_messages_total", COUNTER, FLOW_LABELS, "Messages started on this flow.",
                   "flows.messages")
FLOW_CE_PACKETS = _m("skewscope_flow_ce_packets_total", COUNTER, FLOW_LABELS, "CE-marked packets of this flow.",
                     "flows.ce")
FLOW_CNP_PACKETS = _m("skewscope_flow_cnp_packets_total", COUNTER, FLOW_LABELS,
                      "CNPs addressed to this flow's destination QP.", "flows.cnp")
FLOW_RETRANSMITTED_PACKETS = _m("skewscope_flow_retransmitted_packets_total", COUNTER, FLOW_LABELS,
                                "Retransmitted packets of this flow.", "flows.retransmissions")
FLOW_NAKS = _m("skewscope_flow_naks_total", COUNTER, FLOW_LABELS, "NAKs addressed to this flow (all syndromes).",
               "flow table: nak_seq + nak_rnr + nak_other")
FLOW_MESSAGE_SIZE_BYTES = _m("skewscope_flow_message_size_bytes", HISTOGRAM, FLOW_LABELS,
                             "Message sizes of this flow (log2 buckets).", "flow table: msg_hist, msg_bytes")

# ---- per node ------------------------------------------------------------------------------
MESSAGE_SIZE_BYTES = _m("skewscope_message_size_bytes", HISTOGRAM, NODE_LABELS,
                        "Sizes of the messages of every flow seen by this DPU (log2 buckets).",
                        "flow table: msg_hist, msg_bytes, summed over all flows")
MESSAGE_GAP_SECONDS = _m("skewscope_message_gap_seconds", HISTOGRAM, NODE_LABELS,
                         "Time between consecutive message starts on a flow (log2 ns buckets; no "
                         "_sum: the data plane keeps none).", "flow table: gap_hist, summed over all flows")
FRAMES = _m("skewscope_frames_total", COUNTER, ("node", "category"),
            "Frames seen, by what happened to them (each frame in exactly one category; README 'Counters').",
            "data plane globals: one per layout.CATEGORY_NAMES")
PFC_PAUSE_FRAMES = _m("skewscope_pfc_pause_frames_total", COUNTER, ("node", "priority"),
                      "PFC frames pausing this priority.", "data plane globals: G_PFC_PAUSE + priority")
PFC_RESUME_FRAMES = _m("skewscope_pfc_resume_frames_total", COUNTER, ("node", "priority"),
                       "PFC frames resuming this priority (pause time 0).",
                       "data plane globals: G_PFC_XON + priority")
PFC_PAUSE_QUANTA = _m("skewscope_pfc_pause_quanta_total", COUNTER, ("node", "priority"),
                      "Sum of PFC pause times (quanta of 512 bit times) for this priority.",
                      "data plane globals: G_PFC_QUANTA + priority")
FLOWS = _m("skewscope_flows", GAUGE, NODE_LABELS, "Flows in the flow table now.",
           "flow table: rows at the last read")
FLOWS_CREATED = _m("skewscope_flows_created_total", COUNTER, NODE_LABELS, "Flows inserted into the flow table.",
                   "data plane globals: G_FLOWS_CREATED")
FLOWS_EVICTED = _m("skewscope_flows_evicted_total", COUNTER, NODE_LABELS,
                   "Flows evicted from the full flow table (their later packets start new flows).",
                   "snapshot meta: flows_evicted")
MESSAGE_RECORDS_LOST = _m("skewscope_message_records_lost_total", COUNTER, NODE_LABELS,
                          "Message records overwritten before being read.",
                          "snapshot meta: events_lost (+ events_dropped, live)")
PARTIAL_MESSAGES = _m("skewscope_partial_messages_total", COUNTER, NODE_LABELS,
                      "Message ends seen without their start.", "data plane globals: G_MSG_PARTIAL")
SAMPLING_DENOMINATOR = _m("skewscope_sampling_denominator", GAUGE, NODE_LABELS,
                          "1-in-N packet sampling in force (1 = every packet); packet and byte counters are of "
                          "sampled packets.", "snapshot meta: sample_n")
PEERS = _m("skewscope_peers", GAUGE, NODE_LABELS, "Peer pairs exported (including the overflow pair).",
           "exporter: peer rows exported")
LAST_READ_TIMESTAMP_SECONDS = _m("skewscope_last_read_timestamp_seconds", GAUGE, NODE_LABELS,
                                 "Unix time of the last data plane (or file) read.", "exporter: wall clock")
READ_DURATION_SECONDS = _m("skewscope_read_duration_seconds", GAUGE, NODE_LABELS,
                           "Time the last read of the data plane took.", "exporter: monotonic clock")
EXPORTER_INFO = _m("skewscope_exporter_info", GAUGE, ("node", "version", "source", "input"),
                   "Exporter identity (value 1).",
                   "exporter: package version, snapshot meta source and interface or file")
#: --inventory: what people call the addresses this DPU exports (docs/fleet.md "Inventory"):
#: one series per known address among the peer labels (bounded by --max-peers); names join
#: the per-pair series in PromQL (`* on(dst) group_left(host) label_replace(...)`) rather than
#: riding on them, so renaming a host never splits a counter's series. The inventory's `job` and
#: `instance` are `job_name` and `instance_name` here: Prometheus owns the target labels `job`
#: and `instance` (a scraped `job` would be renamed `exported_job`)
INVENTORY_INFO = _m("skewscope_inventory_info", GAUGE,
                    ("node", "ip", "host", "gpu", "rank", "job_name", "pod", "namespace", "instance_name", "rail"),
                    "What people call an address this DPU exports (value 1; --inventory).",
                    "exporter: the --inventory entry of each src/dst address exported")

# ---- per-node timing (one DPU per node; analysis.nodeview; docs/fleet.md "Per-node timing series")
# Fixed log-spaced buckets (1-2-5 per decade), the same on every DPU (sums across DPUs work).
DURATION_BUCKETS = tuple(float(f"{m}e{e}") for e in range(-6, 1) for m in (1, 2, 5)) + (10.0,)
OFFSET_BUCKETS = (tuple(-b for b in reversed(DURATION_BUCKETS[:-3])) + (0.0,) + DURATION_BUCKETS[:-3])
# own lag: 0 for a healthy member, so its lowest buckets tell a 1 us lag from none
OWN_LAG_BUCKETS = (1e-7, 2e-7, 5e-7) + DURATION_BUCKETS
NODE_FORWARD_LATENCY = _m("skewscope_node_forward_latency_seconds", HISTOGRAM, TIMING_LABELS,
                          "Host forward latency per ring step seen by this node's DPU: its send of step k+1 "
                          "minus the time it was ready (its own step-k send and the step-k message from its "
                          "upstream both done); collective starts left out.",
                          "message records: analysis.nodeview (forward latency)")
NODE_OWN_LAG = _m("skewscope_node_own_lag_seconds", HISTOGRAM, TIMING_LABELS,
                  "Own lag per ring step seen by this node's DPU: min(forward latency, minus the arrival "
                  "offset of the upstream's same step), floored at 0 -- how late the node sent the step on its "
                  "own, under data-flow or barrier-synchronised step timing (a healthy node waiting for a "
                  "barrier or forwarding a late upstream's data has ~0); collective starts left out.",
                  "message records: analysis.nodeview (own lag)")
NODE_ARRIVAL_OFFSET = _m("skewscope_node_arrival_offset_seconds", HISTOGRAM, TIMING_PEER_LABELS,
                         "Per step: start of the step-k message from upstream peer minus the start of this "
                         "node's own step-k send (same DPU clock; signed buckets).",
                         "message records: analysis.nodeview (arrival offset)")
NODE_START_OFFSET = _m("skewscope_node_start_offset_seconds", HISTOGRAM, TIMING_PEER_LABELS,
                       "The arrival offset of the first step of each collective only (negative: this node "
                       "started the collective after its upstream's data was in).",
                       "message records: analysis.nodeview (start offset)")
NODE_STEP = _m("skewscope_node_step_seconds", HISTOGRAM, TIMING_LABELS,
               "Step duration: start of this node's send of step k+1 minus that of step k, inside a collective.",
               "message records: analysis.nodeview (step duration)")
NODE_COLLECTIVE = _m("skewscope_node_collective_seconds", HISTOGRAM, TIMING_LABELS,
                     "Collective duration on this node: its first send to the last end of a message of the "
                     "collective (sent or received).", "message records: analysis.nodeview (collective)")
NODE_ITERATION = _m("skewscope_node_iteration_seconds", HISTOGRAM, TIMING_LABELS,
                    "Iteration / token duration: start to start of consecutive iterations, compute gap "
                    "included (decode: the inter-token latency).",
                    "message records: analysis.nodeview (iteration)")
NODE_STEPS = _m("skewscope_node_steps_total", COUNTER, TIMING_LABELS,
                "Steps measured (forward latencies, arrival offsets) on this node.",
                "message records: analysis.nodeview (steps)")
NODE_COLLECTIVES = _m("skewscope_node_collectives_total", COUNTER, TIMING_LABELS,
                      "Collectives seen on this node.", "message records: analysis.nodeview (collectives)")
NODE_ITERATIONS = _m("skewscope_node_iterations_total", COUNTER, TIMING_LABELS,
                     "Iterations (tokens) seen on this node.", "message records: analysis.nodeview (iterations)")
# (spec, analysis.nodeview sample key, buckets); peer families take a {peer: samples} mapping
TIMING_HISTOGRAMS = ((NODE_FORWARD_LATENCY, "forward_latency", DURATION_BUCKETS),
                     (NODE_OWN_LAG, "own_lag", OWN_LAG_BUCKETS),
                     (NODE_STEP, "step", DURATION_BUCKETS),
                     (NODE_COLLECTIVE, "collective", DURATION_BUCKETS),
                     (NODE_ITERATION, "iteration", DURATION_BUCKETS))
TIMING_PEER_HISTOGRAMS = ((NODE_ARRIVAL_OFFSET, "arrival_offset", OFFSET_BUCKETS),
                          (NODE_START_OFFSET, "start_offset", OFFSET_BUCKETS))
TIMING_COUNTERS = ((NODE_STEPS, "steps"), (NODE_COLLECTIVES, "collectives"), (NODE_ITERATIONS, "iterations"))

PEER_COUNTERS = (PEER_BYTES, PEER_PACKETS, PEER_MESSAGES, PEER_MESSAGE_BYTES, PEER_CE_PACKETS, PEER_CNP_PACKETS,
                 PEER_RETRANSMITTED_PACKETS, PEER_PSN_GAPS)
FLOW_COUNTERS = (FLOW_BYTES, FLOW_PACKETS, FLOW_MESSAGES, FLOW_CE_PACKETS, FLOW_CNP_PACKETS,
                 FLOW_RETRANSMITTED_PACKETS)

# The table, in the exporter's emission order.
METRICS = (
    *PEER_COUNTERS, PEER_NAKS, PEER_BUSY_SECONDS, PEER_TIMED_MESSAGE_BYTES, PEER_MESSAGE_WIRE_SECONDS,
    DESTINATION_BUSY_SECONDS, SOURCE_BUSY_SECONDS, PEER_QPS,
    *FLOW_COUNTERS, FLOW_NAKS, FLOW_MESSAGE_SIZE_BYTES,
    MESSAGE_SIZE_BYTES, MESSAGE_GAP_SECONDS, FRAMES, PFC_PAUSE_FRAMES, PFC_RESUME_FRAMES, PFC_PAUSE_QUANTA,
    FLOWS, FLOWS_CREATED, FLOWS_EVICTED, MESSAGE_RECORDS_LOST, PARTIAL_MESSAGES, SAMPLING_DENOMINATOR, PEERS,
    LAST_READ_TIMESTAMP_SECONDS, READ_DURATION_SECONDS, EXPORTER_INFO, INVENTORY_INFO,
    NODE_FORWARD_LATENCY, NODE_OWN_LAG, NODE_ARRIVAL_OFFSET, NODE_START_OFFSET, NODE_STEP, NODE_COLLECTIVE, NODE_ITERATION,
    NODE_STEPS, NODE_COLLECTIVES, NODE_ITERATIONS,
)
BY_NAME = {m.name: m for m in METRICS}
assert len(BY_NAME) == len(METRICS), "duplicate metric name"


def series_names() -> set:
    """Every sample name the exporter's families put into Prometheus."""
    return {s for m in METRICS for s in m.series_names()}


def recorded(level: str, spec: MetricSpec, ops: str = "rate5m") -> str:
    """Name of the recording rule `level:metric:ops` over a metric (docs/prometheus/skewscope-rules.yml)."""
    return f"{level}:{spec.base}:{ops}"


def family(spec: MetricSpec):
    """An empty prometheus_client family for `spec` (add_metric with the spec's labels, in order)."""
    from prometheus_client import core as pc  # prometheus_client from a light module (skewscope.cli imports it)
    cls = {COUNTER: pc.CounterMetricFamily, GAUGE: pc.GaugeMetricFamily, HISTOGRAM: pc.HistogramMetricFamily}
    return cls[spec.type](spec.name, spec.help, labels=list(spec.labels))


def markdown() -> str:
    """The metric list of docs/fleet.md (between its `metric-table` markers)."""
    rows = ["| metric | type | labels | meaning | source |", "|---|---|---|---|---|"]
    for m in METRICS:
        rows.append(f"| `{m.name}` | {m.type} | {', '.join(m.labels)} | {m.help.replace('|', '/')} | "
                    f"{m.source.replace('|', '/')} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
