"""What the tests of the warm exec path share: starting this run's server, finding it, stopping it.

The session (conftest.py) points ``XDG_RUNTIME_DIR`` at a throw-away directory, so every CLI a test
starts talks to servers of this run only, and stops them at the end by the pids they recorded,
after checking that each pid is one of our servers.

A server found here is a ``ServerPid``: its pid with its start time (/proc/PID/stat field 22), so
that a pid the kernel gave again (the suite forks a lot, pid_max may be 32768), even to another
server of ours, is not taken for it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from hermes_sandboxes.cli.fastpath import warm

SWITCH = warm.SWITCH
WARM_OFF = {SWITCH: "0"}
_SERVER_MARK = b"hermes_sandboxes.cli.fastpath.server"


def runtime_dir(env: dict[str, str] | None = None) -> Path:
    return Path((env or os.environ)["XDG_RUNTIME_DIR"]) / "hermes-sandboxes"


def key(env: dict[str, str] | None = None) -> str:
    """The key of the server a ``python -m hermes_sandboxes.cli`` with ``env`` talks to."""
    done = subprocess.run([sys.executable, "-c", "from hermes_sandboxes.cli.fastpath import warm; "
                           "print(warm.key_of(warm.stamp()))"], env=env, capture_output=True, text=True,
                          check=True, timeout=60)
    return done.stdout.strip()


class ServerPid(int):
    """A server's pid that knows when that server started (clock ticks after boot)."""

    started: int

    def __new__(cls, pid: int, started: int) -> ServerPid:
        self = super().__new__(cls, pid)
        self.started = started
        return self


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (None: no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2:].split()[22 - 3])


def server_at(pid: int) -> ServerPid | None:
    """``pid`` as the server that runs under it now, if a server does."""
    started = start_time(pid)
    if started is None:
        return None
    server = ServerPid(pid, started)
    return server if is_server(server) else None


def server_pid(env: dict[str, str] | None = None) -> ServerPid | None:
    """The live server's pid for ``env``, if one runs."""
    pidfile = runtime_dir(env) / f"{key(env)}.pid"
    try:
        pid = int(pidfile.read_text())
    except (OSError, ValueError):
        return None
    return server_at(pid)


def is_server(pid: int) -> bool:
    """A live server (its workers, forked from it, share its command line but not its session);
    for a ``ServerPid``, the very one that started then, not whoever got its pid since."""
    try:
        if _SERVER_MARK not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return False
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    fields = stat[stat.rindex(b")") + 2:].split()
    if isinstance(pid, ServerPid) and int(fields[22 - 3]) != pid.started:
        return False
    state, _ppid, _pgrp, session = fields[:4]
    return state != b"Z" and int(session) == pid


def answers(env: dict[str, str] | None = None) -> bool:
    path = runtime_dir(env) / f"{key(env)}.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


def start(env: dict[str, str] | None = None, timeout: float = 60) -> ServerPid:
    """Start the server for ``env`` (as a client that finds none does) and wait until it listens."""
    subprocess.run([sys.executable, "-c", "from hermes_sandboxes.cli.fastpath import warm; "
                    "warm.start_server(warm.key_of(warm.stamp()))"], env=env, check=True, timeout=60)
    return wait_for_server(env, timeout)


def wait_for_server(env: dict[str, str] | None = None, timeout: float = 60) -> ServerPid:
    deadline = time.monotonic() + timeout
    while (pid := server_pid(env)) is None:
        assert time.monotonic() < deadline, f"no warm exec server came up in {runtime_dir(env)}"
        time.sleep(0.02)
    return pid


def wait_gone(pid: int, timeout: float = 60) -> None:
    """Wait until server ``pid`` ended (a ``ServerPid``: that server, whoever has its pid since)."""
    deadline = time.monotonic() + timeout
    while is_server(pid):
        assert time.monotonic() < deadline, (
            f"server {pid} (started at tick {getattr(pid, 'started', '?')}, now {start_time(pid)}) still runs:\n"
            f"{where_it_is(pid)}")
        time.sleep(0.02)


def where_it_is(pid: int) -> str:
    """What a process that should have ended is doing: its state, signals and every thread's wait."""
    lines = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        try:
            status = {k: v.strip() for k, _, v in (line.partition(":") for line in
                      (task / "status").read_text().splitlines())}
            wchan = (task / "wchan").read_text()
            stack = (task / "stack").read_text().strip().replace("\n", " | ")
        except OSError as exc:
            lines.append(f"task {task.name}: {exc}")
            continue
        lines.append(f"task {task.name} {status.get('State')} wchan={wchan} SigPnd={status.get('SigPnd')} "
                     f"ShdPnd={status.get('ShdPnd')} SigBlk={status.get('SigBlk')} SigCgt={status.get('SigCgt')} "
                     f"stack: {stack}")
    return "\n".join(lines)


def stop_all(where: Path) -> None:
    """Stop every server that recorded its pid in ``where`` (ours only: checked by command line)."""
    for pidfile in where.glob("*.pid"):
        try:
            pid = server_at(int(pidfile.read_text()))
        except (OSError, ValueError):
            continue
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            try:
                wait_gone(pid, timeout=10)
            except AssertionError:
                os.kill(pid, signal.SIGKILL)


def servers_started_with(env: dict[str, str]) -> list[int]:
    """The live servers whose environment names ``env``'s runtime directory."""
    mark = f"XDG_RUNTIME_DIR={env['XDG_RUNTIME_DIR']}\0".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not is_server(int(entry.name)):
            continue
        try:
            if mark in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return not stat[stat.rindex(b")") + 2:].startswith(b"Z")


def children_of(pid: int) -> list[int]:
    """The live children of ``pid`` but its fork server (a warm server's workers)."""
    return [child for child in _children(pid, zombies=False) if not is_fork_server(child)]


FORK_SERVER_ARGV0 = b"hermes-sandboxes-init"  # (launcher.py; a sandbox's init inherits it too)


def is_fork_server(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == FORK_SERVER_ARGV0
    except OSError:
        return False


def fork_servers_of(pid: int) -> list[int]:
    """The live children of ``pid`` that are local fork servers."""
    return [child for child in _children(pid, zombies=False) if is_fork_server(child)]


def session_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return int(stat.rsplit(b")", 1)[1].split()[3])


def in_session(sid: int) -> list[int]:
    """The live processes of session ``sid``."""
    found = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_bytes().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != b"Z" and int(fields[3]) == sid:
            found.append(int(entry.parent.name))
    return found


def zombies_of(pid: int) -> list[int]:
    """The children of ``pid`` that ended and were not reaped."""
    return _children(pid, zombies=True)


def _children(pid: int, *, zombies: bool) -> list[int]:
    found = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_bytes().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if (fields[0] == b"Z") == zombies and int(fields[1]) == pid:
            found.append(int(entry.parent.name))
    return found


def owners(journal: Path) -> list[int]:
    """The pids that recorded each exec of a journal (the worker's, on the warm path)."""
    records = [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]
    return [r["owner"]["pid"] for r in records if r.get("type") == "exec_start"]
