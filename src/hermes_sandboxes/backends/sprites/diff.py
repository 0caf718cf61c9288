"""Checkpoint diffs on Sprites, computed inside the Sprite.

The service mounts its newest five checkpoints read-only at ``/.sprite/checkpoints/<id>/`` in the
Sprite (the checkpoints concept page of superfly/sprites-docs). A diff is one command in the Sprite
that walks the checkpoint's tree beside the live one (or beside a newer checkpoint's) and prints one
JSON line per path that differs; the lines are read as they arrive, so host memory follows the
number of changes, never the tree. The walk is bounded: it stops after ``MAX_CHANGES`` paths and
after ``WALK_SECONDS``, and says so instead of answering with part of the truth.

What it compares: the top-level directories the checkpoint's mount holds, except the ones that are
not the Sprite's files (``/proc``, ``/sys``, ``/dev``, ``/run``, ``/tmp``, ``/.sprite`` ...); a
top-level directory created since the checkpoint is therefore not listed. A file is unchanged when
its type, permissions and size match and either its modification time or (when only that differs)
its contents do; a symlink when its target does.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from hermes_sandboxes.errors import SandboxError, Unsupported
from hermes_sandboxes.sandbox import ChangeKind, FileChange

if TYPE_CHECKING:
    from hermes_sandboxes.backends.sprites.sandbox import SpritesSandbox

MOUNTS = "/.sprite/checkpoints"
MOUNTED = 5  # how many of the newest checkpoints the service mounts
MAX_CHANGES = 100_000
WALK_SECONDS = 300.0
_TRUNCATED, _LATE, _OLD_MISSING, _NEW_MISSING = 3, 4, 5, 6

# argv: old root, new root, the most changes, seconds, paths to leave out. Prints [kind, path, size, old size].
_SCRIPT = r"""
import json, os, stat, sys, time
old_root, new_root, limit, deadline = sys.argv[1], sys.argv[2], int(sys.argv[3]), time.monotonic() + float(sys.argv[4])
skip = set(sys.argv[5:])
top_skip = {"proc", "sys", "dev", "run", "tmp", ".sprite", "mnt", "media", "lost+found"}
if not os.path.isdir(old_root):
    sys.exit(5)
if new_root and not os.path.isdir(new_root):
    sys.exit(6)
count = 0
def emit(kind, path, new, old):
    global count
    count += 1
    if count > limit:
        sys.exit(3)
    size = None if new is None or stat.S_ISDIR(new.st_mode) else new.st_size
    before = None if old is None or stat.S_ISDIR(old.st_mode) else old.st_size
    sys.stdout.write(json.dumps([kind, path, size, before]) + "\n")
def listing(d):
    d = d or "/"
    try:
        names = os.listdir(d)
    except OSError:
        return {}
    found = {}
    for n in names:
        try:
            found[n] = os.lstat(os.path.join(d, n))
        except OSError:
            pass
    return found
def equal_files(a, b):
    try:
        with open(a, "rb") as fa, open(b, "rb") as fb:
            while True:
                x, y = fa.read(1 << 16), fb.read(1 << 16)
                if x != y:
                    return False
                if not x:
                    return True
    except OSError:
        return False
def same(o, n, po, pn):
    if stat.S_IFMT(o.st_mode) != stat.S_IFMT(n.st_mode) or stat.S_IMODE(o.st_mode) != stat.S_IMODE(n.st_mode):
        return False
    if stat.S_ISLNK(o.st_mode):
        try:
            return os.readlink(po) == os.readlink(pn)
        except OSError:
            return False
    if stat.S_ISREG(o.st_mode):
        return o.st_size == n.st_size and (o.st_mtime_ns == n.st_mtime_ns or equal_files(po, pn))
    return True
def every(root, rel, st, kind):
    emit(kind, rel, st if kind == "added" else None, st if kind == "deleted" else None)
    if stat.S_ISDIR(st.st_mode):
        for name, child in sorted(listing(root + rel).items()):
            if rel + "/" + name not in skip:
                every(root, rel + "/" + name, child, kind)
def walk(rel, names):
    if time.monotonic() > deadline:
        sys.exit(4)
    old, new = listing(old_root + rel), listing(new_root + rel)
    for name in sorted(names if names is not None else set(old) | set(new)):
        path = rel + "/" + name
        if path in skip or (rel == "" and name in top_skip):
            continue
        o, n = old.get(name), new.get(name)
        if o is None and n is None:
            continue
        if o is None:
            every(new_root, path, n, "added")
        elif n is None:
            every(old_root, path, o, "deleted")
        else:
            if not same(o, n, old_root + path, new_root + path):
                emit("modified", path, n, o)
            if stat.S_ISDIR(o.st_mode) and stat.S_ISDIR(n.st_mode):
                walk(path, None)
            elif stat.S_ISDIR(n.st_mode):  # a file became a directory: what is in it is new
                for child, st in sorted(listing(new_root + path).items()):
                    every(new_root, path + "/" + child, st, "added")
            elif stat.S_ISDIR(o.st_mode):
                for child, st in sorted(listing(old_root + path).items()):
                    every(old_root, path + "/" + child, st, "deleted")
walk("", set(listing(old_root)))
"""


def mount_of(checkpoint_id: str) -> str:
    return f"{MOUNTS}/{checkpoint_id}"


def diff(sandbox: SpritesSandbox, from_id: str, to_id: str | None, *, skip: tuple[str, ...] = ()) -> list[FileChange]:
    """The changes from checkpoint ``from_id`` to ``to_id`` (or to the live tree), computed in the
    Sprite against the service's read-only mounts."""
    old = mount_of(from_id)
    new = mount_of(to_id) if to_id is not None else ""
    changes: list[FileChange] = []
    pending = bytearray()

    def take(chunk: bytes) -> None:
        pending.extend(chunk)
        *lines, rest = bytes(pending).split(b"\n")
        pending[:] = rest
        for line in lines:
            if line:
                changes.append(_change(json.loads(line)))

    argv = ["python3", "-c", _SCRIPT, old, new, str(MAX_CHANGES), str(WALK_SECONDS), *skip]
    err = bytearray()
    proc = sandbox.start(argv, on_stdout=take, on_stderr=err.extend)
    code = proc.wait(timeout=WALK_SECONDS + 60)
    if code is None:
        proc.kill()
    if pending.strip():
        take(b"\n")
    where = f"Sprite {sandbox.name}"
    if code in (_OLD_MISSING, _NEW_MISSING):
        missing = from_id if code == _OLD_MISSING else to_id
        raise Unsupported(f"{where}: checkpoint {missing} is not mounted in the Sprite (the service mounts only "
                          f"its newest {MOUNTED} checkpoints, under {MOUNTS}), so it cannot be compared "
                          "without restoring it")
    if code == _TRUNCATED:
        raise SandboxError(f"{where}: more than {MAX_CHANGES} paths changed since checkpoint {from_id}; "
                           "compare a narrower part of the tree with a command instead")
    if code == _LATE:
        raise SandboxError(f"{where}: comparing with checkpoint {from_id} took longer than {WALK_SECONDS:g}s")
    if code is None:
        raise SandboxError(f"{where}: comparing with checkpoint {from_id} did not finish")
    if code == 127:
        raise Unsupported(f"{where}: a diff runs python3 in the Sprite, and the Sprite has none")
    if code != 0:
        raise SandboxError(f"{where}: comparing with checkpoint {from_id} failed (exit {code}): "
                           f"{err.decode(errors='replace').strip()[-300:]}")
    return changes


def _change(row: Any) -> FileChange:
    kind, path, size, old = row
    return FileChange(path=str(path), kind=ChangeKind(kind), size=size, old_size=old)
