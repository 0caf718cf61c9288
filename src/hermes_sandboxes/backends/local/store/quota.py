"""Disk quotas per sandbox on the btrfs store, with btrfs simple quotas.

Simple quotas (Linux 6.7+) charge each data extent to the subvolume that wrote it, once, at no
measurable cost to snapshots. Full qgroup accounting, measured on the same machine, made
checkpoints about 3x and store-side restores about 5x slower (it re-counts shared extents at every
snapshot), so it is not used.

Each sandbox with a limit gets a level-1 qgroup that holds the qgroup of every layer it has had
(a restore makes a new layer subvolume), and the limit is set on that group. So the limit counts
all data the sandbox wrote that is still on disk: in its layer, or kept alive by its checkpoints
(deleting checkpoints frees it). A write past it fails inside with EDQUOT ("Disk quota exceeded").
Data of the read-only base and metadata are not counted.

A restore's new layer is made a member of that group by the snapshot that creates it (the
snapshot ioctl's qgroup inheritance, see ``Inherit``): it is limited from the moment it exists, and
nothing about the quota is left to do once the old init has died.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import struct

from hermes_sandboxes.errors import Unsupported

_QUOTA_CTL = 0xC0109428  # _IOWR(0x94, 40, struct btrfs_ioctl_quota_ctl_args)
_QGROUP_ASSIGN = 0x40189429  # _IOW(0x94, 41, struct btrfs_ioctl_qgroup_assign_args)
_QGROUP_CREATE = 0x4010942A  # _IOW(0x94, 42, struct btrfs_ioctl_qgroup_create_args)
_QGROUP_LIMIT = 0x8030942B  # _IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args)
_ENABLE_SIMPLE_QUOTA = 4
_LIMIT_MAX_RFER = 1
_NO_LIMIT = 2**64 - 1  # the kernel's "clear this limit" value
_LEVEL_1 = 1 << 48


_INHERIT = struct.Struct("=4Q5Q")  # struct btrfs_qgroup_inherit, before its qgroups[] array


class Inherit:
    """A ``struct btrfs_qgroup_inherit`` naming one qgroup, for a snapshot made with
    BTRFS_SUBVOL_QGROUP_INHERIT: the kernel makes the new subvolume's qgroup a member of it in the
    transaction that creates the subvolume (ENOENT when quotas are on and the group does not exist).
    The kernel reads it through a pointer: keep this object alive until the ioctl returns."""

    def __init__(self, qgroup: int) -> None:
        data = _INHERIT.pack(0, 1, 0, 0, 0, 0, 0, 0, 0) + struct.pack("=Q", qgroup)
        self._buffer = ctypes.create_string_buffer(data, len(data))
        self.size = len(data)

    @property
    def address(self) -> int:
        return ctypes.addressof(self._buffer)


def group_of(number: int) -> int:
    """The level-1 qgroup id "1/<number>"."""
    return _LEVEL_1 | number


def enable(fd: int) -> None:
    """Turn simple quotas on for fd's filesystem (a no-op when quotas are on already)."""
    try:
        fcntl.ioctl(fd, _QUOTA_CTL, bytearray(struct.pack("=QQ", _ENABLE_SIMPLE_QUOTA, 0)))
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTTY):
            raise Unsupported("disk limits need btrfs simple quotas (Linux 6.7 or later); "
                              f"this kernel refused them: {os.strerror(exc.errno)}") from None
        raise


def create_group(fd: int, qgroup: int) -> None:
    with contextlib.suppress(FileExistsError):
        fcntl.ioctl(fd, _QGROUP_CREATE, bytearray(struct.pack("=QQ", 1, qgroup)))


def remove_group(fd: int, qgroup: int) -> None:
    """Best effort: the kernel keeps a group that still has members or usage."""
    with contextlib.suppress(OSError):
        fcntl.ioctl(fd, _QGROUP_CREATE, bytearray(struct.pack("=QQ", 0, qgroup)))


def assign(fd: int, subvolume: int, qgroup: int) -> None:
    """Make the subvolume's own qgroup (0/<id>) a member of ``qgroup``."""
    with contextlib.suppress(FileExistsError):
        fcntl.ioctl(fd, _QGROUP_ASSIGN, bytearray(struct.pack("=QQQ", 1, subvolume, qgroup)))


def set_limit(fd: int, qgroup: int, limit: int | None) -> None:
    """Cap what ``qgroup`` refers to at ``limit`` bytes (None: no cap)."""
    value = _NO_LIMIT if limit is None else limit
    fcntl.ioctl(fd, _QGROUP_LIMIT, bytearray(struct.pack("=6Q", qgroup, _LIMIT_MAX_RFER, value, 0, 0, 0)))
