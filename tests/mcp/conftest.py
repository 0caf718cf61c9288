"""Fixtures of the MCP tests: a server over the session's real local backend, its sandboxes under a
prefix of this run (so parallel runs never touch each other's), every one destroyed at the end."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_sandboxes.backends.local import LocalBackend
from hermes_sandboxes.mcp.scope import Rules
from hermes_sandboxes.mcp.server import Running
from tests.mcp.kit import running_for


@pytest.fixture
def prefix() -> str:
    return f"tmcp{os.getpid()}"


@pytest.fixture
def running(local_backend: LocalBackend, tmp_path: Path, prefix: str) -> Iterator[Running]:
    server = running_for(local_backend, tmp_path / "state", Rules(prefix=prefix))
    try:
        yield server
    finally:
        server.close()
        left = [i.name for i in local_backend.list() if i.name.startswith(f"{prefix}-")]
        for name in left:
            local_backend.get(name).destroy()

