"""How the init turns an exec request into a program to run, shared by its two ways of starting a
command (a posix_spawn child of the init, or the pre-positioned stub of stub.py): the same argv,
environment, working directory and PATH lookup, the same messages and exit codes when it cannot
start (as a shell: 126 found but cannot be run, 127 not found).

Kept to the standard library: it is part of the init.
"""

from __future__ import annotations

import os
import signal

TYPE_CHECKING = False  # typing is not imported at run time: it slows the init's start
if TYPE_CHECKING:
    from typing import Any

# Signals a command gets back at their default disposition (the init ignores or handles them).
DEFAULT_SIGNALS = frozenset({signal.SIGCHLD, signal.SIGPIPE, signal.SIGINT, signal.SIGTERM, signal.SIGHUP,
                             signal.SIGQUIT, signal.SIGXFSZ, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU})


class CannotStart(Exception):
    """The command cannot start: ``message`` goes to its stderr and ``code`` is its exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.message, self.code = message, code


def command_line(message: dict[str, Any]) -> tuple[list[str], dict[str, str], str]:
    """The request's argv (a shell line runs under bash, else sh), environment and directory."""
    env = {str(k): str(v) for k, v in (message.get("env") or {}).items()}
    shell = message.get("shell")
    if shell is not None:
        argv = ["/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh", "-c", str(shell)]
    else:
        argv = [str(a) for a in message.get("argv") or []]
    if not argv:
        raise CannotStart("hermes-sandboxes: empty command", 127)
    return argv, env, str(message.get("cwd") or "/root")


def resolve(program: str, env: dict[str, str]) -> tuple[str | None, int]:
    """The command's PATH lookup, done with the command's PATH (posix_spawnp would use ours), as a
    shell does it: the first executable match, else 126 if only non-executable files matched,
    else 127."""
    candidates = [program] if "/" in program else [
        os.path.join(directory or ".", program) for directory in env.get("PATH", "/usr/bin:/bin").split(":")]
    found = False
    for candidate in candidates:
        if os.path.isfile(candidate):
            if os.access(candidate, os.X_OK):
                return candidate, 0
            found = True
    return None, 126 if found else 127


def enter(cwd: str, argv: list[str], env: dict[str, str]) -> str:
    """Change into the command's directory, then find its program (a relative PATH entry is
    relative to that directory). The caller changes back if it is the init."""
    try:
        os.chdir(cwd)
    except OSError as exc:
        # 126, as a shell says "found but cannot be run": distinct from the command's own failures
        raise CannotStart(f"hermes-sandboxes: cannot use {cwd} as working directory: {exc.strerror}", 126) from None
    path, code = resolve(argv[0], env)
    if path is None:
        raise CannotStart(f"{argv[0]}: {'Permission denied' if code == 126 else 'command not found'}", code)
    return path
