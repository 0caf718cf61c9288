"""The hermes-sandboxes command, run for real against the local backend on the session's store.

Most tests invoke the click group in-process (CliRunner); what needs a real process (live
streaming, signals, a terminal) runs ``python -m hermes_sandboxes.cli`` as a subprocess, on a pty
where a terminal is the point.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox
from hermes_sandboxes.cli import cli
from hermes_sandboxes.cli.session import Session
from hermes_sandboxes.identity import unique_name
from hermes_sandboxes.sandbox import Process

CLI = [sys.executable, "-m", "hermes_sandboxes.cli"]


# -- helpers -------------------------------------------------------------------------------------


@pytest.fixture
def home(local_backend: LocalBackend) -> Path:
    local_backend.store  # noqa: B018 - open the store here, so the session fixture unmounts it
    return local_backend.home


@pytest.fixture
def box(local_backend: LocalBackend) -> Iterator[LocalSandbox]:
    sandbox = local_backend.create(unique_name("cli"))
    try:
        yield sandbox
    finally:
        sandbox.destroy()


def hs(home: Path, *args: str, input: str | None = None, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, ["--home", str(home), *args], input=input, env=env,
                              catch_exceptions=False)


def ok(home: Path, *args: str, **kwargs: Any) -> Result:
    result = hs(home, *args, **kwargs)
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    return result


def as_json(home: Path, *args: str) -> Any:
    return json.loads(ok(home, *args, "--json").stdout)


def state(home: Path, *names: str) -> list[str]:
    """What an error must leave as it was: the listing and each named sandbox's checkpoints."""
    return [ok(home, "ls", "--json").stdout,
            *(ok(home, "checkpoint", "list", name, "--json").stdout for name in names)]


def assert_one_line_error(result: Result, *, exit_code: int | None = None, says: str = "") -> None:
    assert result.exit_code != 0, result.stdout
    if exit_code is not None:
        assert result.exit_code == exit_code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    assert says.lower() in lines[0].lower()


def checkpoint_ids(home: Path, name: str) -> list[str]:
    return [c["id"] for c in as_json(home, "checkpoint", "list", name)]


class Pty:
    """A subprocess whose stdin, stdout and stderr are a terminal we drive."""

    def __init__(self, args: list[str]) -> None:
        self.master, slave = os.openpty()
        self.proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
        os.close(slave)
        self.seen = b""

    def expect(self, text: bytes, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.seen:
            assert time.monotonic() < deadline, f"never saw {text!r} in {self.seen!r}"
            if not self._read(0.2):
                assert self.proc.poll() is None, f"exited before {text!r}: {self.seen!r}"

    def send(self, data: bytes) -> None:
        os.write(self.master, data)

    def finish(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None or self._read(0):
            assert time.monotonic() < deadline, f"still running: {self.seen!r}"
            self._read(0.2)
        os.close(self.master)
        return self.proc.returncode

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return False
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: the terminal's last user has gone
            return False
        self.seen += data
        return bool(data)


# -- usage and global options --------------------------------------------------------------------


def test_no_arguments_prints_the_help_listing_every_command() -> None:
    result = CliRunner().invoke(cli, [])
    for command in ("create", "exec", "run", "shell", "ls", "rm", "stop", "checkpoint", "log", "doctor",
                    "demo"):
        assert command in result.stdout


def test_the_console_script_runs() -> None:
    script = Path(sys.executable).parent / "hermes-sandboxes"
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "checkpoint" in done.stdout


def test_an_unknown_command_is_a_one_line_usage_error(home: Path) -> None:
    assert_one_line_error(hs(home, "explode"), exit_code=2, says="no such command")


def test_the_home_can_come_from_the_environment(home: Path, box: LocalSandbox) -> None:
    result = CliRunner().invoke(cli, ["ls", "--json"], env={"HERMES_SANDBOXES_HOME": str(home)})
    assert box.name in [s["name"] for s in json.loads(result.stdout)]


def test_a_home_that_cannot_be_used_is_a_one_line_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["--home", str(tmp_path / "has,comma"), "ls"])
    assert_one_line_error(result, exit_code=1, says="commas")


# -- create, ls, rm, stop ------------------------------------------------------------------------


def test_create_prints_the_name_and_ls_lists_it_with_its_spec(home: Path) -> None:
    name = unique_name("cli")
    try:
        result = ok(home, "create", name, "--network", "loopback", "--memory", "512M", "--pids", "200",
                    "--cpus", "1.5", "--mask", "/opt/secret")
        assert result.stdout == f"{name}\n"
        listed = {s["name"]: s for s in as_json(home, "ls")}[name]
        assert set(listed) == {"name", "backend", "ephemeral", "state", "created_at", "spec", "layer_bytes",
                               "checkpoint_count"}
        assert listed["backend"] == "local" and listed["ephemeral"] is False
        assert listed["spec"] == {"network": "loopback", "masks": ["/opt/secret"], "base": None,
                                  "limits": {"memory_bytes": 512 << 20, "pids": 200, "cpus": 1.5}}
        assert listed["checkpoint_count"] == 0
        plain = ok(home, "ls").stdout.splitlines()
        assert plain[0].split() == ["NAME", "STATE", "KIND", "AGE", "NETWORK", "CHANGED", "CHECKPOINTS"]
        assert any(line.split()[:3] == [name, "stopped", "persistent"] for line in plain[1:])
    finally:
        hs(home, "rm", name, "--yes")


def test_create_ephemeral_marks_the_sandbox_ephemeral(home: Path) -> None:
    name = unique_name("cli")
    try:
        ok(home, "create", name, "--ephemeral")
        assert {s["name"]: s for s in as_json(home, "ls")}[name]["ephemeral"] is True
    finally:
        hs(home, "rm", name, "--yes")


@pytest.mark.parametrize("name", ["Bad_Name", "a--b", "-a", "a-", "x" * 64, "UPPER", "a.b", ""])
def test_create_with_an_invalid_name_fails_in_one_line_and_changes_nothing(home: Path, name: str) -> None:
    before = state(home)
    assert_one_line_error(hs(home, "create", "--", name), exit_code=1, says="name")
    assert state(home) == before


@pytest.mark.parametrize(("options", "says"), [
    (["--memory", "lots"], "not a size"),
    (["--memory", "0"], "size"),
    (["--memory", "1M"], "at least 16 MiB"),
    (["--network", "wifi"], "--network"),
    (["--pids", "0"], "--pids"),
    (["--cpus", "0"], "--cpus"),
    (["--base", "relative/dir"], "base"),
    (["--base", "/nonexistent-rootfs"], "base"),
    (["--mask", "relative"], "absolute"),
])
def test_create_with_a_bad_option_fails_in_one_line_and_changes_nothing(
        home: Path, options: list[str], says: str) -> None:
    name = unique_name("cli")
    before = state(home)
    assert_one_line_error(hs(home, "create", name, *options), says=says)
    assert state(home) == before
    assert name not in [s["name"] for s in as_json(home, "ls")]


def test_create_refuses_an_existing_name_and_leaves_that_sandbox_alone(home: Path, box: LocalSandbox) -> None:
    box.write_file("/root/keep", b"mine")
    before = state(home, box.name)
    assert_one_line_error(hs(home, "create", box.name), exit_code=1, says="already exists")
    assert state(home, box.name) == before
    assert box.read_file("/root/keep") == b"mine"


def test_rm_destroys_the_sandbox_with_its_checkpoints(home: Path) -> None:
    name = unique_name("cli")
    ok(home, "create", name)
    ok(home, "checkpoint", "create", name)
    result = ok(home, "rm", name)  # stdin is not a terminal: no question asked
    assert f"destroyed {name}" in result.stderr
    assert name not in [s["name"] for s in as_json(home, "ls")]


def test_rm_asks_on_a_terminal_and_declining_keeps_the_sandbox(home: Path, box: LocalSandbox) -> None:
    term = Pty([*CLI, "--home", str(home), "rm", box.name])
    term.expect(b"[y/N]")
    term.send(b"n\r")
    assert term.finish() == 1
    assert b"cancelled" in term.seen
    assert box.name in [s["name"] for s in as_json(home, "ls")]


def test_stop_ends_every_process_and_keeps_the_files(home: Path, box: LocalSandbox) -> None:
    ok(home, "exec", box.name, "--", "echo kept > /root/file; nohup sleep 600 >/dev/null 2>&1 &")
    assert {s["name"]: s for s in as_json(home, "ls")}[box.name]["state"] == "running"
    assert f"stopped {box.name}" in ok(home, "stop", box.name).stderr
    assert {s["name"]: s for s in as_json(home, "ls")}[box.name]["state"] == "stopped"
    assert ok(home, "exec", box.name, "--", "cat /root/file; pgrep -x sleep || echo no-sleep").stdout == \
        "kept\nno-sleep\n"


@pytest.mark.parametrize("command", [
    ["exec", "{missing}", "--", "true"],
    ["rm", "{missing}", "--yes"],
    ["stop", "{missing}"],
    ["shell", "{missing}"],
    ["log", "{missing}"],
    ["checkpoint", "create", "{missing}"],
    ["checkpoint", "list", "{missing}"],
    ["checkpoint", "show", "{missing}", "ck-00000000"],
    ["checkpoint", "diff", "{missing}", "ck-00000000"],
    ["checkpoint", "restore", "{missing}", "ck-00000000", "--yes"],
    ["checkpoint", "rm", "{missing}", "ck-00000000"],
])
def test_every_command_on_an_unknown_sandbox_fails_in_one_line_and_changes_nothing(
        home: Path, command: list[str]) -> None:
    missing = unique_name("nope")
    before = state(home)
    assert_one_line_error(hs(home, *(part.format(missing=missing) for part in command)), says=missing)
    assert state(home) == before


@pytest.mark.parametrize("command", [["exec", "{bad}", "--", "true"], ["rm", "{bad}"], ["stop", "{bad}"],
                                     ["checkpoint", "list", "{bad}"], ["log", "{bad}"]])
def test_every_command_rejects_an_invalid_name_in_one_line(home: Path, command: list[str]) -> None:
    before = state(home)
    assert_one_line_error(hs(home, *(part.format(bad="Not_Valid") for part in command)), says="name")
    assert state(home) == before


# -- exec ------------------------------------------------------------------------------------------


def test_exec_passes_stdout_and_stderr_through_and_exits_with_the_commands_code(
        home: Path, box: LocalSandbox) -> None:
    result = hs(home, "exec", box.name, "--", "echo out; echo err >&2; exit 3")
    assert result.exit_code == 3
    assert result.stdout == "out\n" and result.stderr == "err\n"


def test_exec_runs_one_argument_as_a_shell_line_and_several_as_an_argv(home: Path, box: LocalSandbox) -> None:
    assert ok(home, "exec", box.name, "--", "echo a | tr a b").stdout == "b\n"
    assert ok(home, "exec", box.name, "--", "echo", "a | tr a b", "$HOME").stdout == "a | tr a b $HOME\n"


def test_exec_sets_the_environment_and_working_directory(home: Path, box: LocalSandbox) -> None:
    result = ok(home, "exec", box.name, "--cwd", "/tmp", "--env", "GREETING=hello world", "--env", "N=1",
                "--", 'echo "$GREETING $N $(pwd)"')
    assert result.stdout == "hello world 1 /tmp\n"


def test_exec_with_a_malformed_env_fails_in_one_line(home: Path, box: LocalSandbox) -> None:
    assert_one_line_error(hs(home, "exec", box.name, "--env", "NOEQUALS", "--", "true"), says="--env")


def test_exec_stops_a_command_at_its_timeout_with_exit_124(home: Path, box: LocalSandbox) -> None:
    result = hs(home, "exec", box.name, "--timeout", "1", "--", "echo begun; sleep 60")
    assert result.exit_code == 124
    assert result.stdout == "begun\n" and "timed out" in result.stderr
    assert ok(home, "exec", box.name, "--", "pgrep -x sleep || echo none").stdout == "none\n"


def test_exec_on_a_destroyed_sandbox_fails_in_one_line(home: Path) -> None:
    name = unique_name("cli")
    ok(home, "create", name)
    ok(home, "rm", name, "--yes")
    before = state(home)
    assert_one_line_error(hs(home, "exec", name, "--", "true"), exit_code=125, says=name)
    assert state(home) == before


def test_exec_streams_output_while_the_command_still_runs(home: Path, box: LocalSandbox) -> None:
    proc = subprocess.Popen([*CLI, "--home", str(home), "exec", box.name, "--",
                             "echo first; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo second"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"first\n"
        assert proc.poll() is None  # the command waits for /tmp/go: "first" came live
        box.write_file("/tmp/go", b"")
        assert proc.stdout.readline() == b"second\n"
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
        proc.wait()


def test_exec_into_a_reader_that_stops_early_kills_the_command_and_exits_141_quietly(
        home: Path, box: LocalSandbox) -> None:
    proc = subprocess.Popen([*CLI, "--home", str(home), "exec", box.name, "--", "yes"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"y\n"
    proc.stdout.close()  # what `| head -1` does once it has its line
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 141 and err == b""
    assert ok(home, "exec", box.name, "--", "pgrep -x yes || echo none").stdout == "none\n"


def test_ctrl_c_during_exec_kills_the_command_inside(home: Path, box: LocalSandbox) -> None:
    proc = subprocess.Popen([*CLI, "--home", str(home), "exec", box.name, "--", "echo started; exec sleep 600"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"started\n"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.decode().strip().endswith("error: interrupted"), err.decode()
    assert ok(home, "exec", box.name, "--", "pgrep -x sleep || echo none").stdout == "none\n"


def test_a_ctrl_c_that_lands_as_the_command_starts_leaves_nothing_running(
        home: Path, box: LocalSandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    real_start = box.start

    def start(*args: Any, **kwargs: Any) -> Process:
        proc = real_start(*args, **kwargs)
        signal.raise_signal(signal.SIGINT)  # the init runs the command; exec has not seen it yet
        return proc

    monkeypatch.setattr(box, "start", start)
    with pytest.raises(KeyboardInterrupt):
        Session(box, home).exec("sleep 600")
    monkeypatch.undo()
    assert ok(home, "exec", box.name, "--", "pgrep -x sleep || echo none").stdout == "none\n"


def test_exec_checkpoints_before_a_risky_command_by_default(home: Path, box: LocalSandbox) -> None:
    ok(home, "exec", box.name, "--", "mkdir -p /root/work && echo x > /root/work/f")
    assert checkpoint_ids(home, box.name) == []
    result = ok(home, "exec", box.name, "--", "rm -rf /root/work")
    [auto] = as_json(home, "checkpoint", "list", box.name)
    assert auto["extra"]["trigger"] == "auto" and auto["extra"]["trigger_command"] == "rm -rf /root/work"
    assert auto["id"] in result.stderr and "checkpoint restore" in result.stderr
    ok(home, "checkpoint", "restore", box.name, auto["id"], "--yes")
    assert ok(home, "exec", box.name, "--", "cat /root/work/f").stdout == "x\n"


def test_exec_checkpoint_off_and_always_override_the_default(home: Path, box: LocalSandbox) -> None:
    ok(home, "exec", box.name, "--checkpoint", "off", "--", "rm -rf /root/nothing")
    assert checkpoint_ids(home, box.name) == []
    ok(home, "exec", box.name, "--checkpoint", "always", "--", "true")
    assert len(checkpoint_ids(home, box.name)) == 1
    assert_one_line_error(hs(home, "exec", box.name, "--checkpoint", "sometimes", "--", "true"), exit_code=2)


# -- run -------------------------------------------------------------------------------------------


def test_run_executes_in_a_throwaway_sandbox_and_destroys_it(home: Path) -> None:
    before = state(home)
    result = hs(home, "run", "--network", "none", "--", "echo hi from $(hostname); exit 3")
    assert result.exit_code == 3 and result.stdout.startswith("hi from run-")
    assert state(home) == before
    assert list((home / "journals").glob("run-*")) == []  # its history lives in the audit log only


def test_run_destroys_its_sandbox_after_a_timeout(home: Path) -> None:
    before = state(home)
    assert hs(home, "run", "--timeout", "1", "--", "sleep 60").exit_code == 124
    assert state(home) == before


def test_run_with_bad_options_fails_in_one_line_and_creates_nothing(home: Path) -> None:
    before = state(home)
    assert_one_line_error(hs(home, "run", "--memory", "huge", "--", "true"), says="not a size")
    assert_one_line_error(hs(home, "run", "--cwd", "relative", "--", "true"), says="absolute")
    assert state(home) == before


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_run_destroys_its_sandbox_when_interrupted(home: Path, sig: signal.Signals) -> None:
    before = state(home)
    proc = subprocess.Popen([*CLI, "--home", str(home), "run", "--", "echo started; exec sleep 600"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"started\n"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert state(home) == before


# -- shell -----------------------------------------------------------------------------------------


def test_shell_on_a_terminal_is_interactive_with_job_control(home: Path, box: LocalSandbox) -> None:
    term = Pty([*CLI, "--home", str(home), "shell", box.name])
    # the expected words differ from the typed ones, which the terminal echoes back
    term.send(b"echo mark-$((6*7)); case $- in *m*) echo job-control-$((1+1));; esac\r")
    term.expect(b"mark-42")
    term.expect(b"job-control-2")
    term.send(b"exit 3\r")
    assert term.finish() == 3
    assert [(r["command"], r["exit_code"]) for r in as_json(home, "log", box.name)] == \
        [("(interactive shell)", 3)]


def test_shell_reads_a_script_when_stdin_is_not_a_terminal(home: Path, box: LocalSandbox) -> None:
    done = subprocess.run([*CLI, "--home", str(home), "shell", box.name], input=b"echo hi from $(hostname)\nexit 4\n",
                          capture_output=True, timeout=60, check=False)
    assert done.returncode == 4 and done.stdout == f"hi from {box.name}\n".encode()
    [noted] = as_json(home, "log", box.name)
    assert (noted["command"], noted["exit_code"]) == ("(shell script from stdin)", 4)


def test_shell_on_a_terminal_kills_the_jobs_it_leaves_on_exit(home: Path, box: LocalSandbox) -> None:
    term = Pty([*CLI, "--home", str(home), "shell", box.name])
    term.send(b"sleep 600 & echo job-$((2*3))\r")
    term.expect(b"job-6")
    term.send(b"exit\r")
    assert term.finish() == 0
    assert ok(home, "exec", box.name, "--", "pgrep -x sleep || echo none").stdout == "none\n"


def test_shell_ends_without_waiting_for_its_background_jobs_and_kills_them(home: Path, box: LocalSandbox) -> None:
    script = b"sleep 600 & nohup sleep 700 >/dev/null 2>&1 & echo left two jobs\nexit 5\n"
    done = subprocess.run([*CLI, "--home", str(home), "shell", box.name], input=script, capture_output=True,
                          timeout=60, check=False)
    assert done.returncode == 5 and done.stdout == b"left two jobs\n", done.stderr
    assert ok(home, "exec", box.name, "--", "pgrep -x sleep || echo none").stdout == "none\n"


# -- checkpoints ---------------------------------------------------------------------------------


def test_checkpoint_create_prints_only_the_id_on_stdout(home: Path, box: LocalSandbox) -> None:
    result = ok(home, "checkpoint", "create", box.name, "-m", "first")
    assert checkpoint_ids(home, box.name) == [result.stdout.strip()]


def test_checkpoint_list_tells_the_story_newest_first(home: Path, box: LocalSandbox) -> None:
    first = ok(home, "checkpoint", "create", box.name, "-m", "empty").stdout.strip()
    ok(home, "exec", box.name, "--", "echo one")
    assert hs(home, "exec", box.name, "--", "exit 2").exit_code == 2
    second = ok(home, "checkpoint", "create", box.name, "-m", "after two commands").stdout.strip()
    listed = as_json(home, "checkpoint", "list", box.name)
    assert [c["id"] for c in listed] == [second, first]
    assert set(listed[0]) == {"id", "created_at", "comment", "size_bytes", "extra"}
    story = listed[0]["extra"]
    assert story["trigger"] == "manual" and story["previous"] == first
    assert [(c["command"], c["exit_code"]) for c in story["commands"]] == [("echo one", 0), ("exit 2", 2)]
    plain = ok(home, "checkpoint", "list", box.name).stdout.splitlines()
    assert plain[0].split() == ["ID", "AGE", "TRIGGER", "COMMENT", "COMMANDS", "SIZE"]
    assert plain[1].startswith(second) and "after two commands" in plain[1] and " manual " in plain[1]
    assert plain[1].split()[-3] == "2"  # commands since the previous checkpoint
    assert plain[2].startswith(first)


def test_checkpoint_show_gives_the_details_and_the_commands_before_it(home: Path, box: LocalSandbox) -> None:
    ok(home, "exec", box.name, "--", "echo building")
    taken = ok(home, "checkpoint", "create", box.name, "-m", "built").stdout.strip()
    shown = ok(home, "checkpoint", "show", box.name, taken).stdout
    assert taken in shown and "built" in shown and "manual" in shown and "echo building" in shown
    assert as_json(home, "checkpoint", "show", box.name, taken)["id"] == taken


def test_checkpoint_diff_summarises_by_directory_and_lists_files_with_full(home: Path, box: LocalSandbox) -> None:
    ok(home, "exec", box.name, "--", "mkdir -p /srv/a && echo 1 > /srv/a/one && echo 0 > /srv/a/gone")
    taken = ok(home, "checkpoint", "create", box.name).stdout.strip()
    ok(home, "exec", box.name, "--checkpoint", "off", "--",
       "echo 22 > /srv/a/two; echo 333 > /srv/a/one; rm /srv/a/gone")
    summary = ok(home, "checkpoint", "diff", box.name, taken).stdout
    assert "/srv/a" in summary and "total" in summary
    full = ok(home, "checkpoint", "diff", box.name, taken, "--full").stdout
    assert "+  /srv/a/two" in full and "~  /srv/a/one" in full and "-  /srv/a/gone" in full
    data = as_json(home, "checkpoint", "diff", box.name, taken, "--full")
    assert data["from"] == taken and data["to"] is None
    assert data["summary"]["total"]["added"] == 1 and data["summary"]["total"]["modified"] == 1
    assert data["summary"]["total"]["deleted"] == 1
    assert {c["path"]: c["kind"] for c in data["changes"]} == {
        "/srv/a/two": "added", "/srv/a/one": "modified", "/srv/a/gone": "deleted"}
    assert "changes" not in as_json(home, "checkpoint", "diff", box.name, taken)


def test_checkpoint_diff_compares_two_checkpoints(home: Path, box: LocalSandbox) -> None:
    first = ok(home, "checkpoint", "create", box.name).stdout.strip()
    ok(home, "exec", box.name, "--", "echo x > /root/new")
    second = ok(home, "checkpoint", "create", box.name).stdout.strip()
    ok(home, "exec", box.name, "--", "echo y > /root/later")
    data = as_json(home, "checkpoint", "diff", box.name, first, second, "--full")
    assert [c["path"] for c in data["changes"]] == ["/root/new"]
    assert "no changes" in ok(home, "checkpoint", "diff", box.name, second, second).stdout


def test_a_diff_from_a_checkpoint_taken_before_any_command_shows_only_the_commands_changes(
        home: Path, box: LocalSandbox) -> None:
    taken = ok(home, "checkpoint", "create", box.name).stdout.strip()
    ok(home, "exec", box.name, "--", "echo x > /root/new")
    data = as_json(home, "checkpoint", "diff", box.name, taken, "--full")
    assert [c["path"] for c in data["changes"]] == ["/root/new"]


def test_a_diff_gives_the_size_of_a_deleted_base_file(home: Path, box: LocalSandbox) -> None:
    ok(home, "exec", box.name, "--", "true")
    taken = ok(home, "checkpoint", "create", box.name).stdout.strip()
    ok(home, "exec", box.name, "--checkpoint", "off", "--", "rm /usr/bin/git")
    [change] = as_json(home, "checkpoint", "diff", box.name, taken, "--full")["changes"]
    assert change["path"] == "/usr/bin/git" and change["old_size"] == os.path.getsize("/usr/bin/git")


def test_checkpoint_restore_shows_what_it_discards_then_restores(home: Path, box: LocalSandbox) -> None:
    ok(home, "exec", box.name, "--", "echo v1 > /root/state")
    taken = ok(home, "checkpoint", "create", box.name, "-m", "v1").stdout.strip()
    ok(home, "exec", box.name, "--checkpoint", "off", "--", "echo v2 > /root/state; rm /usr/bin/git")
    result = ok(home, "checkpoint", "restore", box.name, taken)  # stdin is not a terminal: no question
    assert "throws away" in result.stdout and "/usr/bin" in result.stdout
    assert "echo v2 > /root/state; rm /usr/bin/git" in result.stdout
    assert f"restored {box.name} to {taken}" in result.stderr
    assert ok(home, "exec", box.name, "--", "cat /root/state; git --version >/dev/null && echo git").stdout == \
        "v1\ngit\n"


def test_checkpoint_restore_asks_on_a_terminal_and_declining_changes_nothing(
        home: Path, box: LocalSandbox) -> None:
    taken = ok(home, "checkpoint", "create", box.name).stdout.strip()
    ok(home, "exec", box.name, "--", "echo after > /root/after")
    before = state(home, box.name)
    term = Pty([*CLI, "--home", str(home), "checkpoint", "restore", box.name, taken])
    term.expect(b"echo after > /root/after")  # the preview comes before the question
    term.expect(b"[y/N]")
    term.send(b"n\r")
    assert term.finish() == 1 and b"restore cancelled" in term.seen
    assert state(home, box.name) == before
    assert box.read_file("/root/after") == b"after\n"
    term = Pty([*CLI, "--home", str(home), "checkpoint", "restore", box.name, taken])
    term.expect(b"[y/N]")
    term.send(b"y\r")
    assert term.finish() == 0
    assert hs(home, "exec", box.name, "--", "test -e /root/after").exit_code == 1


def test_checkpoint_rm_deletes_only_that_checkpoint(home: Path, box: LocalSandbox) -> None:
    first = ok(home, "checkpoint", "create", box.name).stdout.strip()
    second = ok(home, "checkpoint", "create", box.name).stdout.strip()
    ok(home, "checkpoint", "rm", box.name, first)
    assert checkpoint_ids(home, box.name) == [second]


@pytest.mark.parametrize("command", [
    ["show", "{name}", "ck-deadbeef"],
    ["diff", "{name}", "ck-deadbeef"],
    ["diff", "{name}", "{real}", "ck-deadbeef"],
    ["restore", "{name}", "ck-deadbeef", "--yes"],
    ["rm", "{name}", "ck-deadbeef"],
])
def test_an_unknown_checkpoint_fails_in_one_line_and_changes_nothing(
        home: Path, box: LocalSandbox, command: list[str]) -> None:
    real = ok(home, "checkpoint", "create", box.name).stdout.strip()
    ok(home, "exec", box.name, "--", "echo since > /root/since")
    before = state(home, box.name)
    args = [part.format(name=box.name, real=real) for part in command]
    assert_one_line_error(hs(home, "checkpoint", *args), exit_code=1, says="ck-deadbeef")
    assert state(home, box.name) == before
    assert box.read_file("/root/since") == b"since\n"


# -- log and doctor ------------------------------------------------------------------------------


def test_log_shows_the_audit_trail_oldest_first(home: Path) -> None:
    name = unique_name("cli")
    ok(home, "create", name)
    try:
        assert hs(home, "exec", name, "--", "exit 5").exit_code == 5
        taken = ok(home, "checkpoint", "create", name, "-m", "marked").stdout.strip()
        ok(home, "checkpoint", "restore", name, taken, "--yes")
        ok(home, "checkpoint", "rm", name, taken)
        records = as_json(home, "log", name)
        assert [r["type"] for r in records] == ["create", "exec", "checkpoint", "restore", "checkpoint_delete"]
        assert records[1]["command"] == "exit 5" and records[1]["exit_code"] == 5
        assert records[2]["id"] == taken and records[2]["comment"] == "marked"
        plain = ok(home, "log", name).stdout.splitlines()
        assert plain[0].split() == ["TIME", "EVENT", "EXIT", "TOOK", "DETAIL"]
        assert "exit 5" in plain[2] and f"{taken} [manual] marked" in plain[3]
    finally:
        ok(home, "rm", name, "--yes")
    assert as_json(home, "log", name)[-1]["type"] == "destroy"  # the history outlives the sandbox


def test_secrets_passed_with_env_never_reach_the_audit_log(home: Path, box: LocalSandbox) -> None:
    secret = "s3cr3t-" + unique_name("v")
    result = ok(home, "exec", box.name, "--env", f"API_TOKEN={secret}", "--", f"test $API_TOKEN = {secret}")
    assert result.exit_code == 0
    audit = (home / "audit.jsonl").read_text()
    assert secret not in audit and "REDACTED" in audit


def test_doctor_shows_a_table_of_checks_and_exits_0_here(home: Path) -> None:
    result = ok(home, "doctor")
    assert "running as root" in result.stdout and "sandbox store" in result.stdout
    data = as_json(home, "doctor")
    assert data["usable"] is True and data["problem"] is None
    assert all(set(c) == {"ok", "label", "detail"} for c in data["checks"])


def test_doctor_exits_1_where_sandboxes_cannot_run() -> None:
    never_created = f"/tmp/{unique_name('hs-doctor')}"  # a non-root doctor must not create it either
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *CLI,
                           "--home", never_created, "doctor"],
                          capture_output=True, text=True, timeout=60, check=False, cwd="/")
    assert done.returncode == 1, done.stderr
    assert "FAIL" in done.stdout and done.stderr.startswith("error: local sandboxes cannot run here")
    assert not os.path.exists(never_created)
