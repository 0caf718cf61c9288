"""Journal overhead per recorded command (target: <= 2 ms), with and without fsync.

Run: python benchmarks/bench_journal.py [--appends N]
Writes benchmarks/results/journal.json and prints a short summary.

A recorded command costs one append to the sandbox's journal and one to the audit log, so the
"per command" figure is both; reading and folding the story is measured too because
``RecordedSandbox.checkpoints()`` and restore previews pay it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from hermes_sandboxes.recorder.journal import CheckpointRecord, ExecRecord, Journal

TARGET_MS = 2.0
RESULTS = Path(__file__).resolve().parent / "results" / "journal.json"


def exec_record(i: int) -> ExecRecord:
    return ExecRecord(sandbox="bench", command=f"pytest -q tests/test_{i % 50}.py -k 'not slow'",
                      exit_code=i % 3, duration_s=1.25, origin={"task": "t-42", "session": "s-7"})


def timings_ms(n: int, step: Callable[[int], object]) -> dict[str, float]:
    samples = []
    for i in range(n):
        started = time.perf_counter_ns()
        step(i)
        samples.append((time.perf_counter_ns() - started) / 1e6)
    samples.sort()
    return {"median_ms": round(statistics.median(samples), 4),
            "p95_ms": round(samples[int(len(samples) * 0.95) - 1], 4),
            "max_ms": round(samples[-1], 4), "samples": n}


def bench(directory: Path, appends: int) -> dict[str, object]:
    results: dict[str, object] = {}
    for durable in (True, False):
        journal = Journal(directory / f"single-{durable}.jsonl", durable=durable)
        journal.append(exec_record(-1))  # open and create outside the timing

        def append(i: int, journal: Journal = journal) -> None:
            journal.append(exec_record(i))

        results[f"append_{'fsync' if durable else 'no_fsync'}"] = timings_ms(appends, append)

        own = Journal(directory / f"journal-{durable}.jsonl", durable=durable)
        audit = Journal(directory / f"audit-{durable}.jsonl", durable=durable)

        def per_command(i: int, own: Journal = own, audit: Journal = audit) -> None:
            own.append(exec_record(i))
            audit.append(exec_record(i))

        per_command(-1)
        results[f"per_command_{'fsync' if durable else 'no_fsync'}"] = timings_ms(appends, per_command)

    story = Journal(directory / "story.jsonl", durable=False)
    for i in range(1000):
        story.append(exec_record(i))
        if i % 10 == 9:
            story.append(CheckpointRecord(sandbox="bench", id=f"cp{i}", trigger="auto"))
    results["fold_story_1100_records"] = timings_ms(50, lambda _: story.story().commands_since("cp9"))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=2000, help="appends per measurement")
    parser.add_argument("--dir", type=Path, default=None,
                        help="where to write the journals (default: a temporary directory; fsync cost "
                             "depends on the filesystem, so measure where the journals will live)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        results = bench(Path(tmp), args.appends)
        fs_dir = args.dir or Path(tempfile.gettempdir())
    per_command = results["per_command_fsync"]
    assert isinstance(per_command, dict)
    report = {
        "benchmark": "journal",
        "target_ms_per_command": TARGET_MS,
        "meets_target": per_command["median_ms"] <= TARGET_MS,
        "results": results,
        "environment": {"python": sys.version.split()[0], "platform": platform.platform(),
                        "cpus": os.cpu_count(), "directory": str(fs_dir)},
        "measured_at": time.time(),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    for name, value in results.items():
        assert isinstance(value, dict)
        print(f"{name:28} median {value['median_ms']:8.4f} ms   p95 {value['p95_ms']:8.4f} ms")
    verdict = "meets" if report["meets_target"] else "MISSES"
    print(f"per command (journal + audit, fsync): {verdict} the {TARGET_MS} ms target; wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
