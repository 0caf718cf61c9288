"""Who a sandbox's root is on the host: the user namespace's id mapping, for both modes.

Rootless (a normal user runs it): Podman's mapping. Inner 0 is the user; inner 1.. is the user's
first block in /etc/subuid (/etc/subgid), so package managers that switch users work. Without a
block, inner 0 is the user alone (every other id shows as nobody inside). The kernel lets a user
write a one-line map of its own id; a map with a subordinate block is written by the setuid
``newuidmap``/``newgidmap`` (Debian's ``uidmap``).

Root mode: each sandbox runs as a range of ids no account uses (``ROOT_RANGE_BASE`` and up, one
block of ``RANGE_SIZE`` per sandbox, claimed in ``RANGE_CLAIMS``), so uid 0 inside is nobody
outside, and the kernel's per-user counters (inotify instances, POSIX message queue bytes, process
counts) are the sandbox's own, neither host root's nor another sandbox's. The layer keeps the ids it
always had on disk: the init reads and writes it through idmapped mounts (rootfs.py).

Kept to the standard library: the launcher (forked from the fork server) uses ``write_maps``.
"""

from __future__ import annotations

import os
import pwd
import signal
from pathlib import Path

from hermes_sandboxes.backends.local.guest import syscalls as sc
from hermes_sandboxes.util.values import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator

RANGE_SIZE = 65536
# Above what useradd hands out as subordinate ids (SUB_UID_MAX 600100000) and below the ids the
# kernel reserves (-1): 16384 blocks of 65536 from 2^30.
ROOT_RANGE_BASE = 1 << 30
ROOT_RANGE_SLOTS = 16384
RANGE_CLAIMS = Path("/var/lib/hermes-sandboxes-ids")
SUBUID, SUBGID = Path("/etc/subuid"), Path("/etc/subgid")

Line = tuple[int, int, int]  # (inner, outer, count), as /proc/PID/uid_map takes them


@dataclass(frozen=True)
class IdMap:
    """The uid and gid maps of one user namespace."""

    uids: tuple[Line, ...]
    gids: tuple[Line, ...]

    @property
    def inner_count(self) -> int:
        """How many inner ids (from 0) map to host ids."""
        return min(sum(c for _, _, c in self.uids), sum(c for _, _, c in self.gids))

    @property
    def full(self) -> bool:
        """More than the one id of the user: users such as apt's ``_apt`` exist inside."""
        return self.inner_count > 1

    def outer_uid(self, inner: int) -> int | None:
        return _outer(self.uids, inner)

    def outer_gid(self, inner: int) -> int | None:
        return _outer(self.gids, inner)

    def inner_ids(self, uid: int, gid: int) -> tuple[int, int]:
        """The ids inside for host ``uid`` and ``gid``; one the map lacks is kept (a host 0 in a
        rootless map: root of the base, which is inner 0)."""
        return _inner(self.uids, uid, uid), _inner(self.gids, gid, gid)

    def text(self, kind: str) -> str:
        lines = self.uids if kind == "uid" else self.gids
        return "".join(f"{i} {o} {c}\n" for i, o, c in lines)


def _inner(lines: tuple[Line, ...], outer: int, unmapped: int) -> int:
    for start, first, count in lines:
        if first <= outer < first + count:
            return start + outer - first
    return unmapped


def _outer(lines: tuple[Line, ...], inner: int) -> int | None:
    for start, outer, count in lines:
        if start <= inner < start + count:
            return outer + inner - start
    return None


def subordinate_block(path: Path, name: str, uid: int) -> tuple[int, int] | None:
    """The first (start, count) block of ``path`` (/etc/subuid format) for the user, by name or id."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        fields = line.strip().split(":")
        if len(fields) != 3 or fields[0] not in (name, str(uid)):
            continue
        try:
            start, count = int(fields[1]), int(fields[2])
        except ValueError:
            continue
        if count > 0:
            return start, count
    return None


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _which(name: str) -> str | None:
    """``shutil.which`` without importing shutil (a launcher, forked per start, would import it)."""
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return None


def newidmap_tools() -> tuple[str, str] | None:
    """Paths of newuidmap and newgidmap, if both are installed."""
    uid_tool, gid_tool = _which("newuidmap"), _which("newgidmap")
    return (uid_tool, gid_tool) if uid_tool and gid_tool else None


def rootless_map(uid: int | None = None, gid: int | None = None) -> IdMap:
    """The mapping of a rootless sandbox of the user ``uid`` (default: this process's)."""
    uid = os.getuid() if uid is None else uid
    gid = os.getgid() if gid is None else gid
    name = _user_name(uid)
    uids: list[Line] = [(0, uid, 1)]
    gids: list[Line] = [(0, gid, 1)]
    sub_u, sub_g = subordinate_block(SUBUID, name, uid), subordinate_block(SUBGID, name, uid)
    if sub_u and sub_g and newidmap_tools():
        count = min(sub_u[1], sub_g[1], RANGE_SIZE - 1)
        uids.append((1, sub_u[0], count))
        gids.append((1, sub_g[0], count))
    return IdMap(tuple(uids), tuple(gids))


def root_range_map(slot: int) -> IdMap:
    """Root mode: inner 0..RANGE_SIZE-1 to the block of ``slot``."""
    start = ROOT_RANGE_BASE + slot * RANGE_SIZE
    return IdMap(((0, start, RANGE_SIZE),), ((0, start, RANGE_SIZE),))


def _claim_key(home: Path, name: str) -> str:
    return f"{Path(home).resolve()}\0{name}"


def _candidates(key: str) -> Iterator[int]:
    import hashlib

    first = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % ROOT_RANGE_SLOTS
    for i in range(ROOT_RANGE_SLOTS):
        yield (first + i) % ROOT_RANGE_SLOTS


def claim_slot(home: Path, name: str, claims: Path = RANGE_CLAIMS) -> int:
    """The block of ids of sandbox ``name`` of the store at ``home``: the same every time, and no
    other sandbox's. Claims are files named by slot holding their owner (created with O_EXCL)."""
    key = _claim_key(home, name).encode()
    claims.mkdir(mode=0o700, parents=True, exist_ok=True)
    for slot in _candidates(key.decode()):
        path = claims / str(slot)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            try:
                if path.read_bytes() == key:
                    return slot
            except OSError:
                pass
            continue
        try:
            os.write(fd, key)
        finally:
            os.close(fd)
        return slot
    raise OSError("every block of sandbox ids is claimed")


def release_slot(home: Path, name: str, claims: Path = RANGE_CLAIMS) -> None:
    """Give the block of a destroyed sandbox back."""
    key = _claim_key(home, name).encode()
    for slot in _candidates(key.decode()):
        path = claims / str(slot)
        try:
            held = path.read_bytes()
        except FileNotFoundError:
            return  # probing stops at the first free slot, as claim_slot does
        except OSError:
            continue
        if held == key:
            path.unlink(missing_ok=True)
            return


def write_maps(pid: int, idmap: IdMap) -> None:
    """Map the user namespace of ``pid`` (just made, not mapped yet) as ``idmap`` says. Called from
    the parent namespace. Root writes the maps itself; a user writes a one-line map of its own
    ids itself (after denying setgroups, as the kernel requires) and runs newuidmap/newgidmap for
    more. OSError with the tool's own words if a map is refused."""
    if os.geteuid() == 0 or not idmap.full:
        if os.geteuid() != 0:
            _write(f"/proc/{pid}/setgroups", "deny")
        _write(f"/proc/{pid}/uid_map", idmap.text("uid"))
        _write(f"/proc/{pid}/gid_map", idmap.text("gid"))
        return
    tools = newidmap_tools()
    if tools is None:
        raise OSError("newuidmap/newgidmap are not installed (apt-get install uidmap)")
    # both at once (each is a setuid exec, the costly part of a rootless start), spawned directly:
    # a launcher is forked per start, and importing subprocess there cost more than the tools
    running = [_spawn(tool, [str(pid), *(str(n) for line in lines for n in line)])
               for tool, lines in zip(tools, (idmap.uids, idmap.gids), strict=True)]
    failures = [failure for failure in (_finish(*child) for child in running) if failure]
    if failures:
        raise OSError(failures[0])


def _spawn(tool: str, args: list[str]) -> tuple[str, int, int]:
    """Start ``tool`` with its stdout and stderr on a pipe; (tool, pid, read end)."""
    read, write = os.pipe2(os.O_CLOEXEC)
    try:
        devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        try:
            actions = [(os.POSIX_SPAWN_DUP2, devnull, 0), (os.POSIX_SPAWN_DUP2, write, 1),
                       (os.POSIX_SPAWN_DUP2, write, 2), *_closing_inherited()]
            child = os.posix_spawn(tool, [tool, *args], os.environ, file_actions=actions)
        finally:
            os.close(devnull)
    except BaseException:
        os.close(read)
        raise
    finally:
        os.close(write)
    return tool, child, read


def _closing_inherited() -> list[tuple[int, int]]:
    """Close actions for every inheritable descriptor above 2 (as subprocess's close_fds): a
    setuid tool gets none of the launcher's sockets or pipes."""
    actions = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            inheritable = fd > 2 and os.get_inheritable(fd)
        except OSError:  # the descriptor listdir read the directory through, closed since
            continue
        if inheritable:
            actions.append((os.POSIX_SPAWN_CLOSE, fd))
    return actions


def _finish(tool: str, child: int, read: int) -> str | None:
    """Wait for a spawned tool; None when it mapped, else what it said."""
    try:
        said = _fail_text(read)
    finally:
        os.close(read)
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        return None
    lines = said.splitlines()
    return f"{os.path.basename(tool)} failed: {lines[-1] if lines else code}"


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _fail_text(fd: int) -> str:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace").strip()


def owned_namespace(idmap: IdMap) -> int:
    """Root mode: a new user namespace owned by the sandbox's root's host id (so the kernel's
    per-user counters of everything inside count against that id at every level, never against
    host root) and mapped as ``idmap``; returns a descriptor of it (see namespace_maker)."""
    maker = namespace_maker(idmap)
    try:
        return maker.take()
    finally:
        maker.reap()


def namespace_maker(idmap: IdMap) -> ClonedMaker | ForkedMaker:
    """Root mode's user namespace being made, owned by the sandbox's root's host ids and mapped as
    ``idmap``: take() returns a descriptor of it, reap() waits for the child that made it.

    Where it can be, by a child that shares this process's memory and only waits
    (syscalls.clone_paused; ClonedMaker), in ~0.1 ms: a fork of the launcher, a Python process,
    cost ~1.5 ms of CPU per start in page tables and pages copied on write, on the path of every
    restore. Where that clone is refused (an architecture without pause()), by a forked child
    (ForkedMaker)."""
    uid, gid = idmap.outer_uid(0), idmap.outer_gid(0)
    assert uid is not None and gid is not None
    try:
        child = _clone_owned(uid, gid)
    except OSError:
        return ForkedMaker(idmap)
    return ClonedMaker(idmap, child)


def _clone_owned(uid: int, gid: int) -> tuple[int, object]:
    """syscalls.clone_paused into a new user namespace owned by ``uid``/``gid``: a namespace's owner
    is its maker's effective ids, so they are taken for the instant of the clone (the real and
    saved ids stay root's, and with them the permitted capabilities, effective again once the
    effective ids are back)."""
    _, euid, _ = os.getresuid()
    _, egid, _ = os.getresgid()
    os.setresgid(-1, gid, -1)
    try:
        os.setresuid(-1, uid, -1)
        try:
            return sc.clone_paused(sc.CLONE_NEWUSER)
        finally:
            os.setresuid(-1, euid, -1)
    finally:
        os.setresgid(-1, egid, -1)


class ClonedMaker:
    """The namespace of a clone_paused child (``child``: its pid and stack), mapped and opened at
    once, and the child sent SIGKILL before the constructor returns: nothing is left that the
    launcher's end would not end (reap() waits for it)."""

    def __init__(self, idmap: IdMap, child: tuple[int, object]) -> None:
        pid, stack = child
        try:
            write_maps(pid, idmap)
            self._fd: int | None = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        except BaseException:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise
        # Our child, not reaped yet: the pid is still its own. Reaped in reap(): its death needs
        # a CPU, which a loaded machine gives it later, and it runs nothing meanwhile.
        os.kill(pid, signal.SIGKILL)
        self.pid: int | None = pid
        self._stack: object | None = stack  # kept until it is reaped

    def take(self) -> int:
        """A descriptor of the mapped namespace (once)."""
        assert self._fd is not None
        fd, self._fd = self._fd, None
        return fd

    def reap(self) -> None:
        """Wait for the killed child; a descriptor nobody took is closed."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self.pid is not None:
            os.waitpid(self.pid, 0)
            self.pid = self._stack = None


class ForkedMaker:
    """A forked child takes the sandbox's root's host ids and makes the namespace, then waits while
    this process maps it (take()); the descriptor keeps it alive after the child exits. Started
    ahead: the child's set-up runs while the launcher joins the sandbox's cgroups (a migration
    waits for the kernel), and it ends with the launcher (its pipe closes)."""

    def __init__(self, idmap: IdMap) -> None:
        self.idmap = idmap
        outer_uid, outer_gid = idmap.outer_uid(0), idmap.outer_gid(0)
        assert outer_uid is not None and outer_gid is not None
        self._made_r, made_w = os.pipe()
        done_r, self._done_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(self._made_r)
                os.close(self._done_w)
                os.setgroups([])
                os.setresgid(outer_gid, outer_gid, outer_gid)
                os.setresuid(outer_uid, outer_uid, outer_uid)
                sc.unshare(sc.CLONE_NEWUSER)
                os.write(made_w, b"u")
                os.read(done_r, 1)
            except BaseException as exc:
                os.write(made_w, f"!{exc}".encode())
            finally:
                os._exit(0)
        self.pid: int | None = pid
        os.close(made_w)
        os.close(done_r)

    def take(self) -> int:
        """Map the child's namespace and return a descriptor of it; the child is let go (OSError
        if it could not make one, or a map is refused)."""
        try:
            said = os.read(self._made_r, 1)
            if said != b"u":
                raise OSError(f"cannot make the sandbox's user namespace: {_fail_text(self._made_r)}")
            assert self.pid is not None
            write_maps(self.pid, self.idmap)
            return os.open(f"/proc/{self.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            self._release()

    def _release(self) -> None:
        for fd in (self._made_r, self._done_w):
            if fd >= 0:
                os.close(fd)
        self._made_r = self._done_w = -1

    def reap(self) -> None:
        """Wait for the child (it exits once let go; by the time a launcher calls this, it has)."""
        self._release()
        if self.pid is not None:
            os.waitpid(self.pid, 0)
            self.pid = None


def enter_new(idmap: IdMap) -> None:
    """Rootless: move this process into a new user namespace mapped as ``idmap`` (a helper left in
    the parent namespace writes the maps: newuidmap must run outside). Root of it afterwards."""
    go_r, go_w = os.pipe()
    err_r, err_w = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(go_w)
            os.close(err_r)
            if os.read(go_r, 1) == b"m":
                write_maps(parent, idmap)
                code = 0
        except BaseException as exc:
            os.write(err_w, str(exc).encode())
        finally:
            os._exit(code)
    os.close(go_r)
    os.close(err_w)
    try:
        try:
            sc.unshare(sc.CLONE_NEWUSER)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot make a user namespace: {exc.strerror} "
                                     "(see `hermes-sandboxes doctor`)") from None
        os.write(go_w, b"m")
        os.close(go_w)
        go_w = -1
        _, status = os.waitpid(pid, 0)
        if status != 0:
            raise OSError(f"cannot map the sandbox's user namespace: {_fail_text(err_r) or 'the helper died'}")
    finally:
        if go_w >= 0:
            os.close(go_w)
            os.waitpid(pid, 0)
        os.close(err_r)
    if idmap.full:
        os.setgroups([0])
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
