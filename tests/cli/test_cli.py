"""The hermes-sandboxes command, run for real against the local backend on the session's store:
usage, create, ls, rm, stop, exec, run, shell and doctor. Checkpoints and the audit log are in
test_cli_checkpoints.py; the fixtures and helpers both use are in cli_kit.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox
from hermes_sandboxes.cli import cli, signals
from hermes_sandboxes.cli.running import run_command
from hermes_sandboxes.cli.session import Session
from hermes_sandboxes.names import unique_name
from hermes_sandboxes.recorder.state import HostState
from hermes_sandboxes.sandbox import Process
from tests.cli import cli_kit
from tests.cli.cli_kit import CLI, Pty, as_json, assert_one_line_error, checkpoint_ids, hs, ok, state
from tests.interrupts import interruptible
from tests.patience import until_started

home, box = cli_kit.home, cli_kit.box  # the shared fixtures, under the names the tests ask for


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
                               "checkpoint_count", "last_used"}
        assert listed["backend"] == "local" and listed["ephemeral"] is False
        assert listed["spec"] == {"network": "loopback", "allow": [], "image": None, "labels": {},
                                  "idle_timeout": None,
                                  "limits": {"memory_bytes": 512 << 20, "pids": 200, "cpus": 1.5, "disk_bytes": None}}
        assert listed["checkpoint_count"] == 0
        plain = ok(home, "ls").stdout.splitlines()
        assert plain[0].split() == ["NAME", "STATE", "KIND", "AGE", "LAST", "USED", "NETWORK", "CHANGED",
                                    "CHECKPOINTS"]
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
    (["--network", "proxy", "--allow", "no host!"], "Invalid value for '--allow': allow entry 'no host!'"),
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
    result = ok(home, "rm", name, "--yes")
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
    assert_one_line_error(hs(home, "exec", box.name, "--env", "NOEQUALS", "--", "true"), exit_code=2, says="--env")


def test_exec_stops_a_command_at_its_timeout_with_exit_124(home: Path, box: LocalSandbox) -> None:
    result = until_started(lambda timeout: hs(home, "exec", box.name, "--timeout", f"{timeout:g}", "--",
                                              "echo begun; sleep 60"), lambda result: result.stdout != "")
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
    proc = subprocess.Popen(interruptible([*CLI, "--home", str(home), "exec", box.name, "--",
                                           "echo started; exec sleep 600"]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"started\n"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.decode().strip().endswith("error: interrupted"), err.decode()
    assert ok(home, "exec", box.name, "--", "pgrep -x sleep || echo none").stdout == "none\n"


def test_a_signal_that_lands_as_the_command_starts_leaves_nothing_running_and_is_journaled(
        home: Path, box: LocalSandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    real_start = box.start

    def start(*args: Any, **kwargs: Any) -> Process:
        proc = real_start(*args, **kwargs)
        signal.raise_signal(signal.SIGTERM)  # the init runs the command; we do not hold it yet
        return proc

    monkeypatch.setattr(box, "start", start)
    restore = signals.install()
    try:
        with pytest.raises(signals.Stopped):
            run_command(Session(box, HostState()), "sleep 600", policy="off", cwd=None, env={}, timeout=None,
                        stdin=None, announce=lambda *_: None)
    finally:
        restore()
    monkeypatch.undo()
    assert ok(home, "exec", box.name, "--", "pgrep -x sleep || echo none").stdout == "none\n"
    [record, _] = as_json(home, "log", box.name)
    assert record["command"] == "sleep 600" and record["killed"] is True, record
    assert record["error"] == "interrupted by SIGTERM", record


def test_exec_checkpoints_before_a_risky_command_by_default(home: Path, box: LocalSandbox) -> None:
    ok(home, "exec", box.name, "--", "mkdir -p /root/work && echo x > /root/work/f")
    assert checkpoint_ids(home, box.name) == []
    result = ok(home, "exec", box.name, "--", "rm -rf /root/work")
    [auto] = as_json(home, "checkpoint", "list", box.name)
    assert auto["trigger"] == "auto" and auto["trigger_command"] == "rm -rf /root/work"
    assert auto["id"] in result.stderr and "checkpoint restore" in result.stderr
    ok(home, "checkpoint", "restore", box.name, auto["id"], "--yes")
    assert ok(home, "exec", box.name, "--", "cat /root/work/f").stdout == "x\n"


def test_exec_checkpoint_off_and_always_override_the_default(home: Path, box: LocalSandbox) -> None:
    ok(home, "exec", box.name, "--checkpoint", "off", "--", "rm -rf /root/nothing")
    assert checkpoint_ids(home, box.name) == []
    ok(home, "exec", box.name, "--checkpoint", "always", "--", "true")
    assert len(checkpoint_ids(home, box.name)) == 1
    assert_one_line_error(hs(home, "exec", box.name, "--checkpoint", "sometimes", "--", "true"), exit_code=2)


def test_exec_checkpoint_risky_is_named_as_the_setting_and_auto_still_means_it(home: Path, box: LocalSandbox) -> None:
    ok(home, "exec", box.name, "--checkpoint", "risky", "--", "rm -rf /root/one")
    assert len(checkpoint_ids(home, box.name)) == 1
    ok(home, "exec", box.name, "--checkpoint", "off", "--", "touch /root/changed")  # (else the first is reused)
    ok(home, "exec", box.name, "--checkpoint", "auto", "--", "rm -rf /root/two")  # the old word
    assert len(checkpoint_ids(home, box.name)) == 2
    help_text = " ".join(ok(home, "exec", "--help").stdout.split())
    assert "[risky|always|off]" in help_text and "default: the setting auto_checkpoint" in help_text


# -- run -------------------------------------------------------------------------------------------


def test_run_executes_in_a_throwaway_sandbox_and_destroys_it(home: Path) -> None:
    before = state(home)
    result = hs(home, "run", "--network", "none", "--", "echo hi from $(hostname); exit 3")
    assert result.exit_code == 3 and result.stdout.startswith("hi from run-")
    assert state(home) == before
    # its history lives in the audit log only
    assert list(HostState().backend_dir(LocalBackend(home).key).glob("journals/run-*")) == []


def test_run_destroys_its_sandbox_after_a_timeout(home: Path) -> None:
    before = state(home)
    assert hs(home, "run", "--timeout", "1", "--", "sleep 60").exit_code == 124
    assert state(home) == before


def test_run_with_bad_options_fails_in_one_line_and_creates_nothing(home: Path) -> None:
    before = state(home)
    assert_one_line_error(hs(home, "run", "--memory", "huge", "--", "true"), says="not a size")
    assert_one_line_error(hs(home, "run", "--cwd", "relative", "--", "true"), says="absolute")
    assert state(home) == before


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_run_destroys_its_sandbox_when_interrupted(home: Path, sig: signal.Signals) -> None:
    before = state(home)
    proc = subprocess.Popen(interruptible([*CLI, "--home", str(home), "run", "--", "echo started; exec sleep 600"]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"started\n"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err.decode()
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


def test_shell_on_a_terminal_leaves_nohup_setsid_and_disowned_jobs_running(home: Path, box: LocalSandbox) -> None:
    term = Pty([*CLI, "--home", str(home), "shell", box.name])
    term.send(b"nohup sleep 601 >/dev/null 2>&1 & setsid sleep 602 & sleep 603 & disown; echo job-$((2*3))\r")
    term.expect(b"job-6")
    term.send(b"exit\r")
    assert term.finish() == 0
    left = ok(home, "exec", box.name, "--", "pgrep -a sleep | cut -d' ' -f3 | sort").stdout.split()
    assert left == ["601", "602", "603"]  # as after closing a real terminal


def test_shell_ends_without_waiting_for_its_background_jobs(home: Path, box: LocalSandbox) -> None:
    script = b"sleep 600 & nohup sleep 700 >/dev/null 2>&1 & echo left two jobs\nexit 5\n"
    done = subprocess.run([*CLI, "--home", str(home), "shell", box.name], input=script, capture_output=True,
                          timeout=60, check=False)
    assert done.returncode == 5 and done.stdout == b"left two jobs\n", done.stderr
    assert ok(home, "exec", box.name, "--", "pgrep -x sleep | wc -l").stdout == "2\n"


# -- doctor ---------------------------------------------------------------------------------------


def test_doctor_shows_a_table_of_checks_and_exits_0_here(home: Path) -> None:
    result = ok(home, "doctor")
    assert "running as root" in result.stdout and "sandbox store" in result.stdout
    data = as_json(home, "doctor")
    assert data["usable"] is True and data["problem"] is None
    assert data["backend"] == "local"
    assert all(set(c) == {"backend", "ok", "label", "detail"} for c in data["checks"])
    # every registered backend has a row; the cloud ones say what to install when their SDK is missing
    assert {c["backend"] for c in data["checks"]} >= {"local", "sprites", "e2b"}


def test_store_info_and_doctor_name_the_store_kind_and_what_a_checkpoint_costs(home: Path) -> None:
    info = ok(home, "store", "info").stdout
    assert "btrfs" in info and "constant-time checkpoints" in info and "disk limits" in info
    store = next(c for c in as_json(home, "doctor")["checks"] if c["label"] == "sandbox store")
    assert "btrfs at " in store["detail"] and "subvolume snapshots" in store["detail"]


def test_doctor_exits_1_where_sandboxes_cannot_run() -> None:
    never_created = f"/tmp/{unique_name('hs-doctor')}"  # a non-root doctor must not create it either
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *CLI,
                           "--home", never_created, "doctor"],
                          capture_output=True, text=True, timeout=60, check=False, cwd="/")
    assert done.returncode == 1, done.stderr
    assert "FAIL" in done.stdout and done.stderr.startswith("error: local sandboxes cannot run here")
    assert not os.path.exists(never_created)
