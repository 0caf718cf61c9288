"""The cgroup hierarchies mounted on this host, and where this process sits in each.

A v1 hierarchy is keyed by the names /proc/self/cgroup gives it: its controllers joined by commas
("memory", "cpu,cpuacct") or its name ("name=systemd"). The unified (v2) hierarchy is "unified",
whether it holds every controller (a v2 host) or none but a few (the hybrid layout of this
machine kind).
"""

from __future__ import annotations

from pathlib import Path

from hermes_sandboxes.util.values import dataclass

UNIFIED = "unified"


@dataclass(frozen=True)
class Hierarchy:
    key: str
    mount: Path  # where it is mounted
    own: str  # the group this process is in, relative to the mount's root ("" for the root)

    @property
    def version(self) -> int:
        return 2 if self.key == UNIFIED else 1

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.key.split(",")) if self.version == 1 else frozenset()

    def own_dir(self) -> Path:
        return self.mount / self.own


def _own_groups(text: str) -> dict[str, str]:
    """/proc/self/cgroup: hierarchy key -> our group's path (from the hierarchy's root)."""
    groups: dict[str, str] = {}
    for line in text.splitlines():
        hierarchy_id, names, path = line.split(":", 2)
        groups[UNIFIED if hierarchy_id == "0" and not names else names] = path
    return groups


def _relative(path: str, mount_root: str) -> str:
    """Our group's path relative to a mount that may show only a subtree (a container's view)."""
    if mount_root != "/" and (path == mount_root or path.startswith(mount_root + "/")):
        path = path[len(mount_root):]
    return path.strip("/")


def parse(mountinfo: str, own_cgroup: str) -> list[Hierarchy]:
    """Every mounted hierarchy once (the first mount of each), v1 ones first."""
    own = _own_groups(own_cgroup)
    found: dict[str, Hierarchy] = {}
    for line in mountinfo.splitlines():
        pre, _, post = line.partition(" - ")
        fields, before = post.split(), pre.split()
        if len(fields) < 3 or len(before) < 5 or fields[0] not in ("cgroup", "cgroup2"):
            continue
        if fields[0] == "cgroup2":
            key: str | None = UNIFIED
        else:
            options = set(fields[2].split(","))
            key = next((k for k in own if k != UNIFIED and set(k.split(",")) <= options), None)
        if key is None or key in found or key not in own:
            continue
        found[key] = Hierarchy(key, Path(before[4]), _relative(own[key], before[3]))
    return sorted(found.values(), key=lambda h: (h.version, h.key))


def discover() -> list[Hierarchy]:
    try:
        with open("/proc/self/mountinfo") as f:
            mountinfo = f.read()
        with open("/proc/self/cgroup") as f:
            own_cgroup = f.read()
    except OSError:
        return []
    return parse(mountinfo, own_cgroup)


def find(hierarchies: list[Hierarchy], controller: str) -> Hierarchy | None:
    """The hierarchy that holds ``controller`` (v1), if any."""
    return next((h for h in hierarchies if controller in h.names), None)
