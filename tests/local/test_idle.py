"""``idle_timeout`` on the local backend: the sandbox's init stops it after that long without a command
(files and checkpoints kept, journaled as an idle stop by the next call), never while a command's
client waits for it, also when every host process of ours was killed with -9 before the timeout;
the next command starts it again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_sandboxes.backends.local import LocalBackend
from hermes_sandboxes.backends.local.sandbox import LocalSandbox
from hermes_sandboxes.names import unique_name
from hermes_sandboxes.recorder.records import ExecRecord, StopRecord
from hermes_sandboxes.recorder.state import HostState
from hermes_sandboxes.sandbox import SandboxSpec, SandboxState

IDLE_S = 2.0
DEADLINE_S = 60.0  # how long a test waits for the event it expects (the machine is shared)


@pytest.fixture
def idle_box(local_backend: LocalBackend) -> Iterator[LocalSandbox]:
    sb = local_backend.create(unique_name("idle"), SandboxSpec(idle_timeout=IDLE_S))
    try:
        yield sb
    finally:
        sb.destroy()


def _wait_stopped(sb: LocalSandbox) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while sb.is_running():
        assert time.monotonic() < deadline, f"{sb.name} still runs {DEADLINE_S:.0f}s after its idle timeout"
        time.sleep(0.1)


def _sleepers(sb: LocalSandbox) -> str:
    return sb.exec("pgrep -f 'sleep 100[0-9]' || true").stdout.strip()


def test_an_idle_sandbox_is_stopped_its_files_kept_and_the_next_command_starts_it(idle_box: LocalSandbox) -> None:
    recorded = HostState().recorded(idle_box)
    assert recorded.exec("echo kept > /root/f && (setsid sleep 1001 >/dev/null 2>&1 &)").result.exit_code == 0
    checkpoint = recorded.checkpoint("before idling")
    assert _sleepers(idle_box), "the background process runs"
    _wait_stopped(idle_box)
    assert idle_box.info().state is SandboxState.STOPPED
    after = recorded.exec("cat /root/f")  # transparently started again
    assert after.result.exit_code == 0 and after.result.stdout == "kept\n"
    assert _sleepers(idle_box) == "", "the idle stop ended the background process"
    assert [c.id for c in recorded.checkpoints()] == [checkpoint.id]
    stops = recorded.journal.records_of(StopRecord, sandbox=idle_box.name)
    assert len(stops) == 1 and stops[0].reason == "idle" and stops[0].idle_timeout == IDLE_S, stops
    # journaled before the command that started it again
    records = recorded.journal.records(sandbox=idle_box.name)
    kinds = [type(r).__name__ for r in records if isinstance(r, StopRecord | ExecRecord)]
    assert kinds[-2:] == ["StopRecord", "ExecRecord"], kinds


def test_a_command_longer_than_the_idle_timeout_is_never_stopped(idle_box: LocalSandbox) -> None:
    started = time.monotonic()
    result = idle_box.exec(f"sleep {3 * IDLE_S:g}; echo finished")
    assert result.exit_code == 0 and result.stdout == "finished\n"
    assert time.monotonic() - started >= 3 * IDLE_S
    assert idle_box.take_idle_stops() == [], "it was never stopped under the command"


def test_every_host_process_killed_before_the_timeout_still_ends_in_a_stopped_sandbox(
        idle_box: LocalSandbox, local_backend: LocalBackend) -> None:
    # a host process of ours that started a command and a background job, killed with -9 while
    # the command runs: nothing on the host is left to enforce anything
    script = textwrap.dedent(f"""
        import sys
        from hermes_sandboxes.backends.local import LocalBackend
        from hermes_sandboxes.recorder.state import HostState
        sb = LocalBackend({str(local_backend.home)!r}).get({idle_box.name!r})
        recorded = HostState().recorded(sb)
        recorded.exec("(setsid sleep 1002 >/dev/null 2>&1 &)")
        print("started", flush=True)
        recorded.exec("sleep 1003")
    """)
    host = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout is not None and host.stdout.readline().strip() == "started"
        deadline = time.monotonic() + DEADLINE_S
        while "sleep 1003" not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout:
            assert time.monotonic() < deadline, "the foreground command never started"
            time.sleep(0.05)
    finally:
        os.kill(host.pid, signal.SIGKILL)
        host.wait()
    _wait_stopped(idle_box)
    recorded = HostState().recorded(idle_box)
    written = recorded.settle()
    assert any(isinstance(r, StopRecord) and r.reason == "idle" for r in written), written
    lost = [r for r in written if isinstance(r, ExecRecord)]
    assert [r.command for r in lost] == ["sleep 1003"] and lost[0].exit_code is None, lost
    assert _sleepers(idle_box) == ""


def test_an_idle_timeout_is_refused_unless_positive(local_backend: LocalBackend) -> None:
    from hermes_sandboxes.errors import InvalidInput

    with pytest.raises(InvalidInput, match="positive number of seconds"):
        local_backend.create(unique_name("idle"), SandboxSpec(idle_timeout=0))


def test_the_cli_and_the_config_file_set_it(local_backend: LocalBackend, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.cli.cli_kit import ok

    home = local_backend.home
    flagged, configured = unique_name("idle"), unique_name("idle")
    try:
        ok(home, "create", flagged, "--idle-timeout", "90s")
        assert local_backend.get(flagged).info().spec.idle_timeout == 90.0
        config = tmp_path / "config.toml"
        config.write_text("[local]\nidle_timeout = \"2h\"\n")
        monkeypatch.setenv("HERMES_SANDBOXES_CONFIG", str(config))
        ok(home, "create", configured)
        assert local_backend.get(configured).info().spec.idle_timeout == 7200.0
    finally:
        for name in (flagged, configured):
            if name in local_backend.names():
                local_backend.get(name).destroy()


def test_an_attached_terminal_keeps_the_sandbox_up(idle_box: LocalSandbox) -> None:
    master, slave = os.openpty()
    try:
        proc = idle_box.attach(["sleep", f"{3 * IDLE_S:g}"], (slave, slave, slave))
        os.close(slave)
        slave = -1
        assert proc.wait(DEADLINE_S) == 0
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    assert idle_box.take_idle_stops() == [], "not stopped under an attached terminal"


def test_an_idle_stop_ends_the_sandboxs_egress_proxy_too(local_backend: LocalBackend) -> None:
    import json

    sb = local_backend.create(unique_name("idle"), SandboxSpec(network="proxy", allow=("127.0.0.1:9",),
                                                               idle_timeout=IDLE_S))
    try:
        assert sb.exec("true").exit_code == 0
        state = json.loads((local_backend.layout.run_dir(sb.name) / "init.json").read_text())
        proxy = int(state["egress"]["pid"])
        assert os.path.exists(f"/proc/{proxy}")
        _wait_stopped(sb)
        deadline = time.monotonic() + DEADLINE_S
        while _alive(proxy):
            assert time.monotonic() < deadline, "the proxy outlived the sandbox's idle stop"
            time.sleep(0.05)
        assert sb.exec("true").exit_code == 0, "the next command starts the sandbox and a proxy again"
    finally:
        sb.destroy()


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent to reap it has exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
