"""Pure functions of the plugin: settings validation, names, secrets. No sandbox needed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hermes_sandboxes.backends.local.settings import LocalSettings
from hermes_sandboxes.errors import InvalidInput
from hermes_sandboxes.hermes.naming import (
    Profile,
    ephemeral_name,
    persistent_name,
    require_within_prefix,
    task_key_for_scope,
)
from hermes_sandboxes.names import is_valid_name
from hermes_sandboxes.recorder.credentials import Redactor, StreamRedactor, plan_credentials, programs_invoked
from hermes_sandboxes.settings import InvalidSettings, validate_settings
from hermes_sandboxes.util.units import parse_size

DEFAULT = Profile("default", "/root/.hermes")
WORK = Profile("work", "/root/.hermes/profiles/work")
WHERE = "plugins.entries.sandbox.settings"


def _settings(**raw: object) -> LocalSettings:
    return validate_settings(LocalSettings, raw, where=WHERE)


def test_names_are_pinned_so_an_upgrade_never_orphans_a_sandbox() -> None:
    assert persistent_name("hermes", DEFAULT, "default") == "hermes-default-f2e6023b4978"
    assert persistent_name("hermes", WORK, "session:abc") == "hermes-work-session-abc-3364c37f06db"


def test_names_stay_dns_bounded_with_the_longest_prefix_and_key() -> None:
    name = persistent_name("a" * 40, DEFAULT, "session:" + "x" * 300)
    assert len(name) <= 63 and is_valid_name(name) and name.startswith("a" * 40 + "-")


def test_a_component_boundary_cannot_be_moved_to_forge_another_name() -> None:
    assert persistent_name("ab", DEFAULT, "c") != persistent_name("a", DEFAULT, "bc")
    assert persistent_name("hermes", Profile("x", "/a"), "b:c") != persistent_name("hermes", Profile("x", "/a:b"), "c")


def test_truncated_hints_do_not_make_two_keys_share_a_sandbox() -> None:
    long = "session:" + "y" * 100
    assert persistent_name("p" * 40, DEFAULT, long + "1") != persistent_name("p" * 40, DEFAULT, long + "2")


def test_profiles_and_ephemeral_runs_never_share_a_name() -> None:
    assert persistent_name("hermes", DEFAULT, "default") != persistent_name("hermes", WORK, "default")
    first, second = ephemeral_name("hermes", DEFAULT, "t"), ephemeral_name("hermes", DEFAULT, "t")
    assert first != second and first.startswith("hermes-tmp-t-")


def test_instance_scope_collapses_every_task_and_the_prefix_is_enforced() -> None:
    assert task_key_for_scope("session:a", "instance") == "default"
    assert task_key_for_scope("session:a", "session") == "session:a"
    with pytest.raises(InvalidInput, match="outside this plugin's name_prefix"):
        require_within_prefix("hc-a", "hc-b-default-0123456789ab")


@pytest.mark.parametrize(("raw", "key", "reason"), [
    ({"name_prefix": 7}, "name_prefix", "7 was read as a number"),
    ({"name_prefix": True}, "name_prefix", "as a boolean"),
    ({"name_prefix": "Bad_Prefix"}, "name_prefix", "lowercase letters"),
    ({"name_prefix": "a" * 41}, "name_prefix", "at most 40"),
    ({"scope": "global"}, "scope", "not a scope"),
    ({"auto_checkpoint": True}, "auto_checkpoint", "does not say which policy"),
    ({"network": False}, "network", "as a boolean"),
    ({"memory": 2048}, "memory", "size with a unit"),
    ({"memory": "1M"}, "memory", "too small"),
    ({"pids": True}, "pids", "got True"),
    ({"cpus": 0}, "cpus", "between 0 and 1024"),
    ({"masks": "/srv"}, "masks", "list of absolute paths"),
    ({"credentials": {"flyctl": "fly-token"}}, "credentials", "env variable name"),
    ({"credentials": {"/usr/bin/flyctl": "FLY"}}, "credentials", "not a program name"),
    ({"retention": 0}, "retention", "at least 1"),
    ({"retention_min_age": -5}, "retention_min_age", "cannot be negative"),
    ({"retention_min_age": "ten minutes"}, "retention_min_age", "not a duration"),
    ({"retention_min_age": True}, "retention_min_age", "as a boolean"),
    ({"idle_timeout": 0}, "idle_timeout", "more than 0 seconds"),
    ({"idle_timeout": "soon"}, "idle_timeout", "not a duration"),
    ({"idle_timeout": True}, "idle_timeout", "as a boolean"),
    ({"nmae_prefix": "x"}, "nmae_prefix", "unknown setting"),
])
def test_an_invalid_setting_names_its_key_and_reason(raw: dict[str, object], key: str, reason: str) -> None:
    with pytest.raises(InvalidSettings) as caught:
        _settings(**raw)
    assert caught.value.key == f"{WHERE}.{key}" and reason in caught.value.reason


def test_yaml_values_are_read_the_way_a_user_means_them() -> None:
    settings = _settings(name_prefix=None, auto_checkpoint=False, cpus=2, memory="512M")
    assert settings.name_prefix == "hermes"  # null clears the setting
    assert settings.auto_checkpoint == "off"  # `auto_checkpoint: off` arrives as False
    assert settings.cpus == 2.0 and settings.memory == 512 * 1024**2
    assert settings.spec().limits.memory_bytes == 512 * 1024**2
    assert settings.retention_min_age == 600.0
    assert _settings(retention_min_age="10m").retention_min_age == 600.0
    assert _settings(retention_min_age=0).retention_min_age == 0.0
    assert _settings(idle_timeout="30m").spec().idle_timeout == 1800.0  # what a new sandbox gets
    assert _settings().spec().idle_timeout is None


def test_parse_size() -> None:
    assert parse_size("2G") == 2 * 1024**3
    assert parse_size("1.5k") == 1536
    assert parse_size("100") == 100
    for bad in ("", "2X", "-1G", True):
        with pytest.raises(InvalidInput):
            parse_size(bad)


@pytest.mark.parametrize(("command", "programs"), [
    ("flyctl deploy", {"flyctl"}),
    ("echo flyctl", {"echo"}),
    ("FOO=1 /usr/local/bin/flyctl x && ls", {"flyctl", "ls"}),
    ("sudo -E flyctl auth whoami", {"flyctl"}),
    ("x=$(flyctl token)", {"flyctl"}),
    ("cat notes | grep flyctl", {"cat", "grep"}),
    ("echo 'unterminated", set()),
])
def test_programs_invoked(command: str, programs: set[str]) -> None:
    assert programs_invoked(command) == programs


def test_a_credential_goes_only_to_a_command_running_its_program() -> None:
    secrets = {"FLY_API_TOKEN": "tok"}
    plan = plan_credentials("flyctl deploy", {"flyctl": "FLY_API_TOKEN"}, secrets.get)
    assert dict(plan.env) == {"FLY_API_TOKEN": "tok"} and plan.used == ("FLY_API_TOKEN",)
    assert not plan_credentials("echo flyctl", {"flyctl": "FLY_API_TOKEN"}, secrets.get).env
    missing = plan_credentials("flyctl", {"flyctl": "OTHER"}, secrets.get)
    assert not missing.env and missing.missing == ("OTHER",) and "OTHER" in missing.note()


def test_stream_redaction_catches_a_secret_split_across_chunks() -> None:
    out: list[bytes] = []
    stream = StreamRedactor(Redactor({"T": "secret-value"}), out.append)
    for chunk in (b"a secret-va", b"lue b secr", b"et-value", b"!"):
        stream.write(chunk)
    stream.flush()
    assert b"".join(out) == b"a [REDACTED:T] b [REDACTED:T]!"


@pytest.mark.parametrize(("value", "expected"), [(None, 2 * 1024 ** 3), (4096, 4096), ("4096", 4096), (0, 0),
                                                 ("lots", "not a whole number"), (-1, "is negative"),
                                                 (1.5, "not a whole number"), (True, "not a whole number")])
def test_the_archive_cap_follows_hermes_s_sync_back_max_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: object, expected: int | str) -> None:
    from hermes_sandboxes.hermes.config import sync_back_max_bytes

    terminal = {} if value is None else {"sync_back_max_bytes": value}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"terminal": terminal}))
    monkeypatch.setenv("HERMES_HOME", str(tmp_path))
    if isinstance(expected, int):
        assert sync_back_max_bytes() == expected
    else:
        with pytest.raises(InvalidSettings, match=f"terminal.sync_back_max_bytes: .*{expected}"):
            sync_back_max_bytes()
