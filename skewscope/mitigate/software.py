"""The software backend of `skewscope mitigate`: ebpf/mitigate.bpf.c as a cls_bpf filter on
the interface's clsact hook, attached by netlink so that it outlives the process that added
it (a bpf_link would die with it), with its rules in the program's own map.

What is ours, and nothing else is touched: the filter at priority PRIO on the chosen hook
whose program is named `ss_mitigate` (the kernel's name, read by program id). A foreign
filter at PRIO is a conflict (one-line refusal); a clsact qdisc that was there before stays
(mt_meta remembers whether we created it). TTL: the program ignores a rule past its
deadline on CLOCK_BOOTTIME, so an action ends on time even when every skewscope process was
SIGKILLed; the inert slot and, when no rule is left, the filter (and our clsact) are removed
by the next `mitigate` command of any kind (`reap`).

Other processes reach the maps through the program: filter -> program id -> map ids
(BPF_OBJ_GET_INFO_BY_FD) -> map fds by id, so status and revert need no pinned files.
"""
from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import socket
import struct
import time

from skewscope.bpf import syscalls as bpfsys
from skewscope.core.errors import EXIT_BUSY, EXIT_KERNEL, EXIT_NO_IFACE, EXIT_NO_PRIV, DataplaneError
from skewscope.mitigate.rules import MAX_RULES, RULE_SIZE, STATE_SIZE, MitigationError, Rule, has_clsact, same_key, unpack_state
from skewscope.mitigate.rules import tc as _tc

PROG_NAME = "ss_mitigate"
PRIO = 49392                  # next to the mirror's 49376..49387; ours on either hook
HOOKS = {"ingress": 0xFFFFFFF2, "egress": 0xFFFFFFF3}
META_CREATED_CLSACT = 1


def boot_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def _source_path() -> str:
    from skewscope.bpf.loader import EBPF_DIR  # heavy (numpy): ebpf/ of a checkout, or of the wheel
    return str(EBPF_DIR / "mitigate.bpf.c")


class Software:
    """The software mitigation on one interface hook (in the caller's network namespace)."""

    def __init__(self, iface: str, direction: str = "ingress"):
        if direction not in HOOKS:
            raise MitigationError(f"direction {direction!r}: ingress or egress")
        self.iface, self.direction = iface, direction
        try:
            self.idx = socket.if_nametoindex(iface)
        except OSError:
            raise DataplaneError(f"interface {iface!r} does not exist (see 'ip link')", EXIT_NO_IFACE) from None

    # ---- finding what is there -----------------------------------------------------------
    def _filters(self) -> list[dict]:
        p = _tc(["-j", "filter", "show", "dev", self.iface, self.direction], check=False)
        if p.returncode != 0 or not p.stdout.strip():
            return []
        try:
            return [f for f in json.loads(p.stdout) if f.get("pref") == PRIO]
        except json.JSONDecodeError:
            return []

    def _ours(self) -> tuple[int | None, bool]:
        """(our program's id or None, whether a foreign filter holds PRIO)."""
        foreign = False
        for f in self._filters():
            opts = f.get("options") or {}
            pid = (opts.get("prog") or {}).get("id")
            if f.get("kind") == "bpf" and pid and bpfsys.prog_name_by_id(int(pid)) == PROG_NAME:
                return int(pid), False
            if f.get("kind") is not None and opts:
                foreign = True
        return None, foreign

    def _maps(self, prog_id: int) -> dict[str, int]:
        fd = bpfsys.prog_fd_by_id(prog_id)
        try:
            out = {}
            for mid in bpfsys.prog_map_ids(fd):
                mfd = bpfsys.map_fd_by_id(mid)
                name = bpfsys.map_info(mfd)["name"]
                if name in ("mt_rules", "mt_state", "mt_meta"):
                    out[name] = mfd
                else:
                    os.close(mfd)
            return out
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _open(self):
        pid, _ = self._ours()
        if pid is None:
            yield None
            return
        maps = self._maps(pid)
        try:
            yield maps
        finally:
            for fd in maps.values():
                os.close(fd)

    def _slots(self, maps) -> list[tuple[int, bytes, bytes]]:
        out = []
        for i in range(MAX_RULES):
            k = struct.pack("<I", i)
            out.append((i, bpfsys.map_lookup(maps["mt_rules"], k, RULE_SIZE),
                        bpfsys.map_lookup(maps["mt_state"], k, STATE_SIZE, bpfsys.BPF_F_LOCK)))
        return out

    def _clear(self, maps, slot: int) -> None:
        k = struct.pack("<I", slot)
        bpfsys.map_update(maps["mt_rules"], k, b"\0" * RULE_SIZE)
        bpfsys.map_update(maps["mt_state"], k, b"\0" * STATE_SIZE)

    # ---- the commands --------------------------------------------------------------------
    def status(self, include_expired: bool = False) -> list[Rule]:
        """The active rules (with their counters), oldest first."""
        now = boot_ns()
        out = []
        with self._open() as maps:
            if maps is None:
                return []
            for slot, raw, st in self._slots(maps):
                r = Rule.unpack(raw, slot, now)
                if r is None or (r.expires_in <= 0 and not include_expired):
                    continue
                r.counters = unpack_state(st)
                out.append(r)
        return sorted(out, key=lambda r: r.id)

    def reap(self) -> list[Rule]:
        """Clear the slots past their deadline; remove the filter (and a clsact we created)
        when no rule is left. Returns the rules cleared."""
        now = boot_ns()
        cleared, left = [], 0
        with self._open() as maps:
            if maps is None:
                return []
            for slot, raw, st in self._slots(maps):
                r = Rule.unpack(raw, slot, now)
                if r is None:
                    continue
                if r.expires_in <= 0:
                    r.counters = unpack_state(st)
                    self._clear(maps, slot)
                    cleared.append(r)
                else:
                    left += 1
            created = self._created_clsact(maps)
        if not left:
            self._remove(created)
        return cleared

    def revert(self, ids=None) -> list[Rule]:
        """Remove the rules with these ids (None: all of ours); the filter goes with the last."""
        now = boot_ns()
        removed, left = [], 0
        with self._open() as maps:
            if maps is None:
                if ids:
                    raise MitigationError(f"{self.iface} {self.direction}: no skewscope mitigation is active "
                                          f"(nothing with id {', '.join(map(str, ids))})")
                return []
            want = None if ids is None else set(int(i) for i in ids)
            for slot, raw, st in self._slots(maps):
                r = Rule.unpack(raw, slot, now)
                if r is None:
                    continue
                if want is None or r.id in want:
                    r.counters = unpack_state(st)
                    self._clear(maps, slot)
                    removed.append(r)
                elif r.expires_in > 0:
                    left += 1
                else:
                    self._clear(maps, slot)
            created = self._created_clsact(maps)
        missing = (want or set()) - {r.id for r in removed}
        if not left:
            self._remove(created)
        if missing:
            raise MitigationError(f"{self.iface} {self.direction}: no active mitigation with id "
                                  f"{', '.join(map(str, sorted(missing)))} (see 'skewscope mitigate status')")
        return removed

    def apply(self, rules: list[Rule]) -> list[Rule]:
        """Install the rules (each checked first; all or nothing). A rule identical to an
        active one (same match and action) is not added twice: that one's TTL is renewed."""
        for r in rules:
            r.check()
        if os.geteuid() != 0:
            raise DataplaneError("mitigate apply needs root (CAP_NET_ADMIN and CAP_BPF)", EXIT_NO_PRIV)
        pid, foreign = self._ours()
        if foreign:
            raise MitigationError(f"{self.iface} {self.direction}: a filter that is not skewscope's holds tc priority "
                                  f"{PRIO}; refusing to touch it", EXIT_BUSY)
        attached_now, created_clsact = False, False
        if pid is None:
            pid, created_clsact = self._attach()
            attached_now = True
        now = boot_ns()
        done: list[Rule] = []
        try:
            maps = self._maps(pid)
            try:
                slots = self._slots(maps)
                active = {}
                free = []
                top = 0
                for slot, raw, _st in slots:
                    r = Rule.unpack(raw, slot, now)
                    if r is None or r.expires_in <= 0:
                        free.append(slot)
                        continue
                    active[same_key(r)] = r
                    top = max(top, r.id)
                need = [r for r in rules if same_key(r) not in active]
                if len(need) > len(free):
                    raise MitigationError(f"{self.iface} {self.direction}: {len(need)} new rules but {len(free)} free of "
                                          f"{MAX_RULES} (revert some: 'skewscope mitigate revert')", EXIT_BUSY)
                for r in rules:
                    old = active.get(same_key(r))
                    if old is not None:
                        r.id, r.slot = old.id, old.slot
                    else:
                        top += 1
                        r.id, r.slot = top, free.pop(0)
                        self._clear(maps, r.slot)      # fresh counters and bucket
                    bpfsys.map_update(maps["mt_rules"], struct.pack("<I", r.slot), r.pack(r.id, now))
                    r.expires_in = r.ttl
                    done.append(r)
            finally:
                for fd in maps.values():
                    os.close(fd)
        except BaseException:
            if attached_now:          # leave nothing half-made
                self._remove(created_clsact)
            raise
        return done

    # ---- attach / remove -----------------------------------------------------------------
    def _attach(self) -> tuple[int, bool]:
        from bcc import BPF  # heavy (bcc): only when the first rule goes in

        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                b = BPF(src_file=_source_path().encode())
                fn = b.load_func(PROG_NAME.encode(), BPF.SCHED_CLS)
        except Exception as e:  # bcc raises bare Exception on compile errors
            raise DataplaneError(f"cannot compile the mitigation program: {str(e) or err.getvalue()[-300:]}",
                                 EXIT_KERNEL) from None
        created = not has_clsact(self.iface)
        from pyroute2 import IPRoute  # heavy (pyroute2): only when attaching
        with IPRoute() as ipr:
            if created:
                try:
                    ipr.tc("add", "clsact", self.idx)
                except Exception as e:
                    if getattr(e, "code", 0) != errno.EEXIST:
                        raise DataplaneError(f"cannot add clsact qdisc on {self.iface}: {e}", EXIT_KERNEL) from None
                    created = False
            try:
                ipr.tc("add-filter", "bpf", self.idx, ":1", fd=fn.fd, name=PROG_NAME, parent=HOOKS[self.direction],
                       classid=1, direct_action=True, prio=PRIO)
            except Exception as e:
                if created:
                    _tc(["qdisc", "del", "dev", self.iface, "clsact"], check=False)
                raise DataplaneError(f"cannot attach the mitigation program to {self.iface} {self.direction}: {e}",
                                     EXIT_KERNEL) from None
        pid, _ = self._ours()
        if pid is None:
            raise DataplaneError(f"{self.iface}: the mitigation filter was added but cannot be found", EXIT_KERNEL)
        maps = self._maps(pid)
        try:
            bpfsys.map_update(maps["mt_meta"], struct.pack("<I", 0),
                              struct.pack("<Q", META_CREATED_CLSACT if created else 0))
        finally:
            for fd in maps.values():
                os.close(fd)
        b.cleanup()       # the filter holds the program (and its maps) from here on
        return pid, created

    def _created_clsact(self, maps) -> bool:
        raw = bpfsys.map_lookup(maps["mt_meta"], struct.pack("<I", 0), 8)
        return bool(struct.unpack("<Q", raw)[0] & META_CREATED_CLSACT)

    def _remove(self, created_clsact: bool) -> None:
        pid, _ = self._ours()
        if pid is not None:
            _tc(["filter", "del", "dev", self.iface, self.direction, "prio", str(PRIO)], check=False)
        if created_clsact:
            for d in HOOKS:
                p = _tc(["filter", "show", "dev", self.iface, d], check=False)
                if p.returncode == 0 and p.stdout.strip():
                    return          # someone else's filters now live there: keep the qdisc
            _tc(["qdisc", "del", "dev", self.iface, "clsact"], check=False)


def list_all() -> list[dict]:
    """Every skewscope mitigation active in this network namespace, all interfaces and hooks,
    both backends (the exporter's /v1/mitigations: the state is in the kernel, not in the
    process that applied it)."""
    from skewscope.mitigate.flower import list_all as flower_all  # light (tc)
    out = flower_all()
    for _idx, name in socket.if_nameindex():
        for d in HOOKS:
            try:
                rules = Software(name, d).status()
            except (DataplaneError, MitigationError, OSError):
                continue
            out += [dict(r.to_dict(), interface=name, direction=d, backend="software") for r in rules]
    return out
