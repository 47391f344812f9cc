"""skewscope: skews and pathologies in RoCEv2 traffic of multi-GPU LLM jobs, seen with eBPF."""
__version__ = "0.1.0"
