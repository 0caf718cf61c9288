"""Fixtures of the E2B tests: one fake E2B per session (its sandboxes are real local sandboxes in a
throw-away store), with the request log and armed faults reset for every test, and a check that
every test removed the sandboxes it made."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import _require_root, make_backend, teardown_backend
from tests.fakes.e2b import API_KEY, FakeE2B


def _reap_stale_homes() -> None:
    """Remove the stores of earlier runs killed before their teardown (their owner is gone), so a
    killed run does not leave a mounted store and a loop device behind for good."""
    for owner in Path("/tmp").glob("hse-*/owner.pid"):
        try:
            pid = int(owner.read_text())
        except (OSError, ValueError):
            continue
        if Path(f"/proc/{pid}").exists():
            continue  # a run still going (this machine runs several at once)
        with contextlib.suppress(Exception):
            stale = make_backend(owner.parent)
            stale.store  # noqa: B018 - open (mount) the store so teardown unmounts it
            teardown_backend(stale)


@pytest.fixture(scope="session")
def e2b_server() -> Iterator[FakeE2B]:
    _require_root()
    _reap_stale_homes()
    home = Path(tempfile.mkdtemp(prefix="hse-", dir="/tmp"))
    (home / "owner.pid").write_text(str(os.getpid()))
    backend = make_backend(home, image_size="8G")
    try:
        with FakeE2B(backend) as fake:
            yield fake
        assert not backend.names(), f"the fake left local sandboxes behind: {backend.names()}"
    finally:
        teardown_backend(backend)


@pytest.fixture
def fake(e2b_server: FakeE2B) -> Iterator[FakeE2B]:
    """The session's fake with an empty request log and no armed faults; sandboxes a test leaves
    behind are an error (and are removed)."""
    before = {sb.sandbox_id for sb in e2b_server.sandboxes()}
    e2b_server.clear_requests()
    e2b_server.world.faults.clear()
    yield e2b_server
    e2b_server.world.faults.clear()
    left = [sb for sb in e2b_server.sandboxes() if sb.sandbox_id not in before]
    for sb in left:
        e2b_server.world.kill(sb)
    assert not left, f"the test left sandboxes behind: {[sb.sandbox_id for sb in left]}"


@pytest.fixture
def sdk_opts(fake: FakeE2B) -> dict[str, Any]:
    """What the real SDK needs to talk to the fake instead of api.e2b.app."""
    return {"api_key": API_KEY, "api_url": fake.url, "sandbox_url": fake.url}
