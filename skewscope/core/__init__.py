"""Core types every layer shares: the layout mirror of ebpf/skewscope.h, the Snapshot, errors and exit
codes, signals, network namespaces, atomic files. Imports nothing else of skewscope."""
