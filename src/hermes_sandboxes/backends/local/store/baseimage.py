"""The root filesystem a user's rootless sandboxes share: a Debian root their user namespace owns.

In a user namespace the host's root-owned files are unmapped, so an overlay over the host's own
tree cannot change them (EACCES): an agent could not install a package or replace a tool. The
rootless base is therefore a Debian root owned by the ids the sandbox's namespace maps, built
without root: ``mmdebstrap --mode=unshare`` writes a tarball whose owners are the root's own
(0, _apt...), and ``tar`` unpacks it as root of a namespace mapped as the sandboxes are
(``mapped``), so each file lands owned by the host id that shows inside as its owner.

Built once (about a minute, mmdebstrap's progress lines passed on), then cached under
``$XDG_CACHE_HOME/hermes-sandboxes/bases/<name>/root`` and used read-only by every sandbox of the
user, in every store. A build is staged under a temporary name and published with one rename, so a
build killed midway is simply started again. The tarball may come from a cache of its own
(``tarball=``): tests unpack one built once per machine instead of fetching the packages again.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from hermes_sandboxes.backends.local.store import mapped
from hermes_sandboxes.errors import BackendUnavailable, SandboxError

SUITE = "bookworm"
VARIANT = "apt"  # essential packages and apt: the agent installs what else it needs
PACKAGES = ("ca-certificates", "python3", "git", "curl", "procps")
COMPLETE = ".hermes-base-complete"  # written last into a finished root
Progress = Callable[[str], None]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hermes-sandboxes" / "bases"


def name(suite: str = SUITE, packages: tuple[str, ...] = PACKAGES) -> str:
    """A base's name: its suite and a digest of what goes into it (a new list is a new base)."""
    recipe = f"{suite}:{VARIANT}:{','.join(sorted(packages))}"
    return f"debian-{suite}-{hashlib.sha256(recipe.encode()).hexdigest()[:10]}"


def root_of(cache: Path | None = None, suite: str = SUITE, packages: tuple[str, ...] = PACKAGES) -> Path:
    return (cache or cache_dir()) / name(suite, packages) / "root"


def built(cache: Path | None = None) -> Path | None:
    """The default base's root if it is built, else None."""
    root = root_of(cache)
    return root if (root / COMPLETE).exists() else None


def cached(home: Path | None = None) -> Path | None:
    """The built base a rootless store at ``home`` uses, or None (never builds). The base belongs to
    the user, not to a store: every store home of the user shares the one in the user's cache."""
    del home
    return built()


def build_tarball(target: Path, progress: Progress, *, suite: str = SUITE,
                  packages: tuple[str, ...] = PACKAGES, mirror: str | None = None) -> None:
    """Fetch and assemble the root into the tarball ``target`` with mmdebstrap (no root needed)."""
    if shutil.which("mmdebstrap") is None:
        raise BackendUnavailable("building the rootless base needs mmdebstrap (Debian: apt-get install "
                                 "mmdebstrap uidmap)")
    mode = "root" if os.geteuid() == 0 else "unshare"
    staged = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    argv = ["mmdebstrap", f"--mode={mode}", f"--variant={VARIANT}", f"--include={','.join(packages)}",
            "--format=tar", "--skip=output/dev", suite, str(staged), *([mirror] if mirror else [])]
    target.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    tail: list[str] = []
    for line in proc.stderr:
        line = line.rstrip()
        if line.startswith(("I: ", "W: ", "E: ")):
            progress(line)
        tail = [*tail[-4:], line]
    if proc.wait() != 0:
        staged.unlink(missing_ok=True)
        raise SandboxError(f"mmdebstrap failed (exit {proc.returncode}): {' | '.join(tail)}")
    staged.rename(target)


def ensure(cache: Path | None = None, progress: Progress = lambda _: None, *, tarball: Path | None = None,
           mirror: str | None = None) -> Path:
    """The default base's root, built first if it is not (one build at a time per cache)."""
    root = root_of(cache)
    if (root / COMPLETE).exists():
        return root
    home = root.parent
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(home / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / COMPLETE).exists():
            return root  # another process built it meanwhile
        for leftover in home.glob(".root-*"):
            mapped.run(["rm", "-rf", "--", str(leftover)], f"removing {leftover}")
        with tempfile.TemporaryDirectory(dir=home, prefix=".build-") as scratch:
            source = tarball
            if source is None:
                progress(f"building the rootless base {home.name} (Debian {SUITE}, once; about a minute)")
                source = Path(scratch) / "root.tar"
                build_tarball(source, progress, mirror=mirror)
            staged = home / f".root-{os.getpid()}"
            staged.mkdir(mode=0o755)
            progress(f"unpacking into {root}")
            mapped.run(["tar", "-xpf", str(source), "-C", str(staged), "--numeric-owner",
                        "--exclude=./dev/*"], "unpacking the rootless base")
            mapped.call(_finish, staged)
            staged.rename(root)
    progress(f"rootless base ready: {root}")
    return root


def _finish(root: Path) -> None:
    """Make the root usable in a sandbox (run as the namespace's root, which owns it)."""
    os.chmod(root, 0o755)
    (root / "dev").mkdir(mode=0o755, exist_ok=True)  # the init mounts its own /dev here
    (root / COMPLETE).write_text(f"{SUITE} {VARIANT} {','.join(PACKAGES)}\n")
