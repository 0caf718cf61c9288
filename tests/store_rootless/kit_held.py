"""The overlay store's checkpoints through the helper's descriptors (handles.py), as the test user
(``python -m tests.store_rootless.kit_held SCENARIO HOME``): one JSON object on stdout.

A layer with an old, deep subtree is checkpointed until the helper holds a descriptor per entry;
then each kind of change a directory's times do not show (and some they do) is made deep in that
subtree, one per checkpoint, and each checkpoint, read through its chain, must be the layer as it
was. Also: a write through a shared mapping to a page dirtied before the checkpoint (no fault, so
no ctime of its own), and the blocks of deleted files, which a held descriptor keeps only until the
layer's next checkpoint or its removal.
"""

from __future__ import annotations

import json
import mmap
import os
import sys
from pathlib import Path
from typing import Any

from hermes_sandboxes.backends.local.store import handles, mapped, rootless
from tests.store_rootless.kit import _listing, _materialized, _trash_swept

DEEP = "old/a/b/c/d/e/f"
BIG = 16 << 20


def _old_tree(upper: Path) -> None:
    for depth in range(1, 8):
        directory = upper / "/".join(DEEP.split("/")[:depth])
        directory.mkdir(exist_ok=True)
        for i in range(5):
            (directory / f"file{i}").write_bytes(os.urandom(100 + depth))
    (upper / "old/big").write_bytes(os.urandom(BIG))


def _change(upper: Path, kind: str) -> None:
    """One change deep in the old subtree, made as the sandbox's root makes it."""
    deep = upper / DEEP
    target = deep / "file1"
    if kind == "write in place, same size":
        with open(target, "r+b") as f:
            f.write(b"X" * 4)
    elif kind == "chmod only":
        os.chmod(target, 0o600)
    elif kind == "chown only":
        os.chown(target, 42, 43)
    elif kind == "xattr only":
        os.setxattr(target, "user.note", b"set")
    elif kind == "times only":
        os.utime(target, ns=(1_000_000_000, 2_000_000_000))
    elif kind == "truncate":
        os.truncate(target, 3)
    elif kind == "hard link from another directory":
        os.link(deep / "file2", upper / "old/a/linked")
    elif kind == "rename over":
        (deep / "fresh").write_bytes(b"replacement")
        os.replace(deep / "fresh", deep / "file3")
    elif kind == "rename within":
        os.rename(deep / "file4", deep / "moved")
    elif kind == "delete":
        os.unlink(deep / "file0")
    elif kind == "directory replaced by a file":
        for name in os.listdir(deep):
            os.unlink(deep / name)
        os.rmdir(deep)
        deep.write_bytes(b"was a directory")
    else:
        raise AssertionError(kind)


KINDS = ("write in place, same size", "chmod only", "chown only", "xattr only", "times only", "truncate",
         "hard link from another directory", "rename over", "rename within", "delete",
         "directory replaced by a file")


def _held() -> int:
    return handles.count()


def _head(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(2)


def _delete(path: Path) -> None:
    path.unlink()


def _free_bytes(root: Path) -> int:
    os.sync()  # blocks of a deleted file are free once its transaction commits
    st = os.statvfs(root)
    return st.f_bfree * st.f_frsize


def scenario_changes(home: Path) -> dict[str, Any]:
    store = rootless.choose(home)
    store.create_layer("h")
    upper = store.layer("h") / "upper"
    mapped.call(_old_tree, upper)
    out: dict[str, Any] = {"mismatches": []}
    taken = 0

    def checkpoint() -> str:
        nonlocal taken
        cid = f"c{taken:02d}"
        taken += 1
        expected = mapped.call(_listing, upper)
        store.snapshot("h", cid)
        (store.checkpoints_dir("h") / f"{cid}.json").write_text("{}")
        if _materialized(store, "h", cid) != expected:
            out["mismatches"].append(cid)
        return cid

    checkpoint()
    out["held_after_first"] = mapped.call(_held)  # a process that checkpoints once opens none
    checkpoint()
    out["held_after_second"] = mapped.call(_held)
    for kind in KINDS:
        mapped.call(_change, upper, kind)
        cid = checkpoint()
        out.setdefault("checkpoints", {})[kind] = cid
    out["held_at_the_end"] = mapped.call(_held)
    # a shared mapping's writes: the first faults (and moves the ctime); one to the same page after a
    # checkpoint faults only if that checkpoint write-protected the page (else no ctime moves)
    mapped_file = upper / "old/mapped"
    mapped_file.write_bytes(b"\0" * 8192)
    os.sync()  # clean, so the first write through the mapping faults
    fd = os.open(mapped_file, os.O_RDWR)
    try:
        with mmap.mmap(fd, 8192, mmap.MAP_SHARED) as view:
            view[0] = 1
            first = checkpoint()
            view[1] = 2  # the same page, still dirty
            second = checkpoint()
    finally:
        os.close(fd)
    out["mapped"] = {}
    for cid in (first, second):
        with store.checkpoint_tree("h", cid) as tree:
            out["mapped"][cid] = list(mapped.call(_head, tree / "upper/old/mapped"))
    # blocks of a deleted file: kept by its descriptor until the next checkpoint
    free_before = _free_bytes(store.root)
    mapped.call(_delete, upper / "old/big")
    out["freed_at_once"] = _free_bytes(store.root) - free_before
    checkpoint()
    out["freed_after_checkpoint"] = _free_bytes(store.root) - free_before
    store.remove_sandbox("h")
    out["held_after_removal"] = mapped.call(_held)
    _trash_swept(store.root)
    out["left"] = sorted(p.name for p in store.root.iterdir())
    return out


def main() -> None:
    if sys.argv[1] == "changes":
        result = scenario_changes(Path(sys.argv[2]))
    else:
        raise SystemExit(f"unknown scenario {sys.argv[1]}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
