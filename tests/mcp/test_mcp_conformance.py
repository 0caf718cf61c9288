"""The MCP tools' shared story on the local backend (tests/sprites and tests/e2b run it over the fakes)."""

from __future__ import annotations

from pathlib import Path

from hermes_sandboxes.backends.local import LocalBackend
from tests.mcp.conformance import run_story


def test_the_tools_tell_the_whole_story_on_the_local_backend(local_backend: LocalBackend, tmp_path: Path,
                                                             prefix: str) -> None:
    told = run_story(local_backend, tmp_path / "state", prefix)
    assert told == {"preview_diff_unavailable": None}  # it diffs, forks and checkpoints: nothing degraded
