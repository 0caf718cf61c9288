"""Fork on the local backend: a new sandbox from a checkpoint should cost what a checkpoint costs.

Run as root: ``.venv/bin/python benchmarks/bench_fork.py [--quick] [--out FILE]``. For each layer size
it measures, in one run and interleaved: a checkpoint, a fork of that checkpoint (until the fork
exists), and the fork's first command (which starts its init). Writes JSON (default
benchmarks/results/fork.json) and prints a Markdown table. Nothing here is asserted by the tests.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hermes_sandboxes.backends.local import LocalBackend
from hermes_sandboxes.backends.local.store.base import BtrfsStore
from hermes_sandboxes.names import unique_name

HERE = Path(__file__).resolve().parent
LAYERS = {"1MB": (1 << 20, 100), "100MB": (100 << 20, 3_000), "700MB": (700 << 20, 20_000)}
QUICK_LAYERS = {"1MB": (1 << 20, 100)}
POPULATE = (
    "import os,sys\nsize,count=int(sys.argv[1]),int(sys.argv[2])\neach=max(1,size//count)\n"
    "for i in range(count):\n d=f'/root/venv/pkg{i//40:04d}'\n os.makedirs(d,exist_ok=True)\n"
    " open(f'{d}/m{i%40:02d}.py','wb').write(os.urandom(each))\n"
)


def ms(seconds: list[float]) -> float:
    return round(statistics.median(seconds) * 1000, 2)


def bench_layer(backend: LocalBackend, size: int, count: int, reps: int) -> dict[str, Any]:
    source = backend.create(unique_name("bf"))
    try:
        assert source.exec(["python3", "-c", POPULATE, str(size), str(count)], timeout=600).exit_code == 0
        source.checkpoint("settle")  # the first snapshot after a big write pays the flush; not measured
        checkpoint, fork, first = [], [], []
        for _ in range(reps):
            started = time.perf_counter()
            taken = source.checkpoint()
            checkpoint.append(time.perf_counter() - started)
            started = time.perf_counter()
            forked = source.fork(unique_name("bf"), taken.id)
            fork.append(time.perf_counter() - started)
            started = time.perf_counter()
            assert forked.exec(["true"]).exit_code == 0
            first.append(time.perf_counter() - started)
            forked.destroy()
            source.delete_checkpoint(taken.id)
        return {"checkpoint_p50_ms": ms(checkpoint), "fork_p50_ms": ms(fork), "fork_first_exec_p50_ms": ms(first),
                "fork_to_checkpoint_ratio": round(statistics.median(fork) / statistics.median(checkpoint), 2),
                "samples": reps}
    finally:
        source.destroy()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="the 1MB layer only, few samples")
    parser.add_argument("--out", default=str(HERE / "results" / "fork.json"))
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="hsb-", dir="/tmp"))
    backend = LocalBackend(home, image_size="32G")
    results: dict[str, Any] = {}
    try:
        for label, (size, count) in (QUICK_LAYERS if args.quick else LAYERS).items():
            results[label] = bench_layer(backend, size, count, 3 if args.quick else 15)
    finally:
        for name in backend.names():
            backend.get(name).destroy()
        if isinstance(backend._store, BtrfsStore):
            backend._store.unmount()
        import shutil

        shutil.rmtree(home, ignore_errors=True)
    report = {"benchmark": "fork", "quick": args.quick, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": {"cpus": __import__("os").cpu_count(), "kernel": platform.release(),
                          "python": platform.python_version()},
              "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print("| layer | checkpoint (p50) | fork (p50) | fork / checkpoint | fork's first exec (p50) |")
    print("| --- | --- | --- | --- | --- |")
    for label, r in results.items():
        print(f"| {label} | {r['checkpoint_p50_ms']} ms | {r['fork_p50_ms']} ms | {r['fork_to_checkpoint_ratio']}x "
              f"| {r['fork_first_exec_p50_ms']} ms |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
