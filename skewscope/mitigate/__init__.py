"""`skewscope mitigate` (issue 28): guarded, reversible actions on the data path, each with a
TTL, that an operator or a controller approves.

rules.py     Rule (match, action, TTL, why), its map form, the plan from findings
software.py  the software backend: ebpf/mitigate.bpf.c as a cls_bpf filter that outlives the
             process, TTL enforced by the program itself
"""
