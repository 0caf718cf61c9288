"""Stores for rootless sandboxes: copy-on-write without a loop device, on whatever the user has.

A user cannot mount a filesystem image, so the store uses the filesystem its directory is on, and
picks the best that filesystem lets an ordinary user do (probed, never guessed from its name):

``subvolume``  btrfs the user can create subvolumes on: a layer is a subvolume, a checkpoint a
               read-only snapshot of it, a restore or fork a writable snapshot of that: constant
               time, as the root-mode btrfs store. Deleting a subvolume as a user needs the
               filesystem mounted with ``user_subvol_rm_allowed`` (then one ioctl, after clearing a
               snapshot's read-only flag, which its owner may); without it the kernel refuses
               (EPERM) and the store empties the subvolume and removes it with rmdir, which the
               kernel allows its owner (cost follows the subvolume's files; only deletions pay it).
``reflink``    a filesystem with reflinks (XFS made with reflink=1, btrfs without subvolume
               rights): checkpoints and restores copy the layer with ``copy_file_range``, which
               the kernel does as a reflink there, sharing every data block: cost follows the
               layer's file count, not its bytes.
``overlay``    anything else (ext4, the common default): the sandbox's root is an overlay of the
               base and its writable layer, which holds copies of only the files the sandbox
               changed; a checkpoint copies that layer, so it costs what the sandbox changed,
               never the base.

Copies and removals run as root of a user namespace mapped as the sandbox is (``mapped``): the
layer holds files of inner users the host user cannot read. Overlay xattrs in these layers are the
user-namespace ones (``user.overlay.*``, the ``userxattr`` mount option). Disk limits are refused:
every quota these filesystems have (btrfs qgroups, XFS and ext4 project quotas) is root's to set.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import os
import struct
from collections.abc import Iterator
from pathlib import Path

from hermes_sandboxes.backends.local.guest import syscalls as sc
from hermes_sandboxes.backends.local.store import baseimage, handles, increment, mapped, trash, treediff
from hermes_sandboxes.backends.local.store.base import PinnedLayer, Store, tree_bytes
from hermes_sandboxes.errors import Unsupported
from hermes_sandboxes.sandbox import FileChange
from hermes_sandboxes.util import failpoints

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_IOW_4096 = 0x50009400
_SUBVOL_CREATE = _IOW_4096 | 14
_SNAP_DESTROY = _IOW_4096 | 15
_SNAP_CREATE_V2 = _IOW_4096 | 23
_SUBVOL_GETFLAGS = 0x80089419  # _IOR(0x94, 25, __u64)
_SUBVOL_SETFLAGS = 0x4008941A  # _IOW(0x94, 26, __u64)
_FICLONE = 0x40049409  # _IOW(0x94, 9, int)
_RDONLY = 1 << 1
_SUBVOL_ROOT_INO = 256
KINDS = ("subvolume", "reflink", "overlay")
_MANIFEST = ".manifest"  # beside an earlier version's overlay checkpoint: what its layer held
DISK_LIMIT_REFUSAL = ("disk limits need root mode: every quota this store's filesystem has (btrfs qgroups, "
                      "XFS or ext4 project quotas) can only be set by root; create the sandbox without "
                      "a disk limit")


_MAGIC = {0x9123683E: "btrfs", 0x58465342: "xfs", 0xEF53: "ext4", 0x01021994: "tmpfs", 0x794C7630: "overlay"}


def filesystem_of(path: Path) -> tuple[str, frozenset[str]]:
    """The type (statfs) and super-block options (the mount point in mountinfo that holds
    ``path``) of the filesystem ``path`` is on. btrfs gives each subvolume a device number of its
    own, so mountinfo's device numbers cannot name it."""
    buf = ctypes.create_string_buffer(256)  # struct statfs: f_type is its first word
    if _libc.statfs(os.fsencode(path), buf) != 0:
        return "unknown", frozenset()
    magic = ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF
    fstype = _MAGIC.get(magic, f"0x{magic:x}")
    real, best, options = os.path.realpath(path), "", frozenset[str]()
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].replace("\\040", " ")
            inside = real == point or real.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best) and "-" in fields:
                tail = fields[fields.index("-") + 1:]
                best, options = point, frozenset(tail[2].split(",")) if len(tail) > 2 else frozenset()
    return fstype, options


def _ioctl(directory: Path, request: int, arg: bytearray) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, request, arg)
    finally:
        os.close(fd)


def _vol_args(name: str, fd: int = 0) -> bytearray:
    return bytearray(struct.pack("=q4088s", fd, name.encode()))


class RootlessStore(Store):
    """What every rootless kind shares: a plain directory, content work in the user namespace."""

    xattr_prefix = "user.overlay."
    rootless = True

    def __init__(self, home: Path) -> None:
        super().__init__(home / "layers")
        self.home = home

    def ensure(self) -> None:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        if os.stat(self.root).st_mode & 0o077:
            os.chmod(self.root, 0o700)
        self.sweep_leftover_trash()

    def _sweep_trash(self) -> None:
        mapped.call(trash.sweep_later, self.root)  # the sweeper removes inner users' files

    def rootless_base(self) -> Path | None:
        """The built Debian root this user's sandboxes share, or None until it is built."""
        return baseimage.built()

    def _remove_tree(self, path: Path) -> None:
        if os.path.lexists(path):
            mapped.run(["rm", "-rf", "--", str(path)], f"removing {path}")

    def _copy(self, source: Path, target: Path) -> None:
        # in-process (copier.py): starting cp costs more than copying a small layer; its
        # copy_file_range shares the data where the filesystem has reflinks (the kernel clones first)
        mapped.call(increment.copy_layer, source, target)

    def _remove_volume(self, path: Path) -> None:
        self._remove_tree(path)

    def tree_bytes(self, path: Path) -> int:
        return mapped.call(tree_bytes, path)

    def pin_layer(self, name: str) -> PinnedLayer | None:
        # the walk runs in the namespace's helper, which has no way to this process's descriptor
        return None if mapped.needed() else super().pin_layer(name)

    def diff_layers(self, old: Path, new: Path, lower: Path | None, hint: treediff.Hint | None,
                    spend: treediff.Spend | None = None) -> list[FileChange]:
        # the helper's walk has its own budget: no hint came before it here (change_hint is None)
        return mapped.call(treediff.diff_layers, old, new, lower, hint, self.xattr_prefix + "opaque")

    def check_disk_limit(self, limit: int | None) -> None:
        if limit is not None:
            raise Unsupported(DISK_LIMIT_REFUSAL)


class OverlayStore(RootlessStore):
    kind = "overlay"
    cheap = False
    deferred_removal = True
    incremental = True  # chained delta checkpoints (increment.py)

    def __init__(self, home: Path) -> None:
        super().__init__(home)
        self.fstype = "unknown"

    @property
    def description(self) -> str:
        return (f"overlay layers on {self.fstype}: a layer holds copies of the files the sandbox changed; a "
                "checkpoint copies what changed since the previous one (a delta on it), a restore copies "
                "the checkpoint's files (never the base)")

    def ensure(self) -> None:
        super().ensure()
        self.fstype = filesystem_of(self.root)[0]

    def _make_volume(self, path: Path) -> None:
        path.mkdir()

    def _copy_volume(self, source: Path, target: Path, *, readonly: bool, group: int | None = None) -> None:
        if group is not None:
            raise Unsupported(DISK_LIMIT_REFUSAL)
        if not self.incremental:
            self._copy(source, target)
        elif readonly:  # a checkpoint (staged in the checkpoints directory)
            mapped.call(increment.checkpoint, source, target, target.parent)
        elif source.parent.name == "checkpoints":  # a restore or a fork of a checkpoint: its chain
            mapped.call(increment.materialize, source.parent, source.name, target, False)
        else:  # a fork of the live layer
            mapped.call(increment.copy_live, source, target)

    def remove_sandbox(self, name: str) -> None:
        super().remove_sandbox(name)
        self._release()

    def discard(self, volume: Path) -> None:
        super().discard(volume)
        self._release()

    def _release(self) -> None:
        """The helper's descriptors to a layer that is gone (handles.py) go now: they keep its blocks."""
        if self.incremental and mapped.started():
            mapped.call(handles.prune)

    def snapshot(self, name: str, checkpoint_id: str) -> None:
        super().snapshot(name, checkpoint_id)
        if self.incremental:  # the next checkpoint's parent (read with care: this may never happen)
            increment.point_to(self.layer(name), checkpoint_id)

    @contextlib.contextmanager
    def checkpoint_tree(self, name: str, checkpoint_id: str) -> Iterator[Path]:
        path = self.checkpoint_path(name, checkpoint_id)
        if not self.incremental or not (path / increment.DELTA).exists():
            yield path
            return
        view = self.sandbox_dir(name) / f".view-{checkpoint_id}-{os.urandom(4).hex()}"
        try:
            mapped.call(increment.materialize, path.parent, checkpoint_id, view, True)
            yield view
        finally:
            self._remove_tree(view)

    def changed_since(self, name: str, checkpoint_id: str) -> bool | None:
        """From the checkpoint's state: False when no entry of the live layer changed since (an
        automatic checkpoint can then reuse it); None for a layer it was not taken of."""
        if not self.incremental:
            return None
        return mapped.call(increment.changed_since, self.layer(name), self.checkpoint_path(name, checkpoint_id))

    def delete_checkpoint(self, name: str, checkpoint_id: str) -> None:
        """Fold the checkpoint into each delta on it first (each swapped in whole), then drop its
        record, then its files: killed at any point, every checkpoint still listed reads the same."""
        directory = self.checkpoints_dir(name)
        (directory / f"{checkpoint_id}{_MANIFEST}").unlink(missing_ok=True)  # an earlier version's
        if self.incremental and (directory / checkpoint_id).is_dir():
            for child in mapped.call(increment.children, directory, checkpoint_id):
                staged = directory / f".tmp-fold-{child}-{os.urandom(4).hex()}"
                mapped.call(increment.fold, directory, checkpoint_id, child, staged)
                failpoints.pause("fold-staged")
                sc.rename_exchange(str(staged), str(directory / child))
                failpoints.pause("fold-exchanged")
                self._remove_volume(staged)  # the child as it was
            self._repoint(name, checkpoint_id)
        with contextlib.suppress(FileNotFoundError):
            (directory / f"{checkpoint_id}.json").unlink()
        failpoints.pause("checkpoint-unrecorded")
        self._remove_volume(directory / checkpoint_id)

    def _repoint(self, name: str, checkpoint_id: str) -> None:
        """A layer whose last checkpoint is going gets that one's parent as its next parent."""
        layer = self.layer(name)
        with contextlib.suppress(OSError):
            if increment.pointed(layer) == checkpoint_id:
                delta = increment.read_delta(self.checkpoint_path(name, checkpoint_id))
                if delta is None:
                    (layer / increment.PARENT).unlink()
                else:
                    increment.point_to(layer, delta[0])

    def gc(self, name: str) -> None:
        super().gc(name)
        directory = self.checkpoints_dir(name)
        if directory.is_dir():  # manifests of an earlier version's checkpoints that are gone
            for manifest in directory.glob(f"*{_MANIFEST}"):
                if not (directory / manifest.name.removesuffix(_MANIFEST)).is_dir():
                    manifest.unlink(missing_ok=True)


class ReflinkStore(OverlayStore):
    kind = "reflink"
    incremental = False  # a reflink copy shares every block already
    @property
    def description(self) -> str:
        return (f"reflink copies on {self.fstype}: checkpoints and restores share every data block "
                "(their cost follows the layer's file count, not its bytes)")


class SubvolumeStore(RootlessStore):
    kind = "subvolume"
    cheap = True

    def __init__(self, home: Path) -> None:
        super().__init__(home)
        self.fast_delete: bool | None = None  # None: not known yet

    @property
    def description(self) -> str:
        delete = ("deletes in one step (user_subvol_rm_allowed)" if self.fast_delete
                  else "deletes empty the subvolume first (mount with user_subvol_rm_allowed for one-step deletes)")
        return f"btrfs subvolumes: constant-time checkpoints, restores and forks (snapshots); {delete}"

    def ensure(self) -> None:
        super().ensure()
        if self.fast_delete is None:
            self.fast_delete = "user_subvol_rm_allowed" in filesystem_of(self.root)[1]

    def _make_volume(self, path: Path) -> None:
        _ioctl(path.parent, _SUBVOL_CREATE, _vol_args(path.name))

    def _copy_volume(self, source: Path, target: Path, *, readonly: bool, group: int | None = None) -> None:
        if group is not None:
            raise Unsupported(DISK_LIMIT_REFUSAL)
        src = os.open(source, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            flags = _RDONLY if readonly else 0
            args = bytearray(struct.pack("=qQQ32x4040s", src, 0, flags, target.name.encode()))
            _ioctl(target.parent, _SNAP_CREATE_V2, args)
        finally:
            os.close(src)

    def _remove_volume(self, path: Path) -> None:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if st.st_ino != _SUBVOL_ROOT_INO or not os.path.isdir(path):
            self._remove_tree(path)
            return
        _set_writable(path)  # the kernel deletes a read-only snapshot for root only
        try:
            _ioctl(path.parent, _SNAP_DESTROY, _vol_args(path.name))
            return
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EACCES):
                raise
            self.fast_delete = False
        # no user_subvol_rm_allowed: the kernel lets the owner rmdir a subvolume once it is empty
        entries = [str(path / name) for name in os.listdir(path)]
        if entries:
            mapped.run(["rm", "-rf", "--", *entries], f"emptying {path}")
        os.rmdir(path)


def _set_writable(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        flags = bytearray(8)
        fcntl.ioctl(fd, _SUBVOL_GETFLAGS, flags)
        value = struct.unpack("=Q", flags)[0]
        if value & _RDONLY:
            fcntl.ioctl(fd, _SUBVOL_SETFLAGS, bytearray(struct.pack("=Q", value & ~_RDONLY)))
    finally:
        os.close(fd)


def probe(directory: Path) -> str:
    """The best kind the filesystem at ``directory`` gives this user: tried, not guessed."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    trial = directory / f".probe-{os.getpid()}"
    if filesystem_of(directory)[0] == "btrfs":
        try:
            _ioctl(directory, _SUBVOL_CREATE, _vol_args(trial.name))
        except OSError:
            pass
        else:
            os.rmdir(trial)  # an empty subvolume: its owner may rmdir it
            return "subvolume"
    try:
        with open(trial, "w+b") as a:  # FICLONE reads its source: open it readable
            a.write(b"x")
            a.flush()
            with open(f"{trial}.clone", "wb") as b:
                fcntl.ioctl(b.fileno(), _FICLONE, a.fileno())
        return "reflink"
    except OSError:
        return "overlay"
    finally:
        for leftover in (trial, Path(f"{trial}.clone")):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                leftover.unlink()


def make(kind: str, home: Path) -> RootlessStore:
    store: RootlessStore
    if kind == "subvolume":
        store = SubvolumeStore(home)
    elif kind == "reflink":
        store = ReflinkStore(home)
    elif kind == "overlay":
        store = OverlayStore(home)
    else:
        raise Unsupported(f"store kind {kind!r} is not a rootless one ({', '.join(KINDS)}); a store made by "
                          "root is used by root")
    store.ensure()
    return store


def choose(home: Path, recorded: str | None = None) -> RootlessStore:
    """The store at ``home``: the kind it was made with, else the best its filesystem allows."""
    return make(recorded or probe(home / "layers"), home)
