"""The CLI's own cost of ``checkpoint restore``: ``hermes-sandboxes checkpoint restore NAME ID --yes``
run in-process (click's runner) against the backend's ``restore`` alone, interleaved, on a local
sandbox whose journal holds a history (``--history`` commands), so that every extra pass over the
journal or the backend's checkpoint list shows.

Run (root): python benchmarks/bench_restore.py [--runs N] [--history N] [--out FILE]
Writes benchmarks/results/restore.json and prints a table row: the CLI restore's median, the
backend restore's median and their paired difference (the CLI's own overhead: listings, journal
folds, the records written; with --yes no diff since issue 24).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "restore.json"


def median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 2)


def bench(runs: int, history: int, root: Path) -> dict[str, Any]:
    (root / "config.toml").write_text("")  # an empty config of its own (a named one must exist)
    os.environ.update({"HERMES_SANDBOXES_HOME": str(root / "home"), "HERMES_SANDBOXES_STATE": str(root / "state"),
                       "HERMES_SANDBOXES_CONFIG": str(root / "config.toml"), "HERMES_SANDBOXES_WARM": "0"})
    from click.testing import CliRunner

    from hermes_sandboxes.backends.local import LocalBackend
    from hermes_sandboxes.cli import cli
    from hermes_sandboxes.recorder.state import HostState

    runner = CliRunner()

    def call(*argv: str) -> str:
        result = runner.invoke(cli, list(argv), catch_exceptions=False)
        if result.exit_code != 0:
            raise RuntimeError(f"{argv}: exit {result.exit_code}: {result.output}")
        return result.output

    backend = LocalBackend(root / "home")
    call("create", "bench")
    try:
        sandbox = backend.get("bench")
        recorded = HostState(root / "state", durable=False).recorded(sandbox)
        target = recorded.checkpoint("restored to").id
        for i in range(history):  # the journal's history: each restore folds it
            recorded.exec(["sh", "-c", f"echo {i} > /root/f{i % 20}"])
            if i % 25 == 0:
                recorded.checkpoint(f"step {i}")
        recorded.close()
        for _ in range(2):  # warm-up: imports, page cache
            call("checkpoint", "restore", "bench", target, "--yes")
        cli_times, backend_times = [], []
        for _ in range(runs):
            sandbox.exec(["sh", "-c", "echo x > /root/changed"])  # something for the preview to show
            started = time.perf_counter()
            call("checkpoint", "restore", "bench", target, "--yes")
            cli_times.append(time.perf_counter() - started)
            sandbox.exec(["sh", "-c", "echo x > /root/changed"])
            started = time.perf_counter()
            sandbox.restore(target)
            backend_times.append(time.perf_counter() - started)
        overhead = [a - b for a, b in zip(cli_times, backend_times, strict=True)]
        return {"runs": runs, "journal_commands": history,
                "cli_restore_p50_ms": median_ms(cli_times), "backend_restore_p50_ms": median_ms(backend_times),
                "cli_overhead_paired_p50_ms": median_ms(overhead),
                "load_average_after": [round(x, 2) for x in os.getloadavg()]}
    finally:
        runner.invoke(cli, ["rm", "bench", "--yes"])
        store = backend.store
        if hasattr(store, "unmount"):
            store.unmount()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--history", type=int, default=200)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="hsb-restore-", dir=os.environ.get("TMPDIR")))
    load_before = [round(x, 2) for x in os.getloadavg()]
    try:
        results = bench(args.runs, args.history, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results["load_average_before"] = load_before
    report = {"benchmark": "restore", "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
              "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"| CLI `checkpoint restore --yes` in-process (median of {args.runs}, {args.history} commands journaled) | "
          f"{results['cli_restore_p50_ms']} ms; backend restore alone {results['backend_restore_p50_ms']} ms; "
          f"CLI's own overhead (paired) {results['cli_overhead_paired_p50_ms']} ms | - |")
    print(f"load {load_before} -> {results['load_average_after']}")


if __name__ == "__main__":
    main()
