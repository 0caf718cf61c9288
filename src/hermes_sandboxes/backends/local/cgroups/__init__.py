"""Per-sandbox control groups, on cgroup v1 or v2, chosen at run time.

A host with the v1 freezer controller mounted uses v1 (every v1 hierarchy, plus the cgroup2
mount of a hybrid host); otherwise the unified (v2) hierarchy is used. ``probe`` says which, and
what is missing, for ``doctor`` and for the backend's availability check; it creates nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

from hermes_sandboxes.backends.local.cgroups import groupfs, hierarchies
from hermes_sandboxes.backends.local.cgroups.base import (
    BOX,
    BOXES,
    PARENT_PREFIX,
    SandboxCgroups,
    ceiling,
    next_box,
    store_dir_name,
)
from hermes_sandboxes.backends.local.cgroups.groupfs import freeze, is_frozen, kill_group, procs, remove_tree, thaw
from hermes_sandboxes.backends.local.cgroups.hierarchies import UNIFIED, Hierarchy
from hermes_sandboxes.backends.local.cgroups.none import NoCgroups, ask_init
from hermes_sandboxes.backends.local.cgroups.v1 import V1Cgroups
from hermes_sandboxes.backends.local.cgroups.v2 import LIMIT_CONTROLLERS, V2Cgroups
from hermes_sandboxes.errors import BackendUnavailable
from hermes_sandboxes.util.values import dataclass, field

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hot path of a CLI exec)
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "BOX",
    "BOXES",
    "LIMIT_CONTROLLERS",
    "PARENT_PREFIX",
    "NoCgroups",
    "Probe",
    "SandboxCgroups",
    "ask_init",
    "ceiling",
    "for_sandbox",
    "freeze",
    "from_state",
    "is_frozen",
    "kill_group",
    "next_box",
    "probe",
    "procs",
    "remove_tree",
    "store_dir_name",
    "store_groups",
    "thaw",
]

_V2_FREEZE = (5, 2)  # cgroup.freeze
_V2_KILL = (5, 14)  # cgroup.kill


@dataclass()
class Probe:
    """What this host offers: the version in use, the hierarchies a sandbox joins (and the
    directory its store's groups go under in each), the limit controllers, and problems."""

    version: int | None
    bases: dict[str, Path] = field(default_factory=dict)  # hierarchy key -> where store groups go
    limits: dict[str, Path] = field(default_factory=dict)  # limit controller -> hierarchy base
    fatal: list[str] = field(default_factory=list)  # without these, no sandbox can run
    missing: list[str] = field(default_factory=list)  # these weaken a sandbox (no limit, a hierarchy not joined)
    notes: list[str] = field(default_factory=list)


def _kernel() -> tuple[int, int]:
    parts = os.uname().release.split(".")
    try:
        return int(parts[0]), int(parts[1].split("-")[0])
    except (IndexError, ValueError):
        return (0, 0)


def _usable(base: Path) -> bool:
    """Whether store groups can go under ``base`` (looked at, never created)."""
    return base.is_dir() and os.access(base, os.W_OK)


def _probe_v1(found: list[Hierarchy], result: Probe) -> None:
    for h in found:
        base = h.own_dir()
        if _usable(base):
            result.bases[h.key] = base
        elif "freezer" in h.names:
            result.fatal.append(f"cannot create cgroups under {base} (freezer hierarchy)")
        else:
            result.missing.append(f"cannot join the {h.key} hierarchy: {base} is not writable")
    for controller in LIMIT_CONTROLLERS:
        holder = hierarchies.find(found, controller)
        if holder is None:
            result.missing.append(f"cgroup v1 '{controller}' controller is not mounted: no {controller} limit")
        elif holder.key in result.bases:
            result.limits[controller] = result.bases[holder.key]


HOST_LEAF = "hermes-sandboxes-host"  # where a delegated group's own processes move (see leave_delegated_root)


def delegated(h: Hierarchy, uid: int | None = None) -> Path | None:
    """Rootless on cgroup v2: the group this process is in, if it is delegated to this user (owned
    by it, with cgroup.procs and cgroup.subtree_control writable), as systemd does for a unit with
    Delegate=yes (`systemd-run --user --scope -p Delegate=yes ...`) or root by chown of a subtree.
    A group that is our own leaf (HOST_LEAF) stands for its parent."""
    own = h.own_dir()
    if own.name == HOST_LEAF:
        own = own.parent
    uid = os.geteuid() if uid is None else uid
    try:
        if own.stat().st_uid != uid:
            return None
    except OSError:
        return None
    writable = all(os.access(own / f, os.W_OK) for f in ("cgroup.procs", "cgroup.subtree_control"))
    return own if writable and os.access(own, os.W_OK) else None


def leave_delegated_root(base: Path) -> None:
    """Move the processes of the delegated group ``base`` into a leaf of their own: a group with
    processes cannot hand controllers to its children (cgroup v2's no-internal-process rule)."""
    pids = groupfs.read(base / "cgroup.procs").split()
    if not pids:
        return
    leaf = base / HOST_LEAF
    leaf.mkdir(exist_ok=True)
    for pid in pids:
        try:
            groupfs.write(leaf / "cgroup.procs", pid)
        except ProcessLookupError:
            continue  # exited meanwhile


def _probe_v2(h: Hierarchy, result: Probe) -> None:
    # At the top: a group with processes of its own cannot hand out controllers. Rootless: the
    # group delegated to this user, whose processes leave_delegated_root moves into a leaf.
    found = h.mount if os.geteuid() == 0 else delegated(h)
    if found is None:
        result.fatal.append(f"no cgroup v2 group is delegated to uid {os.geteuid()} ({h.own_dir()} is not its own)")
        return
    base = found
    if not _usable(base):
        result.fatal.append(f"cannot create cgroups under {base} (cgroup2)")
        return
    result.bases[h.key] = base
    if _kernel() < _V2_FREEZE:
        result.fatal.append("this kernel has no cgroup.freeze (Linux 5.2 or later needed)")
    if _kernel() < _V2_KILL:
        result.notes.append("no cgroup.kill before Linux 5.14: trees are killed by freezing and signalling")
    try:
        available = set((base / "cgroup.controllers").read_text().split())
    except OSError:
        available = set()
    for controller in LIMIT_CONTROLLERS:
        if controller in available:
            result.limits[controller] = base
        else:
            result.missing.append(f"cgroup v2 '{controller}' controller is not available at {base}: "
                                  f"no {controller} limit")


def probe(found: list[Hierarchy] | None = None) -> Probe:
    found = hierarchies.discover() if found is None else found
    if hierarchies.find(found, "freezer") is not None:
        result = Probe(version=1)
        _probe_v1(found, result)
        return result
    unified = next((h for h in found if h.key == UNIFIED), None)
    if unified is None:
        return Probe(version=None, fatal=["no cgroup hierarchy is mounted (neither the v1 freezer nor cgroup2)"])
    result = Probe(version=2)
    _probe_v2(unified, result)
    return result


def for_sandbox(home: Path, name: str) -> SandboxCgroups:
    """The groups sandbox ``name`` of the store at ``home`` gets on this host."""
    found = probe()
    if (found.fatal or found.version is None) and os.geteuid() != 0:
        return NoCgroups.of(home, name)  # rootless without a delegated cgroup
    if found.fatal or found.version is None:
        raise BackendUnavailable("local sandboxes need cgroups: " + "; ".join(found.fatal))
    parent = store_dir_name(home)
    dirs = {key: str(base / parent / name) for key, base in found.bases.items()}
    if found.version == 2 and os.geteuid() != 0:
        leave_delegated_root(found.bases[UNIFIED])
    return V1Cgroups(dirs) if found.version == 1 else V2Cgroups(dirs)


def from_state(state: Any) -> SandboxCgroups:
    """The groups recorded for a running init (``SandboxCgroups.to_state``)."""
    if isinstance(state, dict) and "version" in state:
        box = str(state.get("box") or BOX)
        if state["version"] == 0:
            return NoCgroups(state["dirs"], box)
        return V2Cgroups(state["dirs"], box) if state["version"] == 2 else V1Cgroups(state["dirs"], box)
    return V1Cgroups(state)  # recorded by an older version: v1 controller -> directory


def store_groups(home: Path) -> list[Path]:
    """The shared parent groups of the store at ``home`` that exist now, in every hierarchy."""
    parent = store_dir_name(home)
    return [base / parent for base in probe().bases.values() if (base / parent).is_dir()]
