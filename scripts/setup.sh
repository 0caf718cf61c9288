#!/usr/bin/env bash
# One-time set-up of a fresh Debian 12 machine (run as root): the Debian packages the local sandbox
# needs and a virtualenv in .venv with the project and its test tools. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v mkfs.btrfs >/dev/null 2>&1 || need_apt+=(btrfs-progs)
command -v unshare >/dev/null 2>&1 || need_apt+=(util-linux)
command -v git >/dev/null 2>&1 || need_apt+=(git)
# libseccomp compiles the local sandbox's syscall filter (through the pyseccomp binding)
ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2' || need_apt+=(libseccomp2)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)  # the egress tests fetch through the proxy with it
python3 -m pip --version >/dev/null 2>&1 || need_apt+=(python3-pip)  # ...and pip download from a local index
# rootless mode: newuidmap/newgidmap map a user's /etc/subuid range; mmdebstrap builds its Debian base
command -v newuidmap >/dev/null 2>&1 || need_apt+=(uidmap)
command -v mmdebstrap >/dev/null 2>&1 || need_apt+=(mmdebstrap)
if [[ "${1:-}" == *test* ]]; then
  # the proxy's CA in a sandbox's system trust store: wget and openssl read it, update-ca-certificates rebuilds it
  command -v wget >/dev/null 2>&1 || need_apt+=(wget)
  command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
  command -v update-ca-certificates >/dev/null 2>&1 || need_apt+=(ca-certificates)
  # setcap/getcap: a checkpoint must keep a file's capabilities (tests/local/test_checkpoints.py)
  command -v setcap >/dev/null 2>&1 || need_apt+=(libcap2-bin)
fi
if [[ "${1:-}" == *test* ]]; then
  # the cgroup v2 tests run in a QEMU guest (tests/guest): emulator, static busybox, initramfs tools
  command -v qemu-system-x86_64 >/dev/null 2>&1 || need_apt+=(qemu-system-x86)
  dpkg -s busybox-static >/dev/null 2>&1 || need_apt+=(busybox-static)
  command -v cpio >/dev/null 2>&1 || need_apt+=(cpio)
  command -v depmod >/dev/null 2>&1 || need_apt+=(kmod)
  # the real agent clients of tests/mcp (Codex CLI, Claude Code) install from npm
  command -v npm >/dev/null 2>&1 || need_apt+=(nodejs npm)
  command -v mkfs.xfs >/dev/null 2>&1 || need_apt+=(xfsprogs)  # the rootless store's reflink kind, tested on XFS
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: need root to install ${need_apt[*]}" >&2; exit 1
  fi
  echo "setup: installing Debian packages: ${need_apt[*]} (usually 1-3 minutes)" >&2
  bash scripts/apt-wait.sh  # another apt (unattended upgrades at boot) holds the lock: wait, visibly, bounded
  wait_s=${HERMES_SANDBOXES_APT_WAIT_S:-600}  # (and apt itself waits if one starts in between)
  apt-get -o DPkg::Lock::Timeout="$wait_s" update -qq
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout="$wait_s" install -y -qq \
    --no-install-recommends "${need_apt[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv" >&2
  "$PY" -m venv .venv
fi
extras=${1:-}
if [ -n "$extras" ]; then spec=".[$extras]"; else spec="."; fi
stamp=".venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)-${extras:-base}"
if [ ! -e "$stamp" ]; then
  case "$extras" in  # (measured: the hermes extra alone took 277 s on a loaded machine with a cold cache)
    *test*|*hermes*) took="usually 2-5 minutes the first time: Hermes Agent and ~100 packages of tools; seconds later" ;;
    *) took="usually under a minute" ;;
  esac
  echo "setup: installing hermes-sandboxes${extras:+ [$extras]} into .venv ($took); each package pip" \
       "fetches is named below" >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
  # (not -q: a silent pip for minutes looks hung) only what it collects, not every satisfied requirement
  install=(python3 scripts/venv_swap.py .venv --)  # a working .venv: changed in a copy, swapped in at once,
  ls .venv/.installed-* >/dev/null 2>&1 || install=()  # so a CLI running from it meanwhile never breaks
  where=.venv; [ ${#install[@]} -eq 0 ] || where="{venv}"
  log=$(mktemp -t hermes-sandboxes-pip.XXXXXX.log)
  set +e
  "${install[@]}" "$where/bin/python" -m pip install --disable-pip-version-check --progress-bar off -e "$spec" 2>&1 \
    | tee "$log" | grep --line-buffered -E '^(Collecting|Installing|Successfully|ERROR)' >&2
  pip_status=${PIPESTATUS[0]}
  set -e
  [ "$pip_status" -eq 0 ] || { echo "setup: pip install failed: see $log" >&2; exit 1; }
  rm -f "$log"
  touch "$stamp"
fi

if [[ "$extras" == *test* ]]; then
  bash tests/guest/build.sh  # the guest's kernel and initramfs, under build/guest (reused when unchanged)
  bash tests/mcp/clients.sh  # Codex CLI and Claude Code, pinned, under build/clients (reused when unchanged)
  # the rootless base's tarball (mmdebstrap, ~1-2 min once), under build/rootless-base (reused)
  .venv/bin/python -m tests.store_rootless.base_cache >/dev/null
fi
