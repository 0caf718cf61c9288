"""Copy-on-write storage for sandbox layers and their checkpoints.

Layout under the store root, per sandbox::

    <name>/layer/{upper,work}      the writable overlay layer (one btrfs subvolume: upper and work
                                   must share it, or every delete fails with EXDEV)
    <name>/checkpoints/<id>        a read-only snapshot of layer/
    <name>/checkpoints/<id>.json   its record; a checkpoint is valid only when both exist
    <name>/.tmp-*, <name>/.old-*   leftovers of an interrupted operation, removed by gc()

Every change is staged under a temporary name and published with one rename (or one atomic
exchange), so an operation killed midway never leaves a half-made layer or checkpoint in place.

Two kinds: ``BtrfsStore`` (subvolume snapshots on a loop-mounted image the store creates on first
use: constant-time checkpoints) and ``CopyStore`` (full ``cp -a`` copies in a plain directory, for
machines where btrfs cannot be used: time and disk grow with the layer). Hardlink trees are never
used: an in-place append after the checkpoint would leak into it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import struct
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path

from hermes_sandboxes.backends.local.guest import syscalls as sc
from hermes_sandboxes.backends.local.store import btrfstree, quota, trash, treediff
from hermes_sandboxes.backends.local.store.fdwalk import Tree
from hermes_sandboxes.errors import BackendUnavailable, SandboxError, Unsupported
from hermes_sandboxes.sandbox import FileChange
from hermes_sandboxes.util import failpoints, ownership
from hermes_sandboxes.util.units import parse_size

_IOW_4096 = 0x50009400  # _IOW(BTRFS_IOCTL_MAGIC, nr, 4096-byte argument)
_SUBVOL_CREATE = _IOW_4096 | 14
_SNAP_DESTROY = _IOW_4096 | 15
_SNAP_CREATE_V2 = _IOW_4096 | 23
_SUBVOL_RDONLY = 1 << 1
_SUBVOL_QGROUP_INHERIT = 1 << 2
_BTRFS_FIRST_FREE_OBJECTID = 256


def _vol_args(name: str, fd: int = 0) -> bytearray:
    return bytearray(struct.pack("=q4088s", fd, name.encode()))


def _vol_args_v2(name: str, fd: int, flags: int, inherit: quota.Inherit | None = None) -> bytearray:
    if inherit is None:
        return bytearray(struct.pack("=qQQ32x4040s", fd, 0, flags, name.encode()))
    return bytearray(struct.pack("=qQQQQ16x4040s", fd, 0, flags | _SUBVOL_QGROUP_INHERIT, inherit.size,
                                 inherit.address, name.encode()))


def _run(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        last = detail[-1] if detail else f"exit {proc.returncode}"
        if len(last) > 400:  # e.g. a path thousands of directories deep
            last = f"{last[:150]} ... {last[-150:]}"
        raise SandboxError(f"{what} failed: {last}")


def remove_tree(path: Path) -> None:
    """Remove ``path`` and everything under it, never following symlinks.

    A layer holds whatever root inside made, including directories nested thousands deep:
    shutil.rmtree recurses once per level and dies of RecursionError there (Python 3.11), which
    left such a sandbox impossible to destroy. rm walks by file descriptor, at any depth.
    """
    if os.path.lexists(path):
        _run(["rm", "-rf", "--", str(path)], f"removing {path}")


def tree_bytes(path: Path) -> int:
    """Disk bytes used by the files under ``path`` (each hardlinked inode counted once). Read by
    descriptor (fdwalk): the live layer may be changing under the walk."""
    try:
        tree = Tree(path)
    except OSError:
        return 0
    seen: set[int] = set()
    total = 0
    with tree:
        for _, st in tree.walk():
            if st.st_ino not in seen:
                seen.add(st.st_ino)
                total += st.st_blocks * 512
    return total


def _wait_loop_released(loop: str, image: str, deadline_s: float = 10.0) -> None:
    """Wait for the kernel to let go of the loop device behind an unmounted image: it detaches an
    auto-clearing loop device in a work queue, after umount has returned (seen still attached under
    load), and whoever unmounts the store expects the image free (to move or delete it)."""
    backing = f"/sys/block/{loop}/loop/backing_file"
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            with open(backing) as f:
                if f.read().strip().removesuffix(" (deleted)") != image:
                    return  # the device went, or serves another image already
        except OSError:
            return
        time.sleep(0.005)
    # still attached: another mount namespace holds the filesystem (it goes when that does)


_PINNED = Path("/proc/self/fd")


class PinnedLayer:
    """A sandbox's live layer held by a descriptor, so that a diff can walk it without the
    sandbox's lock: a restore that swaps another layer in meanwhile neither waits for the walk nor
    changes what it reads (the walk goes on in the layer it started in, by ``path``); ``replaced``
    then says the walk's result is no longer the sandbox's. While the descriptor is open the layer's
    inode cannot be reused, so a layer swapped out and back in is not mistaken for the same one."""

    def __init__(self, layer: Path) -> None:
        self.layer = layer
        self.fd = os.open(layer, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        st = os.fstat(self.fd)
        self._identity = (st.st_dev, st.st_ino)
        self.path = _PINNED / str(self.fd)  # this process's name of the pinned directory

    def replaced(self) -> bool:
        """Whether the layer's name no longer leads to the pinned directory (a restore swapped it)."""
        try:
            st = os.stat(self.layer, follow_symlinks=False)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != self._identity

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> PinnedLayer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_volume(path: Path) -> int:
    """A directory descriptor of the volume ``path``, not through a symlink; a pinned layer's
    ``path`` (a link of /proc/self/fd) is opened through its descriptor."""
    name = f"{path}/." if path.parent == _PINNED else path
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def trusted_home(home: Path) -> None:
    """Make the store home if missing; refuse one someone else could control (util/ownership.py)."""
    try:
        ownership.ensure_dir(home, "the sandbox home")
    except ownership.Untrusted as exc:
        raise SandboxError(f"{exc}; refusing to use it as a sandbox home") from None


class Store(ABC):
    kind: str
    cheap: bool  # checkpoint and restore cost does not grow with the layer
    rootless = False  # a store of an ordinary user's sandboxes (see rootless.py)
    # removals walk the files: old layers go to .trash and are removed in the background (trash.py)
    deferred_removal = False
    xattr_prefix = "trusted.overlay."  # the overlay's xattrs in this store's layers

    def __init__(self, root: Path) -> None:
        self.root = root
        self._swept = False

    @property
    def description(self) -> str:
        """What this store does, in a line (doctor and ``store info`` show it)."""
        return self.kind

    @abstractmethod
    def ensure(self) -> None:
        """Make the store usable (create, mount) if it is not; idempotent and cheap when ready."""

    def sandbox_dir(self, name: str) -> Path:
        return self.root / name

    def layer(self, name: str) -> Path:
        return self.root / name / "layer"

    def checkpoints_dir(self, name: str) -> Path:
        return self.root / name / "checkpoints"

    def checkpoint_path(self, name: str, checkpoint_id: str) -> Path:
        return self.checkpoints_dir(name) / checkpoint_id

    @contextlib.contextmanager
    def checkpoint_tree(self, name: str, checkpoint_id: str) -> Iterator[Path]:
        """A volume with the checkpoint's whole layer, to read while the sandbox's lock is held: the
        checkpoint itself, except on a store whose checkpoints hold only what changed since the
        one before (the rootless overlay store: a view of its chain, gone at the end)."""
        yield self.checkpoint_path(name, checkpoint_id)

    # volumes: a directory tree we can snapshot -------------------------------------------------
    @abstractmethod
    def _make_volume(self, path: Path) -> None: ...

    @abstractmethod
    def _copy_volume(self, source: Path, target: Path, *, readonly: bool, group: int | None = None) -> None:
        """Copy ``source`` to ``target``; ``group``: a quota group the copy is a member of from the start."""

    @abstractmethod
    def _remove_volume(self, path: Path) -> None: ...

    # operations ------------------------------------------------------------------------------
    def create_layer(self, name: str) -> None:
        self.remove_sandbox(name)  # leftovers of an earlier sandbox of that name
        base = self.sandbox_dir(name)
        base.mkdir(parents=True)
        self.checkpoints_dir(name).mkdir()
        staged = base / ".tmp-layer"
        self._make_volume(staged)
        (staged / "upper").mkdir(mode=0o755)
        (staged / "work").mkdir(mode=0o700)
        staged.rename(self.layer(name))

    def remove_sandbox(self, name: str) -> None:
        base = self.sandbox_dir(name)
        if not base.exists():
            return
        for child in [*self.checkpoints_dir(name).glob("*"), *base.glob(".*"), self.layer(name)]:
            if child.is_dir() and not child.is_symlink():
                self._remove_volume(child)
            elif child.exists():
                child.unlink()
        with contextlib.suppress(SandboxError):
            self._remove_tree(base)

    def snapshot(self, name: str, checkpoint_id: str) -> None:
        # staged beside its final name: btrfs refuses to move a read-only subvolume to another
        # directory (its ".." would change), but renames it within one
        staged = self.checkpoints_dir(name) / f".tmp-{checkpoint_id}"
        self._copy_volume(self.layer(name), staged, readonly=True)
        failpoints.pause("checkpoint-staged")
        staged.rename(self.checkpoint_path(name, checkpoint_id))

    def restore(self, name: str, checkpoint_id: str, *, disk_limit: int | None) -> None:
        staged = self.stage_restore(name, checkpoint_id, disk_limit=disk_limit)
        self.discard(self.publish_restore(name, checkpoint_id, staged))

    def stage_restore(self, name: str, checkpoint_id: str, *, disk_limit: int | None) -> Path:
        """A writable copy of the checkpoint beside the layer, ready to take its place, and already
        capped at ``disk_limit`` (the sandbox's limit, as set_disk_limit takes it): whoever
        publishes it has nothing left to limit."""
        staged = self.sandbox_dir(name) / f".tmp-restore-{checkpoint_id}"
        group = self._limit_group(name, disk_limit)
        self._copy_volume(self.checkpoint_path(name, checkpoint_id), staged, readonly=False, group=group)
        work = staged / "work"
        if work.exists():  # the overlay's scratch area must start empty
            self._clear(work)
        else:
            work.mkdir(mode=0o700)
        return staged

    def publish_restore(self, name: str, checkpoint_id: str, staged: Path) -> Path:
        """Swap the staged copy in (one atomic exchange); returns where the old layer now is."""
        failpoints.pause("restore-staged")
        sc.rename_exchange(str(staged), str(self.layer(name)))
        old = self.sandbox_dir(name) / f".old-{checkpoint_id}-{time.time_ns()}"
        staged.rename(old)
        return old

    def discard(self, volume: Path) -> None:
        """Remove a volume nothing refers to any more (a restore's old layer, a leftover): at once
        where that is cheap, else moved to the trash and removed in the background."""
        if self.deferred_removal and trash.move(self.root, volume):
            self._sweep_trash()
        else:
            self._remove_volume(volume)

    def _sweep_trash(self) -> None:
        trash.sweep_later(self.root)

    def sweep_leftover_trash(self) -> None:
        """On the first open of the store in this process: sweep what a killed sweeper left."""
        if self._swept or not self.deferred_removal:
            return
        self._swept = True
        if trash.pending(self.root):
            self._sweep_trash()

    def fork(self, source: str, checkpoint_id: str | None, target: str) -> None:
        """Make ``target``'s layer a writable copy of ``source``'s checkpoint (or of its live layer:
        the caller freezes the source then). A snapshot on btrfs, so it costs what a checkpoint
        costs; the target gets no checkpoints."""
        self.remove_sandbox(target)
        base = self.sandbox_dir(target)
        base.mkdir(parents=True)
        self.checkpoints_dir(target).mkdir()
        staged = base / ".tmp-layer"
        origin = self.layer(source) if checkpoint_id is None else self.checkpoint_path(source, checkpoint_id)
        self._copy_volume(origin, staged, readonly=False)
        work = staged / "work"
        if work.exists():  # the overlay's scratch area must start empty
            self._clear(work)
        else:
            work.mkdir(mode=0o700)
        staged.rename(self.layer(target))

    def delete_checkpoint(self, name: str, checkpoint_id: str) -> None:
        path = self.checkpoint_path(name, checkpoint_id)
        with contextlib.suppress(FileNotFoundError):
            (path.parent / f"{checkpoint_id}.json").unlink()
        if path.exists():
            self._remove_volume(path)

    def checkpoint_ids(self, name: str) -> list[str]:
        """Ids with both a snapshot and a record."""
        directory = self.checkpoints_dir(name)
        if not directory.is_dir():
            return []
        return sorted(p.stem for p in directory.glob("*.json") if (directory / p.stem).is_dir())

    def gc(self, name: str) -> None:
        """Remove what interrupted operations left behind (call under the sandbox's lock)."""
        base = self.sandbox_dir(name)
        for leftover in base.glob(".*"):
            self.discard(leftover)
        directory = self.checkpoints_dir(name)
        if directory.is_dir():
            for entry in directory.iterdir():
                if entry.is_dir() and not (directory / f"{entry.name}.json").exists():
                    self._remove_volume(entry)
                elif entry.suffix == ".json" and not (directory / entry.stem).is_dir():
                    entry.unlink()

    def layer_bytes(self, name: str) -> int:
        return self.tree_bytes(self.layer(name) / "upper")

    def tree_bytes(self, path: Path) -> int:
        """Disk bytes of the files under ``path`` in this store (see tree_bytes)."""
        return tree_bytes(path)

    def _remove_tree(self, path: Path) -> None:
        remove_tree(path)

    def diff_layers(self, old: Path, new: Path, lower: Path | None, hint: treediff.Hint | None,
                    spend: treediff.Spend | None = None) -> list[FileChange]:
        """What changed from the upper layer ``old`` to ``new`` over the base ``lower`` (treediff),
        within what is left of ``spend`` (default: a budget of its own)."""
        return treediff.diff_layers(old, new, lower, hint, self.xattr_prefix + "opaque", spend=spend)

    # what changed ----------------------------------------------------------------------------
    def readable_layer(self, name: str) -> Path:
        """The live layer, ready to be compared (readers go by descriptor: see fdwalk)."""
        return self.layer(name)

    def pin_layer(self, name: str) -> PinnedLayer | None:
        """The live layer (readable_layer), held for a walk outside the sandbox's lock (call under
        it); None where the walk runs in another process, which cannot use this one's descriptor
        (the caller keeps the lock for the walk then)."""
        return PinnedLayer(self.readable_layer(name))

    def change_hint(self, name: str, old: Path, new: Path,
                    spend: treediff.Spend | None = None) -> treediff.Hint | None:
        """Where the volumes ``old`` and ``new`` may differ, or None when the store cannot tell;
        counted against ``spend``, the diff's budget (TooBig past it)."""
        return None

    def changed_since(self, name: str, checkpoint_id: str) -> bool | None:
        """Whether the layer's upper may differ from the checkpoint's (None: cannot tell cheaply)."""
        return None

    # disk limits -----------------------------------------------------------------------------
    def check_disk_limit(self, limit: int | None) -> None:
        """Refuse a limit this store cannot enforce (before anything is created)."""
        if limit is not None:
            raise Unsupported(f"disk limits need the btrfs store; this one is the {self.kind} store")

    def set_disk_limit(self, name: str, limit: int | None) -> None:
        """Cap the disk the sandbox's data may take (None: lift a cap set earlier). Called before
        every start of its init but a restore's (whose layer stage_restore capped)."""
        self.check_disk_limit(limit)

    def _limit_group(self, name: str, limit: int | None) -> int | None:
        """The quota group that carries the sandbox's ``limit`` (set on it), or None if it has none."""
        self.check_disk_limit(limit)
        return None

    def _clear(self, directory: Path) -> None:
        for entry in directory.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                try:
                    entry.rmdir()  # the overlay's scratch directories are usually empty
                except OSError:
                    self._remove_tree(entry)
            else:
                entry.unlink()


class BtrfsStore(Store):
    kind = "btrfs"
    cheap = True

    def __init__(self, home: Path, image_size: str = "64G") -> None:
        super().__init__(home / "mnt" / "sandboxes")
        self.home = home
        self.image = home / "store.img"
        self.mountpoint = home / "mnt"
        self.image_size = image_size

    @property
    def description(self) -> str:
        return (f"btrfs image {self.image} mounted at {self.mountpoint}: subvolume snapshots "
                "(constant-time checkpoints, restores and forks)")

    def is_mounted(self) -> bool:
        with open("/proc/self/mountinfo") as f:
            target = str(self.mountpoint)
            return any(line.split()[4] == target for line in f)

    def ensure(self) -> None:
        if self.root.is_dir() and self.is_mounted():
            return
        trusted_home(self.home)
        with open(self.home / "store.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.is_mounted():
                self.root.mkdir(mode=0o700, exist_ok=True)
                return
            if shutil.which("mkfs.btrfs") is None:
                raise BackendUnavailable("mkfs.btrfs not found: install btrfs-progs (apt-get install btrfs-progs)")
            if not self.image.exists():
                staged = self.image.with_suffix(".tmp")
                with contextlib.suppress(FileNotFoundError):
                    staged.unlink()  # a leftover of an interrupted format (unlink follows no link)
                fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.truncate(parse_size(self.image_size))  # sparse: grows with use
                _run(["mkfs.btrfs", "-q", "-f", str(staged)], "formatting the btrfs store image")
                staged.rename(self.image)
            self.mountpoint.mkdir(exist_ok=True)
            # The layers hold whatever root inside made, setuid-root files and all: nosuid and
            # nodev, and a root directory only root can enter, keep them from host users.
            # discard=async: the kernel gives deleted data's blocks back to the host disk by itself,
            # in the background (a kernel older than 5.6 does not know it: mounted without it there)
            options = "loop,noatime,nosuid,nodev"
            try:
                _run(["mount", "-o", f"{options},discard=async", str(self.image), str(self.mountpoint)],
                     f"mounting {self.image}")
            except SandboxError:
                _run(["mount", "-o", options, str(self.image), str(self.mountpoint)], f"mounting {self.image}")
            os.chmod(self.mountpoint, 0o700)
            self.root.mkdir(mode=0o700, exist_ok=True)

    def unmount(self) -> None:
        from hermes_sandboxes.backends.local import incarnation

        incarnation.settle()  # a restore's old root still held would keep the filesystem mounted
        source = self._mount_source()
        if source is None:
            return
        _run(["umount", str(self.mountpoint)], f"unmounting {self.mountpoint}")
        if source.startswith("/dev/loop"):
            _wait_loop_released(source.removeprefix("/dev/"), os.path.realpath(self.image))

    def _mount_source(self) -> str | None:
        """The device mounted at our mount point (``/dev/loopN``), or None when nothing is."""
        with open("/proc/self/mountinfo") as f:
            target = str(self.mountpoint)
            for line in f:
                fields = line.split()
                if fields[4] == target:
                    return fields[fields.index("-") + 2]
        return None

    def _ioctl(self, directory: Path, request: int, arg: bytearray) -> None:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.ioctl(fd, request, arg)
        finally:
            os.close(fd)

    def _make_volume(self, path: Path) -> None:
        self._ioctl(path.parent, _SUBVOL_CREATE, _vol_args(path.name))

    def _copy_volume(self, source: Path, target: Path, *, readonly: bool, group: int | None = None) -> None:
        src = os.open(source, os.O_RDONLY | os.O_DIRECTORY)
        try:
            flags = _SUBVOL_RDONLY if readonly else 0
            inherit = None if group is None else quota.Inherit(group)
            self._ioctl(target.parent, _SNAP_CREATE_V2, _vol_args_v2(target.name, src, flags, inherit))
            del inherit  # read by the kernel through a pointer: alive until here
        finally:
            os.close(src)

    def _remove_volume(self, path: Path) -> None:
        if not path.exists():
            return
        if os.stat(path).st_ino == _BTRFS_FIRST_FREE_OBJECTID:
            self._ioctl(path.parent, _SNAP_DESTROY, _vol_args(path.name))
        else:
            remove_tree(path)


    def readable_layer(self, name: str) -> Path:
        layer = self.layer(name)
        fd = os.open(layer, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            btrfstree.syncfs(fd)  # what is still in memory is not in the tree yet
        finally:
            os.close(fd)
        return layer

    def change_hint(self, name: str, old: Path, new: Path,
                    spend: treediff.Spend | None = None) -> treediff.Hint | None:
        fds = [open_volume(volume) for volume in (old, new)]  # ``new``: a pinned layer, often
        # the hint holds every changed inode in memory (about 600 bytes each): held to the diff's
        # budget, as the walk's entries are, so a layer of millions of files stops here in time
        check = (spend or treediff.Budget().start()).hinted
        try:
            after = self._common_generation(name, fds[0], fds[1])
            if after is None:
                return None
            dirs: set[str] = set()
            inodes: set[int] = set()
            for fd in fds:
                def counted(n: int, held: int = len(inodes)) -> None:  # with the other layer's
                    check(n + held)

                changes = btrfstree.changed_inodes(fd, after, counted)
                changes.complete(fd, counted)
                inodes |= changes.items.keys()
                for inode in changes.dirs:
                    check(len(inodes))  # (the time: a name looked up per directory)
                    path = btrfstree.inode_path(fd, inode)
                    if path is None:
                        return None  # unnamed (e.g. deeper than the kernel can say): walk it all
                    if _under_upper(path):
                        dirs.add(path[len("upper/"):-1])
            return treediff.Hint(dirs, inodes)
        finally:
            for fd in fds:
                os.close(fd)

    def changed_since(self, name: str, checkpoint_id: str) -> bool | None:
        layer, checkpoint = self.readable_layer(name), self.checkpoint_path(name, checkpoint_id)
        fds = [os.open(volume, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
               for volume in (checkpoint, layer)]
        try:
            after = self._common_generation(name, fds[0], fds[1])
            if after is None:
                return None
            # Reads update atimes (overlay ignores the store's noatime), which rewrites inode
            # items: an inode whose item is otherwise the same in both trees has not changed.
            for fd, other in ((fds[1], fds[0]), (fds[0], fds[1])):
                for inode, is_dir, identity in btrfstree.changed_items(fd, after):
                    if btrfstree.inode_identity(other, inode) == identity:
                        continue
                    holders = {inode} if is_dir else btrfstree.parents_of(fd, inode)
                    if any(_under_upper(btrfstree.inode_path(fd, d)) for d in holders):
                        return True
            return False
        finally:
            for fd in fds:
                os.close(fd)

    def check_disk_limit(self, limit: int | None) -> None:
        if limit is not None:
            self.ensure()
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                quota.enable(fd)  # Unsupported where the kernel has no simple quotas
            finally:
                os.close(fd)

    def set_disk_limit(self, name: str, limit: int | None) -> None:
        group = self._limit_group(name, limit)
        if group is not None:
            fd = os.open(self.layer(name), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                quota.assign(fd, btrfstree.subvol_info(fd).treeid, group)
            finally:
                os.close(fd)

    def _limit_group(self, name: str, limit: int | None) -> int | None:
        """The sandbox's level-1 qgroup, made on first use, with ``limit`` set on it (None: lifted);
        None when the sandbox has neither a limit nor a group from an earlier one. Every step is
        idempotent, so an earlier call killed midway is finished by the next."""
        record = self.sandbox_dir(name) / "quota-group"  # n of its level-1 qgroup 1/n
        if limit is None and not record.exists():
            return None
        fd = os.open(self.layer(name), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            quota.enable(fd)
            if not record.exists():  # the first layer's subvolume id: unique, never reused
                staged = record.with_name(".tmp-quota-group")
                staged.write_text(str(btrfstree.subvol_info(fd).treeid))
                staged.rename(record)
            group = quota.group_of(int(record.read_text()))
            quota.create_group(fd, group)
            quota.set_limit(fd, group, limit)
            return group
        finally:
            os.close(fd)

    def remove_sandbox(self, name: str) -> None:
        record = self.sandbox_dir(name) / "quota-group"
        number = int(record.read_text()) if record.exists() else None
        super().remove_sandbox(name)
        if number is not None and self.root.is_dir():
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                quota.remove_group(fd, quota.group_of(number))
            finally:
                os.close(fd)

    def _common_generation(self, name: str, old_fd: int, new_fd: int) -> int | None:
        """See btrfstree.common_generation; None also for a live layer against itself."""
        infos = [btrfstree.subvol_info(fd) for fd in (old_fd, new_fd)]
        if infos[0].uuid == infos[1].uuid and not infos[0].readonly:
            return None
        known = {info.uuid: info for info in (*self._volumes(name), *infos)}
        return btrfstree.common_generation(infos[0], infos[1], known)

    def _volumes(self, name: str) -> Iterator[btrfstree.SubvolInfo]:
        """The subvolumes of this sandbox (its layer and checkpoints), for their ancestry."""
        for volume in [self.layer(name), *self.checkpoints_dir(name).iterdir()]:
            try:
                fd = os.open(volume, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if os.fstat(fd).st_ino == _BTRFS_FIRST_FREE_OBJECTID:
                    yield btrfstree.subvol_info(fd)
            finally:
                os.close(fd)


def _under_upper(path: str | None) -> bool:
    """Whether a directory path from btrfstree.inode_path is upper/ or inside it (None: unknown,
    so yes)."""
    return path is None or path.startswith("upper/")


class CopyStore(Store):
    """Full copies in a plain directory: the fallback where btrfs cannot be used."""

    kind = "copy"
    cheap = False
    deferred_removal = True
    warning = (
        "using the full-copy store: every checkpoint and restore copies the whole writable layer, "
        "so their time and disk use grow with it"
    )

    def __init__(self, home: Path) -> None:
        super().__init__(home / "copy-store")

    @property
    def description(self) -> str:
        return ("full copies (" + self.warning.removeprefix("using the full-copy store: ") + ")")

    def ensure(self) -> None:
        trusted_home(self.root.parent)
        # only root may enter: the layers hold whatever root inside made, setuid-root files too
        self.root.mkdir(mode=0o700, exist_ok=True)
        if os.stat(self.root).st_mode & 0o077:
            os.chmod(self.root, 0o700)
        self.sweep_leftover_trash()

    def _make_volume(self, path: Path) -> None:
        path.mkdir()

    def _copy_volume(self, source: Path, target: Path, *, readonly: bool, group: int | None = None) -> None:
        if group is not None:
            raise Unsupported("disk limits need the btrfs store; this one is the copy store")
        # cp -a keeps ownership, modes, xattrs (overlay whiteouts and opaque markers), hardlinks
        # within the tree and holes; --reflink=auto shares blocks where the filesystem can.
        _run(["cp", "-a", "--reflink=auto", "--sparse=always", str(source), str(target)],
             f"copying {source.name}")

    def _remove_volume(self, path: Path) -> None:
        remove_tree(path)
