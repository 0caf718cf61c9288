"""The faces on a backend that lacks capabilities: the recorder and the CLI degrade and say so.

The backend is ``local-degraded`` (tests/contract/degraded.py), chosen through the registry exactly
as a user chooses a backend: ``--backend local-degraded``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from hermes_sandboxes.backends.local import LocalBackend
from hermes_sandboxes.cli import cli
from hermes_sandboxes.names import unique_name
from hermes_sandboxes.recorder.options import Checkpointing, Retention
from hermes_sandboxes.recorder.state import HostState
from tests.contract import degraded


@pytest.fixture
def degraded_backend(local_backend: LocalBackend) -> degraded.DegradedBackend:
    degraded.register()
    return degraded.DegradedBackend(local_backend)


@pytest.fixture
def name(degraded_backend: degraded.DegradedBackend) -> Iterator[str]:
    box = unique_name("dg")
    degraded_backend.create(box)
    try:
        yield box
    finally:
        degraded_backend.get(box).destroy()


def run(home: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--backend", "local-degraded", "--home", str(home), *args])


def test_retention_keeps_every_checkpoint_and_says_why_when_the_backend_cannot_delete(
        degraded_backend: degraded.DegradedBackend, name: str, tmp_path: Path) -> None:
    recorded = HostState(tmp_path, durable=False).recorded(
        degraded_backend.get(name), checkpointing=Checkpointing("risky"), retention=Retention(1))
    for i in range(3):
        assert recorded.exec(f"rm -rf /root/d{i}").auto_checkpoint is not None
    assert len(recorded.checkpoints()) == 3
    assert "cannot delete checkpoints" in recorded.retention_note and "retention asks for 1" in recorded.retention_note
    assert degraded.WRAPPER_REFUSED not in recorded.retention_note


def test_a_restore_preview_says_the_backend_cannot_diff(degraded_backend: degraded.DegradedBackend, name: str,
                                                        tmp_path: Path) -> None:
    recorded = HostState(tmp_path, durable=False).recorded(degraded_backend.get(name))
    taken = recorded.checkpoint("before")
    recorded.exec("echo x > /root/x")
    preview = recorded.restore_preview(taken.id)
    assert preview.changes is None and "cannot diff" in (preview.diff_unavailable or "")
    assert degraded.WRAPPER_REFUSED not in (preview.diff_unavailable or "")
    assert [c.command for c in preview.commands or ()] == ["echo x > /root/x"]


def test_the_cli_refuses_what_the_backend_cannot_do_in_one_line(local_backend: LocalBackend, name: str) -> None:
    home = local_backend.home
    taken = run(home, "checkpoint", "create", name).stdout.strip()
    assert taken.startswith("ck-")
    for args, says in ((("checkpoint", "diff", name, taken), "cannot diff"),
                       (("fork", name, taken, unique_name("dg")), "cannot fork"),
                       (("checkpoint", "rm", name, taken), "cannot delete checkpoints"),
                       (("network", "allow", name, "pypi.org"), "no egress allow-list")):
        result = run(home, *args)
        assert result.exit_code == 1 and result.stderr.count("\n") == 1 and says in result.stderr, result.stderr
        assert degraded.WRAPPER_REFUSED not in result.stderr  # refused by the CLI's own capability check
    shell = run(home, "shell", name)
    assert shell.exit_code == 125 and "no interactive terminal" in shell.stderr
    restored = run(home, "checkpoint", "restore", name, taken, "--yes")  # the preview says why it has no diff
    assert restored.exit_code == 0 and "cannot diff" in restored.stdout
    assert degraded.WRAPPER_REFUSED not in restored.stdout + restored.stderr


def test_exec_and_the_story_work_the_same_on_the_degraded_backend(local_backend: LocalBackend, name: str) -> None:
    home = local_backend.home
    assert run(home, "exec", name, "--", "echo hi").stdout == "hi\n"
    listed = run(home, "log", name, "--json")
    assert listed.exit_code == 0 and '"echo hi"' in listed.stdout
