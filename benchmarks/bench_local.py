"""Benchmarks of the local sandbox, measured in one run against the targets of the foundation issue.

Run as root: ``.venv/bin/python benchmarks/bench_local.py [--quick] [--out FILE]``. It builds a
throw-away store under /tmp, so it never touches real sandboxes, and removes it at the end.
Writes JSON (default benchmarks/results/local.json) and prints a Markdown table.

Medians of repeated samples; the exec round trip is interleaved with the host baseline so both see
the same machine load. No number here is asserted by the test suite: these machines are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox
from hermes_sandboxes.backends.local.store import treediff
from hermes_sandboxes.backends.local.store.base import BtrfsStore
from hermes_sandboxes.sandbox import Limits, SandboxSpec

HERE = Path(__file__).resolve().parent
LAYERS = {"1MB": (1 << 20, 100), "100MB": (100 << 20, 3_000), "700MB": (700 << 20, 20_000)}
QUICK_LAYERS = {"1MB": (1 << 20, 100), "100MB": (100 << 20, 3_000)}

# Writes `count` files totalling `size` bytes under /root/venv, spread over directories the way a
# virtualenv's site-packages is (many packages, a few dozen files each).
POPULATE = """
import os, sys
size, count = int(sys.argv[1]), int(sys.argv[2])
each = max(1, size // count)
for i in range(count):
    d = f"/root/venv/lib/python3/site-packages/pkg{i // 40:04d}"
    if i % 40 == 0:
        os.makedirs(d, exist_ok=True)
    with open(f"{d}/mod{i % 40:02d}.py", "wb") as f:
        f.write(os.urandom(each))
"""


# Changes `n` files of that layer: a third appended to, a third deleted, a third replaced by new files.
CHANGE = """
import os, sys
n = int(sys.argv[1])
root = "/root/venv/lib/python3/site-packages"
paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)[:n]
for i, p in enumerate(paths):
    if i % 3 == 0:
        with open(p, "ab") as f:
            f.write(b"# changed")
    elif i % 3 == 1:
        os.unlink(p)
    else:
        os.unlink(p)
        with open(p + ".new", "wb") as f:
            f.write(b"new")
"""


def median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 2)


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_exec(sb: LocalSandbox, n: int) -> dict[str, Any]:
    sandbox, host = [], []
    for _ in range(10):
        sb.exec(["true"])
    for _ in range(n):
        sandbox.append(timed(lambda: sb.exec(["true"])))
        host.append(timed(lambda: subprocess.run(["bash", "-c", "true"], check=True)))
    p50, base = median_ms(sandbox), median_ms(host)
    return {"sandbox_exec_true_p50_ms": p50, "sandbox_exec_true_p90_ms": round(
        sorted(sandbox)[int(n * 0.9)] * 1000, 2), "host_bash_c_true_p50_ms": base,
        "ratio_to_host": round(p50 / base, 2), "samples": n}


def dirty_bytes() -> int:
    """Written data the kernel has not yet sent to disk (all filesystems)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Dirty:"):
            return int(line.split()[1]) * 1024
    return 0


def disk_write_mb_s(directory: Path, size: int = 256 << 20) -> float:
    """The store disk's sequential write speed, written and synced the way a flush writes."""
    path = directory / "bench-write-speed"
    block = os.urandom(1 << 20)
    start = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(size >> 20):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    elapsed = time.perf_counter() - start
    path.unlink()
    return round(size / elapsed / 1e6, 1)


def populate(sb: LocalSandbox, label: str, size: int, count: int) -> int:
    result = sb.exec(["python3", "-c", POPULATE, str(size), str(count)], timeout=900)
    if result.exit_code != 0:
        raise RuntimeError(f"populating the {label} layer failed: {result.stderr}")
    return int(sb.exec("find /root/venv -type f | wc -l").stdout.strip())


def checkpoint_and_restore(sb: LocalSandbox, reps: int) -> dict[str, Any]:
    """Checkpoint right after the write (with what was left to flush), then p50s."""
    dirty = dirty_bytes()
    first = timed(lambda: sb.checkpoint("right after the write"))
    checkpoints: list[float] = []
    for i in range(reps):
        checkpoints.append(timed(lambda i=i: sb.checkpoint(f"bench {i}")))  # type: ignore[misc]
    target = sb.checkpoints()[-1].id
    restores, usable = [], []
    for _ in range(max(5, reps)):
        restores.append(timed(lambda: sb.restore(target)))
        usable.append(timed(lambda: sb.exec(["true"])))
    return {"target": target, "dirty_bytes_before_first_checkpoint": dirty,
            "checkpoint_first_ms": round(first * 1000, 2), "checkpoint_p50_ms": median_ms(checkpoints),
            "restore_incl_restart_p50_ms": median_ms(restores),
            "first_exec_after_restore_p50_ms": median_ms(usable)}


def bench_layer(backend: LocalBackend, label: str, size: int, count: int, reps: int,
                write_mb_s: float) -> dict[str, Any]:
    sb = backend.create(f"bench-layer-{label.lower()}")
    try:
        files = populate(sb, label, size, count)
        layer = sb.info().layer_bytes or 0
        timings = checkpoint_and_restore(sb, reps)
        target = timings.pop("target")
        flush_ms = timings["dirty_bytes_before_first_checkpoint"] / (write_mb_s * 1e6) * 1000
        unchanged = sb.checkpoint("nothing changes after this").id
        nochange = [timed(lambda: sb.diff(unchanged)) for _ in range(9)]
        changed = min(1000, files // 2)
        if sb.exec(["python3", "-c", CHANGE, str(changed)], timeout=300).exit_code != 0:
            raise RuntimeError(f"changing files of the {label} layer failed")
        diffs = [timed(lambda: sb.diff(target)) for _ in range(9)]
        found = len(sb.diff(target))
        store = backend.store
        old, new = store.checkpoint_path(sb.name, target) / "upper", store.readable_layer(sb.name) / "upper"
        full = [timed(lambda: treediff.diff_layers(old, new, Path("/"))) for _ in range(3)]
        return {"layer_bytes": layer, "files": files, **timings,
                "flush_at_disk_speed_ms": round(flush_ms, 2),
                "checkpoint_first_to_flush_ratio": round(timings["checkpoint_first_ms"] / flush_ms, 2)
                if flush_ms else None,
                "diff_changed_files": changed, "diff_entries": found, "diff_p50_ms": median_ms(diffs),
                "diff_full_walk_p50_ms": median_ms(full), "diff_no_change_p50_ms": median_ms(nochange)}
    finally:
        sb.destroy()


def bench_quota(plain_backend: LocalBackend, limited_backend: LocalBackend, label: str, size: int, count: int,
                rounds: int) -> dict[str, Any]:
    """Checkpoints and restores of a sandbox with a disk limit (in a store of its own, btrfs simple
    quotas on) interleaved with those of a sandbox without one (in a store where quotas were never
    on), the same layer in both: each operation runs on one and then the other, the order
    alternating, so both see the same machine load and the same background work of the stores.
    Many samples: the difference sought (~1 ms) is smaller than a loaded machine's noise. The
    checkpoints are deleted, and btrfs has dropped them, before the restores are measured: a
    subvolume being dropped in the background slows what runs meanwhile, unevenly between stores."""
    spec = SandboxSpec(limits=Limits(disk_bytes=size * 4 + (256 << 20)))
    sandboxes = {"plain": plain_backend.create(f"bench-noquota-{label.lower()}"),
                 "limited": limited_backend.create(f"bench-quota-{label.lower()}", spec)}
    try:
        for sb in sandboxes.values():
            populate(sb, label, size, count)
        for sb in sandboxes.values():
            sb.checkpoint("right after the write")  # pays for the flush, in both stores
        load_before = os.getloadavg()[0]
        targets = {kind: sb.checkpoint("restored to").id for kind, sb in sandboxes.items()}
        taken: list[tuple[LocalSandbox, str]] = []
        checkpoints = interleaved(sandboxes, max(5, rounds // 4),
                                  lambda kind, sb: taken.append((sb, sb.checkpoint("bench").id)))
        for sb, checkpoint_id in taken:
            sb.delete_checkpoint(checkpoint_id)
        for backend in (plain_backend, limited_backend):  # a sync commits and wakes btrfs's cleaner
            for command in (["filesystem", "sync"], ["subvolume", "sync"]):
                subprocess.run(["btrfs", *command, str(backend.home / "mnt")], check=True, capture_output=True)
        execs: dict[str, list[float]] = {kind: [] for kind in sandboxes}
        restores = interleaved(sandboxes, rounds, lambda kind, sb: sb.restore(targets[kind]),
                               after=lambda kind, sb: execs[kind].append(timed(lambda: sb.exec(["true"]))))
        return quota_summary(checkpoints, restores, execs, load_before)
    finally:
        for sb in sandboxes.values():
            sb.destroy()


def interleaved(sandboxes: dict[str, LocalSandbox], rounds: int, operation: Callable[[str, LocalSandbox], object],
                after: Callable[[str, LocalSandbox], object] | None = None) -> dict[str, list[float]]:
    """Times ``operation`` on each sandbox in turn, ``rounds`` times, the order alternating;
    ``after`` runs (untimed here) after each one."""
    samples: dict[str, list[float]] = {kind: [] for kind in sandboxes}
    for i in range(rounds):
        for kind, sb in list(sandboxes.items())[:: 1 if i % 2 == 0 else -1]:
            samples[kind].append(timed(lambda kind=kind, sb=sb: operation(kind, sb)))  # type: ignore[misc]
            if after is not None:
                after(kind, sb)
    return samples


def quota_summary(checkpoints: dict[str, list[float]], restores: dict[str, list[float]],
                  execs: dict[str, list[float]], load_before: float) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for kind, prefix in (("limited", ""), ("plain", "no_limit_")):
        result[f"{prefix}checkpoint_p50_ms"] = median_ms(checkpoints[kind])
        result[f"{prefix}restore_incl_restart_p50_ms"] = median_ms(restores[kind])
        result[f"{prefix}first_exec_after_restore_p50_ms"] = median_ms(execs[kind])
    result["checkpoint_p50_ratio"] = round(result["checkpoint_p50_ms"] / result["no_limit_checkpoint_p50_ms"], 2)
    result["restore_p50_ratio"] = round(result["restore_incl_restart_p50_ms"]
                                        / result["no_limit_restore_incl_restart_p50_ms"], 2)
    # the median of each round's own ratio: the load drifts over a run, a round shares it
    result["restore_paired_ratio_p50"] = round(statistics.median(
        a / b for a, b in zip(restores["limited"], restores["plain"], strict=True)), 2)
    result["samples"] = {"checkpoint": len(checkpoints["limited"]), "restore": len(restores["limited"])}
    result["load_average_1min"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    return result


def bench_create(backend: LocalBackend, n: int) -> dict[str, Any]:
    create, first_exec = [], []
    for i in range(n):
        started = time.perf_counter()
        sb = backend.create(f"bench-create-{i}")
        create.append(time.perf_counter() - started)
        first_exec.append(timed(lambda sb=sb: sb.exec(["true"])))  # type: ignore[misc]
        sb.destroy()
    return {"create_p50_ms": median_ms(create), "first_exec_after_create_p50_ms": median_ms(first_exec),
            "create_and_first_exec_p50_ms": round(median_ms(create) + median_ms(first_exec), 2)}


def init_memory(sb: LocalSandbox) -> tuple[int, int]:
    state = sb._runtime()
    assert state is not None
    pid = int(state["pid"])
    rss = pss = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == "Rss":
            rss = int(value.split()[0])
        elif key == "Pss":
            pss = int(value.split()[0])
    return rss * 1024, pss * 1024


def bench_memory(backend: LocalBackend, n: int) -> dict[str, Any]:
    sandboxes = [backend.create(f"bench-idle-{i}") for i in range(n)]
    try:
        for sb in sandboxes:
            for _ in range(5):
                sb.exec(["true"])
        time.sleep(0.5)
        readings = [init_memory(sb) for sb in sandboxes]
        return {"idle_init_rss_mb": round(statistics.median(r for r, _ in readings) / 2**20, 2),
                "idle_init_pss_mb": round(statistics.median(p for _, p in readings) / 2**20, 2),
                "sandboxes": n}
    finally:
        for sb in sandboxes:
            sb.destroy()


def bench_concurrent(backend: LocalBackend, n: int) -> dict[str, Any]:
    results: dict[int, int] = {}
    errors: list[str] = []

    def one(i: int) -> None:
        try:
            sb = backend.create(f"bench-many-{i}")
            results[i] = sb.exec(f"echo sandbox {i}").exit_code
        except Exception as exc:
            errors.append(f"{i}: {exc}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    for i in range(n):
        try:
            backend.get(f"bench-many-{i}").destroy()
        except Exception as exc:
            errors.append(f"destroy {i}: {exc}")
    ok = sum(1 for code in results.values() if code == 0)
    return {"sandboxes": n, "succeeded": ok, "errors": errors, "wall_s": round(wall, 2)}


TARGETS = {
    "exec_p50_ms": 10.0, "exec_ratio_to_host": 3.0, "checkpoint_p50_ms": 50.0,
    "restore_incl_restart_ms": 50.0, "create_ms": 300.0, "idle_memory_mb": 20.0, "diff_ms": 30.0,
    "diff_no_change_ms": 5.0, "quota_cost_ratio": 1.10,
}


def verdicts(r: dict[str, Any]) -> dict[str, bool]:
    layers = r["layers"].values()
    return {
        "exec_p50_ms": r["exec"]["sandbox_exec_true_p50_ms"] <= TARGETS["exec_p50_ms"],
        "exec_ratio_to_host": r["exec"]["ratio_to_host"] <= TARGETS["exec_ratio_to_host"],
        "checkpoint_p50_ms": all(v["checkpoint_p50_ms"] <= TARGETS["checkpoint_p50_ms"] for v in layers),
        "restore_incl_restart_ms": all(
            v["restore_incl_restart_p50_ms"] <= TARGETS["restore_incl_restart_ms"] for v in layers),
        "create_ms": r["create"]["create_and_first_exec_p50_ms"] <= TARGETS["create_ms"],
        "idle_memory_mb": r["memory"]["idle_init_pss_mb"] <= TARGETS["idle_memory_mb"],
        "concurrent_all_succeed": r["concurrent"]["succeeded"] == r["concurrent"]["sandboxes"],
        "diff_ms": all(v["diff_p50_ms"] <= TARGETS["diff_ms"] for v in layers),
        "diff_no_change_ms": all(v["diff_no_change_p50_ms"] <= TARGETS["diff_no_change_ms"] for v in layers),
        "quota_cost_ratio": all(q[f"{key}_ratio"] <= TARGETS["quota_cost_ratio"]
                                for q in r["quota"].values() for key in ("checkpoint_p50", "restore_p50")),
    }


def table(r: dict[str, Any]) -> str:
    e, c, m, k = r["exec"], r["create"], r["memory"], r["concurrent"]
    rows = [
        ("exec round trip of `true` (p50)", f"{e['sandbox_exec_true_p50_ms']} ms", "<= 10 ms"),
        ("host `bash -c true` spawn (p50, same run)", f"{e['host_bash_c_true_p50_ms']} ms", ""),
        ("exec / host spawn", f"{e['ratio_to_host']}x", "<= 3x"),
        ("create (store exists)", f"{c['create_p50_ms']} ms", ""),
        ("create + first exec (starts the init)", f"{c['create_and_first_exec_p50_ms']} ms", "<= 300 ms"),
        ("idle sandbox memory on the host (init PSS / RSS)",
         f"{m['idle_init_pss_mb']} / {m['idle_init_rss_mb']} MB", "<= 20 MB"),
        (f"{k['sandboxes']} sandboxes created + one command each, concurrently",
         f"{k['succeeded']}/{k['sandboxes']} ok in {k['wall_s']} s", "all succeed"),
    ]
    write = r["disk_write_mb_s"]
    for label, v in r["layers"].items():
        size = f"{label} layer ({v['files']} files, {v['layer_bytes'] / 2**20:.0f} MiB on disk)"
        rows.append((f"checkpoint, {size} (p50)", f"{v['checkpoint_p50_ms']} ms", "<= 50 ms"))
        rows.append((f"checkpoint right after writing the {label} layer, against flushing what was still "
                     f"unwritten ({v['dirty_bytes_before_first_checkpoint'] / 2**20:.0f} MiB) at the disk's "
                     f"{write} MB/s", f"{v['checkpoint_first_ms']} ms / {v['flush_at_disk_speed_ms']} ms "
                     f"({v['checkpoint_first_to_flush_ratio']}x)", ""))
        rows.append((f"restore incl. restart, {size} (p50)", f"{v['restore_incl_restart_p50_ms']} ms",
                     "<= 50 ms"))
        rows.append((f"diff after changing {v['diff_changed_files']} files, {size} (p50; full walk of both "
                     "layers in brackets)", f"{v['diff_p50_ms']} ms ({v['diff_full_walk_p50_ms']} ms; "
                     f"{v['diff_entries']} entries)", "<= 30 ms"))
        rows.append((f"diff with no change, {size} (p50)", f"{v['diff_no_change_p50_ms']} ms", "<= 5 ms"))
    for label, q in r["quota"].items():
        rows.append((f"with a disk limit (btrfs simple quotas), {label} layer: checkpoint / restore incl. "
                     "restart (p50), against no limit interleaved in the same run",
                     f"{q['checkpoint_p50_ms']} / {q['restore_incl_restart_p50_ms']} ms against "
                     f"{q['no_limit_checkpoint_p50_ms']} / {q['no_limit_restore_incl_restart_p50_ms']} ms "
                     f"({q['checkpoint_p50_ratio']}x / {q['restore_p50_ratio']}x; restores round by round "
                     f"{q['restore_paired_ratio_p50']}x)", "<= 1.1x"))
    lines = ["| measure | result | target |", "| --- | --- | --- |"]
    lines += [f"| {a} | {b} | {t} |" for a, b, t in rows]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small layers and few samples (a smoke run)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "local.json")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_local: must run as root (the local sandbox needs it)", file=sys.stderr)
        return 2
    home = Path(tempfile.mkdtemp(prefix="hsb-local-", dir="/tmp"))  # its own prefix: see the test
    backend = LocalBackend(home, image_size="32G")
    # the disk-limited sandboxes' own store: once on, quotas stay on for a whole store
    limited_backend = LocalBackend(home / "limited", image_size="32G")
    reps = 3 if args.quick else 9
    results: dict[str, Any] = {"load_average_1min": {"start": round(os.getloadavg()[0], 2)}}
    try:
        print("exec round trip...", file=sys.stderr)
        sb = backend.create("bench-exec")
        results["exec"] = bench_exec(sb, 40 if args.quick else 300)
        sb.destroy()
        print("create...", file=sys.stderr)
        results["create"] = bench_create(backend, 3 if args.quick else 10)
        print("idle memory...", file=sys.stderr)
        results["memory"] = bench_memory(backend, 2 if args.quick else 5)
        print("concurrency...", file=sys.stderr)
        results["concurrent"] = bench_concurrent(backend, 20)
        results["layers"], results["quota"] = {}, {}
        backend.store.ensure()
        results["disk_write_mb_s"] = disk_write_mb_s(backend.store.root)
        for label, (size, count) in (QUICK_LAYERS if args.quick else LAYERS).items():
            print(f"checkpoint/restore/diff with a {label} layer...", file=sys.stderr)
            results["layers"][label] = bench_layer(backend, label, size, count, reps, results["disk_write_mb_s"])
        for label, (size, count) in (QUICK_LAYERS if args.quick else LAYERS).items():
            print(f"with and without a disk limit, interleaved, {label} layer...", file=sys.stderr)
            results["quota"][label] = bench_quota(backend, limited_backend, label, size, count,
                                                    30 if args.quick else 200)
        results["store"] = backend.store.kind
        results["load_average_1min"]["end"] = round(os.getloadavg()[0], 2)
    finally:
        for each in (backend, limited_backend):
            for name in each.names():
                each.get(name).destroy()
            if isinstance(each._store, BtrfsStore):
                each._store.unmount()
        subprocess.run(["rm", "-rf", str(home)], check=False)
    report = {"benchmark": "local", "quick": args.quick, "home": str(home),
              "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()},
              "targets": TARGETS, "results": results, "meets_targets": verdicts(results)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(results))
    print(f"\nwritten to {args.out}; targets met: {report['meets_targets']}")
    return 0 if all(report["meets_targets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
