"""The hermes-sandboxes command with ``--backend sprites`` against the fake Sprites API: the same
commands as on the local backend, reaching the Sprites backend only through the registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from hermes_sandboxes.cli import cli
from tests.fakes.sprites import FakeSprites


@pytest.fixture
def env(fake: FakeSprites, tmp_path: Path) -> dict[str, str]:
    return {"SPRITES_TOKEN": fake.token, "SPRITES_API_URL": fake.url, "HERMES_SANDBOXES_BACKEND": "sprites",
            "HERMES_SANDBOXES_STATE": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "config")}


def hs(env: dict[str, str], *args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def ok(env: dict[str, str], *args: str) -> Result:
    result = hs(env, *args)
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    return result


def test_create_exec_timeout_and_rm_through_the_cli(env: dict[str, str], fake: FakeSprites) -> None:
    ok(env, "create", "cli-one")
    result = hs(env, "exec", "cli-one", "--", "bash", "-c", "echo hi; echo err >&2; exit 3")
    assert (result.exit_code, result.stdout, result.stderr) == (3, "hi\n", "err\n")
    timed_out = hs(env, "exec", "--timeout", "1", "cli-one", "--", "sleep", "30")
    assert timed_out.exit_code == 124
    assert len(fake.recorded("POST", r"/v1/sprites/cli-one/exec/\d+/kill")) == 1
    assert [s["name"] for s in json.loads(ok(env, "ls", "--json").stdout)] == ["cli-one"]
    ok(env, "rm", "cli-one", "--yes")
    assert "cli-one" not in fake.world.sprites


def test_checkpoints_through_the_cli(env: dict[str, str], fake: FakeSprites) -> None:
    ok(env, "create", "cli-ck")
    ok(env, "exec", "cli-ck", "--", "bash", "-c", "echo one > /root/f")
    checkpoint = ok(env, "checkpoint", "create", "cli-ck", "-m", "before").stdout.strip()
    ok(env, "exec", "cli-ck", "--", "bash", "-c", "echo two > /root/f")
    listed = json.loads(ok(env, "checkpoint", "list", "cli-ck", "--json").stdout)
    assert [(c["id"], c["comment"]) for c in listed] == [(checkpoint, "before")]
    auto = fake.world.checkpoint("cli-ck", "", auto=True)  # the service's own, hidden by default
    assert [c["id"] for c in json.loads(ok(env, "checkpoint", "list", "cli-ck", "--json").stdout)] == [checkpoint]
    every = json.loads(ok(env, "checkpoint", "list", "cli-ck", "--all", "--json").stdout)
    assert [c["id"] for c in every] == [auto, checkpoint]  # newest first
    assert [s["checkpoint_count"] for s in json.loads(ok(env, "ls", "--json").stdout)] == [1]
    ok(env, "checkpoint", "restore", "cli-ck", checkpoint, "--yes")
    assert ok(env, "exec", "cli-ck", "--", "cat", "/root/f").stdout == "one\n"
    assert json.loads(ok(env, "checkpoint", "diff", "cli-ck", checkpoint, "--json").stdout)["summary"]["rows"] == []
    assert "delete" in hs(env, "checkpoint", "rm", "cli-ck", checkpoint).stderr
    ok(env, "rm", "cli-ck", "--yes")


def test_doctor_checks_the_token_against_the_api(env: dict[str, str], fake: FakeSprites) -> None:
    assert "accepts the token" in ok(env, "doctor").stdout
    refused = hs({**env, "SPRITES_TOKEN": "wrong-secret-value"}, "doctor")
    assert refused.exit_code != 0 and "wrong-secret-value" not in refused.stdout + refused.stderr
