"""Whether a process that wrote something down is still alive: written-ahead records and the CLI's
``run`` owners name their writer by pid, start time and boot.

A pid alone is not enough: the kernel reuses pids, so a record also keeps the process's start time
(from /proc) and the boot it ran in (``/proc/sys/kernel/random/boot_id``), and a process counts as
the writer only if all three match. A record from another boot, or one whose start time is unknown,
names a process that is gone. Standard library only: this is on the hot path of every command.
"""

from __future__ import annotations

import os

from hermes_sandboxes.util.values import dataclass

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hot path of a CLI exec)
if TYPE_CHECKING:
    from typing import Any

_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or None
    when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()
    return fields[19].decode()  # field 22 counts from 1 and includes pid and comm, cut above


class _Cache:
    boot: str | None = None
    boot_read = False
    me: ProcessIdentity | None = None


def boot_id() -> str | None:
    if not _Cache.boot_read:
        try:
            with open(_BOOT_ID, encoding="ascii") as f:
                _Cache.boot = f.read().strip() or None
        except OSError:
            _Cache.boot = None
        _Cache.boot_read = True
    return _Cache.boot


@dataclass(frozen=True)
class ProcessIdentity:
    """One process of one boot: ``pid``, its ``start`` time and the ``boot`` it ran in."""

    pid: int
    start: str | None
    boot: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "start": self.start, "boot": self.boot}

    @classmethod
    def from_dict(cls, data: Any) -> ProcessIdentity | None:
        """The identity ``data`` describes, or None when it does not describe one."""
        if not isinstance(data, dict):
            return None
        pid, start, boot = data.get("pid"), data.get("start"), data.get("boot")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            return None
        if not isinstance(start, str | None) or not isinstance(boot, str | None):
            return None
        return cls(pid, start, boot)


def current() -> ProcessIdentity:
    """This process (computed once per process; a forked child computes its own)."""
    me = _Cache.me
    if me is None or me.pid != os.getpid():
        pid = os.getpid()
        me = _Cache.me = ProcessIdentity(pid, start_time(pid), boot_id())
    return me


def alive(identity: ProcessIdentity) -> bool:
    """Whether that very process still runs on this machine (False when we cannot tell it apart
    from a process that reused its pid)."""
    if identity.start is None:
        return False
    if identity.boot is not None and identity.boot != boot_id():
        return False
    return start_time(identity.pid) == identity.start
