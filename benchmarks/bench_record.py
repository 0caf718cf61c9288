"""What recording costs per command: ``RecordedSandbox.exec(["true"])`` against the same sandbox's
bare ``exec``, with the journals fsynced (the Python API's and Hermes's default) and not (the CLI's).

Run as root: python benchmarks/bench_record.py [--runs N] [--out FILE]
Writes benchmarks/results/record.json and prints one line per measure.

The three are interleaved on one local sandbox in a throw-away store and state directory, so load
on the machine hits them alike; the overhead is the difference of the medians. A recorded command
writes ahead that it starts and then how it ended, to its journal and to the audit log.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hermes_sandboxes.backends.local import LocalBackend
from hermes_sandboxes.backends.local.store.base import BtrfsStore
from hermes_sandboxes.recorder.state import HostState

RESULTS = Path(__file__).resolve().parent / "results" / "record.json"


def timed_ms(fn: Callable[[], object]) -> float:
    started = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - started) / 1e6


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"median_ms": round(statistics.median(ordered), 3), "p90_ms": round(ordered[int(len(ordered) * 0.9)], 3),
            "runs": len(ordered)}


def bench(runs: int, root: Path) -> dict[str, Any]:
    backend = LocalBackend(root / "home")
    sandbox = backend.create("bench")
    try:
        durable = HostState(root / "durable", durable=True).recorded(sandbox)
        fast = HostState(root / "fast", durable=False).recorded(sandbox)
        ways: dict[str, Callable[[], object]] = {
            "bare_exec": lambda: sandbox.exec(["true"]),
            "recorded_fsync": lambda: durable.exec(["true"]),
            "recorded_no_fsync": lambda: fast.exec(["true"]),
        }
        samples: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(10):  # warm-up: the init is up, the journals are open
            for fn in ways.values():
                fn()
        for _ in range(runs):
            for name, fn in ways.items():
                samples[name].append(timed_ms(fn))
        out: dict[str, Any] = {name: summary(values) for name, values in samples.items()}
        bare = out["bare_exec"]["median_ms"]
        for name in ("recorded_fsync", "recorded_no_fsync"):
            out[name]["overhead_ms"] = round(out[name]["median_ms"] - bare, 3)
        return out
    finally:
        sandbox.destroy()
        store = backend.store
        if isinstance(store, BtrfsStore):
            store.unmount()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="hsb-record-"))
    try:
        results = bench(args.runs, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report = {"benchmark": "record", "results": results, "measured_at": time.time(),
              "environment": {"python": sys.version.split()[0], "platform": platform.platform(),
                              "cpus": os.cpu_count()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for name, value in results.items():
        extra = f"   overhead {value['overhead_ms']:.3f} ms" if "overhead_ms" in value else ""
        print(f"{name:18} median {value['median_ms']:.3f} ms   p90 {value['p90_ms']:.3f} ms{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
