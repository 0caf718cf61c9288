"""The rootless tests' user: one per session, made and removed by the root test session."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.rootless import kit


@pytest.fixture(scope="session")
def rootless_user() -> Iterator[kit.TestUser]:
    if os.geteuid() != 0:
        pytest.fail("tests/rootless makes its own user: run it as root, as the rest of the suite")
    name = f"{kit.PREFIX}{os.getpid()}"
    kit.remove_user(name)  # a run killed before its teardown, with this pid
    kit.remove_orphans(kit.PREFIX)  # and those of killed runs with other pids
    try:
        user = kit.create_user(name)
        kit.provision(user)
        yield user
    finally:
        kit.remove_user(name)
