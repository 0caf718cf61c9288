"""Store work done as root of a user namespace mapped as a rootless sandbox is.

A rootless sandbox's files are owned by the ids its user namespace maps: inner root is the user,
inner 1.. are the user's first ``/etc/subuid`` block (what ``unshare --map-auto --map-root-user``
and rootless Podman make). The host user cannot read a directory that inner ``_apt`` made 0700,
nor delete what inner users own, nor give a file an inner owner. So copying, removing, walking and
unpacking a rootless layer runs in a user namespace of its own with the same mapping: there, the
process is root over every id the layer can hold, and ownership passes through unchanged.

Root (the root-mode store) needs none of this: every function here runs the work directly then.
"""

from __future__ import annotations

import os
import pickle
import pwd
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from hermes_sandboxes.backends.local.guest import syscalls as sc
from hermes_sandboxes.errors import SandboxError

_CLONE_NEWUSER = 0x10000000
_SUBID_MAX = 65535  # inner ids 1..65535: what a Debian root uses (nobody is 65534)
T = TypeVar("T")


@dataclass(frozen=True)
class IdMap:
    """Inner 0 is ``uid``/``gid``; inner 1..count are ``sub_uid``.. / ``sub_gid``.. (count 0: none)."""

    uid: int
    gid: int
    sub_uid: int
    sub_gid: int
    count: int

    def uid_lines(self) -> list[str]:
        return [f"0 {self.uid} 1", *([f"1 {self.sub_uid} {self.count}"] if self.count else [])]

    def gid_lines(self) -> list[str]:
        return [f"0 {self.gid} 1", *([f"1 {self.sub_gid} {self.count}"] if self.count else [])]


def _first_block(path: str, name: str, ident: int) -> tuple[int, int] | None:
    """The user's first subordinate id block in ``path`` (``name:start:count`` or ``uid:start:count``)."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.strip().split(":")
        if len(fields) == 3 and fields[0] in (name, str(ident)) and fields[1].isdigit() and fields[2].isdigit():
            return int(fields[1]), int(fields[2])
    return None


def current() -> IdMap:
    """The mapping of this user's rootless sandboxes (without a subordinate block: inner root only)."""
    uid, gid = os.getuid(), os.getgid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    users, groups = _first_block("/etc/subuid", name, uid), _first_block("/etc/subgid", name, uid)
    if users is None or groups is None:
        return IdMap(uid, gid, 0, 0, 0)
    count = min(users[1], groups[1], _SUBID_MAX)
    return IdMap(uid, gid, users[0], groups[0], count)


def needed() -> bool:
    """Whether store work must go through a user namespace (it does unless we are root)."""
    return os.geteuid() != 0


def _write_maps(pid: int, ids: IdMap) -> None:
    """Map the child ``pid``'s new namespace: newuidmap/newgidmap for a subordinate block (setuid
    helpers that check /etc/subuid), else the user's own ids, which a user may map unaided."""
    if ids.count:
        for tool, lines in (("newuidmap", ids.uid_lines()), ("newgidmap", ids.gid_lines())):
            argv = [tool, str(pid), *" ".join(lines).split()]
            proc = subprocess.run(argv, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SandboxError(f"{tool} failed: {proc.stderr.strip() or proc.returncode} "
                                   "(install uidmap: apt-get install uidmap)")
        return
    with open(f"/proc/{pid}/setgroups", "w") as f:
        f.write("deny")
    for kind, lines in (("uid_map", ids.uid_lines()), ("gid_map", ids.gid_lines())):
        with open(f"/proc/{pid}/{kind}", "w") as f:
            f.write("\n".join(lines) + "\n")


def call(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` as root of a fresh user namespace with this user's mapping (directly when we
    are root). Arguments and result travel by pickle; an exception raised inside is raised here."""
    if not needed():
        return fn(*args)
    ids = current()
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through out_w only
        _child(fn, args, ready_w, go_r, out_w, (ready_r, go_w, out_r))
    for fd in (ready_w, go_r, out_w):
        os.close(fd)
    try:
        os.read(ready_r, 1)
        try:
            _write_maps(pid, ids)
        finally:
            os.write(go_w, b"g")
        data = bytearray()
        while chunk := os.read(out_r, 1 << 16):
            data += chunk
    finally:
        for fd in (ready_r, go_w, out_r):
            os.close(fd)
        _, status = os.waitpid(pid, 0)
    if not data:
        raise SandboxError(f"store work in a user namespace died (wait status {status})")
    ok, value = pickle.loads(bytes(data))
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def _child(fn: Callable[..., Any], args: tuple[Any, ...], ready_w: int, go_r: int, out_w: int,
           theirs: tuple[int, ...]) -> None:
    code = 0
    try:
        for fd in theirs:
            os.close(fd)
        sc.unshare(_CLONE_NEWUSER)
        os.write(ready_w, b"r")
        os.read(go_r, 1)
        try:
            payload = pickle.dumps((True, fn(*args)))
        except BaseException as exc:
            payload = pickle.dumps((False, _portable(exc)))
        view = memoryview(payload)
        while view:
            view = view[os.write(out_w, view):]
    except BaseException:
        code = 1
    os._exit(code)


def _portable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return SandboxError(f"{type(exc).__name__}: {exc}")


def run(argv: list[str], what: str) -> None:
    """Run ``argv`` as the namespace's root (directly when we are root); SandboxError on failure."""
    call(_run_checked, argv, what)


def _run_checked(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        last = detail[-1] if detail else f"exit {proc.returncode}"
        if len(last) > 400:
            last = f"{last[:150]} ... {last[-150:]}"
        raise SandboxError(f"{what} failed: {last}")
