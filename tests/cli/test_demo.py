"""`hermes-sandboxes demo`, played for real on the session's store."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from hermes_sandboxes.backends.local import LocalBackend
from hermes_sandboxes.cli import cli
from hermes_sandboxes.cli.commands.demo import Demo
from hermes_sandboxes.recorder.state import HostState
from hermes_sandboxes.ui.output import Ui


def test_the_demo_passes_end_to_end_and_leaves_no_sandbox_behind(local_backend: LocalBackend) -> None:
    local_backend.store  # noqa: B018 - open the store here, so the session fixture unmounts it
    before = local_backend.names()
    result = CliRunner().invoke(cli, ["--home", str(local_backend.home), "demo"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = result.stdout
    for step in ("[1/10] Create a fresh sandbox", "[3/10] Checkpoint", "[7/10] Restore", "[10/10] Clean up"):
        assert step in out
    assert "command not found" in out  # git and python3 were gone ...
    assert "git version" in out and "Python 3" in out  # ... and came back
    assert "001_init.sql" in out and "002_users.sql" in out
    assert "its base: the host's own root filesystem" in out  # root mode's default base is /
    timings = out[out.index("Timings"):]
    assert "checkpoint" in timings and "restore" in timings and " ms" in timings
    assert "Demo passed" in out
    assert local_backend.names() == before
    assert list(HostState().backend_dir(local_backend.key).glob("journals/demo-*")) == []


def test_a_demo_whose_step_misbehaves_exits_1_names_the_step_and_still_cleans_up(
        local_backend: LocalBackend, capsys: pytest.CaptureFixture[str]) -> None:
    before = local_backend.names()
    # a "break" that breaks nothing: step 5 must notice that git still works
    assert Demo(local_backend, Ui(), break_command="true").run() == 1
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines()[-1].startswith("error: demo failed at step 5:")
    assert "[10/10] Clean up" in captured.out
    assert local_backend.names() == before
