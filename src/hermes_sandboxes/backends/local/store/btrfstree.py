"""What changed in a btrfs subvolume since a transaction, read from its metadata tree.

Every btrfs tree block and every inode item carries the id of the transaction that last wrote it,
and a snapshot starts out sharing all blocks with its source. So the inodes changed in a subvolume
after transaction ``g`` are the inode items with ``transid > g``, and the kernel's tree search can
skip every block older than ``g``: the cost follows what changed, not how big the tree is.

A snapshot is always taken in a committed transaction (creating it commits), so anything written
to its source afterwards carries a higher transid. Subvolume uuids record which subvolume each
snapshot came from; ``common_generation`` follows them to the newest state two trees share.

The kernel structures read here are those of ``linux/btrfs.h`` and ``linux/btrfs_tree.h``.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

_SEARCH_V2 = 0xC0709411  # _IOWR(0x94, 17, struct btrfs_ioctl_search_args_v2)
_INO_LOOKUP = 0xD0009412  # _IOWR(0x94, 18, struct btrfs_ioctl_ino_lookup_args)
_GET_SUBVOL_INFO = 0x81F8943C  # _IOR(0x94, 60, struct btrfs_ioctl_get_subvol_info_args)

_SEARCH_KEY = struct.Struct("=7Q4I4Q")  # tree, objectid/offset/transid ranges, types, nr_items
_SEARCH_HEADER = struct.Struct("=3Q2I")  # transid (of the leaf), objectid, offset, type, len
_SUBVOL_INFO = struct.Struct("=Q256s4Q16s16s16s4Q")
_SUBVOL_INFO_SIZE = 504
_BUF_SIZE = 256 << 10

_INODE_ITEM = 1
_INODE_REF = 12
_INODE_EXTREF = 13
_FIRST_FREE_OBJECTID = 256
_LAST_FREE_OBJECTID = 2**64 - 257  # -256 as u64: the last objectid an inode can have
_U64_MAX = 2**64 - 1
_U32_MAX = 2**32 - 1
_INODE_TYPES = frozenset((_INODE_ITEM, _INODE_REF, _INODE_EXTREF))
_S_IFMT, _S_IFDIR = 0o170000, 0o040000
_RDONLY = 1  # BTRFS_ROOT_SUBVOL_RDONLY in the subvolume info's flags


@dataclass(frozen=True)
class SubvolInfo:
    treeid: int  # the subvolume's id (its qgroup is 0/<treeid>)
    uuid: bytes
    parent_uuid: bytes  # the subvolume it is a snapshot of (zeros when made from nothing)
    otransid: int  # the transaction that created it
    generation: int  # the last transaction that wrote its tree
    readonly: bool


def subvol_info(fd: int) -> SubvolInfo:
    """The subvolume ``fd`` (any file or directory in it) belongs to."""
    buf = bytearray(_SUBVOL_INFO_SIZE)
    fcntl.ioctl(fd, _GET_SUBVOL_INFO, buf)
    (treeid, _, _, _, generation, flags, uuid, parent_uuid, _, _, otransid, _, _) = _SUBVOL_INFO.unpack_from(buf)
    return SubvolInfo(treeid, uuid, parent_uuid, otransid, generation, bool(flags & _RDONLY))


def common_generation(a: SubvolInfo, b: SubvolInfo, known: Mapping[bytes, SubvolInfo]) -> int | None:
    """A transaction ``g`` such that both trees are one shared state plus changes made after ``g``
    (the newest such point their ancestry shows), or None when they share no known ancestor.

    A subvolume made as a snapshot of P at transaction t is P's state at t, plus (if writable) its
    own changes since; P's state at t is in turn P's own origin plus P's changes up to t. Two trees
    that meet in the same P, at t1 and t2, share P's state at min(t1, t2).
    """
    points_a, points_b = dict(_ancestry(a, known)), dict(_ancestry(b, known))
    shared = [min(points_a[uuid], points_b[uuid]) for uuid in points_a.keys() & points_b.keys()]
    return max(shared) if shared else None


def _ancestry(info: SubvolInfo, known: Mapping[bytes, SubvolInfo]) -> Iterator[tuple[bytes, int]]:
    """(subvolume uuid, transaction) points: this tree is that subvolume's state then, plus changes."""
    yield info.uuid, info.generation if info.readonly else _U64_MAX
    seen = {info.uuid}
    while any(info.parent_uuid) and info.parent_uuid not in seen:
        yield info.parent_uuid, info.otransid
        seen.add(info.parent_uuid)
        parent = known.get(info.parent_uuid)
        if parent is None:
            return
        info = parent


@dataclass
class Changes:
    """Inodes of one subvolume written after a transaction."""

    items: dict[int, bytes]  # changed inode -> what its inode item says (see _identity)
    parents: dict[int, set[int]]  # changed inode -> the directories holding its names
    dirs: set[int]  # changed directories, and the directories holding a changed inode

    def complete(self, fd: int, check: Callable[[int], None] | None = None) -> None:
        """Read the names of changed inodes whose names were not in the changed blocks; ``check``
        as in changed_inodes."""
        for inode in self.items.keys() - self.parents.keys():
            if check is not None:
                check(len(self.items))
            self.parents[inode] = parents_of(fd, inode)
            self.dirs |= self.parents[inode]


def changed_inodes(fd: int, after: int, check: Callable[[int], None] | None = None) -> Changes:
    """Inodes of fd's subvolume whose inode item was written after transaction ``after``, with
    the directories whose entries (or entries' inodes) changed; call complete() before use.
    ``check`` is told the count of changed inodes held so far at each one (it may raise: a
    budget)."""
    changes = Changes({}, {}, set())
    for objectid, item_type, offset, data in _search(fd, after + 1):
        if item_type == _INODE_ITEM:
            if struct.unpack_from("=Q", data, 8)[0] > after:  # the item's own transid
                changes.items[objectid] = _identity(data)
                if check is not None:
                    check(len(changes.items))
                if struct.unpack_from("=I", data, 52)[0] & _S_IFMT == _S_IFDIR:
                    changes.dirs.add(objectid)
        elif objectid in changes.items:
            found = _parents(item_type, offset, data)
            changes.parents.setdefault(objectid, set()).update(found)
            changes.dirs.update(found)
    return changes


def changed_items(fd: int, after: int) -> Iterator[tuple[int, bool, bytes]]:
    """(inode, is a directory, _identity of its item) for each inode item of fd's subvolume written
    after transaction ``after``, lazily: a caller that only needs the first can stop there."""
    for objectid, _, _, data in _search(fd, after + 1, types=frozenset((_INODE_ITEM,))):
        if struct.unpack_from("=Q", data, 8)[0] > after:
            is_dir = struct.unpack_from("=I", data, 52)[0] & _S_IFMT == _S_IFDIR
            yield objectid, is_dir, _identity(data)


def _identity(item: bytes) -> bytes:
    """An inode item without what a mere read or a rewrite of the same item changes (transid,
    i_version, atime): any real change moves ctime, and often size, nlink, mode or mtime with it."""
    return item[0:8] + item[16:72] + item[124:160]


def inode_identity(fd: int, inode: int) -> bytes | None:
    """_identity of the inode item of ``inode`` in fd's subvolume, None if there is none."""
    for _, _, _, data in _search(fd, 0, inode, inode, _INODE_ITEM, _INODE_ITEM):
        return _identity(data)
    return None


def parents_of(fd: int, inode: int) -> set[int]:
    """The directories holding a name of ``inode`` (read wherever its names are stored)."""
    found: set[int] = set()
    for _, item_type, offset, data in _search(fd, 0, inode, inode, _INODE_REF, _INODE_EXTREF):
        found.update(_parents(item_type, offset, data))
    return found


def _parents(item_type: int, offset: int, data: bytes) -> Iterable[int]:
    if item_type == _INODE_REF:
        return (offset,)  # keyed by the parent directory; the item lists names in it
    parents, pos = [], 0  # extended refs: (parent, index, name length, name) records
    while pos + 18 <= len(data):
        parent, _, name_len = struct.unpack_from("=QQH", data, pos)
        parents.append(parent)
        pos += 18 + name_len
    return parents


def _search(fd: int, min_transid: int, min_objectid: int = _FIRST_FREE_OBJECTID,
            max_objectid: int = _LAST_FREE_OBJECTID, min_type: int = 0,
            max_type: int = 255, types: frozenset[int] = _INODE_TYPES) -> Iterator[tuple[int, int, int, bytes]]:
    """(objectid, type, offset, data) of the items of fd's subvolume tree in the key range whose
    type is in ``types``, from blocks written in or after ``min_transid`` (the kernel skips older
    blocks). Key ranges are lexicographic over (objectid, type, offset)."""
    buf = bytearray(_SEARCH_KEY.size + 8 + _BUF_SIZE)
    start = (min_objectid, min_type, 0)
    header = _SEARCH_HEADER.unpack_from
    while True:
        _SEARCH_KEY.pack_into(buf, 0, 0, start[0], max_objectid, start[2], _U64_MAX, min_transid, _U64_MAX,
                              start[1], max_type, _U32_MAX, 0, 0, 0, 0, 0)
        struct.pack_into("=Q", buf, _SEARCH_KEY.size, _BUF_SIZE)
        fcntl.ioctl(fd, _SEARCH_V2, buf)
        count = struct.unpack_from("=I", buf, 7 * 8 + 8)[0]  # nr_items: how many were returned
        if count == 0:
            return
        pos = _SEARCH_KEY.size + 8
        objectid = item_type = offset = 0
        for _ in range(count):
            _, objectid, offset, item_type, length = header(buf, pos)
            pos += 32
            if item_type in types:
                yield objectid, item_type, offset, bytes(buf[pos:pos + length])
            pos += length
        following = _next_key((objectid, item_type, offset))
        if following is None or following[0] > max_objectid:
            return
        start = following


def _next_key(key: tuple[int, int, int]) -> tuple[int, int, int] | None:
    objectid, item_type, offset = key
    if offset < _U64_MAX:
        return objectid, item_type, offset + 1
    if item_type < 255:
        return objectid, item_type + 1, 0
    if objectid < _U64_MAX:
        return objectid + 1, 0, 0
    return None


def inode_path(fd: int, inode: int) -> str | None:
    """Path of directory ``inode`` relative to the top of fd's subvolume ("" for the top, else
    ending in "/"), or None when it has no name there (deleted, or too long for the kernel)."""
    if inode == _FIRST_FREE_OBJECTID:
        return ""
    buf = bytearray(struct.pack("=QQ", 0, inode) + bytes(4080))
    try:
        fcntl.ioctl(fd, _INO_LOOKUP, buf)
    except OSError:
        return None
    return os.fsdecode(bytes(buf[16:]).split(b"\0", 1)[0])


_libc = ctypes.CDLL(None, use_errno=True)


def syncfs(fd: int) -> None:
    """Commit what is still in memory of fd's filesystem (and only that filesystem)."""
    if _libc.syncfs(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"syncfs: {os.strerror(err)}")
