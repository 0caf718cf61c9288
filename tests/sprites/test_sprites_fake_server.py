"""The fake Sprites API, driven by the real sprites-py SDK: if the SDK accepts what it answers, the
Sprites backend's tests exercise the same encoding, framing and error mapping as production."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from sprites import SpritesClient
from sprites.exceptions import (
    APIError,
    AuthenticationError,
    ExecError,
    FileNotFoundError_,
    NetworkError,
    NotFoundError,
    SpriteError,
)
from sprites.session import kill_session
from sprites.types import ListOptions, SpriteConfig

from tests.fakes.sprites import FakeSprites, Fault


def wait_for(predicate: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_sprites_are_created_listed_updated_and_deleted(fake: FakeSprites, client: SpritesClient) -> None:
    made = client.create_sprite("fk-a", config=SpriteConfig(cpus=2, ram_mb=2048), labels=["x"])
    assert made.name == "fk-a" and made.status == "warm" and made.labels == ["x"]
    client.create_sprite("fk-b")
    client.create_sprite("other")
    assert client.get_sprite("fk-a").id == made.id
    page = client.list_sprites(ListOptions(prefix="fk-", max_results=1))
    assert [s.name for s in page.sprites] == ["fk-a"] and page.has_more
    assert sorted(s.name for s in client.list_all_sprites(prefix="fk-")) == ["fk-a", "fk-b"]
    assert client.update_sprite("fk-b", labels=["y"]).labels == ["y"]
    client.delete_sprite("fk-a")
    with pytest.raises(NotFoundError):
        client.get_sprite("fk-a")
    with pytest.raises(NotFoundError):
        client.delete_sprite("fk-a")
    create = fake.recorded("POST", "/v1/sprites")[0]
    assert create.status == 201 and create.body_size > 0


def test_a_second_create_of_the_same_name_is_refused_as_the_api_reference_says(
        fake: FakeSprites, client: SpritesClient) -> None:
    client.create_sprite("fk-dup")
    with pytest.raises(SpriteError, match=r"status 400.*name already exists"):
        client.create_sprite("fk-dup")
    fake.duplicate_status = 409
    try:
        with pytest.raises(SpriteError, match="status 409"):
            client.create_sprite("fk-dup")
    finally:
        fake.duplicate_status = 400
    assert len(fake.world.backend.names()) >= 1 and list(fake.world.sprites) == ["fk-dup"]


def test_a_create_body_with_an_unpublished_field_is_refused(fake: FakeSprites, client: SpritesClient) -> None:
    answer = client.http_client.post(f"{fake.url}/v1/sprites", json={"name": "fk-img", "image": "ubuntu:24.04"})
    assert answer.status_code == 400 and "image" in answer.text
    assert "fk-img" not in fake.world.sprites


def test_a_wrong_token_is_refused(fake: FakeSprites) -> None:
    with SpritesClient("not-the-token", base_url=fake.url) as sdk, pytest.raises(AuthenticationError):
        sdk.list_sprites()
    assert fake.recorded()[0].status == 401


def test_exec_runs_for_real_with_both_streams_exit_code_env_cwd_and_stdin(
        fake: FakeSprites, client: SpritesClient) -> None:
    sprite = client.create_sprite("fk-exec")
    result = sprite.run("bash", "-c", "echo out; echo err >&2; echo $GREETING; pwd; exit 3",
                        capture_output=True, env={"GREETING": "hello"}, cwd="/tmp")
    assert (result.returncode, result.stdout, result.stderr) == (3, b"out\nhello\n/tmp\n", b"err\n")
    cmd = sprite.command("tr", "a-z", "A-Z", stdin=io.BytesIO(b"piped in\n"))
    assert cmd.output() == b"PIPED IN\n"
    ws = fake.recorded("WS", "/v1/sprites/fk-exec/exec")[0]
    assert ws.params("cmd")[0] == "bash" and ws.params("env") == ["GREETING=hello"] and ws.param("dir") == "/tmp"
    # the file written by one command is there for the next: one real sandbox behind the Sprite
    sprite.run("bash", "-c", "echo kept > /root/f", check=True)
    assert sprite.command("cat", "/root/f").output() == b"kept\n"


def test_exec_streams_large_output_in_order(fake: FakeSprites, client: SpritesClient) -> None:
    sprite = client.create_sprite("fk-big")
    out = sprite.command("python3", "-c", "import sys\nfor i in range(200000): print(i)").output()
    assert out.splitlines()[-1] == b"199999" and len(out.splitlines()) == 200000


def test_an_unknown_sprite_refuses_the_exec_socket_with_404(fake: FakeSprites, client: SpritesClient) -> None:
    with pytest.raises(APIError) as caught:
        client.sprite("fk-none").run("true")
    assert caught.value.status_code == 404


def test_tty_exec_gets_a_terminal_of_the_asked_size(fake: FakeSprites, client: SpritesClient) -> None:
    sprite = client.create_sprite("fk-tty")
    out = sprite.command("bash", "-c", "test -t 0 && stty size", tty=True, tty_rows=33, tty_cols=101).output()
    assert b"33 101" in out
    assert fake.recorded("WS")[0].param("tty") == "true"


def test_a_running_session_is_listed_and_killed_through_the_kill_endpoint(
        fake: FakeSprites, client: SpritesClient) -> None:
    sprite = client.create_sprite("fk-kill")
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            sprite.run("bash", "-c", "sleep 60 & wait", check=True)
        except ExecError as exc:
            outcome["code"] = exc.exit_code()

    worker = threading.Thread(target=run)
    worker.start()
    wait_for(lambda: bool(sprite.list_sessions()), "the session to be listed")
    session = sprite.list_sessions()[0]
    assert session.is_active and "sleep 60" in session.command
    messages = list(kill_session(sprite, session.id, timeout=10))
    worker.join(20)
    assert not worker.is_alive() and outcome["code"] == 143  # 128 + SIGTERM, the SDK's default signal
    assert messages[-1].type == "complete"
    assert sprite.list_sessions() == []
    assert fake.recorded("POST", rf"/v1/sprites/fk-kill/exec/{session.id}/kill")[0].status == 200


def test_files_are_written_with_mode_and_parents_read_listed_and_deleted(
        fake: FakeSprites, client: SpritesClient) -> None:
    sprite = client.create_sprite("fk-fs")
    fs = sprite.filesystem("/")
    (fs / "root/deep/er/run.sh").write_bytes(b"#!/bin/sh\n", mode=0o755)
    assert sprite.command("stat", "-c", "%a", "/root/deep/er/run.sh").output() == b"755\n"
    with pytest.raises(FileNotFoundError_):
        (fs / "root/missing/x").write_bytes(b"x", mkdir_parents=False)
    assert (fs / "root/deep/er/run.sh").read_bytes() == b"#!/bin/sh\n"
    assert [p.name for p in (fs / "root/deep/er").iterdir()] == ["run.sh"]
    (fs / "root/deep/er/run.sh").unlink()
    assert not (fs / "root/deep/er/run.sh").exists()
    write = fake.recorded("PUT", "/v1/sprites/fk-fs/fs/write")[0]
    assert (write.param("mode"), write.param("mkdirParents"), write.body_size) == ("0755", "true", 10)


def test_checkpoints_are_created_listed_and_restored(fake: FakeSprites, client: SpritesClient) -> None:
    sprite = client.create_sprite("fk-ck")
    sprite.run("bash", "-c", "echo one > /root/state", check=True)
    messages = list(sprite.create_checkpoint("first one"))
    assert messages[-1].type == "complete"
    sprite.run("bash", "-c", "echo two > /root/state", check=True)
    [checkpoint] = sprite.list_checkpoints()
    assert (checkpoint.id, checkpoint.comment) == ("v1", "first one")
    assert sprite.get_checkpoint("v1").comment == "first one"
    text = [m.data for m in messages]
    assert text[-1] == "Checkpoint v1 created" and all("v1" not in t for t in text[:-1])  # the id: only there
    fake.restore_gate = gate = threading.Event()
    try:
        assert list(sprite.restore_checkpoint("v1"))[-1].type == "complete"  # answered before it is done
        with pytest.raises(Exception, match="restarting"):  # the environment restarts: exec is refused
            sprite.command("true").run()
    finally:
        gate.set()
        fake.restore_gate = None
    wait_for(lambda: not fake.world.sprites["fk-ck"].restarting, "the Sprite to be back")
    assert sprite.command("cat", "/root/state").output() == b"one\n"
    with pytest.raises(NotFoundError):
        sprite.get_checkpoint("v9")
    create = fake.recorded("POST", "/v1/sprites/fk-ck/checkpoint")[0]
    assert json.loads(create.body) == {"comment": "first one"}


def test_injected_server_errors_and_rate_limits_reach_the_sdk(fake: FakeSprites, client: SpritesClient) -> None:
    client.create_sprite("fk-err")
    fake.inject(Fault("GET", "/v1/sprites/fk-err", status=503))
    with pytest.raises(SpriteError, match="status 503"):
        client.get_sprite("fk-err")
    assert client.get_sprite("fk-err").name == "fk-err"  # only once
    fake.inject(Fault("WS", "/v1/sprites/fk-err/exec", status=429, retry_after=7))
    with pytest.raises(APIError) as caught:
        client.sprite("fk-err").run("true")
    assert caught.value.status_code == 429 and caught.value.get_retry_after_seconds() == 7
    assert [r.status for r in fake.recorded("WS")] == [429]


def test_a_dropped_exec_connection_leaves_the_command_running_until_killed(
        fake: FakeSprites, client: SpritesClient) -> None:
    sprite = client.create_sprite("fk-drop")
    fake.inject(Fault("WS", "/v1/sprites/fk-drop/exec", drop_exec=True))
    with pytest.raises(NetworkError, match="before receiving command exit status"):
        sprite.run("bash", "-c", "echo started; sleep 60", check=True)
    [session] = sprite.list_sessions()  # like the real service: the command outlives its client
    list(kill_session(sprite, session.id))
    wait_for(lambda: sprite.list_sessions() == [], "the killed session to end")


def test_a_slow_create_is_visible_as_creating_and_blocks_the_name(fake: FakeSprites, client: SpritesClient) -> None:
    fake.inject(Fault("POST", "/v1/sprites", delay=1.0))
    worker = threading.Thread(target=client.create_sprite, args=("fk-slow",))
    worker.start()
    wait_for(lambda: "fk-slow" in fake.world.sprites, "the create to start")
    assert client.get_sprite("fk-slow").status == "creating"
    with pytest.raises(SpriteError, match="status 400"):
        client.create_sprite("fk-slow")
    worker.join(30)
    assert client.get_sprite("fk-slow").status == "warm"


def test_a_lost_create_response_leaves_a_sprite_behind(fake: FakeSprites, client: SpritesClient) -> None:
    fake.inject(Fault("POST", "/v1/sprites", lose_response=True))
    with pytest.raises(NetworkError):
        client.create_sprite("fk-lost")
    assert client.get_sprite("fk-lost").status == "warm"


_RACER = """
import os, sys
os.environ["SPRITES_CLIENT_SIGNALS"] = "0"
from sprites import SpritesClient
from sprites.exceptions import SpriteError
client = SpritesClient(sys.argv[1], base_url=sys.argv[2])
try:
    client.create_sprite("fk-race")
    print("created")
except SpriteError as exc:
    print("refused", exc)
"""


def test_two_processes_creating_one_name_end_with_one_sprite(fake: FakeSprites, client: SpritesClient) -> None:
    fake.inject(Fault("POST", "/v1/sprites", delay=1.0))  # whoever comes first holds the name a while
    racers = [subprocess.Popen([sys.executable, "-c", _RACER, fake.token, fake.url], stdout=subprocess.PIPE,
                               text=True) for _ in range(2)]
    outputs = sorted(p.communicate(timeout=60)[0].split()[0] for p in racers)
    assert outputs == ["created", "refused"]
    assert [s.name for s in client.list_all_sprites(prefix="fk-race")] == ["fk-race"]
    assert sorted(r.status for r in fake.recorded("POST", "/v1/sprites")) == [201, 400]
