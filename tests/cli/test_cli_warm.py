"""The warm exec path (cli/fastpath/: warm.py, server.py, worker.py), in real processes: a per-user
server forks a worker per ``exec``, which must be indistinguishable from the CLI in-process (bytes,
exit codes, records, signals), must stop its command when its client dies, and must never leave a
client hanging or serve someone else.

Each test that controls the server's life gets its own runtime directory (``rt``), so it starts,
kills and counts only its own servers; the rest use the session's (conftest.py).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from click.testing import CliRunner

from hermes_sandboxes.backends.local import LocalSandbox
from hermes_sandboxes.cli import cli as main_cli
from hermes_sandboxes.cli.fastpath.server import IDLE_VAR
from hermes_sandboxes.recorder.state import HostState
from tests.cli import cli_kit, warm_kit
from tests.cli.cli_kit import CLI, as_json, ok
from tests.interrupts import interruptible

home, box = cli_kit.home, cli_kit.box
T = TypeVar("T")


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[dict[str, str]]:
    """An environment with a runtime directory of this test's own; its servers stop at the end."""
    where = tmp_path / "run"
    where.mkdir(mode=0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(where), "HERMES_SANDBOXES_WARM_IDLE_S": "60"}
    try:
        yield env
    finally:
        warm_kit.stop_all(where / "hermes-sandboxes")


def cli(home: Path, *args: str | bytes) -> list[str | bytes]:
    return [*CLI, "--home", str(home), *args]


def journal(box: LocalSandbox) -> Path:
    return HostState().journal_path(box.backend.key, box.name)


def execs(home: Path, name: str) -> list[dict[str, Any]]:
    return [r for r in as_json(home, "log", name) if r["type"] == "exec"]


def comparable(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in ("ts", "id", "duration_s")}


def poll(predicate: Callable[[], T], what: str, timeout: float = 60) -> T:
    """Wait until ``predicate`` returns something true, and return what it returned: the state the
    poll saw, which a second read could find gone (a spare worker leaves with an idle server)."""
    deadline = time.monotonic() + timeout
    while not (seen := predicate()):
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.02)
    return seen


def exactly_one(pids: list[int]) -> list[int]:
    """``pids`` if it holds one pid, else nothing (to poll for one and keep it)."""
    return pids if len(pids) == 1 else []


# -- the same as in-process ------------------------------------------------------------------------

CORPUS: list[tuple[str, list[str | bytes], bytes | None]] = [
    ("bytes and codes", ["--", "printf 'caf\\xe9\\n'; printf 'e\\xff\\n' >&2; exit 3"], None),
    ("bytes in the command line", ["--", b"echo caf\xe9 \xff"], None),
    ("stdin with its end", ["--", "cat; echo end"], b"one\n\xfe\xff two\n"),
    ("env and cwd options", ["-e", "A=1", "-w", "/tmp", "--", "echo $A; pwd"], None),
    ("a bad option", ["--timeout", "0", "--", "true"], None),
    ("a timeout", ["--timeout", "0.5", "--", "sleep 30"], None),
    ("no such sandbox", ["@missing", "--", "true"], None),
]


@pytest.mark.parametrize(("case", "args", "stdin"), CORPUS, ids=[c[0] for c in CORPUS])
def test_warm_and_in_process_give_the_same_bytes_codes_and_records(
        home: Path, box: LocalSandbox, rt: dict[str, str], case: str, args: list[str | bytes],
        stdin: bytes | None) -> None:
    warm_kit.start(rt)
    name = "no-such-box" if args[0] == "@missing" else box.name
    argv = cli(home, "exec", name, *(args[1:] if args[0] == "@missing" else args))
    seen = []
    for env in ({**rt, **warm_kit.WARM_OFF}, rt):
        done = subprocess.run(argv, input=stdin or b"", env=env, capture_output=True, timeout=120, check=False)
        seen.append((done.returncode, done.stdout, done.stderr))
    assert seen[0] == seen[1], seen
    if name == box.name and seen[0][0] != 2:
        records = execs(home, box.name)
        assert len(records) == 2 and comparable(records[0]) == comparable(records[1]), records
        cold_owner, warm_owner = warm_kit.owners(journal(box))
        assert warm_owner != cold_owner and warm_kit.server_pid(rt) is not None  # the second one ran warm


# every command but `shell` is served warm: output, codes and prompts as in-process
COMMANDS: list[tuple[str, list[str]]] = [
    ("ls", ["ls", "--json"]),
    ("checkpoint list", ["checkpoint", "list", "@box", "--json"]),
    ("log", ["log", "@box"]),
    ("config", ["config", "--json"]),
    ("help", ["--help"]),
    ("a command's help", ["checkpoint", "restore", "--help"]),
    ("an unknown checkpoint", ["checkpoint", "show", "@box", "ck-nope"]),
    ("bad usage", ["create", "--bogus"]),
    ("a question nobody can answer", ["rm", "@box"]),
]


@pytest.mark.parametrize(("case", "args"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_other_commands_give_the_same_bytes_and_codes_warm_as_in_process(
        home: Path, box: LocalSandbox, rt: dict[str, str], case: str, args: list[str]) -> None:
    warm_kit.start(rt)
    ok(home, "checkpoint", "create", box.name, "-m", "one")
    argv = cli(home, *(box.name if arg == "@box" else arg for arg in args))
    seen = [call(argv, env)[:3] for env in ({**rt, **warm_kit.WARM_OFF}, rt)]
    assert seen[0] == seen[1], seen
    assert warm_kit.server_pid(rt) is not None


def test_a_checkpoint_taken_warm_is_recorded_by_the_worker(home: Path, box: LocalSandbox, rt: dict[str, str]) -> None:
    server = warm_kit.start(rt)
    code, out, err, pid = call(cli(home, "checkpoint", "create", box.name, "-m", "warm"), rt)
    assert code == 0 and out.startswith(b"ck-"), (code, out, err)
    records = [json.loads(line) for line in journal(box).read_text().splitlines() if line.strip()]
    [ahead] = [r for r in records if r["type"] == "checkpoint_start"]
    assert ahead["owner"]["pid"] not in (pid, server), ahead  # the worker took it
    assert [c["comment"] for c in as_json(home, "checkpoint", "list", box.name)] == ["warm"]


def test_a_warm_prompt_reads_the_terminal_and_ctrl_c_reaches_it(
        home: Path, box: LocalSandbox, rt: dict[str, str]) -> None:
    server = warm_kit.start(rt)
    env = {"XDG_RUNTIME_DIR": rt["XDG_RUNTIME_DIR"], "HERMES_SANDBOXES_WARM_IDLE_S": "60"}
    for answer, code, says in ((b"n\r", 1, b"cancelled; nothing was changed"), (b"\x03", 130, b"interrupted")):
        pty = cli_kit.Pty([str(a) for a in cli(home, "rm", box.name)], rows_cols=(24, 80), env=env)
        try:
            pty.expect(b"[y/N]")
            # the client imported none of the CLI (no pydantic): the worker asks the question
            maps = Path(f"/proc/{pty.proc.pid}/maps").read_text()
            assert "pydantic_core" not in maps and len(warm_kit.children_of(server)) >= 1
            pty.send(answer)
            assert pty.finish() == code, pty.seen
        finally:
            if pty.proc.poll() is None:
                pty.proc.kill()
        assert says in pty.seen, pty.seen
    assert box.name in ok(home, "ls").stdout


def test_a_run_whose_client_is_killed_is_destroyed_by_its_worker(home: Path, rt: dict[str, str]) -> None:
    warm_kit.start(rt)
    proc = subprocess.Popen(cli(home, "run", "--", "hostname; exec sleep 600"), env=rt, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None
    name = proc.stdout.readline().decode().strip()
    assert name.startswith("run-") and name in {s["name"] for s in as_json(home, "ls")}, name
    proc.kill()
    proc.wait(timeout=60)
    poll(lambda: name not in {s["name"] for s in as_json(home, "ls")}, f"{name} destroyed by the worker")
    [end] = [r for r in as_json(home, "log", name) if r["type"] == "exec"]
    assert end["killed"] and "SIGHUP" in end["error"], end  # its client went away: as a closed terminal


def test_version_is_answered_without_a_server(rt: dict[str, str]) -> None:
    from importlib.metadata import version

    done = subprocess.run([*CLI, "--version"], env=rt, capture_output=True, timeout=60, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (
        0, f"hermes-sandboxes, version {version('hermes-sandboxes')}\n".encode(), b"")
    assert CliRunner().invoke(main_cli, ["--version"]).output == done.stdout.decode()  # as click says it
    assert not warm_kit.runtime_dir(rt).exists()  # no server was started for it


def test_shell_runs_in_process(home: Path, box: LocalSandbox, rt: dict[str, str]) -> None:
    """It owns the terminal (raw mode, window size): never served by a worker."""
    warm_kit.start(rt)
    code, out, err, pid = call(cli(home, "shell", box.name), rt, b"echo from shell\n")
    assert (code, out) == (0, b"from shell\n"), (code, out, err)
    assert warm_kit.owners(journal(box)) == [pid]  # recorded by the CLI's own process


def test_the_exec_of_a_running_command_is_recorded_by_the_worker_as_running(
        home: Path, box: LocalSandbox, rt: dict[str, str]) -> None:
    server = warm_kit.start(rt)
    proc = subprocess.Popen(cli(home, "exec", box.name, "--", "echo started; read line"), env=rt,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert proc.stdout.readline() == b"started\n"
        [running] = execs(home, box.name)
        assert running["unfinished"] and not running.get("lost"), running
        [worker] = warm_kit.owners(journal(box))
        assert worker not in (proc.pid, server) and Path(f"/proc/{worker}").exists()
    finally:
        proc.communicate(b"go\n", timeout=60)
    assert proc.returncode == 0
    [ended] = execs(home, box.name)
    assert ended["exit_code"] == 0 and not ended.get("unfinished"), ended


@pytest.mark.parametrize("warm", [False, True], ids=["in-process", "warm"])
def test_a_reader_that_goes_away_ends_the_call_with_141_either_way(
        home: Path, box: LocalSandbox, rt: dict[str, str], warm: bool) -> None:
    env = rt if warm else {**rt, **warm_kit.WARM_OFF}
    if warm:
        warm_kit.start(rt)
    proc = subprocess.Popen(cli(home, "exec", box.name, "--", "yes"), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"y\n"
    proc.stdout.close()
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (141, b"")
    [record] = execs(home, box.name)
    assert record["killed"] is True and "broken pipe" in record["error"], record
    assert (warm_kit.owners(journal(box)) == [proc.pid]) is not warm


# -- signals and deaths ----------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_signals_reach_the_worker_which_stops_and_records_the_command(
        home: Path, box: LocalSandbox, rt: dict[str, str], sig: signal.Signals) -> None:
    warm_kit.start(rt)
    proc = subprocess.Popen(interruptible(cli(home, "exec", box.name, "--", "echo started; exec sleep 600")), env=rt,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"started\n"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert err.decode().strip().startswith("error: interrupted"), err
    [record] = execs(home, box.name)
    assert record["killed"] is True and record["error"] == f"interrupted by {sig.name}", record
    assert warm_kit.owners(journal(box)) != [proc.pid]  # it ran warm


def _caught_and_ignored(pid: int) -> tuple[int, int]:
    """The signal masks the kernel keeps for ``pid``: those it catches, those it ignores."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
    return int(fields["SigCgt"], 16), int(fields["SigIgn"], 16)


@pytest.mark.parametrize("warm", [False, True], ids=["in-process", "warm"])
def test_under_nohup_a_hang_up_leaves_the_call_and_its_command_running(
        home: Path, box: LocalSandbox, rt: dict[str, str], warm: bool) -> None:
    """nohup starts the CLI with SIGHUP ignored so that the command outlives the terminal: the CLI
    keeps it ignored (in-process, and the warm path's client, which passes on only what it catches),
    so the kernel discards a SIGHUP and the command runs to its end, recorded as any other."""
    env = rt if warm else {**rt, **warm_kit.WARM_OFF}
    if warm:
        warm_kit.start(env)
    proc = subprocess.Popen(["nohup", *cli(home, "exec", box.name, "--", "echo started; read line; echo done-$line")],
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"started\n"
        # the command runs: the CLI has set its handlers by now, and left SIGHUP as nohup set it
        caught, ignored = _caught_and_ignored(proc.pid)
        hup = 1 << (signal.SIGHUP - 1)
        assert (caught & hup, ignored & hup) == (0, hup), (hex(caught), hex(ignored))
        assert caught & (1 << (signal.SIGTERM - 1))  # (the others are still the CLI's)
        proc.send_signal(signal.SIGHUP)  # an ignored signal is discarded as it is sent
        out, err = proc.communicate(b"go\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert (proc.returncode, out) == (0, b"done-go\n"), err
    [record] = execs(home, box.name)
    assert record["exit_code"] == 0 and not record.get("killed") and not record.get("error"), record
    owners = warm_kit.owners(journal(box))
    assert (owners != [proc.pid]) if warm else (owners == [proc.pid]), owners  # it ran where it says


def _sleepers(box: LocalSandbox, marker: str) -> int:
    text = box.exec("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done 2>/dev/null").stdout
    return sum(1 for line in text.splitlines() if line.strip() == f"sleep {marker}")


@pytest.mark.parametrize("nohup", [False, True], ids=["", "under nohup"])
def test_a_client_killed_with_sigkill_has_its_command_stopped_inside_and_recorded(
        home: Path, box: LocalSandbox, rt: dict[str, str], nohup: bool) -> None:
    """(Under nohup too: an ignored SIGHUP is the client's; the worker still stops what nobody waits for.)"""
    warm_kit.start(rt)
    argv = cli(home, "exec", box.name, "--", "echo started; exec sleep 6001")
    proc = subprocess.Popen(["nohup", *argv] if nohup else argv, env=rt, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    assert proc.stdout is not None and proc.stdout.readline() == b"started\n"
    assert _sleepers(box, "6001") == 1
    proc.kill()
    proc.wait(timeout=60)
    proc.stdout.close()
    poll(lambda: [r.get("error") for r in execs(home, box.name)] == ["interrupted by SIGHUP"],
         "the command recorded as interrupted")
    [record] = execs(home, box.name)
    assert record["killed"] is True and not record.get("unfinished"), record
    assert _sleepers(box, "6001") == 0


def test_a_killed_worker_is_reported_in_one_line_and_the_next_calls_work(
        home: Path, box: LocalSandbox, rt: dict[str, str]) -> None:
    server = warm_kit.start(rt)
    proc = subprocess.Popen(cli(home, "exec", box.name, "--", "echo started; exec sleep 600"), env=rt,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"started\n"
    [worker] = warm_kit.owners(journal(box))
    assert worker != proc.pid
    os.kill(worker, signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 125 and err.count(b"\n") == 1 and b"worker" in err, err
    assert ok(home, "exec", box.name, "--", "echo next").stdout == "next\n"  # (in-process)
    # as when an in-process CLI is killed: its command was lost with it (the next call settles it)
    [lost] = [r for r in execs(home, box.name) if r["command"].startswith("echo started")]
    assert lost.get("lost") and lost["exit_code"] is None, lost
    again = subprocess.run(cli(home, "exec", box.name, "--", "echo warm"), env=rt, capture_output=True,
                           timeout=60, check=False)
    assert (again.returncode, again.stdout) == (0, b"warm\n"), again
    assert warm_kit.server_pid(rt) == server  # the server lived on


def test_the_clients_output_ends_with_the_client_not_with_its_worker(
        home: Path, box: LocalSandbox, rt: dict[str, str], tmp_path: Path) -> None:
    """A reader of the call's output (a pipe, `$(...)`) is done once the client exits: the worker,
    held here after it answered, no longer keeps the client's stdout and stderr open."""
    warm_kit.start(rt)
    answered = tmp_path / "answered"
    env = {**rt, "HERMES_SANDBOXES_TEST_PAUSE": "warm-answered", "HERMES_SANDBOXES_TEST_PAUSE_MARKER": str(answered)}
    proc = subprocess.Popen(cli(home, "exec", box.name, "--", "echo hi"), env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=60)  # (end of file on both pipes, and the exit)
    finally:
        worker = int(poll(lambda: answered.exists() and answered.read_text(), "the worker answer"))
    try:
        assert (proc.returncode, out, err) == (0, b"hi\n", b"")
        assert warm_kit.alive(worker) and worker != proc.pid, "not a warm call held after its answer"
    finally:
        os.kill(worker, signal.SIGKILL)


def call(argv: list[str | bytes], env: dict[str, str], stdin: bytes = b"") -> tuple[int, bytes, bytes, int]:
    """Run a CLI to its end: exit code, stdout, stderr and its pid."""
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(stdin, timeout=120)
    return proc.returncode, out, err, proc.pid


def test_a_killed_server_costs_one_in_process_call_then_a_new_server_serves(
        home: Path, box: LocalSandbox, rt: dict[str, str]) -> None:
    server = warm_kit.start(rt)
    # (the kit knows a server by its start time too: whoever gets its pid next is not it)
    assert warm_kit.is_server(server) and not warm_kit.is_server(warm_kit.ServerPid(server, server.started + 1))
    os.kill(server, signal.SIGKILL)
    warm_kit.wait_gone(server)
    argv = cli(home, "exec", box.name, "--", "echo hi")
    code, out, err, pid = call(argv, rt)
    assert (code, out, err) == (0, b"hi\n", b"")
    assert warm_kit.owners(journal(box)) == [pid]  # in-process, and it started a new server
    successor = warm_kit.wait_for_server(rt)
    assert successor != server
    code, out, err, pid = call(argv, rt)
    assert (code, out, err) == (0, b"hi\n", b"")
    assert warm_kit.owners(journal(box))[-1] != pid


def test_a_server_that_never_answers_costs_a_bounded_wait_then_runs_in_process(
        home: Path, box: LocalSandbox, rt: dict[str, str]) -> None:
    server = warm_kit.start(rt)
    os.kill(server, signal.SIGSTOP)  # it accepts (the kernel queues the connection) and never answers
    try:
        code, out, _, pid = call(cli(home, "exec", box.name, "--", "echo hi"), rt)
        assert (code, out) == (0, b"hi\n")
        assert warm_kit.owners(journal(box)) == [pid]
        assert not (warm_kit.runtime_dir(rt) / f"{warm_kit.key(rt)}.sock").exists()  # taken away
    finally:
        os.kill(server, signal.SIGCONT)
    warm_kit.wait_gone(server)  # it finds its socket gone and leaves
    code, out, _, pid = call(cli(home, "exec", box.name, "--", "echo hi"), rt)  # no server: starts one
    assert (code, out) == (0, b"hi\n") and warm_kit.owners(journal(box))[-1] == pid
    assert warm_kit.wait_for_server(rt) != server


def test_a_signal_before_the_worker_is_known_acts_on_the_cli_as_it_would_in_process(
        home: Path, box: LocalSandbox, rt: dict[str, str]) -> None:
    server = warm_kit.start(rt)
    os.kill(server, signal.SIGSTOP)  # the client waits for a pid that does not come...
    try:
        proc = subprocess.Popen(cli(home, "exec", box.name, "--", "touch /root/ran"), env=rt,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        poll(lambda: _catches(proc.pid, signal.SIGTERM), "the client waiting for its worker's pid")
        proc.send_signal(signal.SIGTERM)  # ...and is told to stop meanwhile: kept, then acted on
        proc.communicate(timeout=60)
    finally:
        os.kill(server, signal.SIGCONT)
    assert proc.returncode == -signal.SIGTERM  # as an in-process CLI stopped while starting up
    assert box.exec("test -e /root/ran").exit_code == 1 and execs(home, box.name) == []


def _catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (the client installs its own once it asked)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught & (1 << (sig - 1)))


# ui/text.py: imported by the server, outside cli/ (the check once watched cli/ only, where this
# module had been); cli/commands/demo.py: imported by no server, only by a worker that runs `demo`.
# The server runs a copy of the package, whose file the test changes: a change to the checkout's
# would make every server of a copy of the suite running alongside stale, and its warm tests fail.
@pytest.mark.parametrize("module", ["ui/text.py", "cli/commands/demo.py"])
def test_a_changed_package_file_makes_the_server_step_aside_for_a_new_one(
        home: Path, box: LocalSandbox, rt: dict[str, str], module: str, tmp_path: Path) -> None:
    import hermes_sandboxes

    copy = tmp_path / "src"
    shutil.copytree(Path(hermes_sandboxes.__file__).parent, copy / "hermes_sandboxes")  # (mtimes kept)
    rt = {**rt, "PYTHONPATH": os.pathsep.join([str(copy), *filter(None, [rt.get("PYTHONPATH")])])}
    server = warm_kit.start(rt)
    source = copy / "hermes_sandboxes" / module
    before = source.stat()
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    code, out, _, pid = call(cli(home, "exec", box.name, "--", "echo hi"), rt)
    assert (code, out) == (0, b"hi\n")
    assert warm_kit.owners(journal(box)) == [pid]  # it ran in-process
    warm_kit.wait_gone(server)
    successor = warm_kit.wait_for_server(rt)
    code, out, _, pid = call(cli(home, "exec", box.name, "--", "echo hi"), rt)
    assert (code, out) == (0, b"hi\n") and warm_kit.owners(journal(box))[-1] != pid
    assert warm_kit.server_pid(rt) == successor


# -- who it serves, how many there are ---------------------------------------------------------------


REQUEST_AS_ANOTHER_USER = """
import socket, sys
sock = socket.socket(socket.AF_UNIX)
try:
    sock.connect(sys.argv[1])
except OSError as exc:
    print("refused", type(exc).__name__)
    sys.exit()
try:
    sock.sendall(b"\\0\\0\\0\\1N")  # a request (of nothing): the worker would answer "fallback"
    print("answer", sock.recv(64) or "none")
except (ConnectionResetError, BrokenPipeError):  # closed on us, our request unread
    print("answer none")
"""


@pytest.fixture
def rt_in_tmp() -> Iterator[dict[str, str]]:
    """A runtime directory right under /tmp (whose path another user can walk to)."""
    base = Path(tempfile.mkdtemp(prefix="hwarm-", dir="/tmp"))
    try:
        yield {**os.environ, "XDG_RUNTIME_DIR": str(base), "HERMES_SANDBOXES_WARM_IDLE_S": "60"}
    finally:
        warm_kit.stop_all(base / "hermes-sandboxes")
        shutil.rmtree(base, ignore_errors=True)


def test_another_user_is_not_served(home: Path, box: LocalSandbox, rt_in_tmp: dict[str, str]) -> None:
    rt = rt_in_tmp
    warm_kit.start(rt)
    where = warm_kit.runtime_dir(rt)
    path = where / f"{warm_kit.key(rt)}.sock"
    assert where.stat().st_mode & 0o777 == 0o700 and where.parent.stat().st_mode & 0o077 == 0
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c",
              REQUEST_AS_ANOTHER_USER, str(path)]
    done = subprocess.run(nobody, env=rt, capture_output=True, text=True, timeout=60, check=False)
    assert done.stdout.startswith("refused PermissionError"), done  # the directory is ours alone
    # with the doors opened, the server itself checks who calls (SO_PEERCRED) and says nothing
    where.parent.chmod(0o711)
    where.chmod(0o711)
    path.chmod(0o777)
    try:
        done = subprocess.run(nobody, env=rt, capture_output=True, text=True, timeout=60, check=False)
        assert done.stdout.strip() == "answer none", done
        # and our own client no longer trusts the directory: in-process, no request
        code, out, _, pid = call(cli(home, "exec", box.name, "--", "echo hi"), rt)
        assert (code, out) == (0, b"hi\n") and warm_kit.owners(journal(box)) == [pid]
    finally:
        where.chmod(0o700)
        where.parent.chmod(0o700)


def test_clients_racing_to_start_a_server_leave_one(rt: dict[str, str]) -> None:
    starter = [sys.executable, "-c",
               "from hermes_sandboxes.cli.fastpath import warm; warm.start_server(warm.key_of(warm.stamp()))"]
    procs = [subprocess.Popen(starter, env=rt) for _ in range(4)]
    for proc in procs:
        assert proc.wait(timeout=60) == 0
    server = warm_kit.wait_for_server(rt)
    deadline = time.monotonic() + 30
    while True:  # the losers wait for the lock a little, then leave
        servers = warm_kit.servers_started_with(rt)
        if servers == [server] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert servers == [server]


def test_concurrent_calls_are_served_by_their_own_workers(home: Path, box: LocalSandbox, rt: dict[str, str]) -> None:
    warm_kit.start(rt)
    procs = [subprocess.Popen(cli(home, "exec", box.name, "--", f"sleep 0.3; echo {i}"), env=rt,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    expected = [(0, f"{i}\n".encode()) for i in range(4)]
    assert [(p.returncode, o) for p, (o, _) in zip(procs, outs, strict=True)] == expected
    owners = warm_kit.owners(journal(box))
    assert len(set(owners)) == 4 and not set(owners) & {p.pid for p in procs}, owners


def test_a_spare_worker_waits_ahead_and_a_killed_one_is_replaced(
        home: Path, box: LocalSandbox, rt: dict[str, str]) -> None:
    ok(home, "config")  # the full CLI validates the settings and caches them for the fast path
    server = warm_kit.start(rt)
    [spare] = poll(lambda: exactly_one(warm_kit.children_of(server)), "a spare worker")
    code, out, _, _ = call(cli(home, "exec", box.name, "--", "echo hi"), rt)
    assert (code, out) == (0, b"hi\n") and warm_kit.owners(journal(box)) == [spare]  # it served the call
    [spare] = poll(lambda: [pid for pid in exactly_one(warm_kit.children_of(server)) if pid != spare],
                   "the next spare")
    os.kill(spare, signal.SIGKILL)
    code, out, _, pid = call(cli(home, "exec", box.name, "--", "echo hi"), rt)
    assert (code, out) == (0, b"hi\n") and warm_kit.owners(journal(box))[-1] not in (pid, spare)
    poll(lambda: not warm_kit.zombies_of(server) and len(warm_kit.children_of(server)) == 1, "a new spare")


def test_an_idle_server_exits_and_removes_its_socket(home: Path, box: LocalSandbox, rt: dict[str, str]) -> None:
    """Half a second after its last worker ended, the server exits, its spare worker with it. A call
    in progress holds it meanwhile (it never idles out with a worker), so the spare it forks ahead is
    found at leisure, whatever the load: no race against the idle timer."""
    env = {**rt, IDLE_VAR: "0.5"}
    ok(home, "config")  # the full CLI validates the settings and caches them for the fast path
    server = warm_kit.start(env)
    proc = subprocess.Popen(cli(home, "exec", box.name, "--", "echo started; read line; echo done-$line"), env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"started\n"
        [worker] = warm_kit.owners(journal(box))
        assert worker in warm_kit.children_of(server)  # served warm: the server cannot idle out now
        [spare] = poll(lambda: exactly_one([pid for pid in warm_kit.children_of(server) if pid != worker]),
                       "a spare worker")
        assert warm_kit.is_server(server)
        out, err = proc.communicate(b"go\n", timeout=60)
        assert (proc.returncode, out) == (0, b"done-go\n"), err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    warm_kit.wait_gone(server)
    poll(lambda: not warm_kit.alive(spare), "the spare leaving with its server")
    assert not list(warm_kit.runtime_dir(env).glob("*.sock")) and not list(warm_kit.runtime_dir(env).glob("*.pid"))


def test_warm_off_runs_in_process_and_starts_no_server(home: Path, box: LocalSandbox, rt: dict[str, str]) -> None:
    off = {**rt, **warm_kit.WARM_OFF}
    code, out, _, pid = call(cli(home, "exec", box.name, "--", "echo hi"), off)
    assert (code, out) == (0, b"hi\n") and warm_kit.owners(journal(box)) == [pid]
    assert not warm_kit.runtime_dir(rt).exists()
    warm_kit.start(rt)
    code, out, _, pid = call(cli(home, "exec", box.name, "--", "echo hi"), off)
    assert (code, out) == (0, b"hi\n") and warm_kit.owners(journal(box))[-1] == pid


def test_the_worker_takes_on_the_clients_environment_directory_umask_and_ignored_signals(
        home: Path, box: LocalSandbox, rt: dict[str, str], tmp_path: Path) -> None:
    warm_kit.start(rt)
    state = tmp_path / "other-state"
    env = {**rt, "HERMES_SANDBOXES_STATE": str(state)}  # where this call's records go
    # (the first call in a new state validates the settings in-process and caches them)
    assert call(cli(home, "exec", box.name, "--", "true"), env)[0] == 0
    argv = [str(arg) for arg in cli(home, 'exec', box.name, '--', 'echo started; read x')]
    shell = f"umask 027; trap '' USR1; exec {shlex.join(argv)}"
    proc = subprocess.Popen(["sh", "-c", shell], env=env, cwd=tmp_path, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline() == b"started\n"
        [_, worker] = warm_kit.owners(HostState(state).journal_path(box.backend.key, box.name))
        assert worker != proc.pid
        status = dict(line.split(":\t", 1) for line in Path(f"/proc/{worker}/status").read_text().splitlines())
        assert status["Umask"] == "0027", status
        assert int(status["SigIgn"], 16) & (1 << (signal.SIGUSR1 - 1))
        assert os.readlink(f"/proc/{worker}/cwd") == str(tmp_path)
    finally:
        proc.communicate(b"x\n", timeout=60)
    assert proc.returncode == 0
    assert not journal(box).exists() or warm_kit.owners(journal(box)) == []  # not in the session's state


# -- what the client costs ------------------------------------------------------------------------------

# What the warm client must never import: each would cost a warm call start-up for nothing
_NOT_IN_THE_CLIENT = {"json", "pathlib", "threading", "signal", "enum", "re", "collections", "typing",
                      "hermes_sandboxes.cli.fastpath.inprocess", "hermes_sandboxes.recorder.sandbox", "click"}


def test_a_warm_call_imports_only_the_client(home: Path, box: LocalSandbox, rt: dict[str, str]) -> None:
    script = "import sys; from hermes_sandboxes.cli import main; main()"
    argv = [sys.executable, "-X", "importtime", "-c", script, "--home", str(home), "exec", box.name, "--", "true"]
    first = subprocess.run(argv, env=rt, capture_output=True, timeout=60, check=False)  # starts its server
    assert first.returncode == 0, first
    poll(lambda: warm_kit.answers({**rt}) or _any_socket(rt), "a server for -X importtime")
    deadline = time.monotonic() + 60
    while True:
        done = subprocess.run(argv, env=rt, stdin=subprocess.DEVNULL, capture_output=True, timeout=60, check=False)
        modules = {line.split("|")[-1].strip() for line in done.stderr.decode().splitlines()
                   if line.startswith("import time:")}
        if "hermes_sandboxes.cli.fastpath.inprocess" not in modules or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert done.returncode == 0, done
    assert "hermes_sandboxes.cli.fastpath.warm" in modules and not _NOT_IN_THE_CLIENT & modules, sorted(modules)


def _any_socket(env: dict[str, str]) -> bool:
    return len(list(warm_kit.runtime_dir(env).glob("*.sock"))) >= 1


@pytest.mark.parametrize("warm", [False, True], ids=["in-process", "warm"])
def test_a_command_that_leaves_an_open_stdin_unread_exits_cleanly(
        home: Path, box: LocalSandbox, rt: dict[str, str], warm: bool) -> None:
    # (in-process, the interpreter used to abort at exit, 134, over the stdin reader's lock)
    env = rt if warm else {**rt, **warm_kit.WARM_OFF}
    if warm:
        warm_kit.start(rt)
    proc = subprocess.Popen(cli(home, "exec", box.name, "--", "true"), env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        assert proc.wait(timeout=60) == 0, proc.stderr.read()  # while our end of its stdin stays open
    finally:
        proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()
    assert (warm_kit.owners(journal(box)) == [proc.pid]) is not warm


def test_a_worker_starts_a_stopped_sandbox_whose_init_outlives_it_as_it_outlives_the_cli(
        home: Path, box: LocalSandbox, rt: dict[str, str]) -> None:
    server = warm_kit.start(rt)
    ok(home, "config")  # the full CLI validates the settings and caches them for the fast path
    box.stop()
    init_state = box.backend.layout.run_dir(box.name) / "init.json"
    assert not init_state.exists()
    code, _, _, pid = call(cli(home, "exec", box.name, "--", "echo $$"), rt)
    assert code == 0 and warm_kit.owners(journal(box))[-1] != pid  # the worker started the init
    init = json.loads(init_state.read_text())["pid"]
    # the worker is gone, its init lives on, neither a child nor a zombie of the server (which reaps
    # its worker once that has exited: after the client had its code, so not at once)
    assert Path(f"/proc/{init}").exists()
    deadline = time.monotonic() + 30
    while warm_kit.zombies_of(server):
        assert time.monotonic() < deadline, f"the server never reaped {warm_kit.zombies_of(server)}"
        time.sleep(0.01)
    assert Path(f"/proc/{init}").exists()
    ppid = int(Path(f"/proc/{init}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
    assert ppid != server
    code, out2, _, _ = call(cli(home, "exec", box.name, "--", "echo again"), rt)
    assert (code, out2) == (0, b"again\n")
    assert json.loads(init_state.read_text())["pid"] == init  # the same init served the next call


@pytest.mark.parametrize(
    "module", ["hermes_sandboxes.cli.fastpath.warm", "_socket", "hermes_sandboxes.cli.fastpath.inprocess"]
)
def test_ctrl_c_while_the_exec_path_starts_up_prints_no_traceback(home: Path, rt: dict[str, str], module: str) -> None:
    from tests.cli.test_cli_robust import INTERRUPTED_WHILE_IMPORTING

    warm_kit.start(rt)
    env = {**rt, **warm_kit.WARM_OFF} if module.endswith("inprocess") else rt
    done = subprocess.run(interruptible([sys.executable, "-c", INTERRUPTED_WHILE_IMPORTING, module, "--home",
                                         str(home), "exec", "no-such-box", "--", "true"]),
                          env=env, capture_output=True, timeout=60, check=False)
    assert (done.returncode, done.stderr) == (130, b"error: interrupted\n"), done


def test_a_client_with_fewer_capabilities_is_not_served_by_a_server_with_more(rt: dict[str, str]) -> None:
    """Every command is served warm: a create from a client without CAP_SYS_ADMIN must not be made
    by a worker that has it (the stamp holds the capability sets, no_new_privs and seccomp)."""
    code = "from hermes_sandboxes.cli.fastpath import warm; print(warm.key_of(warm.stamp()))"
    full = subprocess.run([sys.executable, "-c", code], env=rt, capture_output=True, text=True, check=True)
    dropped = subprocess.run(["setpriv", "--inh-caps=-sys_admin", "--bounding-set=-sys_admin", sys.executable,
                              "-c", code], env=rt, capture_output=True, text=True, check=True)
    no_new_privs = subprocess.run(["setpriv", "--no-new-privs", sys.executable, "-c", code], env=rt,
                                  capture_output=True, text=True, check=True)
    assert len({full.stdout, dropped.stdout, no_new_privs.stdout}) == 3, (full, dropped, no_new_privs)


def test_a_sandbox_started_warm_is_forked_from_the_servers_fork_server_which_leaves_with_it(
        home: Path, rt: dict[str, str]) -> None:
    ok(home, "config")  # the full CLI validates the settings and caches them for the fast path
    server = warm_kit.start(rt)
    [forks] = poll(lambda: exactly_one(warm_kit.fork_servers_of(server)), "the server's fork server, started ahead")
    assert call(cli(home, "create", "hs-finisher-fs"), rt)[0] == 0
    # the caller's umask reaches the init (so its commands) as in-process, not the server's 077
    argv = [str(arg) for arg in cli(home, "exec", "hs-finisher-fs", "--", "umask")]
    done = subprocess.run(["sh", "-c", f"umask 027; exec {shlex.join(argv)}"], env=rt, capture_output=True,
                          timeout=120, check=False)
    assert (done.returncode, done.stdout) == (0, b"0027\n"), done
    # its init is in the fork server's session (launchers fork from it; the init makes none of its own)
    inits = [pid for pid in warm_kit.in_session(forks) if pid != forks]
    assert len(inits) == 1 and warm_kit.is_fork_server(inits[0]), inits
    assert warm_kit.fork_servers_of(server) == [forks]  # the same one: no worker started another
    assert call(cli(home, "rm", "hs-finisher-fs", "--yes"), rt)[0] == 0
    os.kill(server, signal.SIGTERM)
    warm_kit.wait_gone(server)
    poll(lambda: not warm_kit.alive(forks), "the fork server leaving with its server")


@pytest.mark.parametrize("end", ["idle timeout", "SIGTERM", "SIGKILL"])
def test_the_servers_fork_server_ends_with_the_server_however_it_ends(
        home: Path, box: LocalSandbox, rt: dict[str, str], end: str) -> None:
    """Every worker is forked from the server and so holds the fork server's socket too: the end of
    that socket alone would keep the fork server (ppid 1) for as long as any worker, or anything a
    worker forked, lives on. It ends with the server itself, and a call in progress is not harmed."""
    env = {**rt, IDLE_VAR: "1"} if end == "idle timeout" else rt
    server = warm_kit.start(env)
    # a call in progress: the server cannot idle out meanwhile, and we find its fork server at leisure
    proc = subprocess.Popen(cli(home, "exec", box.name, "--", "echo started; read line; echo done-$line"), env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"started\n"
        [forks] = poll(lambda: exactly_one(warm_kit.fork_servers_of(server)),
                       "the server's fork server, started ahead")
        [worker] = warm_kit.owners(journal(box))  # (the server's children include a spare worker, forked ahead)
        if end == "idle timeout":
            out, err = proc.communicate(b"go\n", timeout=60)
            assert (proc.returncode, out) == (0, b"done-go\n"), err
            warm_kit.wait_gone(server)  # by itself, its last worker gone and one idle second passed
        else:
            os.kill(server, getattr(signal, end))
            warm_kit.wait_gone(server)
            assert warm_kit.alive(worker)  # its call runs on, and its worker with it
        poll(lambda: not warm_kit.alive(forks), f"the fork server {forks} ending with its server {server}")
        if end != "idle timeout":
            out, err = proc.communicate(b"go\n", timeout=60)
            assert (proc.returncode, out) == (0, b"done-go\n"), err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
