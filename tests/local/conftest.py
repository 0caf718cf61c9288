"""Fixtures of the local backend's real tests, and a final check that nothing was left behind."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_REPO = str(Path(__file__).resolve().parents[2])
if _REPO not in sys.path:  # the helpers are imported as tests.local.kit, however pytest was started
    sys.path.insert(0, _REPO)

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox  # noqa: E402
from tests.local.kit import leftovers, new_sandbox, register_home  # noqa: E402


@pytest.fixture
def sandbox(local_backend: LocalBackend) -> Iterator[LocalSandbox]:
    """A fresh sandbox, destroyed after the test (named under this run's prefix)."""
    with new_sandbox(local_backend) as sb:
        yield sb


@pytest.fixture(scope="session", autouse=True)
def nothing_left_behind(store_home: Path) -> Iterator[None]:
    """After every local test (and the session backend's teardown, which runs first): no mount,
    loop device, cgroup, init process or store home of this run remains."""
    register_home(store_home, expect_removed=False)  # the session fixture removes it after us
    yield
    found = leftovers()
    for item in found:  # clean up what we can, then fail loudly
        if item.startswith("process "):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(item.split()[1].rstrip(":")), signal.SIGKILL)
    assert not found, "the local tests left these behind:\n" + "\n".join(found)
