"""The CLI's round trip: ``hermes-sandboxes exec NAME -- true`` against a bare ``python3 -c pass``
(target: <= 3x), measured in the same run, interleaved so that load on the machine hits all alike.

Run (root): python benchmarks/bench_cli.py [--runs N] [--out FILE]
Writes benchmarks/results/cli.json and prints the README table rows.

Three ways of calling, all fresh processes of this venv's Python through the console script (what
users and scripts call), as a script's call would run (stdin from /dev/null, output to a pipe), on a
local sandbox in a throw-away store whose init is already up, after warm-up calls (which fill the
settings cache the fast path reads):

- warm: the warm exec server is up (cli/warm.py): the headline, against the target;
- in-process: ``HERMES_SANDBOXES_WARM=0``, the whole exec path imported by the call itself;
- first: no server yet, so the call runs in-process and starts one (measured after stopping it).

Also: the server's memory (RSS and PSS) and what one request costs it up to the worker's pid
(accept, fork, the request read): a connection that sends a request and never says go.
"""

from __future__ import annotations

import argparse
import compileall
import json
import marshal
import os
import platform
import shutil
import signal
import socket
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


class Server:
    """The warm exec server of ``env`` (its runtime directory is the benchmark's own)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        stamped = json.loads(subprocess.run(
            [sys.executable, "-c", "import json; from hermes_sandboxes.cli.fastpath import warm; "
             "print(json.dumps(warm.key_of(warm.stamp())))"], env=env, capture_output=True, check=True).stdout)
        where = Path(env["XDG_RUNTIME_DIR"]) / "hermes-sandboxes"
        self.pidfile, self.socket = where / f"{stamped}.pid", where / f"{stamped}.sock"

    def pid(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while True:
            try:
                pid = int(self.pidfile.read_text())
                os.kill(pid, 0)
                return pid
            except (OSError, ValueError):
                if time.monotonic() > deadline:
                    raise RuntimeError("no warm exec server came up") from None
                time.sleep(0.01)

    def stop(self) -> None:
        try:
            pid = int(self.pidfile.read_text())
        except (OSError, ValueError):
            return
        if b"hermes_sandboxes.cli.fastpath.server" in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.01)

    def memory_kib(self) -> dict[str, int]:
        pid = self.pid()
        rss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if line.startswith("VmRSS:"))
        pss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
                   if line.startswith("Pss:"))
        return {"rss_kib": rss, "pss_kib": pss}

    def pid_answer_ms(self) -> float:
        """Connect, send a request (one the worker will not run: it never gets its go), read the pid."""
        stamp = subprocess.run([sys.executable, "-c", "import marshal, sys; "
                                "from hermes_sandboxes.cli.fastpath import warm; "
                                "sys.stdout.buffer.write(marshal.dumps(warm.stamp()))"], env=self.env,
                               capture_output=True, check=True).stdout
        request = marshal.dumps((marshal.loads(stamp), ["hermes-sandboxes"], ["exec", "x", "--", "true"],
                                 {k.encode(): v.encode() for k, v in self.env.items()}, 0o22, [], sys.path))
        started = time.perf_counter_ns()
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(self.socket))
            sock.sendall(len(request).to_bytes(4, "big") + request)
            answer = sock.recv(64)
        took = (time.perf_counter_ns() - started) / 1e6
        if not answer.startswith(b"pid "):
            raise RuntimeError(f"unexpected answer {answer!r}")
        return took


def bench(runs: int, root: Path) -> dict[str, object]:
    # the package's bytecode written as an installed package has it (pip compiles at install): a
    # checkout run with PYTHONDONTWRITEBYTECODE would otherwise compile every changed module per call
    import hermes_sandboxes

    compileall.compile_dir(Path(hermes_sandboxes.__file__).parent, quiet=1)
    runtime = root / "run"
    runtime.mkdir(mode=0o700)
    env = {**os.environ, "HERMES_SANDBOXES_HOME": str(root / "home"), "HERMES_SANDBOXES_STATE": str(root / "state"),
           "HERMES_SANDBOXES_CONFIG": str(root / "config.toml"), "XDG_RUNTIME_DIR": str(runtime)}
    env.pop("HERMES_SANDBOXES_WARM", None)
    cold = {**env, "HERMES_SANDBOXES_WARM": "0"}
    server = Server(env)
    exec_true = [*CLI, "exec", "bench", "--", "true"]
    subprocess.run([*CLI, "create", "bench"], env=env, check=True, capture_output=True)
    try:
        for _ in range(3):  # warm-up: the init starts, the settings cache fills, the page cache warms
            timed(exec_true, cold)
        timed(exec_true, env)  # starts the server
        server.pid()
        python, warm, in_process = [], [], []
        for _ in range(runs):
            python.append(timed([sys.executable, "-c", "pass"], env))
            warm.append(timed(exec_true, env))
            in_process.append(timed(exec_true, cold))
        memory = server.memory_kib()
        pid_answer = [server.pid_answer_ms() for _ in range(max(10, runs // 2))]
        first = []
        for _ in range(max(5, runs // 10)):
            server.stop()
            first.append(timed(exec_true, env))
            server.pid()
        py = statistics.median(python)
        return {"python_c_pass": summary(python), "cli_exec_true_warm": summary(warm),
                "cli_exec_true_in_process": summary(in_process),
                "cli_exec_true_first_starting_the_server": summary(first),
                "ratio_warm": round(statistics.median(warm) / py, 2),
                "ratio_in_process": round(statistics.median(in_process) / py, 2),
                "server_memory": memory, "server_pid_answer": summary(pid_answer),
                "load_average_after": [round(x, 2) for x in os.getloadavg()]}
    finally:
        server.stop()
        subprocess.run([*CLI, "rm", "bench", "--yes"], env=cold, check=False, capture_output=True)
        from hermes_sandboxes.backends.local import LocalBackend

        store = LocalBackend(root / "home").store
        if hasattr(store, "unmount"):
            store.unmount()  # frees the loop device too


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="hsb-cli-"))
    load_before = [round(x, 2) for x in os.getloadavg()]
    try:
        results = bench(args.runs, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results["load_average_before"] = load_before
    ratio = float(results["ratio_warm"])  # type: ignore[arg-type]
    report = {"benchmark": "cli", "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
              "target_ratio": TARGET_RATIO, "meets_target": ratio <= TARGET_RATIO, "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    r: dict[str, dict[str, float]] = results  # type: ignore[assignment]
    py = r["python_c_pass"]["median_ms"]
    print(f"| CLI `exec NAME -- true`, warm server (median of {args.runs}) / bare `python3 -c pass` (same run) | "
          f"{r['cli_exec_true_warm']['median_ms']} ms / {py} ms = {ratio}x | <= {TARGET_RATIO:g}x |")
    print(f"| the same in-process (`HERMES_SANDBOXES_WARM=0`) | {r['cli_exec_true_in_process']['median_ms']} ms / "
          f"{py} ms = {results['ratio_in_process']}x | - |")
    print(f"| the first call, which starts the server | {r['cli_exec_true_first_starting_the_server']['median_ms']} ms"
          " | - |")
    print(f"server: {r['server_memory']}, pid answer {r['server_pid_answer']['median_ms']} ms, "
          f"load {load_before} -> {results['load_average_after']}")


if __name__ == "__main__":
    main()
