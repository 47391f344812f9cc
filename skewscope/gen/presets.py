"""Named scenarios.  Small by default (4-8 nodes, tens of ms, 10k-100k frames) so tests
stay fast; `ring-32` is the large one (use --snaplen with it)."""
from __future__ import annotations

RING = {"kind": "ring_allreduce", "bytes": "8MiB", "channels": 2}
A2A = {"kind": "all_to_all", "bytes_per_peer": "256KiB", "channels": 1}

PRESETS: dict[str, dict] = {
    "ring-healthy": {
        "description": "8-node ring all-reduce, 2 channels, 1 MiB-class SIMPLE slices, 3 iterations",
        "nodes": 8, "iterations": 3, "period_ms": 4.0, "jitter": 0.01,
        "workloads": [dict(RING)],
    },
    "ring-straggler": {
        "description": "8-node ring all-reduce; node 3 sends at 0.4x and starts each step 20 us late",
        "nodes": 8, "iterations": 3, "period_ms": 6.0,
        "workloads": [dict(RING)],
        "pathologies": [{"kind": "straggler", "node": 3, "rate_factor": 0.4, "start_lag_us": 20}],
    },
    "ring-ll128": {
        "description": "4-node ring all-reduce, LL128 messages (multiples of 2048 B), IB MTU 2048, 2 QPs per connection",
        "nodes": 4, "mtu": 2048, "iterations": 3, "period_ms": 3.0,
        "workloads": [{"kind": "ring_allreduce", "bytes": "6MiB", "protocol": "ll128",
                       "channels": 2, "qps": 2}],
    },
    "tree-healthy": {
        "description": "8-node double-binary-tree all-reduce (reduce up, broadcast down), 2 channels",
        "nodes": 8, "iterations": 2, "period_ms": 5.0,
        "workloads": [{"kind": "tree_allreduce", "bytes": "4MiB", "channels": 2}],
    },
    "alltoall-healthy": {
        "description": "8-node all-to-all, 256 KiB per peer in 64 KiB chunks, delta peer order",
        "nodes": 8, "iterations": 3, "period_ms": 3.0,
        "workloads": [dict(A2A)],
    },
    "moe-hot-expert": {
        "description": "8-node MoE all-to-all (dispatch+combine); node 5 hosts a hot expert (4x volume)",
        "nodes": 8, "iterations": 2, "period_ms": 5.0,
        "workloads": [dict(A2A, combine=True, bytes_per_peer="128KiB")],
        "pathologies": [{"kind": "hot_expert", "node": 5, "factor": 4.0}],
    },
    "incast": {
        "description": "6 senders burst 1 MiB each into node 0 at once, twice, over a light ring",
        "nodes": 8, "iterations": 2, "period_ms": 5.0,
        "workloads": [{"kind": "ring_allreduce", "bytes": "2MiB", "channels": 1}],
        "pathologies": [{"kind": "incast", "target": 0, "senders": 6, "bytes": "1MiB",
                         "at_ms": 1.0, "repeat": 2, "period_ms": 5.0}],
    },
    "congestion": {
        "description": "8-node all-to-all; flows into node 2 CE-marked (30%), CNPs back, 0.6x rate",
        "nodes": 8, "iterations": 3, "period_ms": 3.0,
        "workloads": [dict(A2A)],
        "pathologies": [{"kind": "congestion", "into": 2, "ce_fraction": 0.3, "rate_factor": 0.6}],
    },
    "loss": {
        "description": "4-node ring; 6 packets dropped on 10.0.0.2->10.0.0.3: PSN gaps, NAK 0x60, go-back-N",
        "nodes": 4, "iterations": 2, "period_ms": 4.0,
        "workloads": [dict(RING)],
        "pathologies": [{"kind": "loss", "pairs": [[1, 2]], "count": 6}],
    },
    "pfc": {
        "description": "8-node ring; node 4 sends a storm of PFC pause frames on priority 3",
        "nodes": 8, "iterations": 2, "period_ms": 5.0,
        "workloads": [dict(RING)],
        "pathologies": [{"kind": "pfc_pause", "node": 4, "priority": 3, "start_ms": 0.3,
                         "count": 40, "interval_us": 15, "quanta": 4096}],
    },
    "pipeline-bubbles": {
        "description": "4-stage P2P pipeline, 6 micro-batches; stage 1 computes 3x slower (bubbles)",
        "nodes": 4, "iterations": 2, "period_ms": 12.0,
        "workloads": [{"kind": "p2p_pipeline", "activation_bytes": "1MiB", "microbatches": 6}],
        "pathologies": [{"kind": "pipeline_bubble", "stage": 1, "compute_factor": 3.0}],
    },
    "pipeline-healthy": {
        "description": "4-stage P2P pipeline, 6 micro-batches of 1 MiB activations",
        "nodes": 4, "iterations": 2, "period_ms": 8.0,
        "workloads": [{"kind": "p2p_pipeline", "activation_bytes": "1MiB", "microbatches": 6}],
    },
    "slow-link": {
        "description": "8-node ring; node 6's link negotiated at 25 Gb/s instead of 100",
        "nodes": 8, "iterations": 2, "period_ms": 8.0,
        "workloads": [dict(RING, bytes="4MiB")],
        "pathologies": [{"kind": "slow_link", "node": 6, "mode": "slow", "speed_factor": 0.25}],
    },
    "flapping-link": {
        "description": "8-node all-to-all; node 1's link flaps (down 300 us, up 700 us, 4 times)",
        "nodes": 8, "iterations": 3, "period_ms": 2.0,
        "workloads": [dict(A2A, bytes_per_peer="128KiB")],
        "pathologies": [{"kind": "slow_link", "node": 1, "mode": "flapping", "flaps": 4,
                         "down_us": 300, "up_us": 700, "start_ms": 0.2}],
    },
    "tp-decode": {
        "description": "4-node tensor-parallel decode: 2 LL all-reduces (16 KiB) per layer per token, 32 layers",
        "nodes": 4,
        "workloads": [{"kind": "tp_decode", "layers": 32, "tokens": 3, "token_ms": 6.0,
                       "ar_bytes": "16KiB", "layer_compute_us": 15}],
    },
    "tp-decode-prefill": {
        "description": "4-node TP decode with a prefill burst (1 MiB SIMPLE all-reduces) every 2 tokens",
        "nodes": 4,
        "workloads": [{"kind": "tp_decode", "layers": 8, "tokens": 4, "token_ms": 4.0,
                       "ar_bytes": "8KiB", "layer_compute_us": 20, "prefill_every": 2,
                       "prefill_bytes": "1MiB"}],
    },
    "moe-decode": {
        "description": "8-node expert-parallel MoE decode: per layer small dispatch+combine all-to-all",
        "nodes": 8,
        "workloads": [{"kind": "moe_decode", "layers": 4, "tokens": 3, "token_ms": 3.0,
                       "bytes_per_peer": "12KiB", "zipf": 0.8}],
    },
    "ipv6-ring": {
        "description": "4-node ring over IPv6 (fd00::/64), IB MTU 1024, PSNs starting near 2^24 (wrap)",
        "nodes": 4, "ip_version": 6, "mtu": 1024, "psn_start": 16777216 - 3000,
        "iterations": 2, "period_ms": 4.0,
        "workloads": [dict(RING, bytes="4MiB")],
    },
    "vlan-alltoall": {
        "description": "8-node all-to-all behind 802.1Q VLAN 100 (PCP 3), LE immediates, 2 QPs per connection",
        "nodes": 8, "vlan": 100, "imm_endian": "le", "iterations": 2, "period_ms": 3.0,
        "workloads": [dict(A2A, qps=2)],
    },
    "demo-mix": {
        "description": "demo: ring with straggler node 2 + MoE all-to-all with hot expert node 5 + congestion into node 7",
        "nodes": 8, "iterations": 3, "period_ms": 6.0, "jitter": 0.02,
        "workloads": [dict(RING, bytes="4MiB", channels=1),
                      dict(A2A, bytes_per_peer="96KiB", start_ms=2.5)],
        "pathologies": [{"kind": "straggler", "node": 2, "rate_factor": 0.5, "start_lag_us": 10},
                        {"kind": "hot_expert", "node": 5, "factor": 4.0},
                        {"kind": "congestion", "into": 7, "ce_fraction": 0.25, "rate_factor": 0.7}],
    },
    "mixed": {
        "description": "everything at once: ring, all-to-all, pipeline, loss, PFC, CNPs, background UDP",
        "nodes": 8, "iterations": 2, "period_ms": 6.0, "jitter": 0.02, "psn_start": "random",
        "workloads": [{"kind": "ring_allreduce", "members": [0, 1, 2, 3], "bytes": "4MiB",
                       "channels": 2},
                      {"kind": "all_to_all", "members": [4, 5, 6, 7], "bytes_per_peer": "256KiB",
                       "start_ms": 1.0},
                      {"kind": "p2p_pipeline", "members": [0, 4, 1, 5], "microbatches": 3,
                       "activation_bytes": "256KiB", "start_ms": 0.5}],
        "pathologies": [{"kind": "loss", "pairs": [[0, 1]], "count": 3},
                        {"kind": "congestion", "pairs": [[4, 6], [5, 6]], "ce_fraction": 0.2},
                        {"kind": "pfc_pause", "node": 7, "count": 10, "start_ms": 1.2}],
        "background": {"pps": 20000, "plen": 200, "dport": 9000},
    },
    "ring-32": {
        "description": "32-node ring all-reduce, 4 channels, 4 iterations (large: use --snaplen 128)",
        "nodes": 32, "iterations": 4, "period_ms": 8.0,
        "workloads": [{"kind": "ring_allreduce", "bytes": "32MiB", "channels": 4}],
    },
}

# ---------------------------------------------------------------- inference (issue 12)
TPD = {"kind": "decode_tp", "layers": 16, "allreduces_per_layer": 2, "tokens": 6,
       "hidden": 8192, "batch": 1, "dtype_bytes": 2, "compute_gap_us": 2000,
       "layer_compute_us": 10}
EPD = {"kind": "decode_ep", "layers": 4, "tokens": 6, "bytes_per_dest": "2KiB",
       "compute_gap_us": 2000}
KV = {"kind": "kv_transfer", "prefill": [0, 1, 2, 3], "decode": [4, 5, 6, 7], "requests": 16,
      "interval_us": 100, "block_bytes": "64KiB", "block_bytes_max": "256KiB",
      "blocks_per_request": 16, "prefill_us": 50}
PRESETS.update({
    "tp-decode-healthy": {
        "description": "4-way TP decode: per token 16 layers x 2 LL ring all-reduces (16 KiB = hidden 8192 x bf16 -> 8 KiB LL messages), 2 ms compute gap",
        "nodes": 4, "workloads": [dict(TPD)],
    },
    "tp-decode-slow-shard": {
        "description": "4-way TP decode; shard 2 starts every ring send 20 us late, every token waits on it",
        "nodes": 4, "workloads": [dict(TPD)],
        "pathologies": [{"kind": "slow_tp_shard", "node": 2, "lag_us": 20}],
    },
    "ep-decode-healthy": {
        "description": "8-way EP (MoE) decode: per token 4 layers x (dispatch + combine) all-to-all, 2 KiB per destination",
        "nodes": 8, "workloads": [dict(EPD)],
    },
    "ep-decode-hot-expert": {
        "description": "8-way EP decode; destination 5 gets 4x the dispatch bytes (hot expert), combine sends them back",
        "nodes": 8, "workloads": [dict(EPD)],
        "pathologies": [{"kind": "hot_destination", "node": 5, "factor": 4.0}],
    },
    "ep-decode-hot-drift": {
        "description": "8-way EP decode; the hot destination (4x) moves 5 -> 2 -> 6 every 3 tokens",
        "nodes": 8, "workloads": [dict(EPD, tokens=9)],
        "pathologies": [{"kind": "hot_destination", "node": 5, "factor": 4.0,
                         "drift_after_tokens": 3, "drift_to": [2, 6]}],
    },
    "ring-rotating-straggler": {
        "description": "8-node training ring all-reduce, 6 iterations; a different rank arrives 200 us late each iteration (no persistent straggler)",
        "nodes": 8, "iterations": 6, "period_ms": 3.0,
        "workloads": [{"kind": "ring_allreduce", "bytes": "2MiB", "channels": 1}],
        "pathologies": [{"kind": "rotating_straggler", "lag_us": 200, "noise_us": 5}],
    },
    "pd-healthy": {
        "description": "prefill/decode disaggregation: 4 prefill nodes push KV caches (16 WRITEs of 64-256 KiB per request, one-way) to 4 decode nodes, round robin",
        "nodes": 8, "workloads": [dict(KV)],
    },
    "pd-imbalanced": {
        "description": "P/D disaggregation; the router sends half of the KV transfers to decode node 4 (of 4)",
        "nodes": 8, "workloads": [dict(KV)],
        "pathologies": [{"kind": "pd_imbalance", "node": 4, "share": 0.5}],
    },
    "pd-slow-link": {
        "description": "P/D disaggregation; the prefill 0 -> decode 5 link runs at 0.25x",
        "nodes": 8, "workloads": [dict(KV)],
        "pathologies": [{"kind": "kv_transfer_slow", "src": 0, "dst": 5, "rate_factor": 0.25}],
    },
    "tp-decode-instances": {
        "description": "4 serving instances, each 4-way TP decode (nodes 0-3, 4-7, 8-11, 12-15); the router overloads instance 1 (nodes 4-7): batch 4 against 1, 4x the decode bytes per token",
        "nodes": 16,
        "workloads": [dict(TPD, members=list(range(4 * i, 4 * i + 4)), batch=4 if i == 1 else 1,
                           start_ms=0.3 * i) for i in range(4)],
    },
    "prefill-interference": {
        "description": "TP decode group on nodes 4-7; batches of 4 KV transfers (4 MiB each) from prefill nodes 0-3 into decode nodes 4, 5 queue on their downlinks: the token period stretches",
        "nodes": 8,
        "workloads": [dict(TPD, members=[4, 5, 6, 7], tokens=4),
                      dict(KV, decode=[4, 5], requests=24, interval_us=1400, arrival_batch=4,
                           block_bytes="256KiB", block_bytes_max=None, start_ms=0.2)],
    },
})

# ---------------------------------------------------------------- other libraries (issue 25)
PRESETS.update({
    "mpi-ring-healthy": {
        "description": "Open MPI (ob1/openib) ring all-reduce of 4 ranks, 1 MiB blocks: eager SENDs up to 12 KiB, larger blocks read by the receiver (RGET: RDMA READ), credit/FIN SENDs back, a start-up exchange between every pair",
        "nodes": 4, "iterations": 4, "period_ms": 8.0, "library": "mpi",
        "workloads": [{"kind": "ring_allreduce", "bytes": "4MiB", "channels": 1}],
    },
    "mpi-decode-slow-rank": {
        "description": "Open MPI decode loop (as the real openmpi_softroce_decode_slow_rank run): 4-way ring all-reduces of 16 KiB (eager SEND_FIRST/LAST), rank 2 starts every send 20 us late",
        "nodes": 4, "library": "mpi",
        "workloads": [dict(TPD, protocol="simple", hidden=8192)],
        "pathologies": [{"kind": "slow_tp_shard", "node": 2, "lag_us": 20}],
    },
    "mpi-alltoallv-hot": {
        "description": "Open MPI MPI_Alltoallv of 6 ranks (dispatch + combine), 64 KiB per peer read by the receiver (RGET); rank 4 is a hot destination (4x)",
        "nodes": 6, "iterations": 3, "period_ms": 8.0, "library": "mpi",
        "workloads": [dict(A2A, combine=True, bytes_per_peer="64KiB")],
        "pathologies": [{"kind": "hot_expert", "node": 4, "factor": 4.0}],
    },
})
