"""The CLI's round trip: ``hermes-sandboxes exec NAME -- true`` against a bare ``python3 -c pass``
(target: <= 3x), measured in the same run, interleaved so that load on the machine hits both alike.

Run (root): python benchmarks/bench_cli.py [--runs N] [--out FILE]
Writes benchmarks/results/cli.json and prints the README table row.

Both are fresh processes of this venv's Python, the CLI through its console script (what users
and scripts call); it runs as a script's call would (stdin from /dev/null, output to a pipe), on a
local sandbox in a throw-away store whose init is already up, after warm-up calls (which fill the
settings cache the fast path reads).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_RATIO = 3.0
RESULTS = Path(__file__).resolve().parent / "results" / "cli.json"
# The installed command, as users and scripts call it (python -m would add runpy's imports).
_SCRIPT = Path(sys.executable).with_name("hermes-sandboxes")
CLI = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "hermes_sandboxes.cli"]


def timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter_ns()
    subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, env=env, check=True)
    return (time.perf_counter_ns() - started) / 1e6


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"median_ms": round(statistics.median(ordered), 2), "p90_ms": round(ordered[int(len(ordered) * 0.9)], 2),
            "min_ms": round(ordered[0], 2), "runs": len(ordered)}


def bench(runs: int, root: Path) -> dict[str, object]:
    # the package's bytecode written as an installed package has it (pip compiles at install): a
    # checkout run with PYTHONDONTWRITEBYTECODE would otherwise compile every changed module per call
    import hermes_sandboxes

    compileall.compile_dir(Path(hermes_sandboxes.__file__).parent, quiet=1)
    env = {**os.environ, "HERMES_SANDBOXES_HOME": str(root / "home"), "HERMES_SANDBOXES_STATE": str(root / "state"),
           "HERMES_SANDBOXES_CONFIG": str(root / "config.toml")}
    subprocess.run([*CLI, "create", "bench"], env=env, check=True, capture_output=True)
    try:
        for _ in range(3):  # warm-up: the init starts, the settings cache fills, the page cache warms
            timed([*CLI, "exec", "bench", "--", "true"], env)
        python, cli = [], []
        for _ in range(runs):
            python.append(timed([sys.executable, "-c", "pass"], env))
            cli.append(timed([*CLI, "exec", "bench", "--", "true"], env))
        ratio = statistics.median(cli) / statistics.median(python)
        return {"python_c_pass": summary(python), "cli_exec_true": summary(cli), "ratio": round(ratio, 2)}
    finally:
        subprocess.run([*CLI, "rm", "bench", "--yes"], env=env, check=False, capture_output=True)
        from hermes_sandboxes.backends.local import LocalBackend

        store = LocalBackend(root / "home").store
        if hasattr(store, "unmount"):
            store.unmount()  # frees the loop device too


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="hsb-cli-", dir="/tmp"))
    try:
        results = bench(args.runs, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratio = float(results["ratio"])  # type: ignore[arg-type]
    report = {"benchmark": "cli", "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
              "target_ratio": TARGET_RATIO, "meets_target": ratio <= TARGET_RATIO, "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    cli, python = results["cli_exec_true"], results["python_c_pass"]
    print(f"| CLI `exec NAME -- true` (median of {args.runs}) / bare `python3 -c pass` (same run) | "
          f"{cli['median_ms']} ms / {python['median_ms']} ms = {ratio}x | <= {TARGET_RATIO:g}x |")  # type: ignore[index]


if __name__ == "__main__":
    main()
