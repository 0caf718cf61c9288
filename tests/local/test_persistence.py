"""Persistence: a named sandbox outlives the host process that made it, a stop, and a killed init."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox, cgroups
from hermes_sandboxes.backends.local import paths as local_paths
from hermes_sandboxes.backends.local.guest import protocol
from hermes_sandboxes.sandbox import SandboxState
from tests.local.kit import PYTHON, cgroup_dir, fresh_name, init_state, pid_alive, sandbox_commands, sh, wait_for


def _in_new_process(home: Path, code: str) -> str:
    """Run ``code`` (with ``backend`` bound to a fresh LocalBackend on ``home``) in a new Python."""
    script = "from hermes_sandboxes.backends.local import LocalBackend\n" \
             f"backend = LocalBackend({str(home)!r})\n" + textwrap.dedent(code)
    proc = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_files_and_daemons_outlive_the_host_process_that_created_them(local_backend: LocalBackend) -> None:
    name = fresh_name()
    try:
        out = _in_new_process(local_backend.home, f"""
            sb = backend.open({name!r})
            sb.write_file("/root/from-first", b"written by the first process\\n")
            assert sb.exec("nohup sleep 7301 >/dev/null 2>&1 &").exit_code == 0
            import json
            print(json.load(open(backend.layout.run_dir({name!r}) / "init.json"))["pid"])
        """)
        first_init = int(out)
        sb = local_backend.get(name)
        assert not sb.ephemeral
        assert sb.read_file("/root/from-first") == b"written by the first process\n"
        assert "sleep 7301" in sandbox_commands(sb)  # the daemon kept running: same init
        assert init_state(sb)["pid"] == first_init
        sb.write_file("/root/from-test", b"written by the test process\n")
        out = _in_new_process(local_backend.home, f"""
            print(backend.get({name!r}).read_file("/root/from-test").decode(), end="")
        """)
        assert out == "written by the test process\n"
    finally:
        local_backend.get(name).destroy()


def test_after_stop_the_next_exec_starts_the_init_again_and_files_are_there(sandbox: LocalSandbox) -> None:
    sh(sandbox, "echo kept > /root/kept; nohup sleep 7302 >/dev/null 2>&1 &")
    old = init_state(sandbox)
    group = cgroup_dir(sandbox, "freezer")
    sandbox.stop()
    assert not pid_alive(old["pid"])
    assert sandbox.info().state == SandboxState.STOPPED
    assert not cgroups.procs(group)
    assert sh(sandbox, "cat /root/kept").stdout == "kept\n"
    assert sandbox.info().state == SandboxState.RUNNING
    assert init_state(sandbox)["pid"] != old["pid"]
    assert "sleep 7302" not in sandbox_commands(sandbox)  # processes do not survive a stop


def test_an_init_killed_from_the_host_is_restarted_by_the_next_exec(sandbox: LocalSandbox) -> None:
    sh(sandbox, "echo kept > /root/kept")
    old = init_state(sandbox)["pid"]
    os.kill(old, signal.SIGKILL)  # our own sandbox's init, started by this test
    wait_for(lambda: not pid_alive(old), "the init to die")
    assert sh(sandbox, "cat /root/kept").stdout == "kept\n"
    new = init_state(sandbox)["pid"]
    assert new != old and pid_alive(new)
    assert sh(sandbox, "echo again").stdout == "again\n"


@pytest.mark.parametrize("stale", ["another-boot", "reused-pid"])
def test_a_stale_runtime_record_is_not_trusted_and_its_pid_is_left_alone(sandbox: LocalSandbox,
                                                                        stale: str) -> None:
    """After a reboot (another boot id) or with a pid reused by another program (another start
    time), the recorded pid is not the init: a fresh init starts and that program is untouched."""
    sh(sandbox, "echo kept > /root/kept")
    groups = init_state(sandbox)["cgroups"]
    sandbox.stop()
    bystander = subprocess.Popen(["sleep", "600"])
    try:
        record = {"pid": bystander.pid, "start": local_paths.process_start_time(bystander.pid),
                  "boot": local_paths.boot_id(), "cgroups": groups, "protocol": getattr(protocol, "VERSION", None)}
        if stale == "another-boot":
            record["boot"] = "00000000-0000-0000-0000-000000000000"
        else:
            record["start"] = (record["start"] or 0) + 1
        state_file = sandbox.backend.layout.run_dir(sandbox.name) / "init.json"
        state_file.write_text(json.dumps(record))
        assert sh(sandbox, "cat /root/kept").stdout == "kept\n"
        assert init_state(sandbox)["pid"] != bystander.pid
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_info_reports_state_and_layer_size(sandbox: LocalSandbox) -> None:
    assert sandbox.info().state == SandboxState.STOPPED  # created, never run
    before = sandbox.info().layer_bytes or 0
    sh(sandbox, "head -c 4000000 /dev/urandom > /root/blob")
    info = sandbox.info()
    assert info.state == SandboxState.RUNNING and info.name == sandbox.name and info.backend == "local"
    assert (info.layer_bytes or 0) >= before + 4_000_000
