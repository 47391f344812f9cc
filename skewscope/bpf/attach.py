"""Attach the loaded programs to an interface (XDP or TC) and find or remove ours."""
from __future__ import annotations

import atexit
import errno
import os
import socket

from skewscope.bpf import syscalls as bpfsys
from skewscope.bpf.loader import OUR_PROG_NAMES, PROG_TC, Dataplane
from skewscope.core.errors import EXIT_BUSY, EXIT_KERNEL, EXIT_NO_IFACE, EXIT_USAGE, DataplaneError
from skewscope.core.netns import in_netns_fd
from skewscope.core.signals import EXIT_SIGNALS, install_exit_handlers, restore_handlers

XDP_FLAGS_UPDATE_IF_NOEXIST = 1
XDP_FLAGS_SKB_MODE = 2
XDP_FLAGS_DRV_MODE = 4


# ---- attach / detach ------------------------------------------------------------------
def ifindex(name: str) -> int:
    try:
        return socket.if_nametoindex(name)
    except OSError:
        raise DataplaneError(f"interface {name!r} does not exist", EXIT_NO_IFACE) from None


def _ipr():
    from pyroute2 import IPRoute  # heavy (pyroute2): only when attaching
    return IPRoute()


def xdp_prog_id(ifname: str) -> int:
    """Id of the XDP program attached to ifname (0 = none)."""
    idx = ifindex(ifname)
    with _ipr() as ipr:
        link = ipr.get_links(idx)[0]
    xdp = link.get_attr("IFLA_XDP")
    if not xdp:
        return 0
    return int(xdp.get_attr("IFLA_XDP_PROG_ID") or 0)


def _xdp_set(idx: int, fd: int, flags: int) -> None:
    with _ipr() as ipr:
        ipr.link("set", index=idx, xdp={"attrs": [("IFLA_XDP_FD", fd), ("IFLA_XDP_FLAGS", flags)]})


class Attachment:
    """Programs attached to one interface; detach() restores the interface.

    Safety: once attached, the attachment is detached when the process exits normally
    (atexit), on an exception or Ctrl-C through `with` / the caller's finally, and on
    SIGTERM/SIGHUP: if the application has not set its own handler for them, attach()
    installs one that raises Terminated (SystemExit) until detach(). Only SIGKILL (or a
    crash of the interpreter) leaves a program attached: `skewscope detach -i IFACE`."""

    def __init__(self, dp: Dataplane, ifname: str, mode: str = "xdp", xdp_mode: str = "native",
                 direction: str = "ingress"):
        if mode not in ("xdp", "tc") or xdp_mode not in ("native", "generic") or \
                direction not in ("ingress", "egress", "both"):
            raise DataplaneError(f"invalid attach mode {mode}/{xdp_mode}/{direction}", EXIT_USAGE)
        if mode == "xdp" and direction != "ingress":
            raise DataplaneError("XDP sees ingress only; use TC for egress or both directions", EXIT_USAGE)
        self.dp, self.ifname, self.mode, self.xdp_mode, self.direction = dp, ifname, mode, xdp_mode, direction
        self.idx = ifindex(ifname)
        self.attached = False
        self._created_clsact = False
        self._xdp_flags = 0
        self._xdp_prog = 0
        self._old_handlers: dict = {}
        self._netns_fd = -1

    def attach(self) -> "Attachment":
        if self.mode == "xdp":
            cur = xdp_prog_id(self.ifname)
            if cur:
                name = bpfsys.prog_name_by_id(cur)
                if name in OUR_PROG_NAMES:
                    raise DataplaneError(f"{self.ifname} already has a skewscope XDP program (id {cur}), probably "
                                         f"left by a crashed run: 'skewscope detach -i {self.ifname}' removes it",
                                         EXIT_BUSY)
                raise DataplaneError(f"{self.ifname} already has an XDP program ({name or '?'}, id {cur}) that is "
                                     "not ours; skewscope will not replace it (use --tc)", EXIT_BUSY)
            fd = self.dp.prog_fd("xdp")
            self._xdp_prog = bpfsys.prog_info(fd)["id"]
            mode_flag = XDP_FLAGS_DRV_MODE if self.xdp_mode == "native" else XDP_FLAGS_SKB_MODE
            self._xdp_flags = XDP_FLAGS_UPDATE_IF_NOEXIST | mode_flag
            try:
                _xdp_set(self.idx, fd, self._xdp_flags)
            except Exception as e:  # pyroute2 NetlinkError
                code = getattr(e, "code", 0)
                hint = ""
                if code in (errno.EOPNOTSUPP, errno.EINVAL) and self.xdp_mode == "native":
                    hint = " (driver lacks native XDP or MTU too large; try --xdp-mode generic or --tc)"
                raise DataplaneError(f"cannot attach XDP to {self.ifname}: {os.strerror(code) if code else e}{hint}",
                                     EXIT_KERNEL) from None
        else:
            fd = self.dp.prog_fd("tc")
            dirs = ("ingress", "egress") if self.direction == "both" else (self.direction,)
            with _ipr() as ipr:
                try:
                    ipr.tc("add", "clsact", self.idx)
                    self._created_clsact = True
                except Exception as e:
                    if getattr(e, "code", 0) != errno.EEXIST:
                        raise DataplaneError(f"cannot add clsact qdisc on {self.ifname}: {e}", EXIT_KERNEL) from None
                for d in dirs:
                    parent = 0xFFFFFFF2 if d == "ingress" else 0xFFFFFFF3
                    try:
                        ipr.tc("add-filter", "bpf", self.idx, ":1", fd=fd, name=PROG_TC, parent=parent,
                               classid=1, direct_action=True, prio=_TC_PRIO)
                    except Exception as e:
                        self.attached = True
                        self.detach()
                        raise DataplaneError(f"cannot attach TC {d} program to {self.ifname}: {e}",
                                             EXIT_KERNEL) from None
        self.attached = True
        try:  # detach must happen in this network namespace even if the thread moves later
            self._netns_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._netns_fd = -1
        atexit.register(self.detach)
        self._old_handlers = install_exit_handlers(EXIT_SIGNALS, only_if_default=True)
        return self

    def detach(self) -> None:
        if not self.attached:
            return
        self.attached = False
        try:
            atexit.unregister(self.detach)
        except Exception:
            pass
        restore_handlers(self._old_handlers)
        self._old_handlers = {}
        dirs = ("ingress", "egress") if self.direction == "both" else (self.direction,)
        try:
            with in_netns_fd(self._netns_fd):
                if self.mode == "xdp":
                    detach_ours(self.ifname, tc=False, xdp_prog=self._xdp_prog)
                else:
                    detach_ours(self.ifname, xdp=False, remove_clsact=self._created_clsact, directions=dirs)
        except (DataplaneError, OSError):
            pass  # interface (or namespace) gone: nothing left to clean
        finally:
            if self._netns_fd >= 0:
                os.close(self._netns_fd)
                self._netns_fd = -1

    def __enter__(self):
        return self.attach()

    def __exit__(self, *exc):
        self.detach()


_TC_PRIO = 0xC0DE & 0xFFFF  # our filter priority: distinctive, so detach finds ours


def _tc_filters(ipr, idx: int, parent: int):
    try:
        return ipr.get_filters(index=idx, parent=parent)
    except Exception:
        return []


def _tc_prog_name(flt) -> str | None:
    """Name of the BPF program behind a cls_bpf filter: the kernel's prog name (by id) when
    the netlink library decodes TCA_BPF_ID (pyroute2 0.7 does not), else the filter's
    TCA_BPF_NAME, which skewscope sets to its program name."""
    opts = flt.get_attr("TCA_OPTIONS")
    if not opts:
        return None
    pid = opts.get_attr("TCA_BPF_ID")
    name = bpfsys.prog_name_by_id(int(pid)) if pid else None
    return name or (opts.get_attr("TCA_BPF_NAME") or "").split(":")[0] or None


def list_ours(ifname: str) -> dict:
    """What skewscope has attached to ifname: {'xdp': prog_id|None, 'tc': [(dir, prio, name)]}"""
    idx = ifindex(ifname)
    out = {"xdp": None, "tc": []}
    pid = xdp_prog_id(ifname)
    if pid and bpfsys.prog_name_by_id(pid) in OUR_PROG_NAMES:
        out["xdp"] = pid
    with _ipr() as ipr:
        for d, parent in (("ingress", 0xFFFFFFF2), ("egress", 0xFFFFFFF3)):
            for flt in _tc_filters(ipr, idx, parent):
                name = _tc_prog_name(flt)
                if name in OUR_PROG_NAMES:
                    out["tc"].append((d, flt["info"] >> 16, name))
    return out


def detach_ours(ifname: str, xdp: bool = True, tc: bool = True, remove_clsact: bool = True,
                directions=("ingress", "egress"), xdp_prog: int | None = None) -> dict:
    """Remove skewscope's programs (and only those) from ifname. Returns what was removed.
    directions: TC hooks to clean; xdp_prog: remove the XDP program only if it is this id."""
    idx = ifindex(ifname)
    found = list_ours(ifname)
    removed = {"xdp": None, "tc": []}
    pid = found["xdp"]
    if xdp and pid and (xdp_prog is None or pid == xdp_prog):
        # IFLA_XDP_FD -1 in the mode it was attached in (drv / skb); re-check the id each time
        for flags in (XDP_FLAGS_DRV_MODE, XDP_FLAGS_SKB_MODE, 0):
            try:
                _xdp_set(idx, -1, flags)
            except Exception:
                continue
            if xdp_prog_id(ifname) != pid:
                removed["xdp"] = pid
                break
    mine = [t for t in found["tc"] if t[0] in directions]
    if tc and mine:
        with _ipr() as ipr:
            for d, prio, name in mine:
                parent = 0xFFFFFFF2 if d == "ingress" else 0xFFFFFFF3
                try:
                    ipr.tc("del-filter", "bpf", idx, parent=parent, prio=prio)
                    removed["tc"].append((d, prio, name))
                except Exception:
                    pass
            if remove_clsact and not any(_tc_filters(ipr, idx, p) for p in (0xFFFFFFF2, 0xFFFFFFF3)):
                try:
                    ipr.tc("del", "clsact", idx)
                except Exception:
                    pass
    return removed

