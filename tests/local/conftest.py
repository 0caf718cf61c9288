"""Fixtures of the local backend's real tests, and a final check that nothing was left behind."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

import pytest

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox
from tests.local.kit import leftovers, new_sandbox, register_home, temp_backend


@pytest.fixture
def sandbox(local_backend: LocalBackend) -> Iterator[LocalSandbox]:
    """A fresh sandbox, destroyed after the test (named under this run's prefix)."""
    with new_sandbox(local_backend) as sb:
        yield sb


@pytest.fixture(scope="module", params=["btrfs", "copy"])
def store_backend(request: pytest.FixtureRequest, local_backend: LocalBackend) -> Iterator[LocalBackend]:
    """Each test that asks for it runs on both kinds of store: btrfs (the default where it works, as
    here) and the full-copy fallback, in a home of its own."""
    if request.param == "btrfs":
        assert local_backend.store.kind == "btrfs"
        yield local_backend
    else:
        with temp_backend(store="copy") as backend:
            assert backend.store.kind == "copy"
            yield backend


@pytest.fixture
def sb(store_backend: LocalBackend) -> Iterator[LocalSandbox]:
    """A fresh sandbox on each kind of store."""
    with new_sandbox(store_backend) as sandbox:
        yield sandbox


def _kill_leftover_processes(found: list[str]) -> None:
    for item in found:
        if item.startswith("process "):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(item.split()[1].rstrip(":")), signal.SIGKILL)  # an init of this run


@pytest.fixture(scope="session", autouse=True)
def nothing_left_behind(local_backend: LocalBackend) -> Iterator[None]:
    """After the local tests: none of their sandboxes (cgroups, inits) and none of their own store
    homes (mounts, loop devices, directories) remain. Runs before the session backend's teardown;
    pytest_sessionfinish below checks again once that backend is gone too."""
    register_home(local_backend.home, expect_removed=False)  # tests/conftest.py removes it, later
    yield
    found = leftovers(session_store_done=False)
    _kill_leftover_processes(found)
    assert not found, "the local tests left these behind:\n" + "\n".join(found)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The last word, after every fixture's teardown: the session store is unmounted and removed
    too. Leftovers make the run fail."""
    if not any(item.nodeid.startswith("tests/local/") for item in session.items):
        return
    found = leftovers(session_store_done=True)
    if found:
        _kill_leftover_processes(found)
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line("tests/local left these behind:\n  " + "\n  ".join(found), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
