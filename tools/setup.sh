#!/usr/bin/env bash
# One-time, idempotent machine + virtualenv set-up for skewscope (run as root by `make setup`).
#
# What it does, and why:
#  1. OS packages (only those missing): python3-bpfcc (bcc's Python bindings; NOT the PyPI
#     project "bcc", which is unrelated), kernel headers, python3-venv, and the independent
#     tools the tests compare against: tshark, tcpdump, prometheus/promtool, tmux, iproute2, chromium (headless: the HTML report's browser test).
#     prometheus-alertmanager: the alert routing chain test (tests/integration/test_alertmanager.py).
#  2. Kernel headers: bcc compiles our C with the running kernel's headers found under
#     /lib/modules/$(uname -r)/build. On a DPU (Ubuntu/DOCA) the matching package usually exists
#     and is installed. When the running kernel has none (as in CI containers/VMs with custom
#     kernels), we link build/source to the newest installed Debian headers. This is sound for
#     skewscope because ebpf/ uses only UAPI headers (struct ethhdr/iphdr/ipv6hdr/udphdr and
#     the bpf helper ABI), which are stable across kernel versions.
#  3. .venv/ from the system Python 3.11 (/usr/bin/python3), with a .pth that exposes only
#     the system 'bcc' package (not the rest of dist-packages), then `pip install -e .[test,html]`.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'setup: %s\n' "$*"; }
need_root() { [ "$(id -u)" = 0 ] || { echo "setup: must run as root to install OS packages ($*)" >&2; exit 3; }; }

ARCH=$(dpkg --print-architecture 2>/dev/null || echo amd64)
PKGS=(python3-bpfcc python3-venv python3-dev "linux-headers-$ARCH" tshark tcpdump prometheus prometheus-alertmanager tmux iproute2 gcc iputils-ping chromium)
missing=()
for p in "${PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  need_root "${missing[*]}"
  log "installing OS packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections || true
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  log "OS packages present"
fi

# Kernel headers for bcc.
KREL=$(uname -r)
MODDIR=/lib/modules/$KREL
if [ -e "$MODDIR/build/include" ] || [ -e "$MODDIR/build/Makefile" ]; then
  log "kernel headers for $KREL present"
else
  need_root "kernel headers"
  # First choice: the exact headers of the running kernel, if the distribution has them.
  if apt-get install -y -q "linux-headers-$KREL" >/dev/null 2>&1; then
    log "installed linux-headers-$KREL"
  fi
  if ! [ -e "$MODDIR/build/include" ] && ! [ -e "$MODDIR/build/Makefile" ]; then
    hdr=$(ls -d /usr/src/linux-headers-*-"$ARCH" 2>/dev/null | sort -V | tail -n1)
    [ -n "$hdr" ] || { echo "setup: no kernel headers found under /usr/src" >&2; exit 3; }
    common="${hdr%-$ARCH}-common"
    mkdir -p "$MODDIR"
    ln -sfn "$hdr" "$MODDIR/build"
    [ -d "$common" ] && ln -sfn "$common" "$MODDIR/source"
    log "kernel $KREL has no headers package; linked $MODDIR/build -> $hdr (UAPI-only use, see README)"
  fi
fi

# Virtualenv.
if [ ! -x .venv/bin/python ]; then
  log "creating .venv from /usr/bin/python3"
  /usr/bin/python3 -m venv .venv
fi
SITE=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
BCCDIR=$(/usr/bin/python3 -c 'import bcc, os; print(os.path.dirname(os.path.dirname(bcc.__file__)))' 2>/dev/null || true)
if [ -n "$BCCDIR" ]; then
  mkdir -p "$SITE/_skewscope_sys"
  ln -sfn "$BCCDIR/bcc" "$SITE/_skewscope_sys/bcc"
  echo "$SITE/_skewscope_sys" > "$SITE/skewscope_system_bcc.pth"
else
  echo "setup: python3-bpfcc installed but 'import bcc' fails in /usr/bin/python3" >&2; exit 3
fi
if ! .venv/bin/python -c 'import skewscope, numba, numpy, pyroute2, click, rich, pytest, scapy, prometheus_client, matplotlib' >/dev/null 2>&1 \
   || [ pyproject.toml -nt .venv/.skewscope-installed ]; then
  log "installing Python dependencies into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[test,html]'
  touch .venv/.skewscope-installed
else
  log "Python dependencies present"
fi
.venv/bin/python -c 'import bcc, numba, numpy, pyroute2, click, rich' && log "ok: bcc, numba, numpy, pyroute2, click, rich import in .venv"
