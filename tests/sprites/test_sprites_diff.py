"""Checkpoint diffs on Sprites: computed in the Sprite against the service's read-only mounts of its
newest five checkpoints (emulated by the fake at the same path), for the contract's diff, the CLI's
``checkpoint diff`` and the restore preview; an older checkpoint says why it cannot be compared."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from hermes_sandboxes.backends.sprites import SpritesBackend, SpritesSandbox
from hermes_sandboxes.backends.sprites.settings import SpritesSettings
from hermes_sandboxes.cli import cli
from hermes_sandboxes.errors import CheckpointNotFound, Unsupported
from hermes_sandboxes.recorder.sandbox import RecordedSandbox
from hermes_sandboxes.sandbox import Capability, ChangeKind
from tests.fakes.sprites import FakeSprites


@pytest.fixture
def sprite(fake: FakeSprites) -> Iterator[SpritesSandbox]:
    with SpritesBackend(SpritesSettings(api_url=fake.url), token=fake.token) as backend:
        assert Capability.DIFF in backend.capabilities
        yield backend.open("sp-diff")


def kinds(changes: object) -> set[tuple[str, ChangeKind]]:
    return {(c.path, c.kind) for c in changes}  # type: ignore[attr-defined]


def test_a_diff_against_the_live_tree_and_between_two_checkpoints(sprite: SpritesSandbox,
                                                                   fake: FakeSprites) -> None:
    sprite.exec("mkdir -p /root/app && echo 1 > /root/app/keep && echo old > /root/app/edit && echo x > /root/gone")
    first = sprite.checkpoint("first")
    assert sprite.exec(f"cat /.sprite/checkpoints/{first.id}/root/app/edit").stdout == "old\n"  # the mount
    assert sprite.diff(first.id) == []
    sprite.exec("echo newer > /root/app/edit && rm /root/gone && echo n > /root/app/new && mkdir /root/d")
    changes = sprite.diff(first.id)
    assert kinds(changes) == {("/root/app/edit", ChangeKind.MODIFIED), ("/root/gone", ChangeKind.DELETED),
                              ("/root/app/new", ChangeKind.ADDED), ("/root/d", ChangeKind.ADDED)}
    edit = next(c for c in changes if c.path == "/root/app/edit")
    assert (edit.size, edit.old_size) == (6, 4)
    second = sprite.checkpoint("second")
    assert kinds(sprite.diff(first.id, second.id)) == kinds(changes)
    assert sprite.diff(second.id) == []
    # the walk ran in the Sprite: one exec, no file reads from the host
    assert not fake.recorded("GET", r".*/fs/read")


def test_a_checkpoint_older_than_the_newest_five_says_why_it_cannot_be_compared(sprite: SpritesSandbox) -> None:
    taken = [sprite.checkpoint(f"n{i}") for i in range(6)]
    with pytest.raises(Unsupported, match=r"newest 5 checkpoints"):
        sprite.diff(taken[0].id)
    assert sprite.diff(taken[1].id) == []
    with pytest.raises(CheckpointNotFound):
        sprite.diff("v99")


def test_after_a_restore_the_newest_five_are_still_mounted(sprite: SpritesSandbox) -> None:
    sprite.exec("echo a > /root/f")
    first = sprite.checkpoint("a")
    sprite.exec("echo b > /root/f")
    second = sprite.checkpoint("b")
    sprite.restore(first.id)
    assert sprite.diff(first.id) == []
    assert kinds(sprite.diff(second.id)) == {("/root/f", ChangeKind.MODIFIED)}


def test_the_restore_preview_shows_the_changed_files(sprite: SpritesSandbox, tmp_path: Path) -> None:
    from hermes_sandboxes.recorder.state import HostState

    recorded: RecordedSandbox = HostState(tmp_path / "state").recorded(sprite)
    recorded.exec("echo a > /root/kept")
    taken = recorded.checkpoint("before")
    recorded.exec("echo b > /root/kept && echo c > /root/extra")
    preview = recorded.restore_preview(taken.id)
    assert preview.changes is not None, preview.diff_unavailable
    assert kinds(preview.changes) == {("/root/kept", ChangeKind.MODIFIED), ("/root/extra", ChangeKind.ADDED)}


def test_checkpoint_diff_through_the_cli(fake: FakeSprites, tmp_path: Path) -> None:
    env = {"SPRITES_TOKEN": fake.token, "SPRITES_API_URL": fake.url, "HERMES_SANDBOXES_BACKEND": "sprites",
           "HERMES_SANDBOXES_STATE": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "config")}

    def ok(*args: str) -> str:
        result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
        assert result.exit_code == 0, (result.stdout, result.stderr)
        return result.stdout

    ok("create", "cli-diff")
    ok("exec", "cli-diff", "--", "bash", "-c", "echo one > /root/f")
    checkpoint = ok("checkpoint", "create", "cli-diff", "-m", "before").strip()
    ok("exec", "cli-diff", "--", "bash", "-c", "echo two > /root/f && echo new > /root/g")
    listed = json.loads(ok("checkpoint", "diff", "cli-diff", checkpoint, "--json"))
    (row,) = listed["summary"]["rows"]
    assert (row["path"], row["files"], row["added"], row["modified"], row["deleted"]) == ("/root", 2, 1, 1, 0)
    ok("rm", "cli-diff", "--yes")
