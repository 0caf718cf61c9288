"""The automatic checkpoint before a command: whether the policy wants one, and whether the last
one can serve again.

An automatic checkpoint is not taken again when the sandbox has not changed since the checkpoint
it grew from (``Sandbox.changed_since`` answers False, or True but the diff holds only the agent
framework's scratch files, as ``Hooks.scratch`` tells them): that one is reused, so a stream of
commands that change nothing adds no checkpoints. None (cannot tell) takes a new one. Fail-closed:
the caller does not run the command when the checkpoint cannot be taken.
"""

from __future__ import annotations

from collections.abc import Callable

from hermes_sandboxes.errors import SandboxError
from hermes_sandboxes.risk import RiskVerdict
from hermes_sandboxes.sandbox import Capability, Sandbox


def comment(command: str, verdict: RiskVerdict, limit: int = 80) -> str:
    """The automatic checkpoint's comment: the command (on one line, shortened) and why."""
    line = " ".join(command.split())
    short = line if len(line) <= limit else line[: limit - 1] + "…"
    why = f" ({', '.join(verdict.reasons)})" if verdict.reasons else ""
    return f"before: {short}{why}"


def unchanged_since(sandbox: Sandbox, base: str | None, scratch: Callable[[str], bool]) -> bool:
    """Whether ``sandbox`` is known unchanged since checkpoint ``base`` but for scratch files (False
    when it changed, when there is no base, or when the backend cannot tell: take a new one)."""
    if base is None:
        return False
    try:
        changed = sandbox.changed_since(base)
        if changed is None:
            return False
        if not changed:
            return True
        # A store that answers cheaply also diffs in proportion to the change: look at what it was.
        if Capability.DIFF not in sandbox.backend.capabilities:
            return False
        return all(scratch(c.path) for c in sandbox.diff(base))
    except SandboxError:  # gone, or the backend cannot say: a new checkpoint is the safe answer
        return False
