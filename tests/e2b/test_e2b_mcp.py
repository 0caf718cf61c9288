"""The MCP server over the E2B backend (the real e2b SDK against the fake): the shared story, with
what E2B cannot do (diff) said in the tool results instead."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from hermes_sandboxes.backends.e2b import E2BBackend
from hermes_sandboxes.backends.e2b.settings import E2BSettings
from tests.fakes.e2b import API_KEY, FakeE2B
from tests.mcp.conformance import run_story


def test_the_mcp_tools_tell_the_story_on_e2b_and_say_what_it_cannot(fake: FakeE2B, tmp_path: Path) -> None:
    with E2BBackend(E2BSettings(lease_seconds=300, command_grace_seconds=30), api_key=API_KEY,
                    profile=f"/profiles/{secrets.token_hex(4)}", api_url=fake.url, sandbox_url=fake.url) as backend:
        told = run_story(backend, tmp_path / "state", f"e2m{os.getpid()}", lease_seconds=300,
                         command_grace_seconds=30)
    assert "the e2b backend cannot diff checkpoints" in told["preview_diff_unavailable"]
    assert "cannot diff" in told["diff"]
