"""What ``idle_timeout`` costs a command: recorded ``exec(["true"])`` in a sandbox with an idle timeout
(the use lock taken shared around the request, the stop notes looked at) against one without,
interleaved in one run; and how long the next command takes when the init stopped the sandbox for
being idle (its start included) against one in a running sandbox.

Run as root: ``.venv/bin/python benchmarks/bench_idle.py``. Writes benchmarks/results/idle.json
with medians, their ratio and the load average before and after (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests.local.kit's throw-away backend

from hermes_sandboxes.recorder.state import HostState  # noqa: E402
from hermes_sandboxes.sandbox import SandboxSpec  # noqa: E402
from tests.local.kit import new_sandbox, temp_backend  # noqa: E402


def _timed(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=200)
    parser.add_argument("--restarts", type=int, default=10)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "idle.json")
    args = parser.parse_args()
    state = HostState(Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-idle-state-{os.getpid()}", durable=False)
    plain_s: list[float] = []
    idle_s: list[float] = []
    restart_s: list[float] = []
    load_before = os.getloadavg()[0]
    try:
        with temp_backend() as backend, new_sandbox(backend) as plain, \
                new_sandbox(backend, SandboxSpec(idle_timeout=3600)) as idle, \
                new_sandbox(backend, SandboxSpec(idle_timeout=0.2)) as short:
            rp, ri, rs = state.recorded(plain), state.recorded(idle), state.recorded(short)
            for recorded in (rp, ri):
                for _ in range(10):
                    recorded.exec(["true"])
            for _ in range(args.n):
                plain_s.append(_timed(lambda: rp.exec(["true"])))
                idle_s.append(_timed(lambda: ri.exec(["true"])))
            for _ in range(args.restarts):
                rs.exec(["true"])
                deadline = time.monotonic() + 60
                while short.is_running():
                    if time.monotonic() > deadline:
                        raise SystemExit("the short-idle sandbox was never stopped")
                    time.sleep(0.05)
                restart_s.append(_timed(lambda: rs.exec(["true"])))
    finally:
        shutil.rmtree(state.root, ignore_errors=True)
    row = {
        "exec_p50_ms_without_idle_timeout": round(statistics.median(plain_s) * 1000, 3),
        "exec_p50_ms_with_idle_timeout": round(statistics.median(idle_s) * 1000, 3),
        "ratio_with_to_without": round(statistics.median(idle_s) / statistics.median(plain_s), 3),
        "first_exec_after_idle_stop_p50_ms": round(statistics.median(restart_s) * 1000, 1),
        "samples": args.n, "restarts": args.restarts,
        "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    args.out.write_text(json.dumps(row, indent=2) + "\n")
    print(json.dumps(row, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
