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

Every other command, served warm, interleaved with ``python3 -c pass`` the same way (issue #22,
point 6): ``ls``, ``checkpoint list``, ``log``, ``config``, ``--help``, ``--version`` and ``create``
against 3x the bare Python; ``run -- true``, ``checkpoint create`` and ``checkpoint restore --yes``
against 3x the bare Python plus the same operation through the Python API (the local backend's
``create``+``exec``+``destroy``, ``checkpoint()``, ``restore()``), measured in this process in the
same rounds. ``run`` is also measured against ``podman run --rm`` and ``runsc do`` when installed.
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
from typing import Any

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
    (root / "config.toml").write_text("")  # the defaults (a config file named must exist)
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
        commands = bench_commands(max(10, runs // 3), env, root)
        py = statistics.median(python)
        return {"commands": commands, "python_c_pass": summary(python), "cli_exec_true_warm": summary(warm),
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


LIGHT = {"ls": ["ls"], "checkpoint list": ["checkpoint", "list", "bench"], "log": ["log", "bench"],
         "config": ["config"], "--help": ["--help"], "--version": ["--version"]}
PEERS = {"podman run --rm": ["podman", "run", "--rm", "--network", "none", "localhost/hsb-bench-true", "/true"],
         "runsc do": ["runsc", "--network", "none", "do", "true"]}


def bench_commands(runs: int, env: dict[str, str], root: Path) -> dict[str, object]:
    """Each command (and its API counterpart) once per round, with a bare Python in every round."""
    from hermes_sandboxes.backends.local import LocalBackend

    backend = LocalBackend(root / "home")
    sandbox = backend.get("bench")
    base = subprocess.run([*CLI, "checkpoint", "create", "bench"], env=env, check=True,
                          capture_output=True, text=True).stdout.strip()
    peers = {name: argv for name, argv in PEERS.items() if _peer_ready(name, argv)}
    cli: dict[str, list[float]] = {name: [] for name in [*LIGHT, "create", "run -- true", "checkpoint create",
                                                         "checkpoint restore", *peers]}
    api: dict[str, list[float]] = {"run -- true": [], "checkpoint create": [], "checkpoint restore": []}
    python: list[float] = []
    for i in range(runs):
        python.append(timed([sys.executable, "-c", "pass"], env))
        for name, args in LIGHT.items():
            cli[name].append(timed([*CLI, *args], env))
        cli["create"].append(timed([*CLI, "create", f"bench-{i}"], env))
        cli["run -- true"].append(timed([*CLI, "run", "--", "true"], env))
        cli["checkpoint create"].append(timed([*CLI, "checkpoint", "create", "bench"], env))
        cli["checkpoint restore"].append(timed([*CLI, "checkpoint", "restore", "bench", base, "--yes"], env))
        for name, argv in peers.items():
            cli[name].append(timed(argv, env))
        api["run -- true"].append(_api_ms(lambda: _api_run(backend)))
        api["checkpoint create"].append(_api_ms(sandbox.checkpoint))
        api["checkpoint restore"].append(_api_ms(lambda: sandbox.restore(base)))
    for i in range(runs):
        backend.get(f"bench-{i}").destroy()
    py = statistics.median(python)
    rows: dict[str, object] = {}
    for name, samples in cli.items():
        own = statistics.median(api[name]) if name in api else 0.0
        limit = None if name in peers else TARGET_RATIO * py + own
        rows[name] = {"cli": summary(samples), "api": summary(api[name]) if name in api else None,
                      "limit_ms": None if limit is None else round(limit, 2),
                      "ratio_to_python": round(statistics.median(samples) / py, 2),
                      "meets_target": None if limit is None else statistics.median(samples) <= limit}
    rows["peers_not_measured"] = [name for name in PEERS if name not in peers]  # not installed, or fails here
    rows["python_c_pass"] = summary(python)
    return rows


def _api_ms(call: Any) -> float:
    started = time.perf_counter_ns()
    call()
    return (time.perf_counter_ns() - started) / 1e6


def _api_run(backend: Any) -> None:
    sandbox = backend.create(f"run-api-{os.getpid()}", ephemeral=True)
    try:
        sandbox.exec("true")
    finally:
        sandbox.destroy()


def _peer_ready(name: str, argv: list[str]) -> bool:
    """Installed, and (podman) with its one-file image imported from a static ``true``."""
    if shutil.which(argv[0]) is None:
        return False
    if name.startswith("podman"):
        busybox = shutil.which("busybox")  # static (busybox-static): an image of one file
        if busybox is None:
            return False
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(busybox, Path(tmp) / "true")
            subprocess.run(["tar", "-C", tmp, "-cf", f"{tmp}/image.tar", "true"], check=True, capture_output=True)
            done = subprocess.run(["podman", "import", f"{tmp}/image.tar", "localhost/hsb-bench-true"],
                                  capture_output=True, check=False)
            if done.returncode != 0:
                return False
    return subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, check=False).returncode == 0


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
    commands: dict[str, Any] = results["commands"]  # type: ignore[assignment]
    for name, row in commands.items():
        if not isinstance(row, dict) or "cli" not in row:
            continue
        api = f" (API {row['api']['median_ms']} ms)" if row["api"] else ""
        limit = f"<= {row['limit_ms']} ms" if row["limit_ms"] is not None else "peer"
        print(f"| `{name}` (median of {row['cli']['runs']}){api} | {row['cli']['median_ms']} ms = "
              f"{row['ratio_to_python']}x python | {limit} |")
    print(f"server: {r['server_memory']}, pid answer {r['server_pid_answer']['median_ms']} ms, "
          f"load {load_before} -> {results['load_average_after']}")


if __name__ == "__main__":
    main()
