"""Helpers shared by the local backend's real tests (imported as ``tests.local.kit``).

Every sandbox these tests create gets a name under this run's prefix, and every store home they
create is registered here, so the session-level leftover check (conftest.py) can look for exactly
our mounts, loop devices, cgroups and init processes even while other test runs share the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox, cgroups
from hermes_sandboxes.names import unique_name
from hermes_sandboxes.sandbox import ExecResult, SandboxSpec
from tests.conftest import teardown_backend

ROOTLESS = os.geteuid() != 0  # run as tests/rootless's user (ROOTLESS_ENV): the same files, rootless
RUN_PREFIX = f"lt{os.getpid()}"  # every sandbox of this run is named RUN_PREFIX-<random>
PYTHON = sys.executable
_HOMES: dict[Path, bool] = {}  # every store home of this run -> whether it must be gone at the end


def fresh_name() -> str:
    return unique_name(RUN_PREFIX)


def register_home(home: Path, *, expect_removed: bool = True) -> Path:
    _HOMES[home] = expect_removed
    return home


def temp_home(parent: str = "/tmp") -> Path:
    """A throw-away store home (short enough for unix socket paths under it)."""
    return register_home(Path(tempfile.mkdtemp(prefix="hsl-", dir=parent)))


def view_root() -> Path:
    """The host directory a new sandbox's / shows: in root mode the host's own tree; rootless, the
    user's built base (nothing else of the host shows; the user owns it, so tests plant files there)."""
    if not ROOTLESS:
        return Path("/")
    from hermes_sandboxes.backends.local.store import baseimage

    built = baseimage.built()
    assert built is not None, "the test user's rootless base is not built (tests/rootless/kit.py provisions it)"
    return built


def visible_dir(tag: str, parent: str = "/srv") -> Path:
    """A new host directory that sandboxes started after it see, at ``inside(path)``."""
    return Path(tempfile.mkdtemp(prefix=f"hsl-{tag}-", dir=view_root() / parent.lstrip("/")))


def inside(path: Path) -> str:
    """Where the host path ``path`` (under view_root()) shows inside a sandbox."""
    return "/" + str(path.relative_to(view_root())) if ROOTLESS else str(path)


@contextlib.contextmanager
def temp_backend(parent: str = "/tmp", **kwargs: Any) -> Iterator[LocalBackend]:
    """A backend in its own throw-away home, torn down with conftest's teardown_backend."""
    backend = LocalBackend(temp_home(parent), **kwargs)
    try:
        yield backend
    finally:
        teardown_backend(backend)


@contextlib.contextmanager
def new_sandbox(backend: LocalBackend, spec: SandboxSpec | None = None) -> Iterator[LocalSandbox]:
    sb = backend.create(fresh_name(), spec)
    try:
        yield sb
    finally:
        sb.destroy()


def sh(sb: LocalSandbox, script: str, timeout: float = 60, **kwargs: Any) -> ExecResult:
    """Run a shell script that must succeed; show its output if it does not."""
    result = sb.exec(script, timeout=timeout, **kwargs)
    assert result.exit_code == 0, f"{script!r} -> {result.exit_code}\n{result.stdout}\n{result.stderr}"
    return result


def init_state(sb: LocalSandbox) -> dict[str, Any]:
    """The init's record on the host: pid, start time, boot id, cgroup directories."""
    state = json.loads((sb.backend.layout.run_dir(sb.name) / "init.json").read_text())
    assert isinstance(state, dict)
    return state


def cgroup_dirs(sb: LocalSandbox) -> dict[str, Path]:
    """The sandbox's own group (the one with its limits) per hierarchy, as its init recorded them."""
    return {key: Path(d) for key, d in init_state(sb)["cgroups"]["dirs"].items()}


def cgroup_version(sb: LocalSandbox) -> int:
    version = init_state(sb)["cgroups"]["version"]
    assert version in (1, 2)
    return int(version)


def cgroup_dir(sb: LocalSandbox, controller: str) -> Path:
    """The sandbox's group that ``controller`` (memory, pids, cpu, freezer) works in: its v1
    hierarchy's, or the one unified group on v2."""
    dirs = cgroup_dirs(sb)
    return next((d for key, d in dirs.items() if controller in key.split(",")), dirs.get("unified", Path("/none")))


def box_dirs(sb: LocalSandbox) -> dict[str, Path]:
    """The running incarnation's box (its init, and its commands' groups below) per hierarchy."""
    recorded = init_state(sb)["cgroups"]
    return {key: Path(d) / recorded.get("box", "box") for key, d in recorded["dirs"].items()}


def box_dir(sb: LocalSandbox, controller: str) -> Path:
    """The running incarnation's box in the hierarchy ``controller`` works in (see cgroup_dir)."""
    box: str = init_state(sb)["cgroups"].get("box", "box")
    return cgroup_dir(sb, controller) / box


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not count)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.02)


def sandbox_commands(sb: LocalSandbox) -> list[str]:
    """Command lines of every process inside the sandbox, as the sandbox itself sees them."""
    result = sh(sb, "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done")
    return [line.strip() for line in result.stdout.splitlines() if line.strip()]


def killed_at(point: str, sb: LocalSandbox, operation: str, check_paused: object = None) -> None:
    """Run ``operation`` (code using ``sb``) in a child Python with HERMES_SANDBOXES_TEST_PAUSE set:
    the backend pauses it at ``point`` and writes the marker file; then ``check_paused`` runs and
    the child is killed with SIGKILL."""
    marker = Path(tempfile.mkdtemp(prefix="hsl-pause-")) / "paused"
    script = textwrap.dedent(f"""
        from hermes_sandboxes.backends.local import LocalBackend
        sb = LocalBackend({str(sb.backend.home)!r}).get({sb.name!r})
        {operation}
        raise SystemExit("the operation finished: it was never paused")
    """)
    env = {**os.environ, "HERMES_SANDBOXES_TEST_PAUSE": point, "HERMES_SANDBOXES_TEST_PAUSE_MARKER": str(marker)}
    child = subprocess.Popen([PYTHON, "-c", script], env=env, stderr=subprocess.PIPE, text=True)
    try:
        # the marker is created, then written: wait for its content (seen empty in the slow guest)
        wait_for(lambda: (marker.exists() and bool(marker.read_text().strip())) or child.poll() is not None,
                 f"the operation to pause at {point}", 60)
        assert child.poll() is None, f"the operation ended early: {child.stderr.read() if child.stderr else ''}"
        assert marker.read_text().strip() == str(child.pid)
        if callable(check_paused):
            check_paused()
    finally:
        child.send_signal(signal.SIGKILL)  # our own child
        child.wait()
        if child.stderr:
            child.stderr.close()
        marker.unlink(missing_ok=True)
        marker.parent.rmdir()


# a file manifest computed inside the sandbox, for fidelity checks -------------------------------------
MANIFEST_SCRIPT = r"""
import hashlib, json, os, stat, sys
out = {}
for path in sys.argv[1:]:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        out[path] = None
        continue
    e = {"type": stat.S_IFMT(st.st_mode), "mode": oct(stat.S_IMODE(st.st_mode)), "uid": st.st_uid,
         "gid": st.st_gid, "nlink": st.st_nlink, "ino": st.st_ino}
    if stat.S_ISLNK(st.st_mode):
        e["target"] = os.readlink(path)
        e["mtime"] = st.st_mtime_ns
    elif stat.S_ISREG(st.st_mode):
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        e.update(size=st.st_size, blocks=st.st_blocks, sha=h.hexdigest(), mtime=st.st_mtime_ns)
    elif stat.S_ISDIR(st.st_mode):
        e["entries"] = sorted(os.listdir(path))
    try:
        names = sorted(os.listxattr(path, follow_symlinks=False))
        e["xattrs"] = {k: os.getxattr(path, k, follow_symlinks=False).hex() for k in names}
    except OSError as exc:
        e["xattrs"] = f"error {exc.errno}"
    out[path] = e
print(json.dumps(out))
"""


def manifest(sb: LocalSandbox, paths: list[str]) -> dict[str, Any]:
    """Type, mode, owner, links, content hash, blocks, xattrs... of ``paths`` as the sandbox sees them."""
    result = sb.exec(["python3", "-c", MANIFEST_SCRIPT, *paths], timeout=120)
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert isinstance(data, dict)
    return data


def without_inodes(data: dict[str, Any]) -> dict[str, Any]:
    """A manifest minus inode numbers (which a copy may renumber; link structure is checked apart)."""
    return {p: ({k: v for k, v in e.items() if k != "ino"} if e else e) for p, e in data.items()}


# the leftover check ---------------------------------------------------------------------------------
def _our_cgroups(homes: list[str]) -> list[str]:
    """Cgroups of this run: its sandboxes' groups in any store, and the shared parents of the
    stores that must be gone (``homes``) in every hierarchy."""
    found: list[str] = []
    for home in _HOMES:
        for parent in cgroups.store_groups(home):
            if str(home) in homes:
                found.append(str(parent))
            else:
                found += sorted(str(p) for p in parent.iterdir() if p.name.startswith(RUN_PREFIX + "-"))
    return found


def leftovers(*, session_store_done: bool) -> list[str]:
    """Mounts, loop devices, cgroups, init processes and home directories this run left behind.

    Until the session backend (tests/conftest.py) is torn down, its store stays mounted and other
    test directories' sandboxes may run in it: only this run's own sandboxes and homes count then.
    """
    homes = [str(h) for h, removable in _HOMES.items() if removable or session_store_done]
    marks = [*homes, f"/{RUN_PREFIX}-"]  # an init's command line names its run dir: .../run/<name>/
    found = [f"cgroup {path}" for path in _our_cgroups(homes)]
    with open("/proc/self/mountinfo") as f:
        found += [f"mount {line.split()[4]}" for line in f if any(h in line.split()[4] for h in homes)]
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    found += [f"loop device {line}" for line in loops.splitlines() if any(h in line for h in homes)]
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(proc.name) != os.getpid() and any(m in cmdline for m in marks):
            found.append(f"process {proc.name}: {cmdline.strip()}")
    found += [f"directory {h}" for h in homes if Path(h).exists()]
    return found
