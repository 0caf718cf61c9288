"""Rollback against a hostile tree: diff and restore of a 4,000-deep tree and of 300,000 files.

Run as root: ``.venv/bin/python benchmarks/bench_hostile.py [--quick] [--out FILE]``. For each tree,
made inside a fresh sandbox (btrfs store) after a checkpoint: the time of one diff against that
checkpoint and the peak of the memory Python allocated for it (tracemalloc), whether the diff
finished or stopped at its budget, then the time of the restore. Writes JSON (default
benchmarks/results/hostile.json) with the load average, and prints a Markdown table. Issue 24 found
the 4,000-deep diff past 300 s and 455 MB for one diff of 300,000 files.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from hermes_sandboxes.backends.local import LocalBackend
from hermes_sandboxes.backends.local.store.base import BtrfsStore
from hermes_sandboxes.errors import Unsupported
from hermes_sandboxes.names import unique_name

HERE = Path(__file__).resolve().parent
DEEP = ("import os\nos.makedirs('/opt/hs-bench')\nos.chdir('/opt/hs-bench')\n"
        "for _ in range({n}):\n os.mkdir('d')\n os.chdir('d')\n")
FLAT = ("import os\nos.makedirs('/opt/hs-bench')\n"
        "for i in range({n}):\n d=f'/opt/hs-bench/{{i//1000:04d}}'\n"
        " os.makedirs(d,exist_ok=True)\n open(f'{{d}}/f{{i%1000:03d}}','w').close()\n")


def bench_tree(backend: LocalBackend, script: str) -> dict[str, Any]:
    sb = backend.create(unique_name("bh"))
    try:
        base = sb.checkpoint("before")
        assert sb.exec(["python3", "-c", script], timeout=1800).exit_code == 0
        tracemalloc.start()
        started = time.perf_counter()
        try:
            changes: int | None = len(sb.diff(base.id))
            stopped = None
        except Unsupported as exc:
            changes, stopped = None, str(exc)
        diff_s = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        started = time.perf_counter()
        sb.restore(base.id)
        restore_s = time.perf_counter() - started
        assert sb.exec("test ! -e /opt/hs-bench").exit_code == 0
        return {"diff_s": round(diff_s, 2), "diff_peak_mb": round(peak / 1e6, 1), "changes": changes,
                "diff_stopped": stopped, "restore_s": round(restore_s, 2)}
    finally:
        sb.destroy()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="400 deep and 30,000 files")
    parser.add_argument("--out", default=str(HERE / "results" / "hostile.json"))
    args = parser.parse_args()
    depth, files = (400, 30_000) if args.quick else (4_000, 300_000)
    home = Path(tempfile.mkdtemp(prefix="hsb-", dir="/tmp"))
    backend = LocalBackend(home, store="btrfs", image_size="32G")
    load_before = os.getloadavg()
    results: dict[str, Any] = {}
    try:
        results[f"deep_{depth}"] = bench_tree(backend, DEEP.format(n=depth))
        results[f"flat_{files}"] = bench_tree(backend, FLAT.format(n=files))
    finally:
        for name in backend.names():
            backend.get(name).destroy()
        if isinstance(backend._store, BtrfsStore):
            backend._store.unmount()
        shutil.rmtree(home, ignore_errors=True)
    report = {"benchmark": "hostile", "quick": args.quick, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()},
              "load": {"before": [round(x, 2) for x in load_before],
                       "after": [round(x, 2) for x in os.getloadavg()]},
              "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print("| tree | diff | diff peak memory | changes | restore |")
    print("| --- | --- | --- | --- | --- |")
    for label, r in results.items():
        counted = r["changes"] if r["changes"] is not None else f"stopped: {r['diff_stopped']}"
        print(f"| {label} | {r['diff_s']} s | {r['diff_peak_mb']} MB | {counted} | {r['restore_s']} s |")
    print(f"load average {report['load']['before']} -> {report['load']['after']} ({os.cpu_count()} cores, shared)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
