"""Fixtures of the MCP tests: a server over the session's real local backend, its sandboxes under a
prefix of this run (so parallel runs never touch each other's), every one destroyed at the end."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_sandboxes.backends.local import LocalBackend
from hermes_sandboxes.mcp.scope import Rules
from hermes_sandboxes.mcp.server import Running
from tests.mcp.kit import COMMAND, URL, Served, running_for


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


@pytest.fixture
def served(local_backend: LocalBackend, prefix: str) -> Iterator[Served]:
    proc = subprocess.Popen([COMMAND, "--home", str(local_backend.home), "mcp", "--http", "--port", "0",
                             "--prefix", prefix], stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline().decode()
        found = URL.search(line)
        assert found is not None, line
        token_file = Path(os.environ["HERMES_SANDBOXES_STATE"]) / "mcp" / "token"
        yield Served(found.group(1), int(found.group(2)), token_file.read_text().strip(), token_file, proc, line)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:  # never leave it behind, and say so
            proc.kill()
            proc.wait()
            raise
        for info in local_backend.list():
            if info.name.startswith(f"{prefix}-"):
                local_backend.get(info.name).destroy()
