"""An interleaved A/B of the local sandbox's start costs between two source trees (before and after a
change): restore (which starts a new init), the first exec after it, a steady exec, a checkpoint,
create + first exec + destroy, the CLI's `exec NAME -- true` served by the warm exec server, and a
Hermes terminal-tool round trip (``handle_function_call("terminal", ...)`` through the plugin).

Run (root): python benchmarks/bench_ab.py --a OLD/src [--b NEW/src] [--samples N] [--out FILE]
Each tree runs in a worker process of its own (PYTHONPATH=tree, the same interpreter), with a store
of its own under one temporary directory; the driver asks for one sample of each operation from A
then B, the order alternating per sample, so the machine's load (other engineers' tests) falls on
both alike. Prints the medians (wall, and the worker's own CPU time: steadier under load), the
B/A ratios and the load average, and writes a JSON row to benchmarks/results/ab.json (or --out).
The CLI samples run the installed `hermes-sandboxes` script with PYTHONPATH=tree (a tree's own
bytecode is compiled first, as pip does at install) and report the client's CPU time; each tree has
its own warm server (its own runtime directory), stopped at the end.
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
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "ab.json"
OPERATIONS = ("restore", "first_exec", "exec", "checkpoint", "create_exec_destroy", "cli_warm_exec", "hermes")
ASKABLE = ("restore", "exec", "checkpoint", "cli_warm_exec", "hermes")
_SCRIPT = Path(sys.executable).with_name("hermes-sandboxes")  # the installed command, as users call it
# with each wall time, the worker's own CPU time (time.process_time: steadier than wall under load)
MEASURES = tuple(m for op in OPERATIONS for m in (op, f"{op}_host_cpu"))

# The worker: one sandbox with a layer of `size` bytes, a checkpoint to restore to; then, for each
# operation name read on stdin, one timed sample (seconds) on stdout. Written against the API both
# trees share (LocalBackend(home), create, exec, checkpoint, restore, destroy).
WORKER = r"""
import json, os, resource, subprocess, sys, time
import hermes_sandboxes
from hermes_sandboxes.backends.local import LocalBackend
home, size, cli = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
backend = LocalBackend(home)
sb = backend.create("ab")
made = [0]
taken = []
cpus = []
try:
    sb.exec(["sh", "-c", f"head -c {size} /dev/urandom > /root/layer"])
    target = sb.checkpoint("ab target").id
    for _ in range(3):
        sb.restore(target)
        sb.exec(["true"])

    def create_exec_destroy():
        made[0] += 1
        other = backend.create(f"ab-{made[0]}")
        try:
            other.exec(["true"])
        finally:
            other.destroy()

    def checkpoint():
        taken.append(sb.checkpoint("ab").id)

    # the CLI's environment: this store, a state and warm-server runtime directory of its own
    here = os.path.dirname(home)
    for d in ("state", "run"):
        os.makedirs(os.path.join(here, d), mode=0o700, exist_ok=True)
    with open(os.path.join(here, "config.toml"), "w"):
        pass  # the defaults (a config file named must exist)
    cli_env = {**os.environ, "HERMES_SANDBOXES_HOME": home, "HERMES_SANDBOXES_STATE": os.path.join(here, "state"),
               "HERMES_SANDBOXES_CONFIG": os.path.join(here, "config.toml"),
               "XDG_RUNTIME_DIR": os.path.join(here, "run")}
    cli_env.pop("HERMES_SANDBOXES_WARM", None)
    cli_env.pop("PYTHONDONTWRITEBYTECODE", None)

    def cli_exec():
        subprocess.run([*cli, "exec", "ab", "--", "true"], env=cli_env, stdin=subprocess.DEVNULL,
                       capture_output=True, check=True)

    def client_cpu():
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    hermes = []

    def hermes_call():
        if not hermes:  # set up once, untimed: the environment's creation is not a round trip
            hermes_home = os.path.join(here, "hermes-home")
            os.makedirs(hermes_home, exist_ok=True)
            with open(os.path.join(hermes_home, "config.yaml"), "w") as f:
                f.write("plugins:\n  enabled: [sandbox]\n  entries:\n    sandbox:\n      settings:\n"
                        "        name_prefix: abh\n")
            os.environ.update(HERMES_HOME=hermes_home, HERMES_SANDBOXES_HOME=home, TERMINAL_ENV="sandbox",
                              HERMES_SANDBOXES_STATE=os.path.join(here, "state"))
            from hermes_cli.plugins import discover_plugins
            from model_tools import handle_function_call
            from tools.terminal_tool_lifecycle import get_active_env
            discover_plugins()
            hermes.append(handle_function_call)
            for _ in range(6):
                hermes_call()
            env = get_active_env("ab")
            assert type(env).__name__ == "SandboxEnvironment", type(env)
            return
        result = json.loads(hermes[0]("terminal", {"command": "echo hello"}, task_id="ab"))
        assert result.get("exit_code") == 0 and "hello" in result.get("output", ""), result

    def timed(fn):
        started, cpu = time.perf_counter(), time.process_time()
        fn()
        cpus.append(time.process_time() - cpu)  # this process's CPU (not the launcher's or the init's)
        return time.perf_counter() - started

    print(json.dumps({"ready": os.getpid(), "package": hermes_sandboxes.__file__}), flush=True)
    for line in sys.stdin:
        op = line.strip()
        cpus.clear()
        if op == "restore":
            took = timed(lambda: sb.restore(target))
            first = timed(lambda: sb.exec(["true"]))
            print(json.dumps({"restore": took, "first_exec": first,
                              "restore_host_cpu": cpus[0], "first_exec_host_cpu": cpus[1]}), flush=True)
        elif op == "exec":
            took = timed(lambda: sb.exec(["true"]))
            print(json.dumps({"exec": took, "exec_host_cpu": cpus[0]}), flush=True)
        elif op == "checkpoint":
            took = timed(checkpoint)
            sb.delete_checkpoint(taken.pop())  # untimed: the store holds one checkpoint between samples
            print(json.dumps({"checkpoint": took, "checkpoint_host_cpu": cpus[0]}), flush=True)
        elif op == "create_exec_destroy":
            took = timed(create_exec_destroy)
            print(json.dumps({"create_exec_destroy": took, "create_exec_destroy_host_cpu": cpus[0]}), flush=True)
        elif op == "cli_warm_exec":
            if not cli_env.get("_warmed"):  # untimed: starts this tree's warm server and fills its caches
                for _ in range(4):
                    cli_exec()
                cli_env["_warmed"] = "1"
            before = client_cpu()
            took = timed(cli_exec)
            print(json.dumps({"cli_warm_exec": took, "cli_warm_exec_host_cpu": client_cpu() - before}), flush=True)
        elif op == "hermes":
            if not hermes:
                hermes_call()
            took = timed(hermes_call)
            print(json.dumps({"hermes": took, "hermes_host_cpu": cpus[0]}), flush=True)
        elif op == "quit":
            break
finally:
    if hermes:
        from tools.terminal_tool import cleanup_all_environments
        cleanup_all_environments()
    run_dir = os.path.join(os.path.dirname(home), "run", "hermes-sandboxes")
    for name in os.listdir(run_dir) if os.path.isdir(run_dir) else ():
        if name.endswith(".pid"):  # this tree's warm server (its runtime directory is ours alone)
            try:
                pid = int(open(os.path.join(run_dir, name)).read())
                if b"hermes_sandboxes" in open(f"/proc/{pid}/cmdline", "rb").read():
                    os.kill(pid, 15)
            except (OSError, ValueError):
                pass
    for name in backend.names():
        if name != "ab":
            backend.get(name).destroy()
    sb.destroy()
    if hasattr(backend.store, "unmount"):  # the store image's loop device and mount go too
        backend.store.unmount()
"""


class Worker:
    def __init__(self, tree: Path, home: Path, size: int) -> None:
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
        home.parent.mkdir(parents=True, exist_ok=True)
        cli = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "hermes_sandboxes.cli"]
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, str(home), str(size), json.dumps(cli)],
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     cwd=home.parent)
        package = Path(str(self.read()["package"]))
        if not package.is_relative_to(tree):  # PYTHONPATH lost to another copy: the A/B would compare nothing
            raise RuntimeError(f"the worker for {tree} imported {package}")

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker exited: {self.proc.wait()}")
        result: dict[str, Any] = json.loads(line)
        return result

    def ask(self, op: str) -> dict[str, float]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(op + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        self.proc.wait(timeout=120)


def run(a: Path, b: Path, samples: int, size: int, creates: int,
        ops: tuple[str, ...] = ASKABLE) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="hs-bench-ab-"))
    for tree in (a, b):  # each tree's bytecode, as an installed package has it (the CLI runs write none)
        compileall.compile_dir(tree, quiet=1)
    workers: dict[str, Worker] = {}
    try:
        workers["a"] = Worker(a, root / "a" / "home", size)
        workers["b"] = Worker(b, root / "b" / "home", size)
        times: dict[str, dict[str, list[float]]] = {k: {m: [] for m in MEASURES} for k in workers}
        load = [os.getloadavg()[0]]
        for i in range(samples):
            order = ("a", "b") if i % 2 == 0 else ("b", "a")
            for op in [*ops, *(["create_exec_destroy"] if i < creates else [])]:
                for kind in order:
                    for name, took in workers[kind].ask(op).items():
                        times[kind][name].append(took)
            if i % 10 == 0:
                load.append(os.getloadavg()[0])
        load.append(os.getloadavg()[0])
        row: dict[str, Any] = {"a": str(a), "b": str(b), "samples": samples, "layer_bytes": size,
                               "load_average_min_median_max": [round(min(load), 2),
                                                               round(statistics.median(load), 2),
                                                               round(max(load), 2)],
                               "cpus": os.cpu_count(), "kernel": platform.release()}
        for op in MEASURES:
            if not times["a"][op]:
                continue  # not asked for (--ops)
            ma = statistics.median(times["a"][op]) * 1000
            mb = statistics.median(times["b"][op]) * 1000
            row[op] = {"a_p50_ms": round(ma, 2), "b_p50_ms": round(mb, 2), "ratio_b_to_a": round(mb / ma, 3),
                       "n": len(times["a"][op])}
        return row
    finally:
        for worker in workers.values():
            worker.close()
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", type=Path, required=True, help="the before tree's src directory")
    parser.add_argument("--b", type=Path, default=HERE.parent / "src", help="the after tree (default: this one)")
    parser.add_argument("--samples", type=int, default=60)
    parser.add_argument("--creates", type=int, default=20, help="samples that also create a sandbox")
    parser.add_argument("--size", type=int, default=1 << 20, help="the layer's bytes")
    parser.add_argument("--ops", default=",".join(ASKABLE),
                        help=f"which of {', '.join(ASKABLE)} to sample (restore brings the first exec after it)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    ops = tuple(op for op in args.ops.split(",") if op)
    if not set(ops) <= set(ASKABLE):
        parser.error(f"--ops: unknown operations in {args.ops!r}")
    row = run(args.a.resolve(), args.b.resolve(), args.samples, args.size, min(args.creates, args.samples), ops)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(row, indent=2) + "\n")
    print(f"A={row['a']} B={row['b']} samples={row['samples']} load={row['load_average_min_median_max']}")
    print("| operation | A p50 ms | B p50 ms | B/A |")
    print("|---|---|---|---|")
    for op in (m for m in MEASURES if m in row):
        r = row[op]
        print(f"| {op} | {r['a_p50_ms']} | {r['b_p50_ms']} | {r['ratio_b_to_a']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
