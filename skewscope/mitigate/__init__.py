"""`skewscope mitigate` (issue 28): guarded, reversible actions on the data path, each with a
TTL, that an operator or a controller approves.

rules.py     Rule (match, action, TTL, why), its map form, the plan from findings
software.py  the software backend: ebpf/mitigate.bpf.c as a cls_bpf filter that outlives the
             process, TTL enforced by the program itself
policy.py    the closed loop's policy file (watch --mitigate)
loop.py      the closed loop: plan, apply, verify, revert, each step an event
flower.py    the flower backend: the same rules as tc flower filters a BlueField eSwitch offloads,
             ours by priority range + action cookie (also printed by plan --flower)
reaper.py    the flower backend's TTL: `mitigate reap` scheduled at the deadline (systemd-run or a
             detached sleeper), deploy/systemd/skewscope-mitigate-reap.timer behind it
"""
