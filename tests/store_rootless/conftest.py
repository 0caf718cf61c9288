"""Fixtures of the rootless store tests (the suite runs as root; the scenarios run as an
unprivileged user it creates: see harness.py and kit.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT_REASON
from tests.store_rootless.harness import TestUser, unprivileged_user


@pytest.fixture(scope="session")
def test_user() -> Iterator[TestUser]:
    if os.geteuid() != 0:
        pytest.fail(ROOT_REASON)
    with unprivileged_user() as user:
        yield user


@pytest.fixture(scope="session")
def base_tarball() -> Path:
    """The rootless base's tarball, built once per machine (setup.sh test builds it first)."""
    from tests.store_rootless.base_cache import cached_tarball

    return cached_tarball()
