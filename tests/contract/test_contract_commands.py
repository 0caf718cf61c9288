"""The contract for commands and files, stated once, run against every backend (see conftest.TARGETS)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from hermes_sandboxes.errors import InvalidInput, SandboxFileNotFound
from hermes_sandboxes.sandbox import TIMEOUT_EXIT_CODE, Backend, Capability, Sandbox
from tests.patience import until_started


def test_a_string_runs_in_a_shell_and_a_list_runs_as_is(sandbox: Sandbox) -> None:
    assert sandbox.exec("echo $((6 * 7)) | tr 4 x").stdout == "x2\n"
    assert sandbox.exec(["echo", "$((6 * 7))", "|", "tr"]).stdout == "$((6 * 7)) | tr\n"


def test_exit_codes_are_the_commands_own_and_128_plus_n_for_a_signal(sandbox: Sandbox) -> None:
    assert sandbox.exec("exit 3").exit_code == 3
    assert sandbox.exec("kill -9 $$").exit_code == 128 + 9
    assert sandbox.exec(["false"]).exit_code == 1


def test_a_timeout_stops_the_command_with_exit_124(sandbox: Sandbox) -> None:
    result = until_started(lambda timeout: sandbox.exec("echo before; sleep 30; echo after", timeout=timeout),
                           lambda result: result.stdout != "")
    assert result.exit_code == TIMEOUT_EXIT_CODE and result.timed_out
    assert result.stdout == "before\n"
    assert sandbox.exec("pgrep -x sleep || echo none").stdout == "none\n"


def test_a_tree_kill_takes_detached_children_too_where_the_backend_promises_it(
        backend: Backend, sandbox: Sandbox) -> None:
    # each child says it started, so the kill is proven to have found all three running
    script = ("setsid sh -c 'echo a; exec sleep 300' & nohup sh -c 'echo b; exec sleep 301' & "
              "echo c; sleep 302")
    result = until_started(lambda timeout: sandbox.exec(script, timeout=timeout),
                           lambda result: sorted(result.stdout.split()) == ["a", "b", "c"])
    assert result.exit_code == TIMEOUT_EXIT_CODE
    left = sandbox.exec("pgrep -x sleep | wc -l").stdout.strip()
    if Capability.TREE_KILL in backend.capabilities:
        assert left == "0"
    else:  # only the command itself is promised to die
        assert sandbox.exec("pgrep -ax sleep | awk '$3 == 302' | wc -l").stdout == "0\n"


def test_commands_get_a_fresh_environment_with_home_and_the_given_variables(sandbox: Sandbox) -> None:
    result = sandbox.exec('echo "$HOME|$GREETING|${PYTEST_CURRENT_TEST:-unset}"', env={"GREETING": "hi there"})
    assert result.stdout == f"{sandbox.home}|hi there|unset\n"


def test_stdin_reaches_the_command(sandbox: Sandbox) -> None:
    assert sandbox.exec("tr a-z A-Z", stdin=b"quiet\n").stdout == "QUIET\n"


def test_a_stream_as_stdin_is_passed_on_until_its_end_of_file(sandbox: Sandbox) -> None:
    # (that it is passed on as it comes, not read whole first, shows where the wire can: the local
    # backend's CLI test; the Sprites fake starts a command only once its stdin has ended)
    read_end, write_end = os.pipe()
    with open(read_end, "rb", buffering=0) as stream:
        with open(write_end, "wb", buffering=0) as feed:
            feed.write(b"one\ntwo\n")
        result = sandbox.exec("while read line; do echo got-$line; done; echo eof", stdin=stream, timeout=60)
    assert (result.exit_code, result.stdout) == (0, "got-one\ngot-two\neof\n")


def test_output_streams_to_the_sinks_as_it_is_produced(sandbox: Sandbox) -> None:
    first = threading.Event()
    seen: list[bytes] = []

    def sink(chunk: bytes) -> None:
        seen.append(chunk)
        first.set()

    proc = sandbox.start("echo early; sleep 30", on_stdout=sink)
    try:
        assert first.wait(20), "the first line did not arrive while the command was still running"
        assert proc.poll() is None and b"".join(seen) == b"early\n"
    finally:
        proc.kill()
    assert proc.wait(30) is not None


def test_a_sink_that_fails_stops_the_command_and_its_error_comes_out_of_wait(sandbox: Sandbox) -> None:
    class Gone(Exception):
        pass

    def broken(chunk: bytes) -> None:
        raise Gone("reader went away")

    proc = sandbox.start(["yes"], on_stdout=broken)
    with pytest.raises(Gone):
        proc.wait(30)
    assert sandbox.exec("pgrep -x yes || echo none").stdout == "none\n"


def test_wait_with_a_timeout_returns_none_while_it_runs(sandbox: Sandbox) -> None:
    proc = sandbox.start("sleep 30")
    try:
        started = time.monotonic()
        assert proc.wait(0.2) is None and time.monotonic() - started < 20
    finally:
        proc.kill()
    assert proc.wait(30) is not None


def test_file_paths_are_absolute_and_writes_create_parents(sandbox: Sandbox) -> None:
    sandbox.write_file("/srv/deep/er/notes.txt", b"one\n")
    assert sandbox.read_file("/srv/deep/er/notes.txt") == b"one\n"
    sandbox.write_file("/srv/deep/er/notes.txt", b"two\n")  # replaces
    assert sandbox.exec("cat /srv/deep/er/notes.txt").stdout == "two\n"
    sandbox.delete_file("/srv/deep/er/notes.txt")
    for call in (lambda: sandbox.read_file("/srv/deep/er/notes.txt"),
                 lambda: sandbox.delete_file("/srv/deep/er/notes.txt")):
        with pytest.raises(SandboxFileNotFound):
            call()
    with pytest.raises(InvalidInput):
        sandbox.read_file("relative/path")


def test_open_says_whether_it_created_and_never_adopts_an_ephemeral_sandbox(backend: Backend) -> None:
    from hermes_sandboxes.errors import SandboxExists
    from hermes_sandboxes.names import unique_name

    name = unique_name("ct")
    first = backend.open(name)
    try:
        assert first.created is True
        assert backend.open(name).created is False and backend.get(name).created is False
    finally:
        first.destroy()
    ephemeral = backend.create_ephemeral(prefix="ct")
    try:
        with pytest.raises(SandboxExists):
            backend.open(ephemeral.name)
    finally:
        ephemeral.destroy()


def test_stop_keeps_the_files_and_the_next_command_starts_it_again(sandbox: Sandbox) -> None:
    sandbox.write_file("/root/kept", b"yes")
    sandbox.stop()
    assert str(sandbox.info().state) in ("stopped", "paused")
    assert sandbox.exec("cat /root/kept").stdout == "yes"


def test_destroy_is_idempotent_and_a_destroyed_sandbox_is_not_found(backend: Backend) -> None:
    from hermes_sandboxes.errors import SandboxNotFound
    from hermes_sandboxes.names import unique_name

    sb = backend.create(unique_name("ct"))
    sb.destroy()
    sb.destroy()
    with pytest.raises(SandboxNotFound):
        backend.get(sb.name)


def test_a_backend_reports_whether_it_can_run_here_and_closes_cleanly(backend: Backend) -> None:
    assert backend.unavailable_reason() is None
    assert backend.key and "/" not in backend.key
    backend.close()
    backend.close()
