"""The MCP server's start-up and round trips over stdio (targets: ``initialize`` answered within 1 s of
the spawn; an ``exec`` of ``true`` at most 3 ms above an empty tool's round trip, medians, one run).

Run (root): python benchmarks/bench_mcp.py [--runs N] [--quick] [--out FILE]
Writes benchmarks/results/mcp.json and prints the README table rows.

- spawn -> initialize: the installed command (``hermes-sandboxes mcp``, what a client spawns) started
  fresh, the ``initialize`` request written at once, timed until its response is read; for scale, the
  official SDK's server import (``import mcp.server``) timed the same way when the SDK is installed;
- round trips on one server process over its stdio, interleaved so load hits all alike: ``ping``; an
  empty tool (``exec_output`` of an id it does not keep: the whole ``tools/call`` path, arguments
  checked, a handler run on its own thread, a result, but no sandbox touched); ``exec`` of ``true``
  in a local sandbox (the recorded path: journal written ahead and completed, the risk check);
  and, for scale, the same recorded exec called in this process (``RecordedSandbox.exec`` on the
  same sandbox): what the recorder and the backend cost without MCP around them.
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
import time
from pathlib import Path
from typing import Any

INIT_TARGET_MS = 1000.0
EXEC_OVER_EMPTY_TARGET_MS = 3.0
RESULTS = Path(__file__).resolve().parent / "results" / "mcp.json"
_SCRIPT = Path(sys.executable).with_name("hermes-sandboxes")
CLI = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "hermes_sandboxes.cli"]
HELLO = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"median_ms": round(statistics.median(ordered), 3), "p90_ms": round(ordered[int(len(ordered) * 0.9)], 3),
            "min_ms": round(ordered[0], 3), "runs": len(ordered)}


class Server:
    """One ``hermes-sandboxes mcp`` process and a line-at-a-time JSON-RPC client of it."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.started = time.perf_counter_ns()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=env)
        self.ids = 0

    def ask(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.ids += 1
        message = {"jsonrpc": "2.0", "id": self.ids, "method": method, **({"params": params} if params else {})}
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer["result"]  # type: ignore[no-any-return]

    def timed(self, method: str, params: dict[str, Any] | None = None) -> float:
        started = time.perf_counter_ns()
        self.ask(method, params)
        return (time.perf_counter_ns() - started) / 1e6

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def spawn_to_initialize(argv: list[str], env: dict[str, str], runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        server = Server(argv, env)
        server.ask("initialize", HELLO)
        samples.append((time.perf_counter_ns() - server.started) / 1e6)
        server.close()
    return samples


def sdk_import(runs: int) -> list[float] | None:
    probe = subprocess.run([sys.executable, "-c", "import mcp.server"], capture_output=True)
    if probe.returncode != 0:
        return None
    samples = []
    for _ in range(runs):
        started = time.perf_counter_ns()
        subprocess.run([sys.executable, "-c", "import mcp.server"], check=True, capture_output=True)
        samples.append((time.perf_counter_ns() - started) / 1e6)
    return samples


def recorded_exec(store: Path, state: Path, name: str) -> Any:
    """A function timing one ``RecordedSandbox.exec(["true"])`` on ``name``, in this process."""
    from hermes_sandboxes import backends
    from hermes_sandboxes.recorder.options import Checkpointing
    from hermes_sandboxes.recorder.state import HostState

    backend = backends.build(backends.validate("local", {"home": str(store)}, where="the benchmark"))
    recorded = HostState(state, durable=False).recorded(backend.get(name), checkpointing=Checkpointing("risky"))

    def timed() -> float:
        started = time.perf_counter_ns()
        recorded.exec(["true"])
        return (time.perf_counter_ns() - started) / 1e6

    return timed


def round_trips(argv: list[str], env: dict[str, str], runs: int, scratch: Path) -> dict[str, list[float]]:
    server = Server(argv, env)
    try:
        server.ask("initialize", HELLO)
        made = server.ask("tools/call", {"name": "sandbox_create", "arguments": {"name": "bench"}})
        name = made["structuredContent"]["sandbox"]
        calls = {
            "ping": ("ping", None),
            "empty_tool": ("tools/call", {"name": "exec_output", "arguments": {"output_id": "none"}}),
            "exec_true": ("tools/call", {"name": "exec", "arguments": {"sandbox": name, "command": ["true"]}}),
        }
        direct = recorded_exec(scratch / "store", scratch / "state-direct", name)
        for _ in range(max(5, runs // 10)):  # warm-up: imports, the sandbox's first commands
            for method, params in calls.values():
                server.ask(method, params)
            direct()
        samples: dict[str, list[float]] = {key: [] for key in (*calls, "recorded_exec_in_process")}
        for _ in range(runs):
            for key, (method, params) in calls.items():
                samples[key].append(server.timed(method, params))
            samples["recorded_exec_in_process"].append(direct())
        server.ask("tools/call", {"name": "sandbox_remove", "arguments": {"sandbox": name, "confirm": True}})
        return samples
    finally:
        server.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--spawns", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="a few runs, to check that it works")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    runs, spawns = (20, 3) if args.quick else (args.runs, args.spawns)
    scratch = Path(tempfile.mkdtemp(prefix="hbmcp-", dir="/tmp"))
    (scratch / "config.toml").write_text("# empty: the defaults apply\n")  # (a named config file must exist)
    env = {**os.environ, "HERMES_SANDBOXES_STATE": str(scratch / "state"),
           "HERMES_SANDBOXES_CONFIG": str(scratch / "config.toml")}
    argv = [*CLI, "--home", str(scratch / "store"), "mcp", "--prefix", "bench"]
    load_before = os.getloadavg()
    try:
        trips = round_trips(argv, env, runs, scratch)  # first: it also builds the store the spawns then find
        init = spawn_to_initialize(argv, env, spawns)
        imported = sdk_import(spawns)
    finally:
        subprocess.run([*CLI, "--home", str(scratch / "store"), "store", "unmount"], env=env, capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
    results: dict[str, Any] = {
        "spawn_to_initialize": summary(init),
        **{key: summary(samples) for key, samples in trips.items()},
    }
    if imported is not None:
        results["sdk_server_import"] = summary(imported)
    over = results["exec_true"]["median_ms"] - results["empty_tool"]["median_ms"]
    results["exec_true_over_empty_tool_ms"] = round(over, 3)
    report = {
        "benchmark": "mcp", "results": results,
        "targets": {"spawn_to_initialize_ms": INIT_TARGET_MS,
                    "exec_true_over_empty_tool_ms": EXEC_OVER_EMPTY_TARGET_MS},
        "met": {"spawn_to_initialize": results["spawn_to_initialize"]["median_ms"] <= INIT_TARGET_MS,
                "exec_true_over_empty_tool": over <= EXEC_OVER_EMPTY_TARGET_MS},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_before": [round(v, 2) for v in load_before],
                    "load_after": [round(v, 2) for v in os.getloadavg()]},
        "quick": args.quick,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    r = results
    print(f"| MCP spawn -> initialize answered (stdio) | {r['spawn_to_initialize']['median_ms']:.0f} ms "
          f"(p90 {r['spawn_to_initialize']['p90_ms']:.0f}) | <= {INIT_TARGET_MS:.0f} ms |")
    if imported is not None:
        print(f"| for scale: import of the official SDK's server | {r['sdk_server_import']['median_ms']:.0f} ms | - |")
    print(f"| MCP round trip: ping / empty tool | {r['ping']['median_ms']:.2f} / {r['empty_tool']['median_ms']:.2f} ms"
          " | - |")
    print(f"| MCP exec `true` (stdio) | {r['exec_true']['median_ms']:.2f} ms, {over:+.2f} ms over the empty tool "
          f"| <= +{EXEC_OVER_EMPTY_TARGET_MS:.0f} ms |")
    print(f"| for scale: the same recorded exec in-process, no MCP | "
          f"{r['recorded_exec_in_process']['median_ms']:.2f} ms | - |")
    print(f"load average before/after: {report['machine']['load_before']} / {report['machine']['load_after']}")
    return 0 if all(report["met"].values()) or args.quick else 1


if __name__ == "__main__":
    sys.exit(main())
