"""The command line as scripts and supervisors use it: stdin streamed in, every signal stopping and
journaling what it started, runs that a kill -9 orphaned collected, any bytes survived, destructive
commands refusing to guess. Run for real against the local backend, in real processes where a pipe,
a signal or a terminal is the point. (What an interrupted or killed exec, checkpoint or restore
leaves in the record: test_cli_kill9.py.)
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox, cgroups
from hermes_sandboxes.names import unique_name
from tests.cli import cli_kit
from tests.cli.cli_kit import CLI, Pty, as_json, assert_one_line_error, hs, ok, state
from tests.interrupts import interruptible

home, box = cli_kit.home, cli_kit.box


def cli(home: Path, *args: str | bytes) -> list[str | bytes]:
    return [*CLI, "--home", str(home), *args]


def log_of(home: Path, name: str) -> list[dict[str, Any]]:
    return [r for r in as_json(home, "log", name) if r["type"] == "exec"]


# -- stdin ---------------------------------------------------------------------------------------


def test_exec_passes_piped_stdin_on_with_its_end_of_file(home: Path, box: LocalSandbox) -> None:
    done = subprocess.run(cli(home, "exec", box.name, "--", "cat"), input=b"hi\n", capture_output=True,
                          timeout=60, check=False)
    assert (done.returncode, done.stdout) == (0, b"hi\n"), done.stderr


def test_exec_hashes_a_redirected_file_as_the_host_does(home: Path, box: LocalSandbox, tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    (tmp_path / "blob").write_bytes(data)
    with open(tmp_path / "blob", "rb") as f:
        done = subprocess.run(cli(home, "exec", box.name, "--", "sha256sum"), stdin=f, capture_output=True,
                              timeout=60, check=False)
    assert done.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest(), done.stderr


def test_exec_streams_stdin_instead_of_reading_it_whole_first(home: Path, box: LocalSandbox) -> None:
    proc = subprocess.Popen(cli(home, "exec", box.name, "--", "while read line; do echo got-$line; done"),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(b"one\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"got-one\n"  # answered while our stdin is still open
        proc.stdin.write(b"two\n")
        proc.stdin.close()  # end-of-file ends the loop inside
        assert proc.stdout.read() == b"got-two\n"
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
        proc.wait()


def test_a_command_that_ends_before_its_stdin_does_keeps_its_exit_code(home: Path, box: LocalSandbox) -> None:
    # `producer | hermes-sandboxes exec NAME -- cmd`: cmd ends without reading while the producer still
    # writes (here: holds the pipe open); the CLI aborted at exit (134, "Fatal Python error")
    for command in (["exec", box.name, "--", "exit 7"], ["run", "--", "exit 7"]):
        with subprocess.Popen(cli(home, *command), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE) as proc:
            assert proc.stderr is not None
            try:
                assert proc.wait(timeout=60) == 7, proc.stderr.read()  # our end of its stdin still open
                assert proc.stderr.read() == b""
            finally:
                proc.kill()


def test_run_passes_stdin_too(home: Path) -> None:
    done = subprocess.run(cli(home, "run", "--", "tr a-z A-Z"), input=b"shout\n", capture_output=True, timeout=60,
                          check=False)
    assert (done.returncode, done.stdout) == (0, b"SHOUT\n"), done.stderr


def test_on_a_terminal_stdin_is_passed_only_with_interactive(home: Path, box: LocalSandbox) -> None:
    term = Pty(cli(home, "exec", box.name, "--", "cat; echo cat-done-$((1+1))"))  # type: ignore[arg-type]
    term.expect(b"cat-done-2")  # cat read end-of-file at once: the terminal was not passed
    assert term.finish() == 0
    term = Pty(cli(home, "exec", "-i", box.name, "--", "cat"))  # type: ignore[arg-type]
    term.send(b"typed-in\n")
    term.expect(b"typed-in\r\ntyped-in")  # the terminal's echo, then cat's copy
    term.send(b"\x04")  # Ctrl-D: end-of-file
    assert term.finish() == 0


def test_exec_has_docker_style_short_flags(home: Path, box: LocalSandbox) -> None:
    assert ok(home, "exec", box.name, "-w", "/tmp", "-e", "A=1", "--", "echo $A $(pwd)").stdout == "1 /tmp\n"


# -- usage errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("options", "says"), [
    (["--env", "NOEQUALS"], "NAME=VALUE"),
    (["-e", "1BAD=x"], "NAME=VALUE"),
    (["--cwd", "relative"], "absolute path"),
    (["--timeout", "0"], "--timeout"),
    (["--checkpoint", "sometimes"], "--checkpoint"),
])
def test_bad_exec_options_are_usage_errors_that_run_nothing(
        home: Path, box: LocalSandbox, options: list[str], says: str) -> None:
    before = state(home, box.name)
    assert_one_line_error(hs(home, "exec", box.name, *options, "--", "touch /root/ran"), exit_code=2, says=says)
    assert state(home, box.name) == before and log_of(home, box.name) == []


@pytest.mark.parametrize("command", [["create", "{name}"], ["run"]])
def test_a_memory_limit_without_a_unit_is_refused_as_ambiguous(home: Path, command: list[str]) -> None:
    before = state(home)
    args = [part.format(name=unique_name("cli")) for part in command]
    assert_one_line_error(hs(home, *args, "--memory", "512", *(["--", "true"] if args == ["run"] else [])),
                          exit_code=2, says="no unit")
    assert state(home) == before


def test_exec_without_the_double_dash_hints_at_it(home: Path, box: LocalSandbox) -> None:
    assert_one_line_error(hs(home, "exec", box.name, "ls", "-la"), exit_code=2,
                          says="put the command after --")


def test_a_missing_working_directory_is_the_commands_failure_not_the_sandboxes(
        home: Path, box: LocalSandbox) -> None:
    result = hs(home, "exec", box.name, "--cwd", "/nonexistent", "--", "true")
    assert result.exit_code == 126 and "cannot use /nonexistent as working directory" in result.stderr


# -- signals and broken pipes ------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_during_exec_kills_the_command_inside_and_journals_it(
        home: Path, box: LocalSandbox, sig: signal.Signals) -> None:
    proc = subprocess.Popen(interruptible(cli(home, "exec", box.name, "--", "echo started; exec sleep 600")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"started\n"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig and b"Traceback" not in err, err.decode()
    assert err.decode().strip().startswith("error: interrupted"), err.decode()
    assert ok(home, "exec", box.name, "--", "pgrep -x sleep || echo none").stdout == "none\n"
    [record, _] = log_of(home, box.name)
    assert record["killed"] is True and record["error"] == f"interrupted by {sig.name}", record


def test_a_command_stopped_with_ctrl_c_is_in_the_restore_preview(home: Path, box: LocalSandbox) -> None:
    taken = ok(home, "checkpoint", "create", box.name).stdout.strip()
    proc = subprocess.Popen(interruptible(cli(home, "exec", box.name, "--",
                                              "touch /root/half-done; echo started; exec sleep 600")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"started\n"
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    changed = ok(home, "checkpoint", "diff", box.name, taken).stdout  # (restore --yes counts no files)
    assert any(line.split()[:3] == ["/root", "1", "1"] for line in changed.splitlines()), changed  # its file
    preview = ok(home, "checkpoint", "restore", box.name, taken, "--yes").stdout
    [row] = [line for line in preview.splitlines() if "touch /root/half-done" in line]
    assert row.split()[2] == "137", preview  # killed (SIGKILL) by the CLI on the interrupt
    assert "(interrupted by SIGINT)" in " ".join(preview.split()), preview  # and why, as log says
    [record] = log_of(home, box.name)
    assert record["killed"] and record["error"] == "interrupted by SIGINT", record


def test_a_reader_that_goes_away_is_journaled_as_a_broken_pipe(home: Path, box: LocalSandbox) -> None:
    proc = subprocess.Popen(cli(home, "exec", box.name, "--", "yes"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"y\n"
    proc.stdout.close()
    proc.communicate(timeout=60)
    assert proc.returncode == 141
    [record] = log_of(home, box.name)
    assert record["killed"] is True and "broken pipe" in record["error"], record


def _orphan_a_run(home: Path, backend: LocalBackend) -> str:
    """A `run` killed with -9 mid-command; returns its sandbox's name."""
    # (in-process: a warm call's worker outlives its killed client and destroys the sandbox itself,
    # see test_cli_warm.py)
    proc = subprocess.Popen(cli(home, "run", "--", "hostname; exec sleep 600"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=in_process())
    assert proc.stdout is not None
    name = proc.stdout.readline().decode().strip()
    proc.kill()
    proc.wait(timeout=60)
    assert name.startswith("run-") and name in backend.names(), name  # (any CLI call would collect it)
    return name


def test_the_next_call_or_gc_collects_the_sandbox_of_a_run_killed_with_sigkill(
        home: Path, local_backend: LocalBackend) -> None:
    before = state(home)
    name = _orphan_a_run(home, local_backend)
    listed = hs(home, "ls", "--json")  # the next CLI call collects it, and says so
    assert name not in listed.stdout and f"collected {name}" in listed.stderr, listed.stderr
    assert state(home) == before
    name = _orphan_a_run(home, local_backend)
    result = subprocess.run(cli(home, "gc"), capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0 and name in result.stderr, result.stderr
    assert state(home) == before
    assert [r["type"] for r in as_json(home, "log", name)][-1] == "destroy"


def test_a_live_runs_sandbox_is_not_collected(home: Path) -> None:
    proc = subprocess.Popen(cli(home, "run", "--", "hostname; read line; echo done"), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdin is not None
    name = proc.stdout.readline().decode().strip()
    assert ok(home, "gc").stderr.startswith("collected 0 sandbox(es)")
    assert name in [s["name"] for s in as_json(home, "ls")]
    proc.stdin.write(b"go\n")
    proc.stdin.close()
    assert proc.stdout.read() == b"done\n" and proc.wait(timeout=60) == 0


INTERRUPTED_WHILE_IMPORTING = """
import builtins, os, signal, sys
real_import, target = builtins.__import__, sys.argv[1]
def interrupting_import(name, *args, **kwargs):
    if name == target:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, exactly while the CLI imports this module
    return real_import(name, *args, **kwargs)
builtins.__import__ = interrupting_import
sys.argv = ["hermes-sandboxes", *sys.argv[2:]]
from hermes_sandboxes.cli import main
main()
"""


@pytest.mark.parametrize("module", ["click", "rich.console", "hermes_sandboxes.recorder.sandbox"])
def test_ctrl_c_during_start_up_prints_no_traceback(home: Path, module: str) -> None:
    done = subprocess.run(interruptible([CLI[0], "-c", INTERRUPTED_WHILE_IMPORTING, module, "--home", str(home), "ls"]),
                          capture_output=True, timeout=60, check=False, env=in_process())
    assert (done.returncode, done.stderr) == (130, b"error: interrupted\n"), done


# -- any bytes -------------------------------------------------------------------------------------------

CORPUS = [b"caf\xe9", b"\xff\xfe", b"bell\x07esc\x1b[31mred", b"tab\there", "snowman \u2603".encode()]


@pytest.mark.parametrize("text", CORPUS)
def test_commands_and_output_with_any_bytes_run_and_are_journaled(
        home: Path, box: LocalSandbox, text: bytes) -> None:
    done = subprocess.run(cli(home, "exec", box.name, "--", b"printf '%s\\n' '" + text + b"'"),
                          capture_output=True, timeout=60, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (0, text + b"\n", b"")
    [record] = log_of(home, box.name)
    assert record["exit_code"] == 0 and record["command"].startswith("printf"), record
    plain = subprocess.run(cli(home, "log", box.name), capture_output=True, timeout=60, check=False)
    assert plain.returncode == 0 and b"\x1b" not in plain.stdout and b"\x07" not in plain.stdout, plain


def test_exec_of_an_invalid_utf8_argument_exits_0_and_is_journaled(home: Path, box: LocalSandbox) -> None:
    done = subprocess.run(cli(home, "exec", box.name, "--", b"echo caf\xe9"), capture_output=True, timeout=60,
                          check=False)
    assert (done.returncode, done.stdout, done.stderr) == (0, b"caf\xe9\n", b"")
    assert [r["command"] for r in log_of(home, box.name)] == ["echo caf\\xe9"]


@pytest.mark.parametrize("text", CORPUS)
def test_checkpoints_diffs_and_previews_survive_any_bytes_in_comments_and_paths(
        home: Path, box: LocalSandbox, text: bytes) -> None:
    done = subprocess.run(cli(home, "checkpoint", "create", box.name, "-m", text), capture_output=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    taken = done.stdout.decode().strip()
    [listed] = as_json(home, "checkpoint", "list", box.name)
    assert listed["trigger"] == "manual", listed
    # a file named by the same bytes, and one with a long name, made byte for byte (an argv)
    subprocess.run(cli(home, "exec", box.name, "--", "touch", b"/root/" + text, "/root/" + "l" * 250),
                   check=True, capture_output=True, timeout=60)
    for args in (["checkpoint", "diff", box.name, taken, "--full"], ["checkpoint", "list", box.name],
                 ["checkpoint", "show", box.name, taken], ["log", box.name],
                 ["checkpoint", "restore", box.name, taken, "--yes"]):
        shown = subprocess.run(cli(home, *args), capture_output=True, timeout=60, check=False)
        assert shown.returncode == 0 and b"Traceback" not in shown.stderr, (args, shown)
        assert b"\x1b[" not in shown.stdout and b"\x07" not in shown.stdout, (args, shown.stdout)


def test_a_very_long_line_of_output_passes_through_whole(home: Path, box: LocalSandbox) -> None:
    done = subprocess.run(cli(home, "exec", box.name, "--", "head -c 3000000 /dev/zero | tr '\\0' a; echo"),
                          capture_output=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stdout == b"a" * 3_000_000 + b"\n"


# -- destructive commands -------------------------------------------------------------------------------


def test_rm_refuses_without_yes_when_stdin_is_not_a_terminal(home: Path, box: LocalSandbox) -> None:
    before = state(home, box.name)
    done = subprocess.run(cli(home, "rm", box.name), input=b"n\n", capture_output=True, timeout=60, check=False)
    assert done.returncode == 2 and done.stderr.decode().count("\n") == 1, done.stderr
    assert b"add --yes" in done.stderr
    assert state(home, box.name) == before


# -- the fast path ---------------------------------------------------------------------------------------


# These check the in-process path (HERMES_SANDBOXES_WARM=0); what a call served warm imports (the
# client only) is checked in test_cli_warm.py.
def in_process() -> dict[str, str]:
    return {**os.environ, "HERMES_SANDBOXES_WARM": "0"}


def _imported(home: Path, *args: str) -> tuple[subprocess.CompletedProcess[bytes], set[str]]:
    done = subprocess.run([CLI[0], "-X", "importtime", *CLI[1:], "--home", str(home), *args],
                          capture_output=True, timeout=60, check=False, env=in_process())
    modules = {line.split("|")[-1].strip() for line in done.stderr.decode().splitlines()
               if line.startswith("import time:")}
    return done, modules


def test_exec_imports_neither_click_rich_pydantic_nor_the_risk_parser_once_settings_are_cached(
        home: Path, box: LocalSandbox) -> None:
    ok(home, "config")  # the full CLI validates the settings and caches them
    done, modules = _imported(home, "exec", box.name, "-e", "A=1", "-w", "/tmp", "--", "ls", "/tmp")
    assert done.returncode == 0 and done.stdout == b"", done
    assert not {"click", "rich", "pydantic", "yaml", "hermes_sandboxes.risk._scan"} & modules, modules
    assert [r["command"] for r in log_of(home, box.name)] == ["ls /tmp"]
    # what the fast path does not know, the full CLI handles, with the same messages
    done, modules = _imported(home, "exec", box.name, "--env", "NOEQUALS", "--", "true")
    assert done.returncode == 2 and "click" in modules
    assert b"error: Invalid value for '--env' / '-e'" in done.stderr


# What the exec fast path must never import again: each cost a CLI exec milliseconds of start-up
# (benchmarks/bench_cli.py measures it; this guards it without a clock): the full CLI's frameworks,
# settings validation, the risk parser, dataclasses (inspect, ast) and typing, hashlib (OpenSSL),
# logging, subprocess, the store, launcher and egress policy of the local backend.
_NOT_ON_THE_EXEC_PATH = {
    "click", "rich", "pydantic", "yaml", "hermes_sandboxes.cli.config", "hermes_sandboxes.settings",
    "hermes_sandboxes.risk._scan", "hermes_sandboxes.risk._shell", "hermes_sandboxes.recorder.diffsummary",
    "dataclasses", "inspect", "typing", "hashlib", "logging", "subprocess", "shutil", "secrets", "random",
    "importlib.util", "hermes_sandboxes.backends.local.store.base", "hermes_sandboxes.backends.local.launcher",
    "hermes_sandboxes.allowlist",
}


def test_exec_of_a_plain_command_imports_only_what_running_and_recording_it_needs(
        home: Path, box: LocalSandbox) -> None:
    ok(home, "config")  # the full CLI validates the settings and caches them
    ok(home, "exec", box.name, "--", "true")  # its init starts (that takes the launcher and the store)
    # as the console script calls it (python -m would add runpy's own imports)
    script = "import sys; from hermes_sandboxes.cli import main; main()"
    done = subprocess.run([CLI[0], "-X", "importtime", "-c", script, "--home", str(home), "exec", box.name,
                           "--", "true"], stdin=subprocess.DEVNULL, capture_output=True, timeout=60, check=False,
                          env=in_process())
    modules = {line.split("|")[-1].strip() for line in done.stderr.decode().splitlines()
               if line.startswith("import time:")}
    assert done.returncode == 0, done
    assert "hermes_sandboxes.recorder.sandbox" in modules and "hermes_sandboxes.recorder.journal" in modules, modules
    assert not _NOT_ON_THE_EXEC_PATH & modules, sorted(_NOT_ON_THE_EXEC_PATH & modules)
    assert [r["command"] for r in log_of(home, box.name)] == ["true", "true"]  # recorded all the same
    # the start-up idioms (util/values.py) only where this path, the warm server or the guest runs
    stray = sorted(m for m in _start_up_idiom_users() if m not in modules and not _measured_elsewhere(m))
    assert stray == [], "\n".join(stray)


# Modules on hot paths this test does not run: the warm exec server and its worker (their imports
# are checked in test_cli_warm.py), the MCP server's start-up and round trip (cli/fastpath/mcp.py and
# mcp/, benchmarks/bench_mcp.py), the start of a sandbox's init (its fork server and user namespace)
# and what runs inside the sandbox (guest/: standard library only).
_HOT_ELSEWHERE = {"hermes_sandboxes.cli.fastpath.server", "hermes_sandboxes.cli.fastpath.worker",
                  "hermes_sandboxes.cli.fastpath.mcp", "hermes_sandboxes.backends.local.forkserver",
                  "hermes_sandboxes.backends.local.userns"}


def _measured_elsewhere(module: str) -> bool:
    return module in _HOT_ELSEWHERE or module.startswith(("hermes_sandboxes.backends.local.guest.",
                                                           "hermes_sandboxes.mcp."))


def _start_up_idiom_users() -> set[str]:
    """The modules using ``TYPE_CHECKING = False`` or util/values.py's ``dataclass``."""
    import hermes_sandboxes

    src = Path(hermes_sandboxes.__file__).parent
    found = set()
    for path in src.rglob("*.py"):
        text = path.read_text()
        if "\nTYPE_CHECKING = False" in text or "from hermes_sandboxes.util.values import" in text:
            parts = path.relative_to(src.parent).with_suffix("").parts
            found.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def test_a_changed_config_file_is_validated_again(home: Path, box: LocalSandbox, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("[local]\nnetwork = 'loopback'\n")
    env = {**os.environ, "HERMES_SANDBOXES_CONFIG": str(config)}
    run = [*CLI, "--home", str(home), "exec", box.name, "--", "true"]
    assert subprocess.run(run, env=env, capture_output=True, timeout=60, check=False).returncode == 0
    config.write_text("[local]\nnetwork = 'wifi'\n")  # invalid now: the cache must not hide it
    done = subprocess.run(run, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and "network" in done.stderr and "wifi" in done.stderr, done.stderr


# -- smaller points ----------------------------------------------------------------------------------------


def test_the_automatic_checkpoint_note_comes_before_the_command_runs(home: Path, box: LocalSandbox) -> None:
    proc = subprocess.Popen(interruptible(cli(home, "exec", box.name, "--", "rm -rf /root/scratch; exec sleep 600")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stderr is not None
        note = proc.stderr.readline().decode()  # while the command still runs
        assert note.startswith("checkpoint ck-") and "undo with: hermes-sandboxes checkpoint restore" in note, note
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)


def test_ls_never_calls_a_sandbox_a_killed_checkpoint_left_frozen_running(
        home: Path, box: LocalSandbox, tmp_path: Path) -> None:
    ok(home, "exec", box.name, "--", "true")  # its init runs
    state = json.loads((box.backend.layout.run_dir(box.name) / "init.json").read_text())
    groups = cgroups.from_state(state["cgroups"])
    marker = tmp_path / "paused"
    env = {**in_process(), "HERMES_SANDBOXES_TEST_PAUSE": "checkpoint-staged",  # (the CLI itself is killed)
           "HERMES_SANDBOXES_TEST_PAUSE_MARKER": str(marker)}
    proc = subprocess.Popen(cli(home, "checkpoint", "create", box.name), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (marker.exists() and marker.read_text()):  # the snapshot is staged, the sandbox frozen
        assert proc.poll() is None and time.monotonic() < deadline, "the checkpoint never paused"
        time.sleep(0.01)
    [listed] = [s for s in as_json(home, "ls") if s["name"] == box.name]
    assert listed["state"] == "paused" and groups.is_frozen(), listed  # while the checkpoint lives
    proc.kill()  # SIGKILL: nothing thaws the sandbox
    proc.wait()
    assert groups.is_frozen()
    [listed] = [s for s in as_json(home, "ls") if s["name"] == box.name]
    assert listed["state"] == "running" and not groups.is_frozen(), listed  # thawed, so running is true
    assert ok(home, "exec", box.name, "--", "echo alive").stdout == "alive\n"


def test_a_command_the_memory_limit_kills_is_said_to_be_killed_for_memory(home: Path) -> None:
    name = unique_name("cli")
    ok(home, "create", name, "--memory", "64M")
    try:
        ok(home, "exec", name, "--", "true")
        result = hs(home, "exec", name, "--", "python3 -c \"x = b'h' * (256 << 20); print('survived')\"")
        assert result.exit_code == 137 and "survived" not in result.stdout
        assert "killed for memory" in result.stderr and "limit of 64 MiB" in result.stderr, result.stderr
        [*_, record] = log_of(home, name)
        assert record["error"] == "killed by the sandbox's memory limit", record
        plain_kill = hs(home, "exec", name, "--", "kill -9 $$")  # SIGKILL from elsewhere: no such claim
        assert plain_kill.exit_code == 137 and "memory" not in plain_kill.stderr
    finally:
        hs(home, "rm", name, "--yes")
