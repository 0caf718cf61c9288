"""A command whose recording process died before it ended (kill -9, a crash): stopped inside the
sandbox, then recorded as lost.

A command is written ahead with the tag the backend runs it under (``ExecStartRecord.tag``, where
the backend has ``Capability.KILL_TAGGED``). When a later call settles it, ``end_of_lost`` first
kills that very command inside if it still runs (``Sandbox.kill_tagged``: the tag names one command
and never another, whatever pids the sandbox reuses), then says in its end what became of it:

- stopped by the later call (``killed``: it was still running when it was settled);
- already over (it ended inside while nobody was recording it; how, we cannot know);
- may have run on (it was started without a tag, by an older version or on a backend that cannot
  kill by tag).

Its exit code is unknown in every case (``lost``). When the sandbox cannot be reached to stop it,
nothing is recorded: the command stays open, shown as lost, and the next call tries again.
"""

from __future__ import annotations

from hermes_sandboxes.errors import SandboxError, SandboxNotFound, Unsupported
from hermes_sandboxes.recorder.records import (
    ExecRecord,
    ExecStartRecord,
)
from hermes_sandboxes.sandbox import Capability, Sandbox


def why_lost(start: ExecStartRecord) -> str:
    pid = start.owner.pid if start.owner is not None else "?"
    return f"lost: the process recording it (pid {pid}) died before it ended"


def end_of_lost(sandbox: Sandbox, start: ExecStartRecord) -> ExecRecord | None:
    """The end to record for ``start``, whose recording process died, once the command is no longer
    running inside: killed now if it still ran. None when that cannot be done now (the sandbox is
    unreachable): record nothing, a later call tries again."""
    why = why_lost(start)
    untraceable = start.ended(lost=True, error=f"{why}; it may have run on in the sandbox")
    if start.tag is None or Capability.KILL_TAGGED not in sandbox.backend.capabilities:
        return untraceable
    try:
        killed = sandbox.kill_tagged(start.tag)
    except SandboxNotFound:
        killed = False  # the sandbox is gone, and all that ran in it
    except Unsupported:
        return untraceable
    except SandboxError:
        return None
    if killed:
        return start.ended(lost=True, killed=True, error=f"{why}; a later call stopped it in the sandbox")
    return start.ended(lost=True, error=f"{why}; it had ended in the sandbox when a later call looked")
