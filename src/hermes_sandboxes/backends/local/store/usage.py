"""What the local store costs on disk: the store as a whole and each sandbox in it (``df``).

Per sandbox: ``layer`` is its writable layer's files (what ``du`` counts under the layer's upper
directory), ``checkpoints`` the files of its checkpoints counted each on its own (``du`` of each
snapshot: on btrfs they share unchanged data, so this is what they would take as copies), and
``exclusive`` what removing the sandbox would give back: on btrfs the data its layer and checkpoints
reference and nothing else does, as ``btrfs filesystem du -s`` reports it (its Exclusive plus its
Set shared; data a fork still shares is not counted), on the copy store layer plus checkpoints, on
a rootless store every inode of the sandbox once (the overlay store's checkpoints share files).
The store: the bytes its filesystem has in use (what ``df`` reports) and, for the btrfs store, the
image file's allocation on the host disk.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from hermes_sandboxes.backends.local.store import mapped
from hermes_sandboxes.backends.local.store.base import BtrfsStore, Store
from hermes_sandboxes.backends.local.store.fdwalk import Tree
from hermes_sandboxes.errors import SandboxError


def sandbox_bytes(store: Store, name: str) -> tuple[int, int, int]:
    """(layer, checkpoints, exclusive) bytes of sandbox ``name``."""
    layer = store.tree_bytes(store.layer(name) / "upper")  # rootless: read in the sandbox's id mapping
    checkpoints = sum(store.tree_bytes(store.checkpoint_path(name, cid) / "upper")
                      for cid in store.checkpoint_ids(name))
    if store.kind == "subvolume":  # rootless btrfs: its snapshots share extents, as the image store's
        return layer, checkpoints, mapped.call(_btrfs_exclusive, store.sandbox_dir(name))
    if store.rootless:  # the overlay store's checkpoints share unchanged files: each inode counted once
        uppers = [store.layer(name) / "upper",
                  *(store.checkpoint_path(name, cid) / "upper" for cid in store.checkpoint_ids(name))]
        return layer, checkpoints, mapped.call(_unique_bytes, uppers)
    if not isinstance(store, BtrfsStore):
        return layer, checkpoints, layer + checkpoints
    return layer, checkpoints, _btrfs_exclusive(store.sandbox_dir(name))


def _unique_bytes(roots: list[Path]) -> int:
    """Disk bytes of the files under ``roots`` (one filesystem), each inode counted once."""
    seen: set[int] = set()
    total = 0
    for root in roots:
        try:
            tree = Tree(root)
        except OSError:
            continue
        with tree:
            for _, st in tree.walk():
                if st.st_ino not in seen:
                    seen.add(st.st_ino)
                    total += st.st_blocks * 512
    return total


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
    return store.tree_bytes(store.root), None
