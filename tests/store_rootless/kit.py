"""What the rootless store tests run as the unprivileged test user (``python -m tests.store_rootless.kit``).

Each scenario prints one JSON object on stdout: what it saw, for the test (run as root) to check.
Sandbox-side changes are made the way a sandbox makes them: through an overlay (``userxattr``)
mounted in a user namespace mapped as the sandbox's, over a small base owned by that namespace's
ids, so whiteouts, opaque directories and files of inner users are the kernel's own.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import marshal
import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hermes_sandboxes.backends.local.guest import syscalls as sc
from hermes_sandboxes.backends.local.store import baseimage, increment, mapped, rootless, usage
from hermes_sandboxes.errors import SandboxError, Unsupported
from hermes_sandboxes.sandbox import Limits, SandboxSpec

BIG = 8 << 20  # a base file much larger than anything the scenarios change
DENSE = 4 << 20  # a file of the layer's own


def _make_base(base: Path) -> None:
    """A base as a built root would be: owned by inner root, one directory of inner uid 42 (0700)."""
    (base / "etc").mkdir(parents=True)
    (base / "etc" / "motd").write_text("base motd\n")
    (base / "etc" / "gone").write_text("deleted later\n")
    (base / "opt" / "tool").mkdir(parents=True)
    (base / "opt" / "tool" / "old").write_text("old tool\n")
    (base / "srv").mkdir()
    with open(base / "srv" / "big", "wb") as f:
        f.write(os.urandom(BIG))
    private = base / "var" / "apt-private"
    private.mkdir(parents=True)
    (private / "cache").write_text("apt's\n")
    os.chown(private / "cache", 42, 42)
    os.chmod(private, 0o700)
    os.chown(private, 42, 42)


def _in_overlay(base: Path, layer: Path, script: list[tuple[str, str, str]]) -> None:
    """Apply ``script`` (op, path, text) through an overlay of ``base`` under ``layer``: as a
    rootless sandbox's root sees its files (run as the namespace's root, in a mount namespace)."""
    sc.unshare(sc.CLONE_NEWNS)
    sc.mount("none", "/", None, sc.MS_REC | sc.MS_PRIVATE)
    merged = tempfile.mkdtemp(prefix="merged-")
    sc.mount("overlay", merged, "overlay", 0,
             f"lowerdir={base},upperdir={layer / 'upper'},workdir={layer / 'work'},userxattr")
    try:
        for op, rel, text in script:
            path = Path(merged) / rel
            if op == "write":
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
            elif op == "append":
                with open(path, "a") as f:
                    f.write(text)
            elif op == "rm":
                path.unlink()
            elif op == "rmdir-recreate":  # the kernel makes the new directory opaque
                for child in path.iterdir():
                    child.unlink()
                path.rmdir()
                path.mkdir()
                (path / "new").write_text(text)
            elif op == "dense":  # data a copy must duplicate and a reflink or snapshot shares
                path.write_bytes(os.urandom(DENSE))
            elif op == "chown42":
                os.chown(path, 42, 42)
            elif op == "specials":  # what cp -a keeps and a hand-made copy could lose
                path.mkdir(parents=True)
                (path / "a").write_text(text)
                os.link(path / "a", path / "b")
                os.symlink("../motd", path / "link")
                with open(path / "sparse", "wb") as f:
                    f.truncate(64 << 20)
                    f.write(b"x")
                os.mkfifo(path / "fifo")
                (path / "suid").write_text("#!/bin/sh\n")
                os.chmod(path / "suid", 0o4755)
                os.setxattr(path / "a", "user.note", b"kept")
    finally:
        sc.umount(merged)
        os.rmdir(merged)


def _read_view(base: Path, layer: Path) -> dict[str, Any]:
    """What the sandbox would see at the paths the scenarios touch (read through an overlay)."""
    sc.unshare(sc.CLONE_NEWNS)
    sc.mount("none", "/", None, sc.MS_REC | sc.MS_PRIVATE)
    merged = tempfile.mkdtemp(prefix="view-")
    sc.mount("overlay", merged, "overlay", sc.MS_RDONLY,
             f"lowerdir={layer / 'upper'}:{base},userxattr")
    try:
        view: dict[str, Any] = {}
        special = Path(merged) / "etc" / "special"
        if special.exists():
            a, sparse = os.lstat(special / "a"), os.lstat(special / "sparse")
            view["special"] = {
                "hardlinked": a.st_ino == os.lstat(special / "b").st_ino and a.st_nlink == 2,
                "link": os.readlink(special / "link"), "fifo": stat.S_ISFIFO(os.lstat(special / "fifo").st_mode),
                "sparse": [sparse.st_size, sparse.st_blocks * 512 < 1 << 20],
                "suid": oct(os.lstat(special / "suid").st_mode & 0o7777),
                "xattr": os.getxattr(special / "a", "user.note").decode()}
        for rel in ("etc/motd", "etc/gone", "etc/added", "opt/tool/old", "opt/tool/new",
                    "var/apt-private/cache", "var/apt-private/mine"):
            path = Path(merged) / rel
            if path.exists():
                st = path.stat()
                view[rel] = [path.read_text(), st.st_uid]
        return view
    finally:
        sc.umount(merged)
        os.rmdir(merged)


def _layer_owners(path: Path) -> list[int]:
    return sorted({os.lstat(p).st_uid for p in path.rglob("*")} | {os.lstat(path).st_uid})


def _changes(store: rootless.RootlessStore, old: Path, new: Path, base: Path) -> list[list[Any]]:
    return [[c.path, c.kind.value] for c in store.diff_layers(old / "upper", new / "upper", base, None)]


def _trash_swept(root: Path) -> None:
    """Wait for the detached sweeper of the store's .trash (old layers of restores) to remove it."""
    deadline = time.monotonic() + 60
    while (root / ".trash").exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def _deep_tree(store: rootless.RootlessStore, depth: int = 1500) -> Any:
    """A layer nested deeper than PATH_MAX (3 characters a level): checkpoint, restore, remove (or
    the error a copy by path gives, and nothing left behind once the store's gc has run)."""
    store.create_layer("d")
    fd = os.open(store.layer("d") / "upper", os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("dd", dir_fd=fd)
        inner = os.open("dd", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    with open(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as f:
        f.write("deep")
    os.close(fd)
    try:
        store.snapshot("d", "k")
    except SandboxError as exc:
        store.gc("d")
        left = sorted(p.name for p in store.checkpoints_dir("d").iterdir())
        store.remove_sandbox("d")
        return {"error": str(exc)[-300:], "left": left}
    (store.checkpoints_dir("d") / "k.json").write_text("{}")
    store.restore("d", "k", disk_limit=None)
    found = [_depth(store.checkpoint_path("d", "k") / "upper"), _depth(store.layer("d") / "upper")]
    store.remove_sandbox("d")
    return found


def _depth(root: Path) -> int:
    """How deep the chain of dd directories under ``root`` goes (-1 if its leaf is missing)."""
    fd, depth = os.open(root, os.O_RDONLY | os.O_DIRECTORY), 0
    while True:
        try:
            inner = os.open("dd", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        except FileNotFoundError:
            break
        os.close(fd)
        fd, depth = inner, depth + 1
    try:
        os.stat("leaf", dir_fd=fd)
    except FileNotFoundError:
        depth = -1
    os.close(fd)
    return depth


def _helper_keeps_no_lock(path: Path) -> bool:
    """The store's helper starts while a sandbox's lock is held (it forks this process): once the
    lock's holder lets go, another process gets it (the helper kept no copy of the descriptor)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    mapped.call(os.getuid)  # the first call starts the helper
    os.close(fd)
    other = subprocess.run([sys.executable, "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
                            "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)", str(path)], capture_output=True)
    path.unlink()
    return other.returncode == 0 and mapped.call(os.getuid) == 0


def _listing(root: Path) -> list[list[Any]]:
    """Every entry under ``root`` as a copy must keep it: type, owner, mode, times, xattrs, data or
    target or device, and which earlier entry it is a hard link of."""
    rows: list[list[Any]] = []
    first: dict[int, str] = {}
    for path in sorted(root.rglob("*")):
        rel, st = str(path.relative_to(root)), os.lstat(path)
        names = sorted(os.listxattr(path, follow_symlinks=False))
        xattrs = [(n, os.getxattr(path, n, follow_symlinks=False).hex()) for n in names]
        if stat.S_ISREG(st.st_mode):
            with open(path, "rb") as f:
                body: Any = [hashlib.file_digest(f, "sha256").hexdigest(), st.st_size, st.st_blocks > 0]
        elif stat.S_ISLNK(st.st_mode):
            body = os.readlink(path)
        else:
            body = st.st_rdev
        linked = first.setdefault(st.st_ino, rel) if not stat.S_ISDIR(st.st_mode) else rel
        rows.append([rel, st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns, xattrs, body, linked])
    return rows


def scenario_store(home: Path) -> dict[str, Any]:
    store = rootless.choose(home)
    out: dict[str, Any] = {"kind": store.kind, "cheap": store.cheap, "description": store.description,
                           "uid": os.getuid()}
    out["lock_released"] = _helper_keeps_no_lock(home / "held.lock")
    base = home / "base"
    base.mkdir()
    mapped.call(_make_base, base)
    store.create_layer("a")
    layer = store.layer("a")
    out["layer_owner"] = os.stat(layer / "upper").st_uid
    first = [("write", "etc/motd", "changed motd\n"), ("rm", "etc/gone", ""), ("write", "etc/added", "added\n"),
             ("rmdir-recreate", "opt/tool", "new tool\n"), ("write", "var/apt-private/mine", "mine\n"),
             ("chown42", "var/apt-private/mine", ""), ("specials", "etc/special", "a"),
             ("dense", "srv/dense", "")]
    mapped.call(_in_overlay, base, layer, first, fresh=True)
    os.sync()
    free_before = os.statvfs(store.root).f_bfree
    live = mapped.call(_listing, layer / "upper")
    store.snapshot("a", "c1")
    (store.checkpoints_dir("a") / "c1.json").write_text("{}")
    out["c1_is_the_layer"] = mapped.call(_listing, store.checkpoint_path("a", "c1") / "upper") == live
    os.sync()  # allocated, not only reserved
    free_after = os.statvfs(store.root).f_bfree
    out["checkpoint_blocks"] = (free_before - free_after) * os.statvfs(store.root).f_frsize
    out["checkpoint_bytes"] = store.tree_bytes(store.checkpoint_path("a", "c1") / "upper")
    ck = store.checkpoint_path("a", "c1")
    out["checkpoint_is_subvolume"] = os.stat(ck).st_ino == 256
    out["checkpoint_owners"] = mapped.call(_layer_owners, ck / "upper")
    out["diff_c1_vs_base"] = _changes(store, layer.parent / "nothing", ck, base)
    second = [("append", "etc/added", "more\n"), ("rm", "etc/motd", ""), ("write", "srv/new", "x")]
    mapped.call(_in_overlay, base, layer, second, fresh=True)
    out["diff_c1_vs_live"] = _changes(store, ck, layer, base)
    live = mapped.call(_listing, layer / "upper")
    store.snapshot("a", "c2")
    (store.checkpoints_dir("a") / "c2.json").write_text("{}")
    out["c2_is_the_layer"] = _materialized(store, "a", "c2") == live
    out["checkpoint_ids"] = store.checkpoint_ids("a")
    c2 = store.checkpoint_path("a", "c2")
    out["c2_holds_unchanged"] = (c2 / "upper/opt/tool/new").exists()  # not on ext4: a delta on c1
    out["c2_holds_changed"] = (c2 / "upper/etc/added").exists()
    out["c2_kind"] = mapped.call(increment.describe, c2)
    with store.checkpoint_tree("a", "c1") as tree1, store.checkpoint_tree("a", "c2") as tree2:
        out["diff_c1_c2"] = _changes(store, tree1, tree2, base)
    out["usage"] = list(usage.sandbox_bytes(store, "a"))  # layer, checkpoints, exclusive (df)
    out["changed_since_c2"] = [store.changed_since("a", "c2")]
    mapped.call(_in_overlay, base, layer, [("append", "etc/added", "x")], fresh=True)
    out["changed_since_c2"].append(store.changed_since("a", "c2"))
    mapped.call(_in_overlay, base, layer, [("write", "etc/added", "added\nmore\n")], fresh=True)  # as c2 had it
    out["view_live"] = mapped.call(_read_view, base, layer, fresh=True)
    store.restore("a", "c1", disk_limit=None)
    out["view_restored_c1"] = mapped.call(_read_view, base, store.layer("a"), fresh=True)
    out["diff_after_restore"] = _changes(store, ck, store.layer("a"), base)
    store.fork("a", "c2", "b")
    out["view_fork_c2"] = mapped.call(_read_view, base, store.layer("b"), fresh=True)
    mapped.call(_in_overlay, base, store.layer("b"), [("write", "etc/added", "fork only\n")], fresh=True)
    out["view_a_after_fork_write"] = mapped.call(_read_view, base, store.layer("a"), fresh=True)
    store.fork("a", None, "c")  # from the live layer
    out["view_fork_live"] = mapped.call(_read_view, base, store.layer("c"), fresh=True)
    store.delete_checkpoint("a", "c1")
    out["after_delete"] = store.checkpoint_ids("a")
    out["c2_kind_after_delete"] = mapped.call(increment.describe, c2)  # on ext4, c1 was folded into it
    store.restore("a", "c2", disk_limit=None)
    out["view_restored_c2"] = mapped.call(_read_view, base, store.layer("a"), fresh=True)
    store.snapshot("a", "c3")  # of a restored layer: a full copy again (a new layer)
    (store.checkpoints_dir("a") / "c3.json").write_text("{}")
    out["c3_kind"] = mapped.call(increment.describe, store.checkpoint_path("a", "c3"))
    try:
        store.check_disk_limit(1 << 30)
        out["disk_limit"] = "accepted"
    except Unsupported as exc:
        out["disk_limit"] = str(exc)
    out["deep"] = _deep_tree(store)
    for name in ("a", "b", "c"):
        store.remove_sandbox(name)
    _trash_swept(store.root)
    out["left_in_store"] = sorted(p.name for p in store.root.iterdir())
    mapped.run(["rm", "-rf", "--", str(base)], "removing the base")
    return out


def _mutate(upper: Path, seed: int, rounds: int) -> None:
    """Changes a sandbox makes, straight in a layer's upper directory (as namespace root): new,
    rewritten, appended and deleted files, a directory replaced by a file and back, whiteouts,
    opaque markers, owners, modes, xattrs, hard links, symlinks."""
    import random

    rng = random.Random(seed)
    for _ in range(rounds):
        files = [p for p in upper.rglob("*") if p.is_file() and not p.is_symlink()]
        dirs = [upper, *(p for p in upper.rglob("*") if p.is_dir() and not p.is_symlink())]
        op = rng.randrange(12)
        where = rng.choice(dirs)
        name = where / f"n{rng.randrange(30)}"
        if op <= 2 or not files:
            if not os.path.lexists(name):
                name.write_bytes(os.urandom(rng.randrange(1, 5000)))
        elif op == 3:
            with open(rng.choice(files), "ab") as f:  # in place: no directory changes
                f.write(b"more")
        elif op == 4:
            rng.choice(files).unlink()
        elif op == 5:
            if not os.path.lexists(name):
                name.mkdir()
                (name / "inner").write_text("inner")
        elif op == 6 and len(dirs) > 1:
            victim = rng.choice(dirs[1:])
            subprocess.run(["rm", "-rf", str(victim)], check=True)
            if rng.random() < 0.5:
                victim.write_text("was a directory")
            else:
                victim.mkdir()
                os.setxattr(victim, "user.overlay.opaque", b"y")
        elif op == 7:
            target = rng.choice(files)
            os.chown(target, 42, 42)
            os.chmod(target, rng.choice([0o600, 0o755, 0o4755]))
        elif op == 8 and not os.path.lexists(name):
            os.mknod(name, stat.S_IFCHR | 0o000, 0)  # a whiteout
        elif op == 9 and not os.path.lexists(name):
            os.link(rng.choice(files), name)
        elif op == 10 and not os.path.lexists(name):
            os.symlink(f"../t{rng.randrange(9)}", name)
        else:
            os.setxattr(rng.choice(files), "user.note", os.urandom(4).hex().encode())


def _materialized(store: rootless.RootlessStore, name: str, cid: str) -> list[list[Any]]:
    with store.checkpoint_tree(name, cid) as tree:
        return mapped.call(_listing, tree / "upper")


def scenario_chain(home: Path, seed: str) -> dict[str, Any]:
    """Checkpoints after random changes, then deletions in a random order: each checkpoint, read
    through its chain (a view and a restore), holds exactly what the layer held when it was taken."""
    import random

    rng = random.Random(int(seed))
    store = rootless.choose(home)
    store.create_layer("x")
    upper = store.layer("x") / "upper"
    expected: dict[str, list[list[Any]]] = {}
    kinds: dict[str, Any] = {}
    mismatches: list[str] = []
    for i in range(12):
        mapped.call(_mutate, upper, rng.randrange(1 << 30), rng.randrange(1, 15))
        cid = f"k{i:02d}"
        expected[cid] = mapped.call(_listing, upper)
        store.snapshot("x", cid)
        (store.checkpoints_dir("x") / f"{cid}.json").write_text("{}")
        kinds[cid] = mapped.call(increment.describe, store.checkpoint_path("x", cid))
        if store.changed_since("x", cid) is not False:
            mismatches.append(f"{cid}: changed right after")
    for cid in expected:
        if _materialized(store, "x", cid) != expected[cid]:
            mismatches.append(f"{cid}: view")
    order = list(expected)
    rng.shuffle(order)
    for gone in order[:8]:
        store.delete_checkpoint("x", gone)
        del expected[gone]
        for cid in expected:
            if _materialized(store, "x", cid) != expected[cid]:
                mismatches.append(f"{cid}: view after deleting {gone}")
    for cid in expected:
        store.fork("x", cid, "y")
        if mapped.call(_listing, store.layer("y") / "upper") != expected[cid]:
            mismatches.append(f"{cid}: fork")
    store.restore("x", sorted(expected)[-1], disk_limit=None)
    restored = mapped.call(_listing, upper)
    store.remove_sandbox("x")
    store.remove_sandbox("y")
    _trash_swept(store.root)
    return {"kinds": kinds, "mismatches": mismatches, "restored_last": restored == expected[sorted(expected)[-1]],
            "left": sorted(p.name for p in store.root.iterdir()), "remaining": sorted(expected)}


def _as_version_2(checkpoint: Path) -> None:
    """Rewrite a checkpoint's state as the store's version 2 wrote it (one marshal of it all)."""
    state = increment.read_state(checkpoint)
    assert state is not None
    token, taken, root, dirs = state
    (checkpoint / increment.STATE).unlink()
    (checkpoint / increment.STATE).write_bytes(
        marshal.dumps({"v": 2, "token": token, "taken": taken, "root": root, "dirs": dirs}))


def _state_version(checkpoint: Path) -> int:
    return int(marshal.loads((checkpoint / increment.STATE).read_bytes())["v"])


def scenario_formats(home: Path, step: str) -> dict[str, Any]:
    """State formats. Step 1: a checkpoint whose state is rewritten in version 2 (an earlier
    version's), a delta on it, and one more (in this helper: the directories its walk found
    unchanged reuse their encoding from the one before). Step 2, a new process and helper: a
    delta on that last one (its state read from its file). Each: its parent, whether the layer
    changed since it right after, and a digest of it read through its chain."""
    store = rootless.choose(home)
    if step == "1":
        store.create_layer("f")
    upper = store.layer("f") / "upper"
    out: dict[str, Any] = {}
    for cid, seed, rounds in [("f0", 1, 12), ("f1", 2, 4), ("f2", 3, 2)] if step == "1" else [("f3", 4, 3)]:
        mapped.call(_mutate, upper, seed, rounds)
        live = mapped.call(_listing, upper)
        store.snapshot("f", cid)
        (store.checkpoints_dir("f") / f"{cid}.json").write_text("{}")
        path = store.checkpoint_path("f", cid)
        out[cid] = {"parent": mapped.call(increment.describe, path)["parent"],
                    "version": mapped.call(_state_version, path),
                    "changed_right_after": store.changed_since("f", cid),
                    "reads_as_taken": _materialized(store, "f", cid) == live}
        if cid == "f0":
            mapped.call(_as_version_2, path)
            out["f0_as_version_2"] = {"version": mapped.call(_state_version, path),
                                      "changed_right_after": store.changed_since("f", cid)}
    out["views"] = {cid: hashlib.sha256(json.dumps(_materialized(store, "f", cid)).encode()).hexdigest()
                    for cid in store.checkpoint_ids("f")}
    return out


def scenario_killed(home: Path, point: str) -> dict[str, Any]:
    """A chain of three checkpoints; a deletion of the middle one (or a checkpoint, or a restore)
    killed at ``point``; then gc, and every checkpoint still listed reads as it was taken."""
    store = rootless.choose(home)
    store.create_layer("x")
    upper = store.layer("x") / "upper"
    expected: dict[str, list[list[Any]]] = {}
    for i, seed in enumerate((1, 2, 3)):
        mapped.call(_mutate, upper, seed, 8)
        cid = f"k{i}"
        expected[cid] = mapped.call(_listing, upper)
        store.snapshot("x", cid)
        (store.checkpoints_dir("x") / f"{cid}.json").write_text("{}")
    mapped.call(_mutate, upper, 4, 8)
    action = {"fold-staged": "delete k1", "fold-exchanged": "delete k1", "checkpoint-unrecorded": "delete k1",
              "checkpoint-staged": "checkpoint k3", "restore-staged": "restore k1"}[point]
    marker = home / "paused"
    env = {**os.environ, "HERMES_SANDBOXES_TEST_PAUSE": point, "HERMES_SANDBOXES_TEST_PAUSE_MARKER": str(marker)}
    code = ("import sys; from pathlib import Path; from hermes_sandboxes.backends.local.store import rootless; "
            "s = rootless.choose(Path(sys.argv[1])); verb, cid = sys.argv[2].split(); "
            "s.delete_checkpoint('x', cid) if verb == 'delete' else s.snapshot('x', cid) if verb == 'checkpoint' "
            "else s.restore('x', cid, disk_limit=None)")
    child = subprocess.Popen([sys.executable, "-c", code, str(home), action], env=env)
    try:
        deadline = time.monotonic() + 120
        while not (marker.exists() and marker.read_text().strip()) and child.poll() is None:
            if time.monotonic() > deadline:  # the child says where it stopped, or ends
                break
            time.sleep(0.01)
        paused = marker.exists() and marker.read_text().strip() == str(child.pid)
    finally:
        child.kill()
        child.wait()
    store.gc("x")
    listed = store.checkpoint_ids("x")
    readable = {cid: _materialized(store, "x", cid) == expected[cid] for cid in listed}
    store.delete_checkpoint("x", "k1") if "k1" in listed else None
    after = {cid: _materialized(store, "x", cid) == expected[cid] for cid in store.checkpoint_ids("x")}
    store.remove_sandbox("x")
    _trash_swept(store.root)
    return {"paused": paused, "listed": listed, "readable": readable, "after_delete": after,
            "left": sorted(p.name for p in store.root.iterdir())}


def scenario_base(cache: Path, tarball: str) -> dict[str, Any]:
    """Unpack the rootless base from the cached tarball, then see it from a sandbox's namespace."""
    lines: list[str] = []
    root = baseimage.ensure(cache, lines.append, tarball=Path(tarball))
    again: list[str] = []
    baseimage.ensure(cache, again.append)  # cached: nothing rebuilt
    out: dict[str, Any] = {"root": str(root), "progress": lines, "second_progress": again,
                           "built": str(baseimage.built(cache))}
    out.update(mapped.call(_inspect_base, root, fresh=True))
    return out


def _inspect_base(root: Path) -> dict[str, Any]:
    """Owners as the sandbox sees them, and an agent's typical change to system files in an
    overlay of the base (which fails with EACCES over the host's own tree)."""
    seen: dict[str, Any] = {}
    for rel in ("usr/bin/apt-get", "var/cache/apt/archives/partial", "etc/passwd", "usr/bin/git"):
        path = root / rel
        st = os.lstat(path)
        seen[rel] = [st.st_uid, st.st_gid, stat.filemode(st.st_mode)]
    layer = Path(tempfile.mkdtemp(prefix="layer-"))
    (layer / "upper").mkdir()
    (layer / "work").mkdir()
    sc.unshare(sc.CLONE_NEWNS)
    sc.mount("none", "/", None, sc.MS_REC | sc.MS_PRIVATE)
    merged = tempfile.mkdtemp(prefix="merged-")
    sc.mount("overlay", merged, "overlay", 0, f"lowerdir={root},upperdir={layer / 'upper'},"
             f"workdir={layer / 'work'},userxattr")
    try:
        os.unlink(f"{merged}/usr/bin/git")
        with open(f"{merged}/usr/bin/zcat", "a") as f:
            f.write("# changed\n")
        os.chown(f"{merged}/etc/hostname", 42, 42)
        seen["changed_system_files"] = True
        seen["base_git_still_there"] = (root / "usr/bin/git").exists()
    finally:
        sc.umount(merged)
        os.rmdir(merged)
        import shutil

        shutil.rmtree(layer)
    return seen


def scenario_backend(home: Path, tarball: str) -> dict[str, Any]:
    """The store under a real rootless sandbox (the launcher's side is the rootless helper's): as
    this user, on the store at ``home``, with the base unpacked from the cached tarball."""
    from hermes_sandboxes.backends.local import LocalBackend

    baseimage.ensure(tarball=Path(tarball))  # the user's own cache ($XDG_CACHE_HOME), where sandboxes look
    backend = LocalBackend(home)
    out: dict[str, Any] = {"kind": backend.store.kind, "info": dict(backend.store_info()),
                           "cheap": "cheap-checkpoints" in {c.value for c in backend.capabilities}}
    sandbox = backend.create("rs-one")
    try:
        run = sandbox.exec(["sh", "-c", "rm /usr/bin/git && echo one > /root/f && id -u"])
        out["first"] = [run.exit_code, run.stdout.strip()]
        before = sandbox.checkpoint("before")
        sandbox.exec(["sh", "-c", "echo two > /root/f && rm -rf /etc/apt && echo new > /root/g"])
        out["diff"] = sorted((c.path, c.kind.value) for c in sandbox.diff(before.id))
        fork = sandbox.fork("rs-two", before.id)
        out["fork_sees"] = fork.exec(["cat", "/root/f"]).stdout.strip()
        fork.destroy()
        sandbox.restore(before.id)
        after = sandbox.exec(["sh", "-c", "cat /root/f; test -e /root/g; echo $?; test -d /etc/apt; echo $?; "
                                          "test -e /usr/bin/git; echo $?"])
        out["restored"] = after.stdout.split()
        try:
            backend.create("rs-limited", SandboxSpec(limits=Limits(disk_bytes=1 << 30)))
            out["disk_limit"] = "accepted"
        except Unsupported as exc:
            out["disk_limit"] = str(exc)
    finally:
        sandbox.destroy()
    _trash_swept(backend.store.root)
    out["left"] = sorted(p.name for p in backend.store.root.iterdir())
    return out


def scenario_describe(home: Path) -> dict[str, Any]:
    """``store info`` and doctor for a user who has not built the base yet (an empty cache)."""
    from hermes_sandboxes.backends.local import LocalBackend

    os.environ["XDG_CACHE_HOME"] = str(home / "empty-cache")
    backend = LocalBackend(home)
    checks = {c.label: [c.ok, c.detail] for c in backend.doctor()}
    return {"info": dict(backend.store_info()), "doctor": checks, "reason": backend.unavailable_reason()}


def main() -> None:
    scenario = sys.argv[1]
    if scenario == "store":
        result = scenario_store(Path(sys.argv[2]))
    elif scenario == "base":
        result = scenario_base(Path(sys.argv[2]), sys.argv[3])
    elif scenario == "describe":
        result = scenario_describe(Path(sys.argv[2]))
    elif scenario == "chain":
        result = scenario_chain(Path(sys.argv[2]), sys.argv[3])
    elif scenario == "formats":
        result = scenario_formats(Path(sys.argv[2]), sys.argv[3])
    elif scenario == "killed":
        result = scenario_killed(Path(sys.argv[2]), sys.argv[3])
    elif scenario == "backend":
        result = scenario_backend(Path(sys.argv[2]), sys.argv[3])
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
