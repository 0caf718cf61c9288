"""Commands are the OOM killer's first choice inside a sandbox, its init the last.

The memory limit covers the init too, and the kernel's OOM killer takes the biggest process: often
the init (a Python process), ahead of a command filling memory it does not hold itself, and the
whole sandbox went with it (the command then had no exit code, not its 137). Lowering the init's
score needs CAP_SYS_RESOURCE (absent in the sandbox's user namespace, and maybe from root itself);
raising a score needs nothing, and a child inherits its parent's score when it is made. So the init
raises its own score around every fork or spawn of a command, a stub or a file helper, and lowers
it back to 0 at once (back to where it was needs no right either). The init is not set below 0
where host root could (it has CAP_SYS_RESOURCE): a child inherits the lowest score its parent may
return to, so with the init at -1000 a command could write -1000 for itself and be exempt from
the OOM killer, the host's included; at 0 the init already loses to every command at 1000.

Once in its user namespace (and not dumpable) the init can no longer open its own oom_score_adj,
so it opens it once before, as host root: ``hold``; writes through that descriptor need no right.
"""

from __future__ import annotations

import os

COMMAND = b"1000"
INIT = b"0"
_fd = -1


def hold() -> None:
    """Open the init's own score for writing (while it still may)."""
    global _fd
    try:
        _fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        _fd = -1  # a kernel without it: nothing to adjust


def children_first(on: bool) -> None:
    """Give what the init makes next the commands' score (``on``), or the init's back."""
    if _fd >= 0:
        try:  # noqa: SIM105 - contextlib would cost the init start-up time
            os.pwrite(_fd, COMMAND if on else INIT, 0)
        except OSError:
            pass
