"""A command's tree without cgroups (rootless, no delegated cgroup): its session, as the init sees it.

Each command starts a session of its own (setsid), so everything it starts shares its session id
unless it makes another one: ``kill`` ends that session (what a detached ``setsid`` daemon started
is beyond it: only a cgroup holds every process, which is why TREE_KILL is not declared without
one). ``freeze`` stops every process of the sandbox but the init (kill -1 from PID 1 of a pid
namespace reaches all of them) and waits until each is stopped; ``thaw`` lets them run again.

Part of the init: standard library only.
"""

from __future__ import annotations

import os
import signal
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Container
    from typing import Any

FREEZE_TIMEOUT_S = 5.0
_KEPT = 4096  # exec ids remembered after their command ended (their background jobs may live on)


def _stat(pid: str) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _members(session: int) -> list[int]:
    """Live processes of ``session`` (field 6 of /proc/PID/stat), the init excepted."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or name == "1":
            continue
        fields = _stat(name)
        if fields is not None and fields[0] not in ("Z", "X") and int(fields[3]) == session:
            found.append(int(name))
    return found


def kill_session(session: int) -> int:
    """SIGKILL every process of ``session``, until none is left (a fork may race the first pass)."""
    killed = 0
    for _ in range(100):
        members = _members(session)
        if not members:
            break
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed


def _all_stopped() -> bool:
    for name in os.listdir("/proc"):
        if name.isdigit() and name != "1":
            fields = _stat(name)
            if fields is not None and fields[0] not in ("T", "t", "Z", "X"):
                return False
    return True


def _signal_all(sig: int) -> None:
    try:  # noqa: SIM105 - contextlib would cost the init start-up time
        os.kill(-1, sig)
    except ProcessLookupError:
        pass  # nothing runs but the init


def freeze() -> dict[str, Any]:
    _signal_all(signal.SIGSTOP)
    deadline = time.monotonic() + FREEZE_TIMEOUT_S
    while not _all_stopped():
        if time.monotonic() > deadline:
            _signal_all(signal.SIGCONT)
            return {"error": f"the sandbox's processes did not all stop within {FREEZE_TIMEOUT_S:.0f} s"}
        _signal_all(signal.SIGSTOP)  # started since the first pass
        time.sleep(0.0005)
    return {"ok": True}


def remember(sessions: dict[str, int], exec_id: str, pid: int) -> None:
    sessions[exec_id] = pid
    while len(sessions) > _KEPT:
        del sessions[next(iter(sessions))]


def handle(op: str, message: dict[str, Any], sessions: dict[str, int], live: Container[int]) -> dict[str, Any]:
    """``live``: the init's children not reaped yet (a file helper runs in the init's session, so
    it is killed by its pid, which cannot have been reused while it is unreaped)."""
    if op == "freeze":
        return freeze()
    if op == "thaw":
        _signal_all(signal.SIGCONT)
        return {"ok": True}
    session = sessions.get(str(message.get("id", "")))
    if not session:
        return {"killed": 0}
    killed = 0
    if session in live:
        try:
            os.kill(session, signal.SIGKILL)
            killed += 1
        except ProcessLookupError:
            pass
    return {"killed": killed + kill_session(session)}
