"""Fixtures of the core mechanisms every remote backend shares (recovery, archives, sync state): each
test runs once over the Sprites backend and once over the E2B backend, each over its loopback fake
(the real SDK on the wire, every sandbox a real local sandbox), with the fake at hand to inject faults."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from hermes_sandboxes.backends.local import LocalBackend
from hermes_sandboxes.names import unique_name
from hermes_sandboxes.sandbox import Backend, Sandbox

_FAKES = itertools.count(1)


@dataclass
class Remote:
    """A remote backend over its fake, and the faults the tests need from either fake."""

    kind: str
    backend: Backend
    fake: Any

    def cut_next_exec_stream(self) -> None:
        """The next command's output stream is cut after its first output (the command runs on)."""
        if self.kind == "e2b":
            self.fake.drop_stream("Start", after_events=2)
        else:
            from tests.fakes.sprites.server import Fault

            self.fake.inject(Fault("WS", r"/v1/sprites/[^/]+/exec", drop_exec=True))


@contextmanager
def _sprites(local: LocalBackend) -> Iterator[Remote]:
    os.environ["SPRITES_CLIENT_SIGNALS"] = "0"  # no agent-detection headers from the SDK
    from hermes_sandboxes.backends.sprites import SpritesBackend
    from hermes_sandboxes.backends.sprites.settings import SpritesSettings
    from tests.fakes.sprites import FakeSprites

    fake = FakeSprites(local, local_prefix=f"frm{os.getpid()}x{next(_FAKES)}").start()
    try:
        with SpritesBackend(SpritesSettings(api_url=fake.url), token=fake.token) as sprites:
            yield Remote("sprites", sprites, fake)
    finally:
        fake.quiesce()
        errors = fake.stop()
        assert not errors, f"the fake Sprites API could not clean up: {errors}"


@contextmanager
def _e2b(local: LocalBackend) -> Iterator[Remote]:
    from hermes_sandboxes.backends.e2b import E2BBackend
    from tests.fakes.e2b import API_KEY, FakeE2B

    with FakeE2B(local) as fake, E2BBackend(api_key=API_KEY, profile=f"/remote/{unique_name('p')}",
                                            api_url=fake.url, sandbox_url=fake.url) as backend:
        yield Remote("e2b", backend, fake)


@pytest.fixture(scope="module", params=["sprites", "e2b"])
def remote(request: pytest.FixtureRequest, local_backend: LocalBackend) -> Iterator[Remote]:
    with (_sprites if request.param == "sprites" else _e2b)(local_backend) as chosen:
        yield chosen


@pytest.fixture
def remote_sandbox(remote: Remote) -> Iterator[Sandbox]:
    if remote.kind == "e2b":
        remote.fake.world.faults.clear()
    else:
        remote.fake.reset()
    sb = remote.backend.create(unique_name("rc"))
    try:
        yield sb
    finally:
        sb.destroy()
