"""The E2B backend against the fake E2B, through the real SDK: what it sends (recorded requests) and
what the caller gets back."""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import e2b
import pytest

from hermes_sandboxes.backends.e2b import E2BBackend, E2BSandbox, scope_digest
from hermes_sandboxes.backends.e2b.settings import E2BSettings
from hermes_sandboxes.errors import (
    AuthenticationFailed,
    CheckpointNotFound,
    InvalidInput,
    SandboxError,
    SandboxExists,
    SandboxFileNotFound,
    SandboxNotFound,
    SandboxUnreachable,
    SpecMismatch,
    Unsupported,
)
from hermes_sandboxes.sandbox import ExecResult, Limits, SandboxSpec, SandboxState
from hermes_sandboxes.settings import InvalidSettings, validate_settings
from tests.fakes.e2b import API_KEY, FakeE2B
from tests.patience import until_started


@pytest.fixture
def backend(fake: FakeE2B) -> Iterator[E2BBackend]:
    """A backend for a profile of its own, so tests never see each other's sandboxes."""
    with E2BBackend(E2BSettings(lease_seconds=300, command_grace_seconds=30), api_key=API_KEY,
                    profile=f"/profiles/{secrets.token_hex(4)}", api_url=fake.url, sandbox_url=fake.url) as b:
        yield b
        for info in b.list():
            with contextlib.suppress(SandboxError):
                b.get(info.name).destroy()


def wait_until(predicate: Any, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@contextlib.contextmanager
def opened(backend: E2BBackend, name: str = "work", **kwargs: Any) -> Iterator[E2BSandbox]:
    sb = backend.open(name, **kwargs)
    try:
        yield sb
    finally:
        sb.destroy()


def test_identity_digest_is_the_existing_plugins() -> None:
    # pinned: a sandbox made by the existing E2B plugin for this scope must be found by this backend
    digest = scope_digest("/profiles/alice", "default", E2BSettings(), persistent=True)
    assert digest == "af82ed0fcb6d476fb28b0ef2ef723162"
    assert scope_digest("/profiles/alice", "default", E2BSettings(secure=False), persistent=True) != digest
    assert scope_digest("/profiles/alice", "default", E2BSettings(), persistent=False) != digest


def test_open_creates_a_persistent_sandbox_once_and_finds_it_again(fake: FakeE2B, backend: E2BBackend) -> None:
    with opened(backend) as sb:
        (create,) = fake.calls("POST", "/v2/sandboxes")
        body = create.body
        assert body["templateID"] == "base" and body["timeout"] == 300 + 30  # the lease and its headroom
        assert (body["autoPause"], body["autoPauseMemory"], body["autoResume"]) == (True, False, {"enabled": False})
        scope = scope_digest(backend.profile, "work", backend.settings, persistent=True)
        assert body["metadata"]["hermes_plugin"] == "e2b-terminal"
        assert body["metadata"]["hermes_scope"] == scope == sb.scope
        assert sb.created and not sb.ephemeral and sb.home == "/home/user"
        again = backend.open("work")
        assert (again.sandbox_id, again.created) == (sb.sandbox_id, False)
        assert len(fake.calls("POST", "/v2/sandboxes")) == 1
        assert [i.name for i in backend.list()] == ["work"]
        with pytest.raises(SandboxExists):
            backend.create("work")


def test_an_ephemeral_sandbox_is_killed_at_its_lease_end_and_on_destroy(fake: FakeE2B, backend: E2BBackend) -> None:
    sb = backend.create_ephemeral()
    (create,) = fake.calls("POST", "/v2/sandboxes")
    assert create.body["autoPause"] is False and "autoPauseMemory" not in create.body
    assert create.body["timeout"] == 300 + 120 + 30  # the lease, the reaper and request-timeout floor, headroom
    assert sb.ephemeral
    # the lease runs out with nothing extending it: E2B kills an ephemeral sandbox (the fake's clock
    # is moved past the lease's end, as the service's would be)
    remote = fake.world.get(sb.sandbox_id)
    assert remote is not None and remote.state == "running"
    real_clock = fake.world.clock
    fake.world.clock = lambda: remote.end_at + 1
    try:
        with pytest.raises(SandboxNotFound):
            backend.get(sb.name)
        assert fake.world.get(sb.sandbox_id) is None and fake.calls("DELETE") == []  # E2B's doing, not ours
    finally:
        fake.world.clock = real_clock
    sb.destroy()  # a sandbox already gone: nothing to do, no error
    sb = backend.create_ephemeral()
    sb.destroy()
    assert fake.calls("DELETE", f"/sandboxes/{sb.sandbox_id}")
    sb.destroy()  # idempotent
    with pytest.raises(SandboxNotFound):
        backend.get(sb.name)


def test_exec_returns_code_and_both_streams_with_the_lease_extended_first_when_short(
        fake: FakeE2B, backend: E2BBackend) -> None:
    with opened(backend) as sb:
        connects = f"/v2/sandboxes/{sb.sandbox_id}/connect"
        fake.clear_requests()
        result = sb.exec("echo out; echo err >&2; pwd; echo $X; exit 3", env={"X": "y"}, timeout=600)
        assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n/home/user\ny\n", "err\n")
        # the lease secured at open (300 s + headroom) does not cover 600 + grace: extended first
        assert [r.rpc or r.path for r in fake.requests][:2] == [connects, "Process/Start"]
        (connect,) = fake.calls("POST", connects)
        assert connect.body == {"timeout": 600 + 1 + 30 + 30}  # max(lease, timeout + grace) + headroom
        (start,) = fake.calls(rpc="Process/Start")
        assert start.body["timeout_ms"] == (600 + 30) * 1000  # the stream's own deadline
        assert start.body["cwd"] == "/home/user" and start.body["envs"] == {"X": "y"}
        sb.exec(["printf", "%s", "a b"], timeout=600)  # still covered by the bound: no request
        assert sb.exec(["printf", "%s", "a b"]).stdout == "a b"  # argv is quoted, not split
        assert sb.exec("cat", stdin=b"fed").stdout == "fed"
        assert len(fake.calls("POST", connects)) == 1
        fake.clear_requests()
        sb.exec("true", timeout=660)  # 660 + grace is past the bound: extended first again
        assert [r.rpc or r.path for r in fake.requests][:2] == [connects, "Process/Start"]
        assert fake.calls("POST", connects)[0].body == {"timeout": 660 + 1 + 30 + 30}
        assert not fake.calls(path=f"/sandboxes/{sb.sandbox_id}/timeout")  # never a call that can shorten


def test_a_reservation_covers_the_next_started_command_and_its_resume(fake: FakeE2B, backend: E2BBackend) -> None:
    with opened(backend) as sb:
        connects = f"/v2/sandboxes/{sb.sandbox_id}/connect"
        fake.clear_requests()
        sb.reserve(900)  # what the Hermes environment says before starting a command with that deadline
        assert [r.path for r in fake.requests] == [connects]
        assert fake.requests[0].body == {"timeout": 900 + 1 + 30 + 30}
        fake.pause(sb.sandbox_id)  # someone else pauses it in between
        fake.clear_requests()
        sb.reserve(900)  # the bound still covers it: no request, the pause is found by the start
        proc = sb.start("echo resumed")
        assert proc.wait(60) == 0
        assert [r.rpc or r.path for r in fake.requests][:3] == ["Process/Start", connects, "Process/Start"]
        assert fake.calls("POST", connects)[0].body == {"timeout": 900 + 1 + 30 + 30}  # the resume asks for it all


def test_a_timeout_kills_the_command_by_pid_and_the_sandbox_and_background_survive(
        fake: FakeE2B, backend: E2BBackend) -> None:
    with opened(backend) as sb:
        daemon = sb.start("sleep 300")

        def attempt(timeout: float) -> ExecResult:
            fake.clear_requests()  # what follows counts the requests of the attempt that is kept
            result: ExecResult = sb.exec("echo started; sleep 300", timeout=timeout)
            return result

        result = until_started(attempt, lambda result: result.stdout != "", first=3)
        assert (result.exit_code, result.timed_out, result.stdout) == (124, True, "started\n")
        (signal,) = fake.calls(rpc="Process/SendSignal")
        assert signal.body["signal"] == "SIGKILL" and signal.body["pid"] != daemon.pid
        group_kill = [s.body["args"][-1] for s in fake.calls(rpc="Process/Start") if "kill -KILL" in s.body["args"][-1]]
        assert group_kill == [f"kill -KILL -- -{signal.body['pid']} 2>/dev/null; true"]
        order = [r.rpc for r in fake.requests if r.rpc in ("Process/Start", "Process/SendSignal")]
        assert order[-2:] == ["Process/Start", "Process/SendSignal"]  # its group first, then the pid
        assert daemon.poll() is None
        assert sb.exec("echo alive").stdout == "alive\n"
        daemon.kill()
        assert daemon.wait(30) == 137


def test_output_reaches_the_sink_while_the_command_still_runs(backend: E2BBackend) -> None:
    with opened(backend) as sb:
        first = threading.Event()
        chunks: list[bytes] = []

        def sink(chunk: bytes) -> None:
            chunks.append(chunk)
            first.set()

        proc = sb.start("echo one; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo two", on_stdout=sink)
        assert first.wait(30), "no output before the command finished"
        assert proc.poll() is None and b"".join(chunks) == b"one\n"
        sb.write_file("/tmp/go", b"")
        assert proc.wait(30) == 0
        assert b"".join(chunks) == b"one\ntwo\n"


def test_a_failing_sink_stops_the_command_and_surfaces(fake: FakeE2B, backend: E2BBackend) -> None:
    with opened(backend) as sb:
        def broken(chunk: bytes) -> None:
            raise BrokenPipeError("reader went away")

        with pytest.raises(BrokenPipeError):
            sb.exec("while true; do echo spam; sleep 0.01; done", on_stdout=broken, timeout=60)
        assert fake.calls(rpc="Process/SendSignal")
        assert sb.exec("echo still here").stdout == "still here\n"


def test_a_lost_create_reply_is_recovered_by_identity(fake: FakeE2B, backend: E2BBackend) -> None:
    fake.drop_create_response()
    with opened(backend, "lost") as sb:
        assert sb.created
        assert [s.sandbox_id for s in fake.sandboxes() if s.metadata.get("hermes_scope") == sb.scope] == \
            [sb.sandbox_id]
        assert backend.open("lost").sandbox_id == sb.sandbox_id  # and the next run finds it too


def test_duplicates_adopt_the_newest_and_warn_with_the_count(
        fake: FakeE2B, backend: E2BBackend, caplog: pytest.LogCaptureFixture) -> None:
    scope = scope_digest(backend.profile, "dup", backend.settings, persistent=True)
    meta = {"hermes_plugin": "e2b-terminal", "hermes_scope": scope}
    older = e2b.Sandbox.create("base", timeout=300, metadata=meta, api_key=API_KEY, api_url=fake.url,
                               sandbox_url=fake.url)
    newer = e2b.Sandbox.create("base", timeout=300, metadata=meta, api_key=API_KEY, api_url=fake.url,
                               sandbox_url=fake.url)
    try:
        fake.sandbox(newer.sandbox_id).started_at += 1  # started later, whatever the clock's resolution
        with caplog.at_level(logging.WARNING, logger="hermes_sandboxes.backends.e2b"):
            sb = backend.open("dup")
        assert (sb.sandbox_id, sb.created) == (newer.sandbox_id, False)
        assert "2 sandboxes share the identity" in caplog.text
    finally:
        older.kill()
        newer.kill()


def test_a_paused_sandbox_is_resumed_by_the_next_command(fake: FakeE2B, backend: E2BBackend) -> None:
    with opened(backend) as sb:
        sb.write_file("/home/user/notes.txt", b"kept")
        sb.stop()
        assert fake.calls("POST", f"/sandboxes/{sb.sandbox_id}/pause")
        assert fake.sandbox(sb.sandbox_id).state == "paused"
        assert [i.state for i in backend.list()] == [SandboxState.PAUSED]
        assert sb.exec("cat /home/user/notes.txt").stdout == "kept"
        fake.expire(sb.sandbox_id)  # the lease ran out: E2B paused it
        assert backend.open("work").exec("echo back").stdout == "back\n"


def test_files(backend: E2BBackend) -> None:
    with opened(backend) as sb:
        sb.write_file("/home/user/a/b/c.txt", b"\x00\xffdata")
        assert sb.read_file("/home/user/a/b/c.txt") == b"\x00\xffdata"
        sb.write_file("/home/user/run.sh", b"#!/bin/sh\necho ran\n", mode=0o755)
        assert sb.exec("/home/user/run.sh").stdout == "ran\n"
        sb.delete_file("/home/user/run.sh")
        with pytest.raises(SandboxFileNotFound):
            sb.read_file("/home/user/run.sh")
        with pytest.raises(InvalidInput):
            sb.read_file("relative.txt")


def test_checkpoints_are_snapshots_and_restore_replaces_the_sandbox_keeping_identity(
        fake: FakeE2B, backend: E2BBackend) -> None:
    with opened(backend) as sb:
        sb.write_file("/home/user/app.py", b"v1")
        first = sb.checkpoint("before the refactor")
        sb.write_file("/home/user/app.py", b"v2")
        second = sb.checkpoint()
        assert [(c.id, c.comment) for c in sb.checkpoints()] == [(first.id, "before the refactor"), (second.id, "")]
        old_id = sb.sandbox_id
        sb.restore(first.id)
        assert sb.sandbox_id != old_id and sb.read_file("/home/user/app.py") == b"v1"
        assert old_id not in {s.sandbox_id for s in fake.sandboxes()}
        assert fake.sandbox(sb.sandbox_id).metadata["hermes_scope"] == sb.scope
        assert backend.open("work").sandbox_id == sb.sandbox_id
        assert [c.comment for c in sb.checkpoints()] == ["before the refactor", ""]  # comments survive
        sb.delete_checkpoint(second.id)
        with pytest.raises(CheckpointNotFound):
            sb.restore(second.id)
        with pytest.raises(CheckpointNotFound):
            sb.delete_checkpoint("snap-nope")
    assert not [c for c in fake.world.snapshots.values() if c.snapshot_id == first.id]  # destroy removed it


def test_errors_are_mapped_and_never_show_the_key(fake: FakeE2B, backend: E2BBackend) -> None:
    with opened(backend) as sb:
        fake.fail("POST", r"/v2/sandboxes/.*/connect", 500, message=f"boom, key was {API_KEY}")
        fake.clear_requests()
        with pytest.raises(SandboxError) as exc:  # the lease must be extended first, and that fails
            sb.exec("true", timeout=3600)
        assert not fake.calls(rpc="Process/Start")  # so the command never started
        assert API_KEY not in str(exc.value) and "[REDACTED:E2B_API_KEY]" in str(exc.value)
        assert isinstance(exc.value, SandboxUnreachable) and exc.value.retryable
        fake.drop_stream(after_events=3)  # the start event and two chunks get through
        with pytest.raises(SandboxError):
            sb.exec("while true; do echo tick; sleep 0.05; done", timeout=120)
        assert fake.calls(rpc="Process/SendSignal")  # the command whose stream broke was stopped
        assert sb.exec("echo ok").stdout == "ok\n"
    wrong = E2BBackend(api_key="e2b_wrong_key", api_url=fake.url, sandbox_url=fake.url)
    with pytest.raises(AuthenticationFailed) as auth:
        wrong.list()
    assert "e2b_wrong_key" not in str(auth.value)
    with pytest.raises(SandboxNotFound):
        backend.get("never-made")
    assert E2BBackend(api_key="").unavailable_reason() is not None


def test_a_spec_picks_posture_template_and_labels_and_the_rest_is_refused(fake: FakeE2B, backend: E2BBackend) -> None:
    for spec in (SandboxSpec(network="proxy", allow=("*",)), SandboxSpec(network="proxy", allow=("::1",)),
                 SandboxSpec(limits=Limits(pids=10)), SandboxSpec(idle_timeout=60)):
        with pytest.raises(Unsupported):
            backend.open("refused", spec)
    assert not fake.calls("POST", "/v2/sandboxes")
    with opened(backend, "offline", spec=SandboxSpec(network="none", image="base", labels={"team": "infra"})) as sb:
        (create,) = fake.calls("POST", "/v2/sandboxes")
        assert create.body["allow_internet_access"] is False and create.body["templateID"] == "base"
        assert create.body["metadata"]["team"] == "infra"
        offline = backend.settings.model_copy(update={"allow_internet_access": False})
        assert sb.scope == scope_digest(backend.profile, "offline", offline, persistent=True)  # posture is identity


@pytest.mark.parametrize(("raw", "key"), [
    ({"lease_seconds": 0}, "lease_seconds"), ({"lease_seconds": "300"}, "lease_seconds"),
    ({"lease_seconds": 86_401}, "lease_seconds"), ({"cwd": 7}, "cwd"),
    ({"command_grace_seconds": -1}, "command_grace_seconds"), ({"secure": "false"}, "secure"),
    ({"allow_internet_access": 1}, "allow_internet_access"), ({"cwd": "work"}, "cwd"),
    ({"template": ""}, "template"), ({"metadata": {"team": 3}}, "metadata"), ({"bogus": 1}, "bogus"),
])
def test_invalid_settings_name_their_key(raw: dict[str, Any], key: str) -> None:
    with pytest.raises(InvalidSettings) as exc:
        validate_settings(E2BSettings, raw, where="plugins.entries.e2b.settings")
    assert exc.value.key == f"plugins.entries.e2b.settings.{key}"


def test_settings_defaults() -> None:
    s = validate_settings(E2BSettings, {"metadata": {"team": "infra"}}, where="x")
    assert (s.backend, s.template, s.cwd, s.lease_seconds, s.command_grace_seconds) == \
        ("e2b", "base", "/home/user", 300, 30)
    assert (s.allow_internet_access, s.secure, s.metadata) == (True, True, {"team": "infra"})


def test_fork_starts_a_new_named_sandbox_from_now_or_from_a_checkpoint(fake: FakeE2B, backend: E2BBackend) -> None:
    with opened(backend) as sb:
        sb.write_file("/home/user/f", b"one")
        ck = sb.checkpoint()
        sb.write_file("/home/user/f", b"two")
        snapshots = set(fake.world.snapshots)
        now = sb.fork("copy-now")
        try:
            then = sb.fork("copy-then", ck.id)
            try:
                assert (now.read_file("/home/user/f"), then.read_file("/home/user/f")) == (b"two", b"one")
                assert set(fake.world.snapshots) == snapshots  # the fork's own snapshot is gone again
                assert now.scope == scope_digest(backend.profile, "copy-now", backend.settings, persistent=True)
                assert backend.open("copy-now").sandbox_id == now.sandbox_id
                with pytest.raises(SandboxExists):
                    sb.fork("copy-now")
            finally:
                then.destroy()
        finally:
            now.destroy()
        assert sb.read_file("/home/user/f") == b"two"


def test_by_name_another_posture_template_or_labels_is_refused_and_no_spec_resumes_it(
        fake: FakeE2B, backend: E2BBackend) -> None:
    with opened(backend, "scope") as online:
        creates = len(fake.calls("POST", "/v2/sandboxes"))
        refused = [
            (SandboxSpec(network="none"), "network host, not none"),  # a tightened posture: not made beside
            (SandboxSpec(network="host", image="other"), "image base, not other"),
            (SandboxSpec(network="host", labels={"team": "infra"}), "labels {'team': None}, not {'team': 'infra'}"),
        ]
        for spec, phrase in refused:
            with pytest.raises(SpecMismatch) as exc:
                backend.open("scope", spec)
            assert str(exc.value).startswith(f"sandbox scope exists with {phrase}: open it without a spec"), exc.value
        insecure = E2BBackend(E2BSettings(secure=False), api_key=API_KEY, profile=backend.profile, api_url=fake.url,
                              sandbox_url=fake.url)
        with pytest.raises(SpecMismatch, match="with the secure setting True, not False"):
            insecure.open("scope", SandboxSpec(network="host"))
        assert insecure.open("scope").sandbox_id == online.sandbox_id  # no spec: as it was made
        assert len(fake.calls("POST", "/v2/sandboxes")) == creates  # nothing was made beside it
        assert backend.open("scope", SandboxSpec(network="host")).sandbox_id == online.sandbox_id  # the same spec
    eph = backend.create_ephemeral(prefix="scope")
    try:
        with pytest.raises(SandboxExists):
            backend.open(eph.name)  # an ephemeral one is never adopted, nor shadowed
    finally:
        eph.destroy()


def test_on_e2b_loopback_and_none_are_one_posture(backend: E2BBackend) -> None:
    with opened(backend, "quiet", spec=SandboxSpec(network="none")) as sb:
        again = backend.open("quiet", SandboxSpec(network="loopback"))  # E2B keeps the sandbox's own loopback
        assert again.sandbox_id == sb.sandbox_id and not again.created


def test_for_a_hermes_task_a_tightened_posture_gives_a_new_sandbox_beside_the_old(backend: E2BBackend) -> None:
    # as the existing plugin does: the posture is in the task's hermes_scope
    with opened(backend, "scope", task="t1") as online, \
            opened(backend, "scope", spec=SandboxSpec(network="none"), task="t1") as offline:
        assert offline.created and offline.sandbox_id != online.sandbox_id and offline.scope != online.scope
        assert backend.open("scope", task="t1").sandbox_id == online.sandbox_id  # each posture finds its own


@pytest.mark.parametrize("internet", [True, False])
def test_the_settings_spec_keeps_the_internet_setting(fake: FakeE2B, internet: bool) -> None:
    # the providers open sandboxes with settings.spec(); its network must not override the setting
    settings = E2BSettings(allow_internet_access=internet)
    with E2BBackend(settings, api_key=API_KEY, profile=f"/profiles/{secrets.token_hex(4)}", api_url=fake.url,
                    sandbox_url=fake.url) as backend, opened(backend, spec=settings.spec()) as sb:
        (create,) = fake.calls("POST", "/v2/sandboxes")
        assert create.body["allow_internet_access"] is internet and sb.posture.internet is internet
        assert sb.scope == scope_digest(backend.profile, "work", settings, persistent=True)


def test_an_allow_list_becomes_e2bs_egress_rules_and_changes_in_place(fake: FakeE2B, backend: E2BBackend) -> None:
    spec = SandboxSpec(network="proxy", allow=("@pypi", "*.example.com", "203.0.113.7", "198.51.100.0/24:*"))
    with opened(backend, "fenced", spec=spec) as sb:
        (create,) = fake.calls("POST", "/v2/sandboxes")
        assert create.body["network"] == {  # deny everything, allow what the list names (presets expanded)
            "allowOut": ["pypi.org", "files.pythonhosted.org", "*.example.com", "203.0.113.7", "198.51.100.0/24"],
            "denyOut": ["0.0.0.0/0"]}
        assert create.body["allow_internet_access"] is False  # fail closed should the rules be ignored
        assert sb.info().spec == SandboxSpec(network="proxy", allow=spec.allow)
        assert [i.spec.network for i in backend.list()] == ["proxy"]
        # having a list is identity, its entries are not: they change in place
        other = backend.settings.model_copy(update={"allow": ("@npm",)})
        assert sb.scope == scope_digest(backend.profile, "fenced", other, persistent=True)
        assert sb.scope != scope_digest(backend.profile, "fenced", backend.settings, persistent=True)

        sb.set_allow(["@github", "127.0.0.1:8080"])  # a running sandbox, no restart
        (update,) = fake.calls("PUT", f"/sandboxes/{sb.sandbox_id}/network")
        assert update.body["allowOut"] == ["github.com", "api.github.com", "codeload.github.com",
                                           "*.githubusercontent.com", "127.0.0.1"]
        assert update.body["denyOut"] == ["0.0.0.0/0"]
        assert fake.sandbox(sb.sandbox_id).network["allowOut"][-1] == "127.0.0.1"
        assert backend.get("fenced").info().spec.allow == ("@github", "127.0.0.1:8080")
        with pytest.raises(Unsupported):
            sb.set_allow(["*"])  # what E2B cannot say changes nothing
        with pytest.raises(InvalidInput):
            sb.set_allow(["not a host!"])
        assert len(fake.calls("PUT", f"/sandboxes/{sb.sandbox_id}/network")) == 1
        # the entries as set are kept inside the sandbox: a command rewriting them cannot make info() lie
        sb.exec("echo '[\"evil.example\"]' > ~/.cache/hermes-sandboxes/allow.json")
        assert sb.info().spec.allow == tuple(update.body["allowOut"])  # E2B's own rules instead

        ck = sb.checkpoint()
        sb.restore(ck.id)  # the replacement gets the rules in force, not the ones it was made with
        restored = fake.calls("POST", "/v2/sandboxes")[-1]
        assert restored.body["network"]["allowOut"] == update.body["allowOut"]
        assert sb.info().spec.allow == ("@github", "127.0.0.1:8080")
    with opened(backend, "open-net") as plain, pytest.raises(InvalidInput, match="only to network 'proxy'"):
        plain.set_allow(["pypi.org"])


def test_the_allow_setting_gives_a_proxy_spec_and_is_refused_without_internet() -> None:
    settings = validate_settings(E2BSettings, {"allow": ["@pypi"]}, where="s")
    assert settings.spec() == SandboxSpec(network="proxy", allow=("@pypi",))
    with pytest.raises(InvalidSettings) as exc:
        validate_settings(E2BSettings, {"allow_internet_access": False, "allow": ["@pypi"]}, where="s")
    assert exc.value.key == "s.allow"
    with pytest.raises(InvalidSettings, match="preset"):
        validate_settings(E2BSettings, {"allow": ["@nope"]}, where="s")
    assert scope_digest("/p", "n", settings, persistent=True) != scope_digest("/p", "n", E2BSettings(),
                                                                            persistent=True)


def test_a_fenced_sandbox_reaches_only_its_list_and_a_change_applies_without_a_restart(
        fake: FakeE2B, backend: E2BBackend, tmp_path: Path) -> None:
    from tests.local.egress_kit import http_server_process

    (tmp_path / "hello.txt").write_text("hello\n")
    fetch = "curl -sS -f -m 10 http://127.0.0.1:{port}/hello.txt"
    with http_server_process(tmp_path) as port, \
            opened(backend, "fenced", spec=SandboxSpec(network="proxy", allow=("127.0.0.1",))) as sb:
        # the fake enforces the rules it was given; E2B allows a destination on every port
        assert sb.exec(fetch.format(port=port), timeout=60).stdout == "hello\n"
        sb.set_allow(["203.0.113.9"])
        refused = sb.exec(fetch.format(port=port), timeout=60)
        assert refused.exit_code != 0 and "hello" not in refused.stdout, refused
        sb.set_allow(["127.0.0.1"])
        assert sb.exec(fetch.format(port=port), timeout=60).stdout == "hello\n"
