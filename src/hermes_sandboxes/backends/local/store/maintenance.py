"""Looking after a local store: migrating a copy store to btrfs, giving freed space back, unmounting.

Migration (``store migrate``). A store made where btrfs could not be used (btrfs-progs missing, say)
records ``{"kind": "copy"}`` in ``store.json`` and stays a copy store. Migrating copies each sandbox's
layer into a btrfs subvolume and each checkpoint into a read-only one, with the checkpoint records
beside them; the sandbox's record, journal and audit log live outside the store and stay as they
are. Each sandbox is assembled under ``.migrating-<name>`` in the btrfs store and published with one
rename: all or nothing per sandbox. While it runs, ``store.json`` says ``"migrating": "btrfs"``
and every other command refuses the store (a sandbox changed in the copy store after being copied
would be lost); a migration killed midway is finished by running it again, which skips the
sandboxes already published. The switch of ``store.json`` to btrfs is the commit point of the
whole migration; the copy store is removed after it. No sandbox may run meanwhile (a running one
writes its layer): it refuses, or stops them when asked. Checkpoints are full copies on btrfs
too (they were on the copy store): no more disk than before, and new ones are snapshots.

Reclaim (``store reclaim``). Deleting a sandbox frees its extents inside the btrfs image, but the
image file keeps its blocks on the host disk until they are discarded. The store is mounted with
``discard=async`` (the kernel discards freed extents in the background, after a delay of its own);
reclaim does it now: it waits for deleted subvolumes to be cleaned, commits, and trims (FITRIM),
then reports how many bytes the image gave back to the host.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import struct
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from hermes_sandboxes.backends.local import paths
from hermes_sandboxes.backends.local.store import btrfstree
from hermes_sandboxes.backends.local.store.base import (
    BtrfsStore,
    CopyStore,
    Store,
    remove_tree,
    tree_bytes,
)
from hermes_sandboxes.errors import BackendUnavailable, SandboxBusy, SandboxError, Unsupported
from hermes_sandboxes.util import failpoints

if TYPE_CHECKING:
    from hermes_sandboxes.backends.local.backend import LocalBackend

_FITRIM = 0xC0185879  # _IOWR('X', 121, struct fstrim_range {u64 start, len, minlen})
MIGRATING = "migrating"  # the store.json key that marks a migration under way
Progress = Callable[[str], None]


# -- reclaim and unmount ----------------------------------------------------------------------------


def allocated_bytes(path: Path) -> int:
    """What a (sparse) file takes on the host disk."""
    return os.stat(path).st_blocks * 512


def reclaim(store: Store) -> int:
    """Give the space of deleted data back to the host disk now; returns the bytes given back
    (0 for the copy store, whose files the host filesystem frees when they are deleted)."""
    if not isinstance(store, BtrfsStore):
        return 0
    store.ensure()
    before = allocated_bytes(store.image)
    if shutil.which("btrfs"):  # deleted subvolumes are cleaned in the background: wait for it
        subprocess.run(["btrfs", "subvolume", "sync", str(store.mountpoint)], capture_output=True, check=False)
    fd = os.open(store.mountpoint, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        btrfstree.syncfs(fd)  # freed extents are free space only once the transaction commits
        fcntl.ioctl(fd, _FITRIM, bytearray(struct.pack("=QQQ", 0, 2**64 - 1, 0)))
    except OSError as exc:
        raise SandboxError(f"trimming the store at {store.mountpoint} failed: {exc.strerror}") from exc
    finally:
        os.close(fd)
    return max(0, before - allocated_bytes(store.image))


def running_sandboxes(backend: LocalBackend) -> list[str]:
    return [name for name in _recorded_names(backend) if backend.get(name).is_running()]


def unmount(backend: LocalBackend, store: Store) -> bool:
    """Unmount the btrfs store (its loop device goes with it); False when it was not mounted. The
    next command that needs the store mounts it again."""
    if not isinstance(store, BtrfsStore):
        raise Unsupported("this is the copy store, a plain directory: there is nothing to unmount")
    running = running_sandboxes(backend)
    if running:
        raise SandboxBusy(f"not unmounting the store: {_some(running)} still running; stop them first "
                          f"(hermes-sandboxes stop NAME)")
    with open(backend.home / "store.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not store.is_mounted():
            return False
        store.unmount()
    return True


# -- migration --------------------------------------------------------------------------------------


def migrate(backend: LocalBackend, image_size: str, *, stop_running: bool, progress: Progress) -> list[str]:
    """Move every sandbox of a copy store into a new btrfs store; returns the names moved (empty
    when the store is btrfs already). Resumable: see the module's docstring."""
    home = backend.home
    record = paths.read_json(home / "store.json")
    kind = record.get("kind") if isinstance(record, dict) else None
    copy, target = CopyStore(home), BtrfsStore(home, image_size)
    if kind != "copy":
        if copy.root.exists():  # a migration killed between its switch and this clean-up
            remove_tree(copy.root)
        return []
    if shutil.which("mkfs.btrfs") is None:
        raise BackendUnavailable("migrating needs btrfs: install btrfs-progs (apt-get install btrfs-progs)")
    names = _recorded_names(backend)
    if stop_running:
        for name in running_sandboxes(backend):
            progress(f"stopping {name}")
            backend.get(name).stop()
    target.ensure()
    with _all_locked(backend, names):
        running = [name for name in names if backend.get(name).is_running()]
        if running:
            raise SandboxBusy(f"not migrating: {_some(running)} running (a running sandbox writes its layer); "
                              "stop them (hermes-sandboxes stop NAME) or add --stop")
        paths.write_json(home / "store.json", {"kind": "copy", MIGRATING: "btrfs"})
        for number, name in enumerate(names, 1):
            _migrate_sandbox(copy, target, name, f"[{number}/{len(names)}] {name}", progress)
        paths.write_json(home / "store.json", {"kind": "btrfs"})  # the commit point
    remove_tree(copy.root)
    return names


def _migrate_sandbox(copy: CopyStore, target: BtrfsStore, name: str, label: str, progress: Progress) -> None:
    source, final = copy.sandbox_dir(name), target.sandbox_dir(name)
    if final.exists():
        progress(f"{label}: already moved")
        return
    if not copy.layer(name).is_dir():
        raise SandboxError(f"sandbox {name} has no layer in the copy store at {source}; remove it "
                           f"(hermes-sandboxes rm {name}) and run the migration again")
    ids = copy.checkpoint_ids(name)
    size = tree_bytes(source)
    progress(f"{label}: layer and {len(ids)} checkpoint(s), {size / 2**20:.1f} MiB")
    staged = target.root / f".migrating-{name}"
    _remove_staged(target, staged)
    staged.mkdir(mode=0o700)
    checkpoints = staged / "checkpoints"
    checkpoints.mkdir()
    _fill_volume(target, copy.layer(name), staged / ".tmp-layer")
    (staged / ".tmp-layer").rename(staged / "layer")
    for checkpoint_id in ids:
        filling = checkpoints / f".fill-{checkpoint_id}"
        _fill_volume(target, copy.checkpoint_path(name, checkpoint_id), filling)
        target._copy_volume(filling, checkpoints / checkpoint_id, readonly=True)
        target._remove_volume(filling)
        shutil.copy2(copy.checkpoints_dir(name) / f"{checkpoint_id}.json", checkpoints / f"{checkpoint_id}.json")
    fd = os.open(staged, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        btrfstree.syncfs(fd)  # on disk before it is published
    finally:
        os.close(fd)
    failpoints.pause("migrate-staged")
    staged.rename(final)  # the commit point for this sandbox
    progress(f"{label}: done")
    failpoints.pause("migrate-published")


def _fill_volume(target: BtrfsStore, source: Path, volume: Path) -> None:
    """A new subvolume at ``volume`` with a faithful copy of the tree ``source`` (owners, modes,
    extended attributes such as overlay whiteouts, hard links, holes)."""
    target._make_volume(volume)
    done = subprocess.run(["cp", "-a", "--sparse=always", "--", f"{source}/.", str(volume)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SandboxError(f"copying {source} into the btrfs store failed: {done.stderr.strip()[-400:]}")


def _remove_staged(target: BtrfsStore, staged: Path) -> None:
    """What an interrupted migration of one sandbox left (subvolumes included)."""
    if not staged.exists():
        return
    for directory in (staged / "checkpoints", staged):
        if directory.is_dir():
            for entry in directory.iterdir():
                if entry.is_dir() and not entry.is_symlink() and entry.name != "checkpoints":
                    target._remove_volume(entry)
    remove_tree(staged)


def _recorded_names(backend: LocalBackend) -> list[str]:
    """Sandboxes with a record (without going through the store, which a migration refuses)."""
    root = backend.home / "sandboxes"
    return sorted(p.parent.name for p in root.glob("*/sandbox.json")) if root.is_dir() else []


@contextlib.contextmanager
def _all_locked(backend: LocalBackend, names: list[str]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for name in names:
            stack.enter_context(paths.locked(backend.layout.lock_file(name), f"sandbox {name}", timeout=10))
        yield


def _some(names: list[str]) -> str:
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return f"{len(names)} sandbox(es) ({shown})"
