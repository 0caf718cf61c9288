"""Fixtures of the Sprites tests: one loopback fake Sprites API per test session, backed by the
session's local store, and the real sprites-py SDK pointed at it.

Every test starts with no recorded requests and no pending faults, and every Sprite it made is
destroyed (with its local sandbox) when it ends, even on failure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

os.environ["SPRITES_CLIENT_SIGNALS"] = "0"  # the SDK would otherwise add agent-detection headers


from sprites import SpritesClient

from hermes_sandboxes.backends.local import LocalBackend
from tests.fakes.sprites import FakeSprites


@pytest.fixture(scope="session")
def sprites_server(local_backend: LocalBackend) -> Iterator[FakeSprites]:
    server = FakeSprites(local_backend, local_prefix=f"fsp{os.getpid()}", disconnect_grace=10.0).start()
    yield server
    errors = server.stop()
    assert not errors, f"the fake Sprites server could not clean up: {errors}"


@pytest.fixture
def fake(sprites_server: FakeSprites) -> Iterator[FakeSprites]:
    sprites_server.reset()
    try:
        yield sprites_server
    finally:
        sprites_server.quiesce()
        sprites_server.reset()
        errors = sprites_server.world.destroy_all()
        assert not errors, f"cleanup failed: {errors}"


@pytest.fixture
def client(fake: FakeSprites) -> Iterator[SpritesClient]:
    with SpritesClient(fake.token, base_url=fake.url) as sdk:
        yield sdk
