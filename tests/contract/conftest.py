"""The contract suite's backends: every backend of the project, and degraded variants of them.

Each test that asks for ``backend`` runs once per entry of ``TARGETS``. A cloud backend's issue adds
its own entry (its backend over the loopback fake of its service), so the same tests prove it keeps
the same contract.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import pytest

from hermes_sandboxes.backends.local import LocalBackend
from hermes_sandboxes.names import unique_name
from hermes_sandboxes.sandbox import Backend, Sandbox
from tests.contract import degraded

Target = Callable[[LocalBackend], AbstractContextManager[Backend]]


@contextmanager
def _local(local: LocalBackend) -> Iterator[Backend]:
    yield local


@contextmanager
def _local_degraded(local: LocalBackend) -> Iterator[Backend]:
    yield degraded.DegradedBackend(local)


_FAKES = itertools.count(1)


@contextmanager
def _sprites(local: LocalBackend) -> Iterator[Backend]:
    """The Sprites backend over a loopback fake Sprites API whose Sprites are local sandboxes."""
    os.environ["SPRITES_CLIENT_SIGNALS"] = "0"  # no agent-detection headers from the SDK
    from hermes_sandboxes.backends.sprites import SpritesBackend
    from hermes_sandboxes.backends.sprites.settings import SpritesSettings
    from tests.fakes.sprites import FakeSprites

    fake = FakeSprites(local, local_prefix=f"fct{os.getpid()}x{next(_FAKES)}").start()
    try:
        with SpritesBackend(SpritesSettings(api_url=fake.url), token=fake.token) as sprites:
            yield sprites
    finally:
        fake.quiesce()
        errors = fake.stop()
        assert not errors, f"the fake Sprites API could not clean up: {errors}"


@contextmanager
def _e2b(local: LocalBackend) -> Iterator[Backend]:
    """The E2B backend over the loopback fake E2B, whose sandboxes are local sandboxes in ``local``."""
    from hermes_sandboxes.backends.e2b import E2BBackend
    from tests.fakes.e2b import API_KEY, FakeE2B

    with FakeE2B(local) as fake, E2BBackend(api_key=API_KEY, profile=f"/contract/{unique_name('p')}",
                                            api_url=fake.url, sandbox_url=fake.url) as backend:
        yield backend


TARGETS: dict[str, Target] = {"local": _local, "local-degraded": _local_degraded, "sprites": _sprites,
                              "e2b": _e2b}
if os.geteuid() != 0:  # run as a normal user by tests/rootless: the same contract, rootless
    TARGETS = {"local-rootless": _local}


@pytest.fixture(params=list(TARGETS))
def backend(request: pytest.FixtureRequest, local_backend: LocalBackend) -> Iterator[Backend]:
    with TARGETS[request.param](local_backend) as chosen:
        yield chosen


@pytest.fixture
def sandbox(backend: Backend) -> Iterator[Sandbox]:
    sb = backend.create(unique_name("ct"))
    try:
        yield sb
    finally:
        sb.destroy()
