"""The Hermes plugin ``sprites``: the existing plugin's Sprite names (pinned), and a real Hermes
dispatching its terminal tool to a Sprite of the loopback fake through our generic provider."""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from hermes_sandboxes.hermes.naming import Profile, resolve_profile
from hermes_sandboxes.hermes.providers.sprites import ephemeral_sprite_name, sprite_name
from tests.fakes.sprites import FakeSprites

DEFAULT = Profile("default", "/root/.hermes")
WORK = Profile("work", "/root/.hermes/profiles/work")
CUSTOM = Profile("custom", "/srv/h")


@pytest.mark.parametrize(("profile", "task", "name"), [
    (DEFAULT, "default", "hermes-default"),
    (DEFAULT, "session:abc", "hermes-session-abc-a29d80"),  # lossy: a digest of the raw id keeps it apart
    (DEFAULT, "team_prod", "hermes-team-prod-44c43d"),  # ... from team-prod
    (DEFAULT, "x" * 70, "hermes-" + "x" * 43 + "-6fb5d34274c0"),  # too long for a label: bounded
    (WORK, "default", "hermes-work-default-a092ad600654"),
    (WORK, "session:abc", "hermes-work-session-abc-0a9568ecca18"),
    (CUSTOM, "default", "hermes-home-srv-h-default-41bd7e5285c5"),  # a custom home is its own domain
])
def test_sprite_names_are_the_existing_plugins(profile: Profile, task: str, name: str) -> None:
    assert sprite_name("hermes", profile, task) == name
    assert len(name) <= 63


def test_the_prefix_is_never_truncated_and_ephemeral_names_are_fresh() -> None:
    assert sprite_name("hc-42", DEFAULT, "default") == "hc-42-default"
    first, second = ephemeral_sprite_name("hermes", "session:abc"), ephemeral_sprite_name("hermes", "session:abc")
    assert first != second and first.startswith("hermes-eph-session-abc-")


@pytest.fixture
def hermes_home(fake: FakeSprites, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = Path(tempfile.mkdtemp(prefix="hsp-", dir="/tmp"))
    config = {"terminal": {"backend": "sprites"},
              "plugins": {"enabled": ["sprites"],
                          "entries": {"sprites": {"settings": {"name_prefix": "hsp", "api_url": fake.url}}}}}
    (home / "config.yaml").write_text(yaml.safe_dump(config))
    (home / ".env").write_text(f"SPRITES_TOKEN={fake.token}\n")
    monkeypatch.setenv("HERMES_HOME", str(home))
    monkeypatch.setenv("TERMINAL_ENV", "sprites")
    monkeypatch.setenv("TERMINAL_CONTAINER_PERSISTENT", "true")
    for name in ("SPRITES_TOKEN", "SPRITE_TOKEN", "SPRITES_API_URL"):
        monkeypatch.delenv(name, raising=False)
    from hermes_cli.plugins import _reset_plugin_managers_for_tests, discover_plugins

    _reset_plugin_managers_for_tests()
    discover_plugins(force=True)
    try:
        yield home
    finally:
        from tools.terminal_tool import cleanup_all_environments, clear_session_cwd

        cleanup_all_environments()
        clear_session_cwd("t-sprites")
        import shutil

        shutil.rmtree(home, ignore_errors=True)


def test_a_real_hermes_runs_its_terminal_tool_in_a_sprite_with_checkpoints(fake: FakeSprites,
                                                                           hermes_home: Path) -> None:
    from model_tools import handle_function_call

    def call(tool: str, args: dict[str, object]) -> dict[str, object]:
        result = json.loads(handle_function_call(tool, args, task_id="t-sprites"))
        assert isinstance(result, dict)
        return result

    skills = hermes_home / "skills" / "notes"
    skills.mkdir(parents=True)
    for i in range(3):
        (skills / f"note{i}.md").write_text(f"note {i}\n")
    ran = call("terminal", {"command": "echo hello from $(hostname) > /root/greeting; cat /root/greeting"})
    assert ran["exit_code"] == 0 and "hello from" in str(ran["output"]), ran
    # file sync: one fs/write per file, parents made by the service, no mkdir/stat/list on the side
    writes = [dict(r.query)["path"] for r in fake.recorded("PUT") if r.path.endswith("/fs/write")]
    assert sorted(w for w in writes if "/skills/notes/" in w) == [
        f"/root/.hermes/skills/notes/note{i}.md" for i in range(3)]
    side = [r for r in fake.requests if (r.method == "WS" and "mkdir" in str(r.query))
            or r.path.endswith(("/fs/list", "/fs/stat"))]
    assert side == []
    synced = call("terminal", {"command": "cat /root/.hermes/skills/notes/note2.md"})
    assert str(synced["output"]).strip() == "note 2"
    # Hermes resolves a CLI call's task to the profile's default: the profile-default Sprite
    expected = sprite_name("hsp", resolve_profile(), "default")
    assert sorted(fake.world.sprites) == [expected]
    saved = call("sandbox_checkpoint", {"comment": "greeting written"})
    call("terminal", {"command": "rm -rf /root/greeting"})
    restored = call("sandbox_restore", {"id": saved["checkpoint"]})
    assert restored["restored"] == saved["checkpoint"], restored
    assert "hello from" in str(call("terminal", {"command": "cat /root/greeting"})["output"])
    call("terminal", {"command": "echo more > /root/extra"})
    changed = call("sandbox_diff", {"id": saved["checkpoint"]})
    listed = changed["changes"]
    assert isinstance(listed, list) and [c["path"] for c in listed] == ["/root/extra"], changed  # in the Sprite
    assert fake.token not in json.dumps(call("sandbox_checkpoints", {}))


def test_a_session_resumes_its_sprite_as_made_when_the_size_setting_changed(
        fake: FakeSprites, hermes_home: Path, caplog: pytest.LogCaptureFixture) -> None:
    """open() refuses the Sprite with the new size (it cannot be resized); the plugin resumes it as
    it is and says so in the log, so the session's files are still there."""
    from model_tools import handle_function_call
    from tools.terminal_tool import cleanup_all_environments

    def session(ram_gb: int, command: str) -> dict[str, object]:
        cleanup_all_environments()  # the previous session ended
        config = yaml.safe_load((hermes_home / "config.yaml").read_text())
        config["plugins"]["entries"]["sprites"]["settings"]["max_ram_gb"] = ram_gb
        (hermes_home / "config.yaml").write_text(yaml.safe_dump(config))
        result = json.loads(handle_function_call("terminal", {"command": command}, task_id="t-sprites"))
        assert isinstance(result, dict) and result["exit_code"] == 0, result
        return result

    session(2, "echo kept > /root/mark")
    with caplog.at_level(logging.WARNING, logger="hermes_sandboxes.hermes.providers.base"):
        resumed = session(4, "cat /root/mark")
    assert str(resumed["output"]).strip() == "kept" and len(fake.world.sprites) == 1
    assert "memory_bytes 2147483648, not 4294967296" in caplog.text and "resuming it as it is" in caplog.text
    (sprite,) = fake.world.sprites.values()
    assert sprite.config["ram_mb"] == 2048
