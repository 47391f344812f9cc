"""Attach the loaded programs to an interface (XDP or TC) and find or remove ours.

Two ways to attach (docs/datapath.md "Attaching"):
- bpf_link (BPF_LINK_CREATE; XDP: Linux >= 5.9, TC through tcx: Linux >= 6.6): the attachment
  belongs to a file descriptor of this process, so it goes away with the process however it
  ends, SIGKILL included. The default where the kernel has it.
- netlink (IFLA_XDP, a cls_bpf filter on a clsact qdisc): survives the process; skewscope
  detaches on every exit it can see, and `skewscope detach` removes what a SIGKILL left.
  The fallback when BPF_LINK_CREATE is refused (older kernel), or forced with
  SKEWSCOPE_ATTACH=netlink."""
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

ATTACH_ENV = "SKEWSCOPE_ATTACH"
ATTACH_APIS = ("auto", "bpf_link", "netlink")   # auto: bpf_link, netlink when the kernel refuses links


def attach_api(value: str | None = None) -> str:
    """The attach method asked for: `value`, else $SKEWSCOPE_ATTACH, else auto ("link" is
    accepted for bpf_link)."""
    v = (value if value is not None else os.environ.get(ATTACH_ENV, "")).strip().lower() or "auto"
    v = {"link": "bpf_link", "bpf-link": "bpf_link"}.get(v, v)
    if v not in ATTACH_APIS:
        raise DataplaneError(f"{ATTACH_ENV}={v!r}: expected auto, bpf_link or netlink", EXIT_USAGE)
    return v


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

    `api`: "bpf_link", "netlink" or "auto" (default: $SKEWSCOPE_ATTACH, else auto = bpf_link
    where the kernel has it, netlink otherwise); after attach(), `self.api` says which was used.

    Safety: once attached, the attachment is detached when the process exits normally
    (atexit), on an exception or Ctrl-C through `with` / the caller's finally, and on
    SIGTERM/SIGHUP: if the application has not set its own handler for them, attach()
    installs one that raises Terminated (SystemExit) until detach(). A bpf_link attachment
    also goes with the process on SIGKILL or a crash (the kernel closes the link fd); only a
    netlink one is left behind then: `skewscope detach -i IFACE`."""

    def __init__(self, dp: Dataplane, ifname: str, mode: str = "xdp", xdp_mode: str = "native",
                 direction: str = "ingress", api: str | None = None):
        if mode not in ("xdp", "tc") or xdp_mode not in ("native", "generic") or \
                direction not in ("ingress", "egress", "both"):
            raise DataplaneError(f"invalid attach mode {mode}/{xdp_mode}/{direction}", EXIT_USAGE)
        if mode == "xdp" and direction != "ingress":
            raise DataplaneError("XDP sees ingress only; use TC for egress or both directions", EXIT_USAGE)
        self.dp, self.ifname, self.mode, self.xdp_mode, self.direction = dp, ifname, mode, xdp_mode, direction
        self.requested_api = attach_api(api)
        self.idx = ifindex(ifname)
        self.attached = False
        self.api: str | None = None      # "bpf_link" or "netlink" once attached
        self.prog_id = 0
        self._links: list[int] = []       # link fds (bpf_link): the attachment lives as long as they do
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
                if name in OUR_PROG_NAMES and _xdp_link_id(self.idx, cur):
                    raise DataplaneError(f"{self.ifname} already has a skewscope XDP program (id {cur}) attached "
                                         "through a bpf_link, so a running skewscope holds it: stop that run "
                                         f"(or 'skewscope detach -i {self.ifname} --force')", EXIT_BUSY)
                if name in OUR_PROG_NAMES:
                    raise DataplaneError(f"{self.ifname} already has a skewscope XDP program (id {cur}), probably "
                                         f"left by a crashed run: 'skewscope detach -i {self.ifname}' removes it",
                                         EXIT_BUSY)
                raise DataplaneError(f"{self.ifname} already has an XDP program ({name or '?'}, id {cur}) that is "
                                     "not ours; skewscope will not replace it (use --tc)", EXIT_BUSY)
            fd = self.dp.prog_fd("xdp")
            self._xdp_prog = self.prog_id = bpfsys.prog_info(fd)["id"]
            mode_flag = XDP_FLAGS_DRV_MODE if self.xdp_mode == "native" else XDP_FLAGS_SKB_MODE
            if not self._link_attach(fd, [("XDP", bpfsys.BPF_XDP, mode_flag)]):
                self._xdp_flags = XDP_FLAGS_UPDATE_IF_NOEXIST | mode_flag
                try:
                    _xdp_set(self.idx, fd, self._xdp_flags)
                except Exception as e:  # pyroute2 NetlinkError
                    raise DataplaneError(self._xdp_error(getattr(e, "code", 0), e), EXIT_KERNEL) from None
                self.api = "netlink"
        else:
            fd = self.dp.prog_fd("tc")
            self.prog_id = bpfsys.prog_info(fd)["id"]
            dirs = ("ingress", "egress") if self.direction == "both" else (self.direction,)
            tcx = {"ingress": bpfsys.BPF_TCX_INGRESS, "egress": bpfsys.BPF_TCX_EGRESS}
            if not self._link_attach(fd, [(f"TC {d}", tcx[d], 0) for d in dirs]):
                self._tc_netlink_attach(fd, dirs)
                self.api = "netlink"
        self.attached = True
        try:  # detach must happen in this network namespace even if the thread moves later
            self._netns_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._netns_fd = -1
        atexit.register(self.detach)
        self._old_handlers = install_exit_handlers(EXIT_SIGNALS, only_if_default=True)
        return self

    def _link_attach(self, prog_fd: int, hooks) -> bool:
        """BPF_LINK_CREATE on every (label, attach_type, flags) hook; all or none. False (nothing
        attached) when netlink is asked for, or in auto mode when the kernel refuses links."""
        if self.requested_api == "netlink":
            return False
        made: list[int] = []
        try:
            for label, atype, flags in hooks:
                made.append(bpfsys.link_create(prog_fd, self.idx, atype, flags))
        except bpfsys.BPFError as e:
            _close_links(made)
            if self.requested_api == "auto" and e.errno in bpfsys.LINK_UNSUPPORTED:
                self.link_refused = e.errno      # why the fallback (EINVAL: kernel without this link type)
                return False
            if self.mode == "xdp":
                raise DataplaneError(self._xdp_error(e.errno, e, "bpf_link"), EXIT_KERNEL) from None
            raise DataplaneError(f"cannot attach {label} program to {self.ifname} (bpf_link): "
                                 f"{os.strerror(e.errno)}", EXIT_KERNEL) from None
        self._links = made
        self.api = "bpf_link"
        return True

    link_refused = 0

    def _xdp_error(self, code: int, e, how: str = "") -> str:
        hint = ""
        if code in (errno.EOPNOTSUPP, errno.EINVAL) and self.xdp_mode == "native":
            hint = " (driver lacks native XDP or MTU too large; try --xdp-mode generic or --tc)"
        how = f" ({how})" if how else ""
        return f"cannot attach XDP to {self.ifname}{how}: {os.strerror(code) if code else e}{hint}"

    def _tc_netlink_attach(self, fd: int, dirs) -> None:
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
                    self.api = "netlink"
                    self.detach()
                    raise DataplaneError(f"cannot attach TC {d} program to {self.ifname}: {e}",
                                         EXIT_KERNEL) from None

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
        if self._links:
            links, self._links = self._links, []
            _close_links(links)           # no namespace needed: the link knows its interface
            if self._netns_fd >= 0:
                os.close(self._netns_fd)
                self._netns_fd = -1
            return
        try:
            with in_netns_fd(self._netns_fd):
                if self.mode == "xdp":
                    detach_ours(self.ifname, tc=False, xdp_prog=self._xdp_prog, links=False)
                else:
                    detach_ours(self.ifname, xdp=False, remove_clsact=self._created_clsact, directions=dirs,
                                links=False)
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
_TCX_HOOKS = (("ingress", bpfsys.BPF_TCX_INGRESS), ("egress", bpfsys.BPF_TCX_EGRESS))


def _close_links(fds) -> None:
    """Detach (BPF_LINK_DETACH: at once, even if a forked child still shares the fd) and close."""
    for lfd in fds:
        try:
            bpfsys.link_detach(lfd)
        except OSError:
            pass  # interface gone (link already defunct) or a kernel without LINK_DETACH: close does it
        finally:
            os.close(lfd)


def _detach_link_id(link_id: int) -> bool:
    """Detach someone's link by id (detach --force on a running skewscope's bpf_link)."""
    try:
        lfd = bpfsys.link_fd_by_id(link_id)
    except OSError:
        return False
    try:
        bpfsys.link_detach(lfd)
        return True
    except OSError:
        return False
    finally:
        os.close(lfd)


def _xdp_link_id(idx: int, prog_id: int) -> int | None:
    """Id of the bpf_link that holds XDP program prog_id on interface idx (None: attached by
    netlink). Link info carries the ifindex but not the namespace; the program id (global,
    and ours is loaded per process) makes the match unambiguous."""
    for lid in bpfsys.link_ids():
        info = bpfsys.link_info_by_id(lid)
        if info and info["type"] == bpfsys.BPF_LINK_TYPE_XDP and info["prog_id"] == prog_id \
                and info["ifindex"] == idx:
            return lid
    return None


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
    """What skewscope has attached to ifname (in this thread's namespace):
    {'xdp': prog_id|None, 'xdp_link': link_id|None (None: by netlink),
     'tc': [(dir, prio, name)] (cls_bpf filters, netlink), 'tcx': [(dir, link_id, prog_id)]}"""
    idx = ifindex(ifname)
    out = {"xdp": None, "xdp_link": None, "tc": [], "tcx": []}
    pid = xdp_prog_id(ifname)
    if pid and bpfsys.prog_name_by_id(pid) in OUR_PROG_NAMES:
        out["xdp"] = pid
        out["xdp_link"] = _xdp_link_id(idx, pid)
    for d, atype in _TCX_HOOKS:
        for prog, link in bpfsys.tcx_query(idx, atype):
            if bpfsys.prog_name_by_id(prog) in OUR_PROG_NAMES:
                out["tcx"].append((d, link, prog))
    with _ipr() as ipr:
        for d, parent in (("ingress", 0xFFFFFFF2), ("egress", 0xFFFFFFF3)):
            for flt in _tc_filters(ipr, idx, parent):
                name = _tc_prog_name(flt)
                if name in OUR_PROG_NAMES:
                    out["tc"].append((d, flt["info"] >> 16, name))
    return out


def detach_ours(ifname: str, xdp: bool = True, tc: bool = True, remove_clsact: bool = True,
                directions=("ingress", "egress"), xdp_prog: int | None = None, links: bool = True) -> dict:
    """Remove skewscope's programs (and only those) from ifname. Returns what was removed,
    like list_ours. directions: TC hooks to clean; xdp_prog: remove the XDP program only if
    it is this id; links: also bpf_link attachments (BPF_LINK_DETACH: the holder's link
    becomes defunct), which only a running process can hold (skewscope never pins)."""
    idx = ifindex(ifname)
    found = list_ours(ifname)
    removed = {"xdp": None, "xdp_link": None, "tc": [], "tcx": []}
    pid = found["xdp"]
    if xdp and pid and found["xdp_link"] and (xdp_prog is None or pid == xdp_prog):
        if links and _detach_link_id(found["xdp_link"]) and xdp_prog_id(ifname) != pid:
            removed["xdp"], removed["xdp_link"] = pid, found["xdp_link"]
        pid = None                      # a link: netlink cannot remove it (EBUSY)
    if tc and links:
        for d, link, prog in found["tcx"]:
            if d in directions and link and _detach_link_id(link):
                removed["tcx"].append((d, link, prog))
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

