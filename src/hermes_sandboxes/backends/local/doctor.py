"""What works on this machine for local sandboxes, and why not."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from hermes_sandboxes.backends.local import cgroups, syscall_filter
from hermes_sandboxes.errors import Unsupported
from hermes_sandboxes.sandbox import DoctorCheck

if TYPE_CHECKING:
    from hermes_sandboxes.backends.local.backend import LocalBackend
    from hermes_sandboxes.backends.local.store.base import Store


def _filesystems() -> str:
    try:
        return Path("/proc/filesystems").read_text()
    except OSError:
        return ""


def _cgroup_checks() -> list[DoctorCheck]:
    found = cgroups.probe()
    if found.version is None:
        return [DoctorCheck(False, "cgroups", "; ".join(found.fatal))]
    version = f"cgroup v{found.version}"
    checks = [DoctorCheck(not found.fatal, f"{version} in use (freezing, killing a command's tree)",
                          "; ".join(found.fatal) or ", ".join(sorted(found.bases)))]
    for controller in cgroups.LIMIT_CONTROLLERS:
        base = found.limits.get(controller)
        checks.append(DoctorCheck(base is not None, f"{version} {controller} (limits)",
                                  str(base) if base else next((m for m in found.missing if f"'{controller}'" in m),
                                                              "missing")))
    others = [m for m in found.missing if "hierarchy" in m]
    if found.version == 1:
        checks.append(DoctorCheck(not others, "every cgroup hierarchy joined (no host group reachable)",
                                  "; ".join(others) or "yes"))
    top = cgroups.ceiling()
    checks.append(DoctorCheck(True, "ceiling of all sandboxes of a store",
                              f"memory {top.memory_bytes}, pids {top.pids}, cpus {top.cpus}"))
    checks += [DoctorCheck(True, "note", note) for note in found.notes]
    return checks


SIMPLE_QUOTA_FEATURE = Path("/sys/fs/btrfs/features/simple_quota")  # present on Linux >= 6.7


def _disk_limit_check(kind: str) -> DoctorCheck:
    """Optional, so never a failure: the detail says whether a ``disk`` limit is honoured or refused."""
    label = "disk limits (setting disk, --disk)"
    if kind != "btrfs":
        return DoctorCheck(True, label, f"not available: the {kind} store cannot enforce them (refused)")
    if not SIMPLE_QUOTA_FEATURE.exists():
        return DoctorCheck(True, label, "not available: btrfs simple quotas need Linux 6.7 or later "
                                        f"(this is {os.uname().release}; refused)")
    return DoctorCheck(True, label, "available (btrfs simple quotas; data kept by checkpoints counts)")


def _rootless_disk_check(store: Store) -> DoctorCheck:
    try:
        store.check_disk_limit(1 << 30)
    except Unsupported as exc:
        return DoctorCheck(True, "disk limits (setting disk, --disk)", f"not available: {exc} (refused)")
    return DoctorCheck(True, "disk limits (setting disk, --disk)", "available")


def _rootless_base_check() -> DoctorCheck:
    """The Debian root rootless sandboxes are built on: a failure only in that nothing can start yet."""
    from hermes_sandboxes.backends.local.store import baseimage

    built = baseimage.built()
    if built is not None:
        return DoctorCheck(True, "rootless base (Debian root owned by your id range)", str(built))
    tool = shutil.which("mmdebstrap")
    fix = ("run `hermes-sandboxes store base` once (about a minute)" if tool
           else "install mmdebstrap and uidmap (sudo apt-get install mmdebstrap uidmap), then run "
                "`hermes-sandboxes store base` once")
    return DoctorCheck(False, "rootless base (Debian root owned by your id range)", f"not built yet: {fix}")


def _rootless_checks(backend: LocalBackend) -> list[DoctorCheck]:
    """As a normal user: the mode, each prerequisite with its fix, and what is enforced."""
    from hermes_sandboxes.backends.local import prereqs

    checks = [DoctorCheck(True, "mode", f"rootless (uid {os.getuid()}): sandboxes run in user namespaces of "
                                         "yours; nothing needs root, a setuid helper of ours or a daemon")]
    checks += [DoctorCheck(c.ok, c.label, c.detail) for c in prereqs.userns_checks()]
    mapping = prereqs.mapping_check()
    checks.append(DoctorCheck(True, mapping.label, mapping.detail))  # optional: says what it breaks
    found = cgroups.probe()
    if not found.fatal and found.version is not None:
        checks += _cgroup_checks()
    else:
        checks.append(DoctorCheck(True, "limits (no delegated cgroup)",
                                  "memory and cpus limits are refused; processes are limited per user id inside "
                                  "(RLIMIT_NPROC); a command's tree is its session. For every limit run under a "
                                  "systemd user session with a delegated cgroup v2 subtree: `systemd-run --user "
                                  "--scope -p Delegate=yes hermes-sandboxes ...`"))
    if backend.base:
        checks.append(DoctorCheck(True, "base root filesystem (setting base)", backend.base))
    return checks


def run_checks(backend: LocalBackend) -> list[DoctorCheck]:
    if backend.rootless:
        checks = _rootless_checks(backend)
    else:
        checks = [DoctorCheck(True, "running as root", "yes (rootful mode: each sandbox's root is a block of "
                                                       "host ids of its own)")]
    ns = [n for n in ("mnt", "pid", "uts", "ipc", "net", "cgroup") if not Path(f"/proc/self/ns/{n}").exists()]
    checks.append(DoctorCheck(not ns, "namespaces (mount, pid, uts, ipc, net, cgroup)",
                              "available" if not ns else f"missing: {', '.join(ns)}"))
    fs = _filesystems()
    checks.append(DoctorCheck("overlay" in fs, "overlayfs", "available" if "overlay" in fs
                              else "not in /proc/filesystems (modprobe overlay)"))
    if not backend.rootless:
        checks += _cgroup_checks()
    seccomp = syscall_filter.unavailable_reason()
    checks.append(DoctorCheck(seccomp is None, "syscall filter (seccomp via libseccomp)",
                              "available" if seccomp is None else seccomp))
    mkfs = shutil.which("mkfs.btrfs")
    if not backend.rootless:
        checks.append(DoctorCheck(bool(mkfs), "btrfs-progs (constant-time checkpoints)",
                                  mkfs or "mkfs.btrfs not found: apt-get install btrfs-progs"))
    from hermes_sandboxes.backends.local.backend import NO_BASE  # loaded: it called us

    reason = backend.unavailable_reason()
    if reason is None or (backend.rootless and reason == NO_BASE):  # the store is there: say what it is
        try:  # read-only: a store not made yet is described, never created (nor mounted)
            planned = backend.store_preview()
            if planned is not None:
                kind, detail = planned
                checks.append(DoctorCheck(True, "sandbox store", detail))
                checks.append(_disk_limit_check(kind))
            else:
                store = backend.describable_store()
                checks.append(DoctorCheck(True, "sandbox store", f"{store.kind} at {store.root}: {store.description}"))
                checks.append(_disk_limit_check(store.kind) if not store.rootless else _rootless_disk_check(store))
            if backend.rootless and not backend.base:
                checks.append(_rootless_base_check())  # the one failure when it is missing, with its fix
        except Exception as exc:  # doctor reports, it never raises
            checks.append(DoctorCheck(False, "sandbox store", str(exc)))
    else:
        checks.append(DoctorCheck(False, "local sandboxes usable", reason))
    return checks
