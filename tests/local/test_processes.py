"""Commands and their processes: timeouts kill everything a command started (and nothing else),
kill() from start(), background daemons live between execs, exec returns when the command exits.

The tests share one sandbox (loopback network, for the web server): each uses its own sleep
durations as markers, so one test's processes never satisfy another's check.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator

import pytest

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox
from hermes_sandboxes.errors import InvalidInput
from hermes_sandboxes.sandbox import Process, SandboxSpec
from tests.interrupts import sigint_raises
from tests.local.kit import box_dir, init_state, new_sandbox, pid_alive, sandbox_commands, sh, wait_for
from tests.patience import until_started


@pytest.fixture(scope="module")
def sb(local_backend: LocalBackend) -> Iterator[LocalSandbox]:
    with new_sandbox(local_backend, SandboxSpec(network="loopback")) as sandbox:
        yield sandbox


def _running(sb: LocalSandbox, *markers: str) -> set[str]:
    """Which of ``markers`` (e.g. "sleep 7001") appear in a process command line inside."""
    commands = sandbox_commands(sb)
    return {m for m in markers if any(c == m or c.startswith(m + " ") for c in commands)}


DOUBLE_FORK = r"""
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp("sleep", ["sleep", "7005"])
    os._exit(0)
time.sleep(0.2)
"""


def test_a_timeout_returns_124_and_says_so(sb: LocalSandbox) -> None:
    result = until_started(lambda timeout: sb.exec("echo before; sleep 7010; echo after", timeout=timeout),
                           lambda result: result.stdout != "")
    assert result.exit_code == 124 and result.timed_out
    assert result.stdout == "before\n"
    assert not _running(sb, "sleep 7010")


def test_a_timeout_kills_setsid_nohup_and_double_forked_children_but_not_an_earlier_daemon(
        sb: LocalSandbox) -> None:
    sh(sb, "nohup sleep 7001 >/dev/null 2>&1 &")  # a daemon of an earlier command
    script = (
        "setsid sleep 7002 & "  # keeps stdout open, in a session of its own
        "nohup sleep 7003 >/dev/null 2>&1 & "
        "(sleep 7004 >/dev/null 2>&1 &); "  # orphaned at once: reparented to the init
        f"python3 -c '{DOUBLE_FORK}'; "  # setsid + double fork: the classic daemon
        "sleep 7000"
    )
    result = sb.exec(script, timeout=3)
    assert result.exit_code == 124 and result.timed_out
    markers = ("sleep 7000", "sleep 7002", "sleep 7003", "sleep 7004", "sleep 7005")
    assert _running(sb, "sleep 7001", *markers) == {"sleep 7001"}


def test_the_children_exist_until_the_timeout(sb: LocalSandbox) -> None:
    """The check above could pass if the children never started: here they are seen alive first."""
    proc = sb.start("setsid sleep 7022 & nohup sleep 7023 >/dev/null 2>&1 & "
                    f"(sleep 7024 >/dev/null 2>&1 &); python3 -c '{DOUBLE_FORK.replace('7005', '7025')}'; "
                    "sleep 7020")
    markers = ("sleep 7020", "sleep 7022", "sleep 7023", "sleep 7024", "sleep 7025")
    wait_for(lambda: _running(sb, *markers) == set(markers), "the command's children to start")
    proc.kill()
    assert proc.wait(30) == 137
    assert not _running(sb, *markers)


def test_kill_from_start_ends_the_command_and_everything_it_started(sb: LocalSandbox) -> None:
    out = bytearray()
    proc = sb.start("sleep 7101 & setsid sleep 7102 & echo started; sleep 7100", on_stdout=out.extend)
    wait_for(lambda: b"started" in out, "the command to start")
    assert proc.poll() is None
    proc.kill()
    assert proc.wait(30) == 137  # 128 + SIGKILL
    assert proc.returncode == 137
    assert not _running(sb, "sleep 7100", "sleep 7101", "sleep 7102")
    assert sh(sb, "echo fine").stdout == "fine\n"


FETCH = """
import time, urllib.request
for _ in range(400):  # the server may still be starting
    try:
        print(urllib.request.urlopen("http://127.0.0.1:8765/hello.txt").read().decode(), end="")
        break
    except OSError:
        time.sleep(0.05)
"""


def test_a_background_web_server_keeps_serving_between_execs(sb: LocalSandbox) -> None:
    sh(sb, "mkdir -p /srv/www && echo served > /srv/www/hello.txt && cd /srv/www && "
           "nohup python3 -m http.server 8765 --bind 127.0.0.1 >/dev/null 2>&1 &")
    fetch = ["python3", "-c", FETCH]
    assert sb.exec(fetch).stdout == "served\n"
    pid = sh(sb, "pgrep -f 'http.server 8765'").stdout.split()
    sh(sb, "echo another command")
    assert sb.exec(fetch).stdout == "served\n"
    assert sh(sb, "pgrep -f 'http.server 8765'").stdout.split() == pid


def test_a_sleep_loop_daemon_keeps_writing_between_execs(sb: LocalSandbox) -> None:
    sh(sb, "nohup sh -c 'while :; do echo tick >> /root/ticks; sleep 0.05; done' >/dev/null 2>&1 &")

    def ticks() -> int:
        return int(sh(sb, "cat /root/ticks 2>/dev/null | wc -l").stdout)

    first = ticks()
    wait_for(lambda: ticks() > first + 2, "the daemon to keep ticking")


def test_exec_returns_when_the_command_exits_even_if_a_background_child_holds_stdout(
        sb: LocalSandbox) -> None:
    result = sb.exec("sleep 7200 & sleep 7201 >&2 & echo done", timeout=60)
    assert not result.timed_out
    assert (result.exit_code, result.stdout) == (0, "done\n")
    # (the shell returned once it forked them: a child may not have become `sleep` yet)
    wait_for(lambda: _running(sb, "sleep 7200", "sleep 7201") == {"sleep 7200", "sleep 7201"},
             "both background children running on")


def test_exit_codes_output_streams_stdin_env_and_cwd_reach_the_caller(sb: LocalSandbox) -> None:
    result = sb.exec("cat; echo err >&2; echo $GREETING; pwd; exit 3", stdin=b"from stdin\n",
                     env={"GREETING": "hi"}, cwd="/etc")
    assert (result.exit_code, result.stdout, result.stderr) == (3, "from stdin\nhi\n/etc\n", "err\n")
    assert sb.exec(["sh", "-c", "kill -TERM $$"]).exit_code == 128 + 15
    assert sb.exec(["no-such-program-hsl"]).exit_code == 127
    with pytest.raises(InvalidInput):
        sb.exec("true", cwd="relative")


def test_output_of_any_size_is_bounded_in_memory(sb: LocalSandbox) -> None:
    result = sb.exec("head -c 50000000 /dev/zero | tr '\\0' x; echo; echo the-end", capture_limit=64 * 1024)
    assert result.exit_code == 0 and result.truncated
    assert len(result.stdout) < 70 * 1024
    assert result.stdout.startswith("xxxx") and result.stdout.endswith("the-end\n")


def test_a_started_command_streams_its_output_without_anyone_waiting(sb: LocalSandbox) -> None:
    """start() with a sink: output flows as it comes, so a chatty command never blocks on a full pipe."""
    received = bytearray()
    lock = threading.Lock()

    def sink(chunk: bytes) -> None:
        with lock:
            received.extend(chunk)

    proc = sb.start("head -c 3000000 /dev/zero; echo finished > /root/streamed", on_stdout=sink)
    wait_for(lambda: sb.exec("cat /root/streamed").stdout == "finished\n", "the command to finish unattended")
    wait_for(lambda: len(received) == 3_000_000, "all of the output to reach the sink")
    assert proc.wait(30) == 0


def test_large_stdin_and_files_pass_through_whole(sb: LocalSandbox) -> None:
    data = bytes(range(256)) * 40_000  # ~10 MB: far beyond a pipe's buffer
    result = sb.exec("sha256sum | cut -d' ' -f1", stdin=data)
    assert result.stdout.strip() == hashlib.sha256(data).hexdigest()
    sb.write_file("/root/big", data)
    assert sb.read_file("/root/big") == data


def test_killing_a_finished_process_is_harmless(sb: LocalSandbox) -> None:
    proc = sb.start("true")
    assert proc.wait(30) == 0
    proc.kill()
    assert proc.returncode == 0


def test_many_commands_leave_no_cgroup_or_descriptor_behind(local_backend: LocalBackend) -> None:
    with new_sandbox(local_backend) as fresh:
        sh(fresh, "true")
        freezer = box_dir(fresh, "freezer")  # where each command gets its group
        fds_before = len(os.listdir("/proc/self/fd"))
        for i in range(40):
            assert fresh.exec(f"echo {i}").stdout == f"{i}\n"
        fresh.exec("sleep 7300", timeout=0.2)
        # What stays: the init's stubs (cgroup v1), each in a spare group of its own, none empty.
        wait_for(lambda: not [p for p in freezer.iterdir() if p.is_dir() and not p.name.startswith("spare")]
                 and all((p / "cgroup.procs").read_text().strip() for p in freezer.glob("spare*")),
                 "the per-command groups to go")
        assert len(os.listdir("/proc/self/fd")) <= fds_before + 2


@pytest.mark.parametrize("bad", [
    {"env": {"BAD=KEY": "x"}}, {"env": {"": "x"}}, {"env": {"KEY": "nul\0inside"}},
    {"command": ["echo", "nul\0inside"]}, {"command": "echo nul\0inside"}, {"cwd": "/tmp\0x"},
], ids=["env-key-with-equals", "empty-env-key", "nul-in-env", "nul-in-argv", "nul-in-shell", "nul-in-cwd"])
def test_a_malformed_command_is_refused_and_harms_nothing_running(sb: LocalSandbox, bad: dict[str, object]) -> None:
    sh(sb, "nohup sleep 7901 >/dev/null 2>&1 &")
    # the shell returns before its background child has become sleep (slow under load): wait for it
    wait_for(lambda: "sleep 7901" in sandbox_commands(sb), "the background sleep to start")
    init = init_state(sb)["pid"]
    command = bad.get("command", "true")
    with pytest.raises(InvalidInput):
        sb.exec(command, env=bad.get("env"), cwd=bad.get("cwd"))  # type: ignore[arg-type]
    assert pid_alive(init) and init_state(sb)["pid"] == init
    assert "sleep 7901" in sandbox_commands(sb)
    sh(sb, "pkill -f 'sleep 7901'")


def test_a_missing_or_unusable_working_directory_fails_the_command_only(sb: LocalSandbox) -> None:
    missing = sb.exec("true", cwd="/nonexistent")
    assert missing.exit_code != 0 and "/nonexistent" in missing.stderr
    assert sb.exec("true", cwd="/etc/passwd").exit_code != 0
    assert sh(sb, "pwd", cwd="/usr").stdout == "/usr\n"


def test_a_malformed_request_fails_alone_and_the_init_lives_on(sandbox: LocalSandbox) -> None:
    # Bypass the host-side checks of LocalSandbox and speak to the init directly, as a buggy or
    # older client could: the request is refused and a daemon started before it survives.
    from hermes_sandboxes.backends.local import client
    from hermes_sandboxes.backends.local.guest import protocol

    # a sleep of its own length: the sandbox may be shared, and another test's sleeps come and go
    daemon = "pgrep -fx 'sleep 6017'"
    sandbox.exec("sleep 6017 >/dev/null 2>&1 &")
    # the shell returns before its background child has become `sleep`: wait until it has
    wait_for(lambda: sandbox.exec(daemon).stdout.strip() != "", "the background sleep")
    before = sandbox.exec(daemon).stdout.split()
    with client.connect(str(sandbox._socket)) as sock:
        r, w = os.pipe()
        protocol.send(sock, {"op": "exec", "id": "bad1", "argv": ["true"], "env": {"A=B": "x"}}, [r, w, w])
        os.close(r)
        os.close(w)
        reply, _ = protocol.recv(sock)
    assert "error" in reply
    assert sandbox.exec(daemon).stdout.split() == before


def test_a_program_that_is_not_executable_exits_126(sandbox: LocalSandbox) -> None:
    sandbox.write_file("/root/tool", b"#!/bin/sh\necho hi\n", mode=0o644)
    result = sandbox.exec(["/root/tool"])
    assert result.exit_code == 126 and "Permission denied" in result.stderr
    assert sandbox.exec(["no-such-program-here"]).exit_code == 127


def test_a_kill_from_inside_an_output_sink_kills_at_once(sandbox: LocalSandbox) -> None:
    holder: dict[str, Process] = {}
    ready = threading.Event()

    def sink(chunk: bytes) -> None:
        ready.wait(30)  # output may arrive before start() has returned the process
        if not holder.get("killed"):
            holder["killed"] = holder["proc"]
            holder["proc"].kill()

    proc = sandbox.start("echo start; sleep 100", on_stdout=sink)
    holder["proc"] = proc
    ready.set()
    assert proc.wait(60) == 137  # killed, well before the sleep (and not after a 10 s stall)
    assert sandbox.exec("pgrep -x sleep || echo none").stdout.strip() == "none"


def test_a_sink_that_raises_stops_its_command_and_wait_raises_its_error(sandbox: LocalSandbox) -> None:
    def sink(chunk: bytes) -> None:
        raise BrokenPipeError("the reader went away")

    proc = sandbox.start("echo start; sleep 100", on_stdout=sink)
    with pytest.raises(BrokenPipeError):
        proc.wait(60)
    assert proc.returncode == 137
    assert sandbox.exec("pgrep -x sleep || echo none").stdout.strip() == "none"


def test_an_interrupted_exec_leaves_no_command_running(sandbox: LocalSandbox) -> None:
    import signal

    with sigint_raises():
        timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            sandbox.exec("sleep 100")
        timer.join()
    assert sandbox.exec("pgrep -x sleep || echo none").stdout.strip() == "none"


def test_attach_runs_a_command_on_the_callers_own_descriptors(sandbox: LocalSandbox) -> None:
    out_r, out_w = os.pipe()
    in_r, in_w = os.pipe()
    os.write(in_w, b"from the caller\n")
    os.close(in_w)
    try:
        proc = sandbox.attach("cat; echo done >&2; exit 4", (in_r, out_w, out_w))
        os.close(out_w)
        assert proc.wait(30) == 4
        assert os.read(out_r, 1000) == b"from the caller\ndone\n"
    finally:
        os.close(in_r)
        os.close(out_r)
