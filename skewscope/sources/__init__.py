"""Sources: everything that produces a Snapshot: the live session (BPF maps), kernel replay,
the offline pcap parser, capture's pcap tap, and the tc mirror rules that feed a DPU netdev."""
