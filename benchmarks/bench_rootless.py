"""Rootless storage against root mode, on the same machine, in one run.

Run as root: ``.venv/bin/python benchmarks/bench_rootless.py [--quick] [--out FILE]``. It makes an
unprivileged user (``hs-rootstore-bench-<pid>``, with a subuid block) and hands it a btrfs filesystem
(loop image mounted with ``user_subvol_rm_allowed`` and, as root's store image, ``noatime``) and an
ext4 one; the rootless numbers are
measured as that user (this file's ``worker``), the root numbers by root in the same run:

- btrfs: checkpoint (a read-only snapshot and its record) and restore (a writable snapshot swapped in
  for the layer; the old layer's deletion apart) of 1 MB / 100 MB / 700 MB layers, rootless
  ``subvolume`` store against root's btrfs image store.
- ext4: a new sandbox's checkpoint after it changed N bytes (rootless ``overlay`` store: the layer
  holds only the changed files) against a plain ``cp -a`` of those files by the same user, and
  root's copy store for reference; and a checkpoint after 1 MB / 10 MB more changes on top of 100 MB
  (1600 files) checkpointed earlier, and 1 MB on top of 10 MB (160 files): the overlay store's
  checkpoint is then a delta on the one before (increment.py). The
  base is no input of a checkpoint on any store: its size cannot show in these numbers.
- exec round trip of ``true`` and create + first exec, root mode and rootless (the rootless
  sandbox on the user's btrfs store, on the rootless base unpacked from the machine's cached
  tarball first); if a rootless sandbox cannot start, the JSON says why.

These are the store operations themselves (what checkpoint and restore spend in the store); a
sandbox's restore also restarts its init. Writes JSON (default benchmarks/results/rootless.json) and
prints Markdown rows. The machine is shared: ``load`` records ``uptime`` before and after.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LAYERS = {"1MB": (1 << 20, 100), "100MB": (100 << 20, 3_000), "700MB": (700 << 20, 20_000)}
QUICK_LAYERS = {"1MB": (1 << 20, 100)}
CHANGES = {"1MB": 1 << 20, "10MB": 10 << 20, "100MB": 100 << 20}
QUICK_CHANGES = {"1MB": 1 << 20}
CHUNK = 64 << 10  # changed files of 64 KiB


def ms(seconds: list[float]) -> float:
    return round(statistics.median(seconds) * 1000, 2)


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _populate(upper: Path, size: int, count: int) -> None:
    each = max(1, size // count)
    for i in range(count):
        directory = upper / "root" / "venv" / f"pkg{i // 40:04d}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"m{i % 40:02d}.py").write_bytes(os.urandom(each))


def _sync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
        os.sync()
    finally:
        os.close(fd)


def bench_snapshots(store: Any, layers: dict[str, tuple[int, int]], reps: int) -> dict[str, Any]:
    """Checkpoint and restore of layers of each size in ``store`` (one sandbox per size)."""
    rows: dict[str, Any] = {}
    for label, (size, count) in layers.items():
        name = f"bench-{label.lower()}"
        store.create_layer(name)
        try:
            _populate(store.layer(name) / "upper", size, count)
            _sync(store.layer(name))
            store.snapshot(name, "settle")  # the first snapshot after a big write pays its flush
            checkpoint, restore, discard = [], [], []
            for i in range(reps):
                cid = f"ck{i}"
                checkpoint.append(_timed(functools.partial(_checkpoint, store, name, cid)))
                started = time.perf_counter()
                staged = store.stage_restore(name, cid, disk_limit=None)
                old = store.publish_restore(name, cid, staged)
                restore.append(time.perf_counter() - started)
                discard.append(_timed(functools.partial(store.discard, old)))
                store.delete_checkpoint(name, cid)
            rows[label] = {"checkpoint_p50_ms": ms(checkpoint), "restore_p50_ms": ms(restore),
                           "old_layer_delete_p50_ms": ms(discard), "samples": reps, "files": count}
        finally:
            store.remove_sandbox(name)
    return rows


def _both(i: int, a_times: list[float], a: Callable[[], object], b_times: list[float],
          b: Callable[[], object]) -> None:
    """Time ``a`` and ``b``, in turns first (a write-back of the one before must not slow the other
    down), each after a sync that is not timed."""
    for times, fn in ((a_times, a), (b_times, b)) if i % 2 == 0 else ((b_times, b), (a_times, a)):
        os.sync()
        times.append(_timed(fn))


def _checkpoint(store: Any, name: str, checkpoint_id: str) -> None:
    store.snapshot(name, checkpoint_id)
    (store.checkpoints_dir(name) / f"{checkpoint_id}.json").write_text("{}")


def bench_changed(store: Any, scratch: Path, changes: dict[str, int], reps: int) -> dict[str, Any]:
    """A new sandbox's first checkpoint after it changed N bytes (its layer holds just those
    files), against ``cp -a`` of the same files by the same user on the same filesystem."""
    rows: dict[str, Any] = {}
    for label, size in changes.items():
        checkpoint: list[float] = []
        copy: list[float] = []
        for i in range(reps):
            name = f"changed-{label.lower()}-{i}"
            store.create_layer(name)
            try:
                _populate(store.layer(name) / "upper", size, max(1, size // CHUNK))
                reference = scratch / f"ref-{label}"
                shutil.copytree(store.layer(name) / "upper", reference, symlinks=True)
                _sync(scratch)
                _sync(store.layer(name))
                cp = ["cp", "-a", str(reference), str(scratch / "copy")]
                _both(i, copy, functools.partial(subprocess.run, cp, check=True),
                      checkpoint, functools.partial(_checkpoint, store, name, "ck"))
                shutil.rmtree(scratch / "copy")
                shutil.rmtree(reference)
            finally:
                store.remove_sandbox(name)
        rows[label] = {"checkpoint_p50_ms": ms(checkpoint), "cp_a_changed_p50_ms": ms(copy),
                       "ratio": round(statistics.median(checkpoint) / statistics.median(copy), 2),
                       "samples": reps}
    return rows


AFTER = {"1MB after 100MB": (16, 100 << 20, 1600), "10MB after 100MB": (160, 100 << 20, 1600),
         "1MB after 10MB": (16, 10 << 20, 160)}
QUICK_AFTER = {"1MB after 100MB": (16, 100 << 20, 1600)}


def bench_after_earlier(store: Any, scratch: Path, reps: int, cases: dict[str, tuple[int, int, int]]) -> dict[str, Any]:
    """N bytes changed (files of 64 KiB in a new directory) after a layer of earlier changes was
    checkpointed: what each next checkpoint costs (the overlay store's is a delta on the one
    before: a look at each entry of the layer, a copy of the changed ones), against cp -a of the
    changed files; the same change after a smaller earlier layer shows what the layer's size adds."""
    rows: dict[str, Any] = {}
    for label, (files, size, count) in cases.items():
        name = "earlier"
        store.create_layer(name)
        try:
            upper = store.layer(name) / "upper"
            _populate(upper, size, count)
            _checkpoint(store, name, "earlier")
            times: list[float] = []
            copy: list[float] = []
            for i in range(reps):
                fresh = upper / f"new{i}"
                fresh.mkdir()
                for j in range(files):
                    (fresh / f"f{j}").write_bytes(os.urandom(CHUNK))
                shutil.copytree(fresh, scratch / "ref", symlinks=True)
                _sync(scratch)
                _sync(upper)
                cp = ["cp", "-a", str(scratch / "ref"), str(scratch / "copy")]
                _both(i, copy, functools.partial(subprocess.run, cp, check=True),
                      times, functools.partial(_checkpoint, store, name, f"ck{i}"))
                shutil.rmtree(scratch / "ref")
                shutil.rmtree(scratch / "copy")
            rows[label] = {"checkpoint_p50_ms": ms(times), "cp_a_changed_p50_ms": ms(copy),
                           "ratio": round(statistics.median(times) / statistics.median(copy), 2), "samples": reps,
                           "earlier_layer": f"{size >> 20} MB in {count} files", "changed_files": files}
        finally:
            store.remove_sandbox(name)
    return rows


def bench_exec(home: Path, reps: int, creates: int) -> dict[str, Any]:
    """Create + first exec (after one untimed sandbox, which starts this process's fork server),
    and the exec round trip of ``true``, through the Python API."""
    from hermes_sandboxes.backends.local import LocalBackend
    from hermes_sandboxes.names import unique_name

    backend = LocalBackend(home)
    try:
        warm = backend.create(unique_name("br"))
        assert warm.exec(["true"]).exit_code == 0
    except Exception as exc:  # a machine where this mode cannot start a sandbox: say why, measure the rest
        return {"not_measured": f"{type(exc).__name__}: {exc}"}
    try:
        firsts = []
        for _ in range(creates):
            started = time.perf_counter()
            sandbox = backend.create(unique_name("br"))
            assert sandbox.exec(["true"]).exit_code == 0
            firsts.append(time.perf_counter() - started)
            sandbox.destroy()
        times = [_timed(functools.partial(warm.exec, ["true"])) for _ in range(reps)]
        return {"create_first_exec_ms": ms(firsts), "exec_p50_ms": ms(times), "samples": reps,
                "create_samples": creates}
    finally:
        warm.destroy()
        unmount = getattr(backend.store, "unmount", None)
        if unmount is not None:  # root mode's btrfs image: give its loop device back
            unmount()


def worker(kind: str, home: str, quick: bool, tarball: str | None) -> dict[str, Any]:
    """Run as the unprivileged user: the rootless store of ``home``'s filesystem."""
    from hermes_sandboxes.backends.local.store import baseimage, rootless

    if tarball:  # the user's rootless base, unpacked from the machine's cached tarball (not timed)
        baseimage.ensure(tarball=Path(tarball))

    store = rootless.choose(Path(home))
    out: dict[str, Any] = {"store": store.kind, "description": store.description}
    if kind == "btrfs":
        out["snapshots"] = bench_snapshots(store, QUICK_LAYERS if quick else LAYERS, 3 if quick else 5)
        out["exec"] = bench_exec(Path(home) / "sandboxes", 5 if quick else 30, 2 if quick else 7)
    else:
        scratch = Path(home) / "scratch"
        scratch.mkdir()
        out["changed"] = bench_changed(store, scratch, QUICK_CHANGES if quick else CHANGES, 3 if quick else 7)
        out["after_earlier_changes"] = bench_after_earlier(store, scratch, 3 if quick else 7,
                                                           QUICK_AFTER if quick else AFTER)
    return out


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _root_side(quick: bool) -> dict[str, Any]:
    from hermes_sandboxes.backends.local.store.base import BtrfsStore, CopyStore

    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    out: dict[str, Any] = {}
    home = Path(tempfile.mkdtemp(prefix="hs-rootstore-bench-root-", dir=tmp))
    btrfs = BtrfsStore(home, "8G")
    try:
        btrfs.ensure()
        out["btrfs_snapshots"] = bench_snapshots(btrfs, QUICK_LAYERS if quick else LAYERS, 3 if quick else 5)
    finally:
        btrfs.unmount()
        shutil.rmtree(home, ignore_errors=True)
    home = Path(tempfile.mkdtemp(prefix="hs-rootstore-bench-copy-", dir=tmp))
    try:
        copy = CopyStore(home)
        copy.ensure()
        scratch = home / "scratch"
        scratch.mkdir()
        out["copy_changed"] = bench_changed(copy, scratch, QUICK_CHANGES if quick else CHANGES, 3 if quick else 7)
        out["exec"] = bench_exec(home / "exec", 5 if quick else 30, 2 if quick else 7)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=str(HERE / "results" / "rootless.json"))
    parser.add_argument("--ext4-only", action="store_true", help="the rootless ext4 figures alone")
    parser.add_argument("--worker", nargs=2, metavar=("KIND", "HOME"), help=argparse.SUPPRESS)
    parser.add_argument("--tarball", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.worker[1], args.quick, args.tarball)))
        return
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark makes a test user and hands it filesystems")
    sys.path.insert(0, str(REPO))
    from tests.store_rootless.base_cache import cached_tarball
    from tests.store_rootless.harness import unprivileged_user, user_filesystem

    tarball = str(cached_tarball())  # built once per machine (setup.sh test builds it)

    result: dict[str, Any] = {"machine": platform.node(), "kernel": platform.release(),
                              "cpus": os.cpu_count(), "load_before": _uptime(), "quick": args.quick}
    rootless: dict[str, Any] = {}
    with unprivileged_user("hs-rootstore-bench") as user:
        for kind, fs in (("btrfs", "btrfs-bench"), ("ext4", "ext4")):
            if args.ext4_only and kind != "ext4":
                continue
            with user_filesystem(fs, user, size="4G") as mountpoint:
                home = mountpoint / "home"
                home.mkdir()
                os.chown(home, user.uid, user.gid)
                extra = (["--quick"] if args.quick else []) + (["--tarball", tarball] if kind == "btrfs" else [])
                rootless[kind] = user.run("--worker", kind, str(home), *extra, timeout=3600,
                                          module="benchmarks.bench_rootless")
    result["rootless"] = rootless
    result["root"] = {} if args.ext4_only else _root_side(args.quick)
    result["load_after"] = _uptime()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    _print_rows(result)


def _print_rows(result: dict[str, Any]) -> None:
    root, rootless = result["root"], result["rootless"]
    print(f"load: {result['load_before']} / {result['load_after']}")
    if "btrfs" in rootless:
        print("| layer | rootless subvolume checkpoint | restore | root btrfs checkpoint | restore |")
        print("| --- | --- | --- | --- | --- |")
        for label, row in rootless["btrfs"]["snapshots"].items():
            other = root["btrfs_snapshots"][label]
            print(f"| {label} | {row['checkpoint_p50_ms']} ms | {row['restore_p50_ms']} ms | "
                  f"{other['checkpoint_p50_ms']} ms | {other['restore_p50_ms']} ms |")
    print("| changed | rootless overlay checkpoint | cp -a of the changed files | ratio | root copy store |")
    print("| --- | --- | --- | --- | --- |")
    for label, row in rootless["ext4"]["changed"].items():
        other = root.get("copy_changed", {}).get(label, {}).get("checkpoint_p50_ms", "-")
        print(f"| {label} | {row['checkpoint_p50_ms']} ms | {row['cp_a_changed_p50_ms']} ms | {row['ratio']}x | "
              f"{other} ms |")
    for label, row in rootless["ext4"]["after_earlier_changes"].items():
        print(f"| {label} ({row['earlier_layer']}) | {row['checkpoint_p50_ms']} ms | {row['cp_a_changed_p50_ms']} ms | "
              f"{row['ratio']}x | |")
    if "btrfs" not in rootless:
        return
    mine, theirs = rootless["btrfs"]["exec"], root["exec"]
    if "exec_p50_ms" in mine and "exec_p50_ms" in theirs:
        print(f"| exec round trip of true, rootless / root | {mine['exec_p50_ms']} / {theirs['exec_p50_ms']} ms = "
              f"{mine['exec_p50_ms'] / theirs['exec_p50_ms']:.2f}x |")
        print(f"| create + first exec, rootless / root | {mine['create_first_exec_ms']} / "
              f"{theirs['create_first_exec_ms']} ms |")
    else:
        print(f"exec: root {theirs}; rootless {mine}")


if __name__ == "__main__":
    main()
