"""What the local store costs on disk: the store as a whole and each sandbox in it (``df``).

Per sandbox: ``layer`` is its writable layer's files (what ``du`` counts under the layer's upper
directory), ``checkpoints`` the files of its checkpoints counted each on its own (``du`` of each
snapshot: on btrfs they share unchanged data, so this is what they would take as copies), and
``exclusive`` what removing the sandbox would give back: on btrfs the data its layer and checkpoints
reference and nothing else does, as ``btrfs filesystem du -s`` reports it (its Exclusive plus its
Set shared; data a fork still shares is not counted), on the copy store layer plus checkpoints.
The store: the bytes its filesystem has in use (what ``df`` reports) and, for the btrfs store, the
image file's allocation on the host disk.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from hermes_sandboxes.backends.local.store.base import BtrfsStore, Store, tree_bytes
from hermes_sandboxes.errors import SandboxError


def sandbox_bytes(store: Store, name: str) -> tuple[int, int, int]:
    """(layer, checkpoints, exclusive) bytes of sandbox ``name``."""
    layer = tree_bytes(store.layer(name) / "upper")
    checkpoints = sum(tree_bytes(store.checkpoint_path(name, cid) / "upper") for cid in store.checkpoint_ids(name))
    if not isinstance(store, BtrfsStore):
        return layer, checkpoints, layer + checkpoints
    return layer, checkpoints, _btrfs_exclusive(store.sandbox_dir(name))


def _btrfs_exclusive(directory: Path) -> int:
    done = subprocess.run(["btrfs", "filesystem", "du", "-s", "--raw", str(directory)],
                          capture_output=True, text=True, check=False)
    lines = done.stdout.splitlines()
    if done.returncode != 0 or len(lines) < 2:
        raise SandboxError(f"btrfs filesystem du {directory} failed: {done.stderr.strip() or done.stdout.strip()}")
    _total, exclusive, shared, *_ = lines[-1].split()
    return int(exclusive) + int(shared)


def store_bytes(store: Store) -> tuple[int, int | None]:
    """(bytes in use in the store's filesystem, the image's allocation on the host or None)."""
    if isinstance(store, BtrfsStore):
        vfs = os.statvfs(store.root)
        return (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize, os.stat(store.image).st_blocks * 512
    return tree_bytes(store.root), None
