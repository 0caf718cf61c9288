"""An interleaved A/B of the local sandbox's start costs between two source trees (before and after a
change): restore (which starts a new init), the first exec after it, a steady exec, a checkpoint,
and create + first exec + destroy.

Run (root): python benchmarks/bench_ab.py --a OLD/src [--b NEW/src] [--samples N] [--out FILE]
Each tree runs in a worker process of its own (PYTHONPATH=tree, the same interpreter), with a store
of its own under one temporary directory; the driver asks for one sample of each operation from A
then B, the order alternating per sample, so the machine's load (other engineers' tests) falls on
both alike. Prints the medians (wall, and the worker's own CPU time: steadier under load), the
B/A ratios and the load average, and writes a JSON row to benchmarks/results/ab.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "ab.json"
OPERATIONS = ("restore", "first_exec", "exec", "checkpoint", "create_exec_destroy")
# with each wall time, the worker's own CPU time (time.process_time: steadier than wall under load)
MEASURES = tuple(m for op in OPERATIONS for m in (op, f"{op}_host_cpu"))

# The worker: one sandbox with a layer of `size` bytes, a checkpoint to restore to; then, for each
# operation name read on stdin, one timed sample (seconds) on stdout. Written against the API both
# trees share (LocalBackend(home), create, exec, checkpoint, restore, destroy).
WORKER = r"""
import json, os, sys, time
from hermes_sandboxes.backends.local import LocalBackend
home, size = sys.argv[1], int(sys.argv[2])
backend = LocalBackend(home)
sb = backend.create("ab")
made = [0]
taken = []
cpus = []
try:
    sb.exec(["sh", "-c", f"head -c {size} /dev/urandom > /root/layer"])
    target = sb.checkpoint("ab target").id
    for _ in range(3):
        sb.restore(target)
        sb.exec(["true"])

    def create_exec_destroy():
        made[0] += 1
        other = backend.create(f"ab-{made[0]}")
        try:
            other.exec(["true"])
        finally:
            other.destroy()

    def checkpoint():
        taken.append(sb.checkpoint("ab").id)

    def timed(fn):
        started, cpu = time.perf_counter(), time.process_time()
        fn()
        cpus.append(time.process_time() - cpu)  # this process's CPU (not the launcher's or the init's)
        return time.perf_counter() - started

    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        op = line.strip()
        cpus.clear()
        if op == "restore":
            took = timed(lambda: sb.restore(target))
            first = timed(lambda: sb.exec(["true"]))
            print(json.dumps({"restore": took, "first_exec": first,
                              "restore_host_cpu": cpus[0], "first_exec_host_cpu": cpus[1]}), flush=True)
        elif op == "exec":
            took = timed(lambda: sb.exec(["true"]))
            print(json.dumps({"exec": took, "exec_host_cpu": cpus[0]}), flush=True)
        elif op == "checkpoint":
            took = timed(checkpoint)
            sb.delete_checkpoint(taken.pop())  # untimed: the store holds one checkpoint between samples
            print(json.dumps({"checkpoint": took, "checkpoint_host_cpu": cpus[0]}), flush=True)
        elif op == "create_exec_destroy":
            took = timed(create_exec_destroy)
            print(json.dumps({"create_exec_destroy": took, "create_exec_destroy_host_cpu": cpus[0]}), flush=True)
        elif op == "quit":
            break
finally:
    sb.destroy()
    if hasattr(backend.store, "unmount"):  # the store image's loop device and mount go too
        backend.store.unmount()
"""


class Worker:
    def __init__(self, tree: Path, home: Path, size: int) -> None:
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, str(home), str(size)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=home.parent)
        self.read()

    def read(self) -> dict[str, float]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker exited: {self.proc.wait()}")
        result: dict[str, float] = json.loads(line)
        return result

    def ask(self, op: str) -> dict[str, float]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(op + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        self.proc.wait(timeout=120)


def run(a: Path, b: Path, samples: int, size: int, creates: int,
        ops: tuple[str, ...] = ("restore", "exec", "checkpoint")) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="hs-bench-ab-"))
    workers: dict[str, Worker] = {}
    try:
        workers["a"] = Worker(a, root / "home-a", size)
        workers["b"] = Worker(b, root / "home-b", size)
        times: dict[str, dict[str, list[float]]] = {k: {m: [] for m in MEASURES} for k in workers}
        load = [os.getloadavg()[0]]
        for i in range(samples):
            order = ("a", "b") if i % 2 == 0 else ("b", "a")
            for op in [*ops, *(["create_exec_destroy"] if i < creates else [])]:
                for kind in order:
                    for name, took in workers[kind].ask(op).items():
                        times[kind][name].append(took)
            if i % 10 == 0:
                load.append(os.getloadavg()[0])
        load.append(os.getloadavg()[0])
        row: dict[str, Any] = {"a": str(a), "b": str(b), "samples": samples, "layer_bytes": size,
                               "load_average_min_median_max": [round(min(load), 2),
                                                               round(statistics.median(load), 2),
                                                               round(max(load), 2)],
                               "cpus": os.cpu_count(), "kernel": platform.release()}
        for op in MEASURES:
            if not times["a"][op]:
                continue  # not asked for (--ops)
            ma = statistics.median(times["a"][op]) * 1000
            mb = statistics.median(times["b"][op]) * 1000
            row[op] = {"a_p50_ms": round(ma, 2), "b_p50_ms": round(mb, 2), "ratio_b_to_a": round(mb / ma, 3),
                       "n": len(times["a"][op])}
        return row
    finally:
        for worker in workers.values():
            worker.close()
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", type=Path, required=True, help="the before tree's src directory")
    parser.add_argument("--b", type=Path, default=HERE.parent / "src", help="the after tree (default: this one)")
    parser.add_argument("--samples", type=int, default=60)
    parser.add_argument("--creates", type=int, default=20, help="samples that also create a sandbox")
    parser.add_argument("--size", type=int, default=1 << 20, help="the layer's bytes")
    parser.add_argument("--ops", default="restore,exec,checkpoint",
                        help="which of restore (with the first exec after it), exec, checkpoint to sample")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    ops = tuple(op for op in args.ops.split(",") if op)
    if not set(ops) <= {"restore", "exec", "checkpoint"}:
        parser.error(f"--ops: unknown operations in {args.ops!r}")
    row = run(args.a.resolve(), args.b.resolve(), args.samples, args.size, min(args.creates, args.samples), ops)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(row, indent=2) + "\n")
    print(f"A={row['a']} B={row['b']} samples={row['samples']} load={row['load_average_min_median_max']}")
    print("| operation | A p50 ms | B p50 ms | B/A |")
    print("|---|---|---|---|")
    for op in (m for m in MEASURES if m in row):
        r = row[op]
        print(f"| {op} | {r['a_p50_ms']} | {r['b_p50_ms']} | {r['ratio_b_to_a']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
