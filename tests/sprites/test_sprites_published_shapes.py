"""The Sprites API's answers in the shapes the published sources show, each pinned against the fake
(which answers that way, see tests/fakes/sprites/server.py): a taken name refused with 400 (or 409),
429s with their codes and retry hints, checkpoint ids only inside a progress message, automatic
checkpoints hidden by default, an asynchronous restore, every published session-list shape."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from hermes_sandboxes.backends.sprites import SpritesBackend, SpritesSandbox
from hermes_sandboxes.backends.sprites.api import API
from hermes_sandboxes.backends.sprites.settings import SpritesSettings
from hermes_sandboxes.backends.sprites.shapes import created_checkpoint_id, exec_sessions
from hermes_sandboxes.errors import InvalidInput, RateLimited, SandboxError
from tests.fakes.sprites import FakeSprites, Fault


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
    made = backend.open("sp-shapes")
    fake.reset()
    return made


# creates -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("status", [400, 409])
def test_a_create_refused_because_the_name_is_taken_adopts_the_sprite(
        backend: SpritesBackend, fake: FakeSprites, status: int) -> None:
    """A concurrent creator won between our lookup and our create: the API reference answers 400
    "Invalid request body or name already exists" (409 is read the same way)."""
    backend.open("sp-taken")  # the other process's Sprite
    fake.reset()
    fake.duplicate_status = status
    try:
        fake.inject(Fault("GET", "/v1/sprites/sp-taken", status=404))  # our first lookup: not yet there
        adopted = backend.open("sp-taken")
    finally:
        fake.duplicate_status = 400
    assert not adopted.created
    # the refusal checked with a lookup, then the Sprite adopted
    assert [r.status for r in fake.recorded(path="/v1/sprites(/sp-taken)?")] == [404, status, 200, 200]


def test_a_400_for_a_name_that_does_not_exist_is_invalid_input_not_adoption(
        backend: SpritesBackend, fake: FakeSprites) -> None:
    fake.inject(Fault("POST", "/v1/sprites", status=400, message="Invalid request body"))
    with pytest.raises(InvalidInput, match="400"):
        backend.create("sp-bad")
    assert "sp-bad" not in fake.world.sprites


@pytest.mark.parametrize("code", ["sprite_creation_rate_limited", "concurrent_sprite_limit_exceeded"])
def test_a_rate_limited_create_waits_what_the_service_asks_then_succeeds(
        backend: SpritesBackend, fake: FakeSprites, code: str) -> None:
    fake.inject(Fault("POST", "/v1/sprites", status=429, retry_after=1, code=code))
    started = time.monotonic()
    made = backend.create("sp-limited")
    assert made.created and time.monotonic() - started >= 1.0  # it waited the asked second
    assert [r.status for r in fake.recorded("POST", "/v1/sprites")] == [429, 201]


def test_a_create_rate_limited_every_time_says_why_and_when_to_retry(backend: SpritesBackend,
                                                                    fake: FakeSprites) -> None:
    fake.inject(Fault("POST", "/v1/sprites", status=429, retry_after=1, code="concurrent_sprite_limit_exceeded",
                      times=3))
    with pytest.raises(RateLimited, match=r"as many Sprites as it may.*retry in 1s") as caught:
        backend.create("sp-full")
    assert caught.value.retry_after == 1.0 and caught.value.retryable


def test_the_retry_hint_is_the_body_field_else_the_header() -> None:
    api = API("tok", "http://127.0.0.1:9")
    try:
        with_body = api.from_status(429, '{"error": "sprite_creation_rate_limited", "retry_after_seconds": 7}',
                                    "create", "x", headers={"Retry-After": "3"})
        header_only = api.from_status(429, '{"error": "sprite_creation_rate_limited"}', "create", "x",
                                      headers={"Retry-After": "3"})
    finally:
        api.close()
    assert (getattr(with_body, "retry_after", None), getattr(header_only, "retry_after", None)) == (7.0, 3.0)


# checkpoints ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "found"), [
    ("Checkpoint v8 created", "v8"), ("Checkpoint v12 created successfully", "v12"),
    ("Checkpoint created: v3", "v3"), ("Saving filesystem state...", None), ("Creating checkpoint...", None)])
def test_the_checkpoint_id_is_read_from_the_message_text(text: str, found: str | None) -> None:
    assert created_checkpoint_id([{"type": "complete", "data": text}]) == found


def test_a_checkpoint_gets_the_id_its_stream_announces(sprite: SpritesSandbox, fake: FakeSprites) -> None:
    sprite.exec("echo one > /root/state")
    first = sprite.checkpoint("first")
    second = sprite.checkpoint()
    assert (first.id, first.comment, second.id) == ("v1", "first", "v2")
    assert [c.id for c in sprite.checkpoints()] == ["v1", "v2"]
    # no listing before the create: the id comes from the stream
    assert [r.path.rsplit("/", 1)[-1] for r in fake.recorded(path=r"/v1/sprites/sp-shapes/checkpoints?")][:2] == [
        "checkpoint", "checkpoints"]


def test_a_checkpoint_stream_that_names_no_id_is_an_error(sprite: SpritesSandbox, fake: FakeSprites) -> None:
    fake.inject(Fault("POST", "/v1/sprites/sp-shapes/checkpoint",
                      stream=[{"type": "info", "data": "Creating checkpoint..."},
                              {"type": "complete", "data": "done"}]))
    with pytest.raises(SandboxError, match="without naming a checkpoint"):
        sprite.checkpoint("lost")


def test_automatic_checkpoints_are_listed_only_when_all_are_asked_for(sprite: SpritesSandbox,
                                                                     fake: FakeSprites) -> None:
    mine = sprite.checkpoint("mine")
    auto = fake.world.checkpoint("sp-shapes", "", auto=True)
    assert auto.startswith("auto-")
    assert [c.id for c in sprite.checkpoints()] == [mine.id]
    assert [c.id for c in sprite.all_checkpoints()] == [mine.id, auto]
    lists = fake.recorded("GET", "/v1/sprites/sp-shapes/checkpoints")
    assert [r.param("includeAuto") for r in lists][-2:] == [None, "true"]
    sprite.restore(auto)  # restored like any other, by id
    assert sprite.exec("true").exit_code == 0


def test_a_restore_returns_only_once_the_sprite_is_back(sprite: SpritesSandbox, fake: FakeSprites) -> None:
    """The service answers the restore at once and restarts the Sprite afterwards; the backend's
    restore waits for the restarted environment, so the next command sees the checkpoint."""
    sprite.exec("echo before > /root/state")
    taken = sprite.checkpoint("before")
    sprite.exec("echo after > /root/state")
    fake.restore_gate = gate = threading.Event()
    done = threading.Event()
    def restore() -> None:
        sprite.restore(taken.id)
        done.set()

    worker = threading.Thread(target=restore, daemon=True)
    try:
        worker.start()
        wait_for(lambda: fake.recorded("POST", f"/v1/sprites/sp-shapes/checkpoints/{taken.id}/restore"),
                 "the restore request")
        wait_for(lambda: [r for r in fake.recorded("WS") if r.status == 503], "an exec refused while restarting")
        assert not done.is_set()  # answered, but not back: the restore call still waits
    finally:
        gate.set()
        fake.restore_gate = None
    worker.join(60)
    assert done.is_set()
    assert sprite.exec("cat /root/state").stdout == "before\n"


# exec sessions -------------------------------------------------------------------------------------
@pytest.mark.parametrize("envelope", ["object", "array"])
@pytest.mark.parametrize("command", ["string", "list"])
def test_kill_by_tag_reads_every_published_session_list_shape(
        sprite: SpritesSandbox, fake: FakeSprites, envelope: str, command: str) -> None:
    fake.session_envelope, fake.session_command = envelope, command
    try:
        proc = sprite.start(["sleep", "60"], tag="shapes1")
        wait_for(lambda: any(s.active for s in sprite.sessions()), "the session to be listed")
        assert sprite.kill_tagged("shapes1")
        assert proc.wait(timeout=30) is not None
        wait_for(lambda: not any(s.active for s in sprite.sessions()), "the killed session to end")
    finally:
        fake.session_envelope, fake.session_command = "object", "string"


def test_session_list_parsing_accepts_both_envelopes_and_command_forms() -> None:
    item = {"id": "7", "is_active": True, "command": "sh -c 'exec \"$@\"' hermes-sandboxes-tag:t1 sleep 9"}
    listed = {"id": "8", "is_active": False, "cmd": ["sh", "-c", 'exec "$@"', "hermes-sandboxes-tag:t2", "ls"]}
    for data in ([item, listed], {"sessions": [item, listed]}):
        sessions = exec_sessions(data)
        assert [(s.id, s.active, "hermes-sandboxes-tag:t1" in s.words) for s in sessions] == [
            ("7", True, True), ("8", False, False)]
        assert "hermes-sandboxes-tag:t2" in sessions[1].words
    assert exec_sessions({"sessions": None}) == [] and exec_sessions("nonsense") == []
