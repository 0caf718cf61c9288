"""Hermes terminal-tool round trip: the local sandbox backend versus Hermes's built-in ``local``.

Run (as root): python benchmarks/bench_hermes.py [--calls N]
Writes benchmarks/results/hermes.json and prints a short summary. Target: the sandbox's median round
trip within 1.5x of the built-in local backend's, measured in the same run.

Both sides go through ``model_tools.handle_function_call("terminal", ...)``, so both pay Hermes's
own work (guards, snapshot wrapper, cwd marker, result shaping); the difference is the backend.
The sandbox side also pays what the plugin adds per command: the file-sync check, the risk
classifier, the journal and audit appends (durable, fdatasync), and redaction. The first call
(environment creation: sandbox boot, file sync, shell snapshot) is reported separately.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "hermes.json"
TARGET_RATIO = 1.5
COMMAND = "echo hello"
EXPECTED_CLASS = {"local": "LocalEnvironment", "sandbox": "SandboxEnvironment"}


def _summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered), 3),
        "p90_ms": round(ordered[int(len(ordered) * 0.9) - 1], 3),
        "mean_ms": round(statistics.fmean(ordered), 3),
        "min_ms": round(ordered[0], 3),
    }


def _measure(backend: str, calls: int) -> dict[str, Any]:
    from model_tools import handle_function_call
    from tools.terminal_tool import cleanup_all_environments
    from tools.terminal_tool_lifecycle import get_active_env

    os.environ["TERMINAL_ENV"] = backend
    cleanup_all_environments()
    started = time.perf_counter()
    first = json.loads(handle_function_call("terminal", {"command": COMMAND}, task_id="bench"))
    first_ms = (time.perf_counter() - started) * 1000
    assert first.get("exit_code") == 0 and "hello" in first.get("output", ""), first
    env = get_active_env("bench")
    assert env is not None and type(env).__name__ == EXPECTED_CLASS[backend], (backend, type(env))
    for _ in range(5):  # warm up
        handle_function_call("terminal", {"command": COMMAND}, task_id="bench")
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        result = json.loads(handle_function_call("terminal", {"command": COMMAND}, task_id="bench"))
        samples.append((time.perf_counter() - started) * 1000)
        assert result.get("exit_code") == 0, result
    cleanup_all_environments()
    return {"first_call_ms": round(first_ms, 3), **_summary(samples)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("the local sandbox needs root", file=sys.stderr)
        return 2

    store = Path(tempfile.mkdtemp(prefix="hbs-", dir="/tmp"))
    home = Path(tempfile.mkdtemp(prefix="hbh-", dir="/tmp"))
    # Hermes writes into its home (cache/) from its own threads until the interpreter exits
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    (home / "config.yaml").write_text(
        "plugins:\n  enabled: [sandbox]\n"
        "  entries:\n    sandbox:\n      settings:\n        name_prefix: bench\n")
    # No terminal section in config.yaml: TERMINAL_ENV alone picks the backend of each phase.
    os.environ.update(HERMES_HOME=str(home), HERMES_SANDBOXES_HOME=str(store), TERMINAL_ENV="local")
    from hermes_cli.plugins import discover_plugins

    from hermes_sandboxes.backends.local import LocalBackend

    discover_plugins()
    try:
        local = _measure("local", args.calls)
        sandbox = _measure("sandbox", args.calls)
    finally:
        backend = LocalBackend(store)
        for name in backend.names():
            backend.get(name).destroy()
        unmount = getattr(backend.store, "unmount", None)
        if unmount is not None:
            unmount()
        shutil.rmtree(store, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)

    ratio = sandbox["median_ms"] / local["median_ms"]
    report = {
        "benchmark": "hermes terminal tool round trip",
        "command": COMMAND,
        "calls": args.calls,
        "hermes_local": local,
        "sandbox": sandbox,
        "median_ratio": round(ratio, 3),
        "target_ratio": TARGET_RATIO,
        "within_target": ratio <= TARGET_RATIO,
        "machine": {"python": platform.python_version(), "kernel": platform.release(),
                    "cpus": os.cpu_count()},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"hermes local: median {local['median_ms']} ms; sandbox: median {sandbox['median_ms']} ms "
          f"(first call {sandbox['first_call_ms']} ms); ratio {ratio:.2f} (target <= {TARGET_RATIO})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
