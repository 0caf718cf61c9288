"""The fake E2B, driven by the real e2b SDK: it must behave like the service where our backend relies
on it (so the backend's tests mean something) and record exactly what the SDK sent."""

from __future__ import annotations

import contextlib
import os.path
import time
from collections.abc import Iterator
from typing import Any

import e2b
import pytest

from tests.fakes.e2b import FakeE2B

PAUSE = {"on_timeout": {"action": "pause", "keep_memory": False}}


@contextlib.contextmanager
def sdk_sandbox(opts: dict[str, Any], **kwargs: Any) -> Iterator[e2b.Sandbox]:
    sb = e2b.Sandbox.create(**{"template": "base", "timeout": 300, **kwargs}, **opts)
    try:
        yield sb
    finally:
        e2b.Sandbox.kill(sb.sandbox_id, **opts)


def wait_until(predicate: Any, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_create_records_the_request_and_commands_run_in_a_real_sandbox(fake: FakeE2B, sdk_opts: dict[str, Any]) -> None:
    with sdk_sandbox(sdk_opts, metadata={"team": "infra"}, envs={"GREETING": "hi"}, lifecycle=PAUSE) as sb:
        (create,) = fake.calls("POST", "/v2/sandboxes")
        assert create.headers["x-api-key"] == sdk_opts["api_key"]
        assert create.body == {"templateID": "base", "timeout": 300, "autoPause": True, "autoPauseMemory": False,
                               "metadata": {"team": "infra"}, "envVars": {"GREETING": "hi"}}
        result = sb.commands.run('echo "$GREETING from $(pwd)"; echo oops >&2')
        assert (result.stdout, result.stderr, result.exit_code) == ("hi from /home/user\n", "oops\n", 0)
        (start,) = fake.calls(rpc="Process/Start")
        assert start.sandbox_id == sb.sandbox_id
        assert start.body["cmd"] == "/bin/bash" and start.body["args"][:2] == ["-l", "-c"]
        with pytest.raises(e2b.CommandExitException) as exc:
            sb.commands.run("exit 7")
        assert exc.value.exit_code == 7
        # the command really ran in an isolated local sandbox, not on this host
        marker = f"/tmp/only-in-sandbox-{sb.sandbox_id}"
        assert sb.commands.run(f"touch {marker} && echo ok").stdout == "ok\n"
        assert not os.path.exists(marker)


def test_files_round_trip_and_a_missing_file_is_not_found(fake: FakeE2B, sdk_opts: dict[str, Any]) -> None:
    with sdk_sandbox(sdk_opts) as sb:
        sb.files.write("/home/user/deep/dir/a.bin", bytes(range(256)))  # parents are created
        assert bytes(sb.files.read("/home/user/deep/dir/a.bin", format="bytes")) == bytes(range(256))
        sb.files.write("/home/user/b.txt", b"octet", use_octet_stream=True)
        assert sb.files.read("/home/user/b.txt") == "octet"
        uploads = fake.calls("POST", "/files")
        assert [u.body["content_type"] for u in uploads] == ["multipart/form-data", "application/octet-stream"]
        with pytest.raises(e2b.FileNotFoundException):
            sb.files.read("/home/user/nope")
        sb.files.remove("/home/user/deep")
        assert not sb.files.exists("/home/user/deep/dir/a.bin")


def test_a_command_is_killed_by_pid_and_the_sandbox_and_other_processes_survive(
        fake: FakeE2B, sdk_opts: dict[str, Any]) -> None:
    with sdk_sandbox(sdk_opts) as sb:
        daemon = sb.commands.run("sleep 300", background=True, timeout=0)
        victim = sb.commands.run("sleep 300", background=True, timeout=0)
        assert sb.commands.kill(victim.pid)
        with pytest.raises(e2b.CommandExitException) as exc:
            victim.wait()
        assert (exc.value.exit_code, exc.value.error) == (-1, "signal: killed")
        (signal,) = fake.calls(rpc="Process/SendSignal")
        assert signal.body == {"pid": victim.pid, "signal": "SIGKILL"}
        assert [p.pid for p in sb.commands.list()] == [daemon.pid]
        assert sb.commands.run("echo alive").stdout == "alive\n"
        assert not sb.commands.kill(victim.pid)  # gone: NOT_FOUND
        daemon.disconnect()
        assert sb.commands.kill(daemon.pid)


def test_the_stream_deadline_bounds_a_command_and_closing_a_stream_does_not(
        fake: FakeE2B, sdk_opts: dict[str, Any]) -> None:
    with sdk_sandbox(sdk_opts) as sb:
        with pytest.raises(e2b.TimeoutException):
            sb.commands.run("sleep 60", timeout=0.5)
        (start,) = fake.calls(rpc="Process/Start")
        assert start.body["timeout_ms"] == 500
        wait_until(lambda: sb.commands.list() == [], "the timed-out command to be killed")
        handle = sb.commands.run("until [ -e /tmp/go ]; do sleep 0.05; done; echo later; sleep 60",
                                 background=True, timeout=0)
        handle.disconnect()
        assert [p.pid for p in sb.commands.list()] == [handle.pid]
        again = sb.commands.connect(handle.pid, timeout=0)  # follow it again from another stream
        sb.files.write("/tmp/go", b"")
        chunks: list[str] = []

        def got(chunk: str) -> None:
            chunks.append(chunk)
            sb.commands.kill(handle.pid)

        with pytest.raises(e2b.CommandExitException):
            again.wait(on_stdout=got)
        assert "".join(chunks) == "later\n"


def test_stdin_is_delivered_when_closed(fake: FakeE2B, sdk_opts: dict[str, Any]) -> None:
    with sdk_sandbox(sdk_opts) as sb:
        handle = sb.commands.run("wc -c", background=True, stdin=True, timeout=0)
        sb.commands.send_stdin(handle.pid, b"12345")
        sb.commands.close_stdin(handle.pid)
        assert handle.wait().stdout.strip() == "5"


def test_list_filters_by_metadata_and_state_and_pages(fake: FakeE2B, sdk_opts: dict[str, Any]) -> None:
    with (sdk_sandbox(sdk_opts, metadata={"scope": "a"}) as a1, sdk_sandbox(sdk_opts, metadata={"scope": "a"}) as a2,
          sdk_sandbox(sdk_opts, metadata={"scope": "b"}, lifecycle=PAUSE) as b):
        pages = e2b.Sandbox.list(query=e2b.SandboxQuery(metadata={"scope": "a"}), limit=1, **sdk_opts)
        found = []
        while pages.has_next:
            found += [s.sandbox_id for s in pages.next_items()]
        assert sorted(found) == sorted([a1.sandbox_id, a2.sandbox_id])
        assert len(fake.calls("GET", "/v2/sandboxes")) == 2  # two pages of one
        fake.pause(b.sandbox_id)
        paused = e2b.Sandbox.list(query=e2b.SandboxQuery(state=[e2b.SandboxState.PAUSED]), **sdk_opts)
        assert [s.sandbox_id for s in paused.next_items()] == [b.sandbox_id]


def test_connect_resumes_a_paused_sandbox_and_only_extends_a_running_lease(
        fake: FakeE2B, sdk_opts: dict[str, Any]) -> None:
    with sdk_sandbox(sdk_opts, lifecycle=PAUSE) as sb:
        sb.files.write("/home/user/keep.txt", b"kept")
        end = fake.sandbox(sb.sandbox_id).end_at
        e2b.Sandbox.connect(sb.sandbox_id, timeout=10, **sdk_opts)
        assert fake.sandbox(sb.sandbox_id).end_at == end  # never shortened
        e2b.Sandbox.connect(sb.sandbox_id, timeout=3000, **sdk_opts)
        assert fake.sandbox(sb.sandbox_id).end_at > end + 2000
        sb.commands.run("sleep 300", background=True, timeout=0).disconnect()
        fake.expire(sb.sandbox_id)  # the lease ran out: on-timeout pause
        with pytest.raises(e2b.SandboxNotRunningException):
            sb.commands.run("true")
        resumed = e2b.Sandbox.connect(sb.sandbox_id, timeout=300, **sdk_opts)
        assert resumed.files.read("/home/user/keep.txt") == "kept"
        assert resumed.commands.list() == []  # a pause without memory ends every process


def test_an_expired_lease_without_pause_kills_the_sandbox(fake: FakeE2B, sdk_opts: dict[str, Any]) -> None:
    sb = e2b.Sandbox.create("base", timeout=300, **sdk_opts)
    fake.expire(sb.sandbox_id)
    with pytest.raises(e2b.SandboxNotFoundException):
        e2b.Sandbox.connect(sb.sandbox_id, **sdk_opts)


def test_snapshots_carry_files_and_deletions_into_new_sandboxes(fake: FakeE2B, sdk_opts: dict[str, Any]) -> None:
    with sdk_sandbox(sdk_opts) as sb:
        sb.commands.run("echo one > /home/user/f && rm /etc/hostname && mkdir -p /opt/x && echo two > /opt/x/g")
        snap = sb.create_snapshot(name="nightly")
        sb.commands.run("echo later > /home/user/f")
        listed = e2b.Sandbox.list_snapshots(name="nightly", **sdk_opts).next_items()
        assert [s.snapshot_id for s in listed] == [snap.snapshot_id]
        with sdk_sandbox(sdk_opts, template=snap.snapshot_id) as copy:
            out = copy.commands.run("cat /home/user/f /opt/x/g; test -e /etc/hostname || echo gone").stdout
            assert out == "one\ntwo\ngone\n"
        assert e2b.Sandbox.delete_snapshot(snap.snapshot_id, **sdk_opts)
        assert not e2b.Sandbox.delete_snapshot(snap.snapshot_id, **sdk_opts)


def test_injected_faults(fake: FakeE2B, sdk_opts: dict[str, Any]) -> None:
    count = len(fake.sandboxes())
    fake.fail("POST", "/v2/sandboxes", 500)
    with pytest.raises(e2b.SandboxException) as exc:
        e2b.Sandbox.create("base", **sdk_opts)
    assert getattr(exc.value, "status_code", None) == 500
    assert len(fake.sandboxes()) == count  # an answered failure made nothing
    with pytest.raises(e2b.AuthenticationException):
        e2b.Sandbox.create("base", **{**sdk_opts, "api_key": "e2b_wrong"})

    fake.drop_create_response()
    with pytest.raises(Exception) as lost:  # a transport error: the reply never arrived
        e2b.Sandbox.create("base", metadata={"lost": "1"}, timeout=300, **sdk_opts)
    assert not isinstance(lost.value, e2b.SandboxException)
    (orphan,) = [s for s in fake.sandboxes() if s.metadata.get("lost") == "1"]
    sb = e2b.Sandbox.connect(orphan.sandbox_id, **sdk_opts)
    try:
        fake.drop_stream(after_events=2)  # the start event and one chunk get through
        handle = sb.commands.run("echo first; sleep 0.2; echo second; sleep 300", background=True, timeout=0)
        with pytest.raises(Exception):  # noqa: B017 - the SDK surfaces the broken stream as it can
            handle.wait()
        assert [p.pid for p in sb.commands.list()] == [handle.pid]  # the command outlived its stream
        sb.commands.kill(handle.pid)
    finally:
        sb.kill()
