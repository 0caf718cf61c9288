"""Exec after idle: ``exec(["true"])`` through the Python API after a 100 ms pause, interleaved with
back-to-back calls, as an agent's commands come (seconds apart) versus as the other benchmarks run.

Why it exists: a command is born inside its own cgroup v1 freezer group, and moving a process into
a group waits for an RCU grace period (~10 ms) once the kernel's lock has been quiet for ~50 ms.
The init's pre-positioned stub (backends/local/stub.py) takes that move off the command's path;
this shows the difference. Run as root, once per tree to compare (``--label`` names the run):
``.venv/bin/python benchmarks/bench_exec_idle.py --label branch``. Results are merged by label into
benchmarks/results/exec-idle.json with the load average. Nothing here is asserted by a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests.local.kit's throw-away backend

from tests.local.kit import new_sandbox, temp_backend  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--label", required=True)
    parser.add_argument("-n", type=int, default=60)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "exec-idle.json")
    args = parser.parse_args()
    idle: list[float] = []
    busy: list[float] = []
    with temp_backend() as backend, new_sandbox(backend) as sb:
        for _ in range(10):
            sb.exec(["true"])
        load_before = os.getloadavg()[0]
        for _ in range(args.n):
            time.sleep(0.1)
            start = time.perf_counter()
            sb.exec(["true"])
            idle.append(time.perf_counter() - start)
            start = time.perf_counter()
            sb.exec(["true"])
            busy.append(time.perf_counter() - start)
    row = {"exec_after_100ms_idle_p50_ms": round(statistics.median(idle) * 1000, 2),
           "exec_back_to_back_p50_ms": round(statistics.median(busy) * 1000, 2),
           "exec_after_100ms_idle_p90_ms": round(sorted(idle)[int(args.n * 0.9)] * 1000, 2),
           "samples": args.n, "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
           "source": str(Path(sys.modules["hermes_sandboxes"].__file__ or "").parent)}
    report = json.loads(args.out.read_text()) if args.out.exists() else {}
    report[args.label] = row
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({args.label: row}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
