"""The Sprites backend through the contract, against the fake Sprites API, asserting on what was
actually sent over the wire (the fake records every request)."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from hermes_sandboxes.backends.sprites import SpritesBackend, SpritesSandbox
from hermes_sandboxes.backends.sprites.settings import SpritesSettings
from hermes_sandboxes.errors import (
    AuthenticationFailed,
    CheckpointNotFound,
    InvalidInput,
    SandboxExists,
    SandboxFileNotFound,
    SandboxUnreachable,
    SpecMismatch,
    Unsupported,
)
from hermes_sandboxes.names import unique_name
from hermes_sandboxes.sandbox import Capability, ExecResult, Limits, SandboxSpec
from tests.fakes.sprites import FakeSprites, Fault
from tests.patience import read_until, until_started


def wait_for(predicate: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def backend(fake: FakeSprites) -> Iterator[SpritesBackend]:
    with SpritesBackend(SpritesSettings(api_url=fake.url), token=fake.token) as sprites:
        yield sprites


@pytest.fixture
def sprite(backend: SpritesBackend, fake: FakeSprites) -> SpritesSandbox:
    made = backend.open("sp-main")
    fake.reset()  # each test sees only its own requests
    return made


def sessions_of(fake: FakeSprites, name: str) -> list[Any]:
    return fake.sessions.of(name)


# lifecycle ----------------------------------------------------------------------------------------
def test_open_creates_once_then_resumes(backend: SpritesBackend, fake: FakeSprites) -> None:
    first = backend.open("sp-a")
    again = backend.open("sp-a")
    assert (first.created, again.created) == (True, False)
    assert [r.status for r in fake.recorded("POST", "/v1/sprites")] == [201]
    assert [i.name for i in backend.list()] == ["sp-a"]
    assert backend.get("sp-a").info().name == "sp-a"
    with pytest.raises(SandboxExists):
        backend.create("sp-a")


def test_create_sends_the_published_fields_and_the_settings_size(fake: FakeSprites) -> None:
    settings = SpritesSettings(api_url=fake.url, max_cpus=2, max_ram_gb=4, max_disk_gb=20)
    with SpritesBackend(settings, token=fake.token) as backend:
        backend.open("sp-sized")
    body = json.loads(fake.recorded("POST", "/v1/sprites")[0].body)
    assert body == {"name": "sp-sized", "labels": [], "wait_for_capacity": True,
                    "config": {"cpus": 2, "ram_mb": 4096, "storage_gb": 20}}


def test_the_size_asked_for_is_the_size_the_sprite_gets(fake: FakeSprites) -> None:
    """Not only the request: the fake sizes its Sprites as asked, so a memory hog past the asked
    size is killed inside while one within it runs."""
    settings = SpritesSettings(api_url=fake.url, max_cpus=1, max_ram_gb=1)
    with SpritesBackend(settings, token=fake.token) as backend:
        sprite = backend.open(unique_name("sp-size"))
        try:
            hog = sprite.exec("python3 -c 'x = bytearray(3 << 30)'", timeout=120)
            assert hog.exit_code == 137, hog
            assert sprite.exec("python3 -c 'x = bytearray(64 << 20); print(len(x))'").stdout == f"{64 << 20}\n"
        finally:
            sprite.destroy()


def test_reopening_compares_the_size_the_service_reports_with_the_one_asked_for(
        fake: FakeSprites, caplog: pytest.LogCaptureFixture) -> None:
    settings = SpritesSettings(api_url=fake.url, max_cpus=2, max_ram_gb=4)
    with SpritesBackend(settings, token=fake.token) as backend:
        made = backend.open("sp-cmp", settings.spec())
        try:
            assert backend.open("sp-cmp", settings.spec()).created is False  # the same settings: resumed
            refused = [(Limits(cpus=2.0, memory_bytes=8 << 30), "memory_bytes 4294967296, not 8589934592"),
                       (Limits(cpus=4.0, memory_bytes=4 << 30), "cpus 2.0, not 4.0"),
                       (Limits(cpus=2.0, memory_bytes=4 << 30, disk_bytes=20 << 30),
                        "disk_bytes unset, not 21474836480")]
            for limits, phrase in refused:
                with pytest.raises(SpecMismatch, match=f"sandbox sp-cmp exists with {phrase}: "):
                    backend.open("sp-cmp", SandboxSpec(network="host", limits=limits))
            with pytest.raises(Unsupported):  # what a Sprite cannot have is refused on an existing one too
                backend.open("sp-cmp", SandboxSpec(network="loopback"))
            fake.world.sprites["sp-cmp"].reports_config = False  # as the API reference's Sprite schema
            with caplog.at_level(logging.WARNING, logger="hermes_sandboxes.backends.sprites.backend"):
                again = backend.open("sp-cmp", SandboxSpec(network="host", limits=Limits(cpus=8.0)))
            assert again.created is False  # it cannot be compared: resumed, and said
            assert "does not report the size of Sprite sp-cmp" in caplog.text and "cpus 8" in caplog.text
        finally:
            made.destroy()


def test_an_image_is_refused_before_anything_is_sent(backend: SpritesBackend, fake: FakeSprites) -> None:
    with pytest.raises(Unsupported, match="one base image"):
        backend.create("sp-img", SandboxSpec(network="host", image="ubuntu:24.04"))
    assert fake.recorded() == [] and "sp-img" not in fake.world.sprites


def test_specs_the_service_cannot_honour_are_refused_before_anything_is_sent(
        backend: SpritesBackend, fake: FakeSprites) -> None:
    with pytest.raises(Unsupported):
        backend.create("sp-x", SandboxSpec(network="none"))
    with pytest.raises(Unsupported):
        backend.create("sp-x", SandboxSpec(network="host", limits=Limits(pids=10)))
    with pytest.raises(InvalidInput):
        backend.create("sp-x", SandboxSpec(network="host", limits=Limits(cpus=0.5)))
    assert fake.recorded() == []


def test_ephemeral_sprites_are_never_adopted_and_destroy_is_idempotent(
        backend: SpritesBackend, fake: FakeSprites) -> None:
    eph = backend.create_ephemeral(prefix="sp-eph")
    assert eph.ephemeral and eph.created
    with pytest.raises(SandboxExists, match="ephemeral"):
        backend.open(eph.name)
    eph.destroy()
    eph.destroy()
    assert eph.name not in fake.world.sprites


def test_a_missing_token_makes_the_backend_unavailable_without_touching_the_network(fake: FakeSprites) -> None:
    backend = SpritesBackend(SpritesSettings(api_url=fake.url), token="")
    assert "SPRITES_TOKEN" in (backend.unavailable_reason() or "")
    assert not backend.doctor()[0].ok
    assert fake.recorded() == []


def test_a_refused_token_is_an_authentication_error_that_does_not_show_it(fake: FakeSprites) -> None:
    secret = "sk-very-secret-token-value"
    with SpritesBackend(SpritesSettings(api_url=fake.url), token=secret) as backend:
        with pytest.raises(AuthenticationFailed) as caught:
            backend.open("sp-auth")
        checks = backend.doctor()
    assert secret not in str(caught.value) and "SPRITES_TOKEN" in str(caught.value)
    assert not checks[1].ok and secret not in checks[1].detail


# commands -----------------------------------------------------------------------------------------
def test_exec_gives_exit_code_both_streams_and_home(sprite: SpritesSandbox, fake: FakeSprites) -> None:
    result = sprite.exec("echo out; echo err >&2; echo $HOME; exit 4")
    assert (result.exit_code, result.stdout, result.stderr) == (4, "out\n/root\n", "err\n")
    argv = sprite.exec(["printf", "%s|", "a b", "$HOME"])
    assert argv.stdout == "a b|$HOME|"
    sent = fake.recorded("WS")
    assert sent[0].params("cmd") == ["bash", "-c", "echo out; echo err >&2; echo $HOME; exit 4"]
    # the service holds an exec socket open after the exit frame: we hang up, we do not wait for it
    ours = [s for s in fake.sessions.all.values() if s.sprite.name == "sp-main"]
    wait_for(lambda: all(s.client_closed_first for s in ours), "both clients to hang up first", timeout=4)
    assert "HOME=/root" in sent[0].params("env")


def test_exec_passes_stdin_env_and_cwd(sprite: SpritesSandbox) -> None:
    result = sprite.exec("cat; echo $X; pwd", stdin=b"in\n", env={"X": "y"}, cwd="/tmp")
    assert result.stdout == "in\ny\n/tmp\n"


def test_a_stdin_stream_is_passed_on_to_its_end_of_file(sprite: SpritesSandbox) -> None:
    # (the fake starts a command once its stdin has ended, so interleaving is not observable here;
    # the local backend's contract test shows it)
    read_end, write_end = os.pipe()
    with open(read_end, "rb", buffering=0) as stream:
        with open(write_end, "wb", buffering=0) as feed:
            feed.write(b"one\ntwo\n")
        result = sprite.exec("while read l; do echo got-$l; done; echo eof", stdin=stream, timeout=60)
    assert (result.exit_code, result.stdout) == (0, "got-one\ngot-two\neof\n")


def test_output_streams_while_the_command_runs(sprite: SpritesSandbox, fake: FakeSprites) -> None:
    seen: list[bytes] = []
    proc = sprite.start("echo first; sleep 30", on_stdout=seen.append)
    wait_for(lambda: seen == [b"first\n"], "the first line")
    assert proc.poll() is None
    proc.kill()
    assert proc.wait(20) == 128 + 15  # the kill endpoint's SIGTERM ended it (128+N for signal N)
    assert len(fake.recorded("POST", r"/v1/sprites/sp-main/exec/\d+/kill")) == 1


def test_a_timeout_kills_the_remote_command_through_the_kill_endpoint(
        sprite: SpritesSandbox, fake: FakeSprites) -> None:
    def attempt(timeout: float) -> ExecResult:
        kills_before.append(len(fake.recorded("POST", r"/v1/sprites/sp-main/exec/\d+/kill")))
        result: ExecResult = sprite.exec("echo begun; sleep 60; echo never", timeout=timeout)
        return result

    kills_before: list[int] = []
    result = until_started(attempt, lambda result: result.stdout != "")
    assert result.timed_out and result.exit_code == 124 and result.stdout == "begun\n"  # never the end
    [kill] = fake.recorded("POST", r"/v1/sprites/sp-main/exec/\d+/kill")[kills_before[-1]:]
    assert kill.status == 200 and json.loads(kill.body)["signal"] == "SIGTERM"
    assert sessions_of(fake, "sp-main") == []  # nothing of it keeps running...
    assert sprite.exec("echo alive").stdout == "alive\n"  # ...and the Sprite survives


def test_a_command_that_ignores_sigterm_is_killed_by_the_services_sigkill(
        sprite: SpritesSandbox, fake: FakeSprites) -> None:
    """The kill endpoint's SIGTERM reaches the command, which may ignore it: it is seen handling the
    signal and running on until the service's SIGKILL (KILL_GRACE_S later) ends it, and our timeout
    still ends at 124 with nothing left running."""
    script = "trap 'echo got-term' TERM; echo started; while :; do sleep 0.2; done"
    result = until_started(lambda timeout: sprite.exec(script, timeout=timeout), lambda r: "started" in r.stdout)
    assert result.exit_code == 124 and result.timed_out
    assert "got-term" in result.stdout  # the SIGTERM came, was handled, and the command ran on
    assert sessions_of(fake, "sp-main") == []
    assert sprite.exec("pgrep -x sleep || echo none").stdout == "none\n"


def test_a_failing_output_sink_stops_the_remote_command(sprite: SpritesSandbox, fake: FakeSprites) -> None:
    def broken(chunk: bytes) -> None:
        raise BrokenPipeError("reader went away")

    with pytest.raises(BrokenPipeError):
        sprite.exec("while true; do echo y; sleep 0.01; done", on_stdout=broken, timeout=60)
    assert len(fake.recorded("POST", r"/v1/sprites/sp-main/exec/\d+/kill")) == 1
    wait_for(lambda: sessions_of(fake, "sp-main") == [], "the session to end")


def test_a_dropped_connection_is_an_error_naming_the_sprite_and_nothing_is_rerun(
        sprite: SpritesSandbox, fake: FakeSprites) -> None:
    fake.inject(Fault("WS", "/v1/sprites/sp-main/exec", drop_exec=True))
    with pytest.raises(SandboxUnreachable, match=r"Sprite sp-main.*not re-run") as caught:
        sprite.exec("echo once >> /root/runs; echo ran; sleep 60")
    assert caught.value.retryable
    assert len(fake.recorded("WS")) == 1
    assert len(fake.recorded("POST", r"/v1/sprites/sp-main/exec/\d+/kill")) == 1  # the orphan is stopped
    wait_for(lambda: sessions_of(fake, "sp-main") == [], "the orphaned session to be killed")
    assert sprite.read_file("/root/runs") == b"once\n"


def test_a_rate_limited_exec_is_retried_before_anything_runs(sprite: SpritesSandbox, fake: FakeSprites) -> None:
    fake.inject(Fault("WS", "/v1/sprites/sp-main/exec", status=429, retry_after=1))
    assert sprite.exec("echo x >> /root/count; cat /root/count").stdout == "x\n"
    assert [r.status for r in fake.recorded("WS")] == [429, 101]


def test_an_exec_socket_refused_every_time_is_a_retryable_error_and_nothing_ran(
        sprite: SpritesSandbox, fake: FakeSprites) -> None:
    fake.inject(Fault("WS", "/v1/sprites/sp-main/exec", status=503, times=10))
    with pytest.raises(SandboxUnreachable, match="HTTP 503") as caught:
        sprite.exec("echo ran >> /root/never")
    assert caught.value.retryable and [r.status for r in fake.recorded("WS")] == [503] * 3
    fake.reset()
    assert sprite.exec("cat /root/never 2>/dev/null || echo absent").stdout == "absent\n"


# files --------------------------------------------------------------------------------------------
def test_each_written_file_is_one_fs_write_with_parents_made_by_the_server(
        sprite: SpritesSandbox, fake: FakeSprites) -> None:
    files = {f"/root/.hermes/skills/s{i}/deep/SKILL.md": f"skill {i}".encode() for i in range(20)}
    for path, data in files.items():
        sprite.write_file(path, data)
    sprite.write_file("/root/bin/tool", b"#!/bin/sh\necho tool\n", mode=0o755)
    requests = fake.recorded()
    assert [(r.method, r.path) for r in requests] == [("PUT", "/v1/sprites/sp-main/fs/write")] * 21
    assert all(r.param("mkdirParents") == "true" for r in requests)
    assert [r.param("mode") for r in requests] == ["0644"] * 20 + ["0755"]
    assert sprite.exec("/root/bin/tool").stdout == "tool\n"
    assert sprite.read_file("/root/.hermes/skills/s7/deep/SKILL.md") == b"skill 7"


def test_files_read_and_delete_through_exec(sprite: SpritesSandbox, fake: FakeSprites) -> None:
    blob = bytes(range(256)) * 1000
    sprite.write_file("/root/blob", blob)
    assert sprite.read_file("/root/blob") == blob
    sprite.delete_file("/root/blob")
    with pytest.raises(SandboxFileNotFound):
        sprite.read_file("/root/blob")
    with pytest.raises(SandboxFileNotFound):
        sprite.delete_file("/root/blob")
    with pytest.raises(InvalidInput):
        sprite.read_file("relative")
    assert not fake.recorded(path=r".*/fs/(read|list|delete)")


def test_many_deletions_are_one_batched_rm(sprite: SpritesSandbox, fake: FakeSprites) -> None:
    for i in range(3):
        sprite.write_file(f"/root/d/{i}", b"x")
    fake.reset()
    sprite.delete_files(["/root/d/0", "/root/d/1", "/root/d/2", "/root/d/missing"])
    [call] = fake.recorded("WS")
    assert call.params("cmd") == ["rm", "-f", "--", "/root/d/0", "/root/d/1", "/root/d/2", "/root/d/missing"]
    assert sprite.exec("ls -A /root/d").stdout == ""


# checkpoints --------------------------------------------------------------------------------------
def test_checkpoints_are_created_with_a_comment_listed_and_restored(
        sprite: SpritesSandbox, backend: SpritesBackend, fake: FakeSprites) -> None:
    sprite.write_file("/root/state", b"one")
    first = sprite.checkpoint("before the change")
    assert (first.id, first.comment) == ("v1", "before the change")
    sprite.write_file("/root/state", b"two")
    second = sprite.checkpoint()
    assert [c.id for c in sprite.checkpoints()] == [first.id, second.id]
    sprite.restore(first.id)
    assert sprite.read_file("/root/state") == b"one"
    with pytest.raises(CheckpointNotFound):
        sprite.restore("v99")
    with pytest.raises(Unsupported):
        sprite.delete_checkpoint(first.id)
    assert sprite.diff(first.id) == []  # restored: nothing differs (see test_sprites_diff.py)
    assert {Capability.CHECKPOINTS, Capability.DIFF} <= backend.capabilities
    assert not {Capability.DELETE_CHECKPOINTS, Capability.FORK} & backend.capabilities
    assert json.loads(fake.recorded("POST", "/v1/sprites/sp-main/checkpoint")[0].body) == {
        "comment": "before the change"}


# faults -------------------------------------------------------------------------------------------
def test_transient_server_errors_and_rate_limits_are_retried(backend: SpritesBackend, fake: FakeSprites) -> None:
    backend.open("sp-flaky")
    fake.reset()
    fake.inject(Fault("GET", "/v1/sprites/sp-flaky", status=503))
    fake.inject(Fault("GET", "/v1/sprites/sp-flaky", status=429, retry_after=1))
    assert backend.get("sp-flaky").name == "sp-flaky"
    assert [r.status for r in fake.recorded("GET")] == [503, 429, 200]


def test_a_server_that_stays_down_is_a_retryable_unreachable_error(backend: SpritesBackend, fake: FakeSprites) -> None:
    fake.inject(Fault("GET", "/v1/sprites/sp-down", status=502, times=10))
    with pytest.raises(SandboxUnreachable, match="HTTP 502") as caught:
        backend.get("sp-down")
    assert caught.value.retryable and len(fake.recorded("GET")) == 3


def test_a_token_echoed_by_the_service_never_reaches_an_error_message(
        backend: SpritesBackend, fake: FakeSprites) -> None:
    fake.inject(Fault("GET", "/v1/sprites/sp-echo", status=500, message=f"bad header Bearer {fake.token}", times=3))
    with pytest.raises(SandboxUnreachable) as caught:
        backend.get("sp-echo")
    assert fake.token not in str(caught.value) and "[redacted]" in str(caught.value)


def test_a_lost_create_response_is_adopted_not_repeated(backend: SpritesBackend, fake: FakeSprites) -> None:
    fake.inject(Fault("POST", "/v1/sprites", lose_response=True))
    made = backend.open("sp-lost")
    assert made.created and made.exec("echo ok").stdout == "ok\n"
    assert len(fake.recorded("POST", "/v1/sprites")) == 1
    assert list(fake.world.sprites) == ["sp-lost"]


def test_a_create_slower_than_the_wait_fails_with_retry_and_is_picked_up_later(fake: FakeSprites) -> None:
    fake.inject(Fault("POST", "/v1/sprites", delay=2.5))
    with (SpritesBackend(SpritesSettings(api_url=fake.url, create_wait_s=0.5), token=fake.token) as backend,
          pytest.raises(SandboxUnreachable, match="still being created; retry")):
        backend.open("sp-slow")
    with SpritesBackend(SpritesSettings(api_url=fake.url, create_wait_s=30), token=fake.token) as backend:
        later = backend.open("sp-slow")  # waits for the create still running on the server
        assert not later.created and later.exec("echo ready").stdout == "ready\n"
    assert len(fake.recorded("POST", "/v1/sprites")) == 1


_RACER = """
import sys
from hermes_sandboxes.backends.sprites import SpritesBackend
from hermes_sandboxes.backends.sprites.settings import SpritesSettings
with SpritesBackend(SpritesSettings(api_url=sys.argv[2]), token=sys.argv[1]) as backend:
    sprite = backend.open("sp-race")
    print(sprite.exec("echo ok").stdout.strip())
"""


def test_two_processes_opening_one_name_end_with_one_sprite_and_no_error(fake: FakeSprites) -> None:
    fake.inject(Fault("POST", "/v1/sprites", delay=1.0))
    racers = [subprocess.Popen([sys.executable, "-c", _RACER, fake.token, fake.url], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=120) for p in racers]
    assert [r[0].strip() for r in results] == ["ok", "ok"], [r[1][-2000:] for r in results]
    assert list(fake.world.sprites) == ["sp-race"]
    # the second either saw the first's create under way (and waited) or lost the POST race (400, "name already exists")
    statuses = [r.status for r in fake.recorded("POST", "/v1/sprites")]
    assert statuses.count(201) == 1 and set(statuses) <= {201, 400}


def test_stop_kills_running_commands_and_the_sprite_stays(sprite: SpritesSandbox, fake: FakeSprites) -> None:
    proc = sprite.start("sleep 60")
    wait_for(lambda: bool(sessions_of(fake, "sp-main")), "the command to start")
    sprite.stop()
    assert proc.wait(20) is not None
    assert sprite.exec("echo still here").stdout == "still here\n"


def test_parallel_commands_do_not_mix_their_output(sprite: SpritesSandbox) -> None:
    results: dict[int, str] = {}

    def run(i: int) -> None:
        results[i] = sprite.exec(f"for n in 1 2 3; do echo {i}-$n; done").stdout

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {i: f"{i}-1\n{i}-2\n{i}-3\n" for i in range(4)}


def test_an_interactive_terminal_runs_over_the_tty_mode(sprite: SpritesSandbox, fake: FakeSprites) -> None:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    try:
        proc = sprite.attach("stty size; read line; echo got-$line", (slave, slave, slave))
        os.close(slave)  # like the CLI's shell: the caller may close its end once attach returns
        slave = -1
        os.write(master, b"typed\n")
        assert proc.wait(30) == 0
        seen = read_until(master, b"got-typed")
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    assert b"40 120" in seen
    call = fake.recorded("WS")[0]
    assert (call.param("tty"), call.param("rows"), call.param("cols")) == ("true", "40", "120")
