"""Choosing a backend: the registry, the config file, flags over the file over defaults, one-line
errors for an unknown backend, a missing extra or an invalid setting; ``config`` and ``fork``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar, Literal

import pytest
from click.testing import CliRunner, Result

from hermes_sandboxes import backends
from hermes_sandboxes.backends.local import LocalSandbox
from hermes_sandboxes.backends.local.settings import LocalSettings
from hermes_sandboxes.cli import cli
from hermes_sandboxes.errors import MissingDependency
from hermes_sandboxes.names import unique_name
from hermes_sandboxes.recorder.state import HostState
from tests.cli import cli_kit
from tests.cli.cli_kit import as_json, hs, ok

home, box = cli_kit.home, cli_kit.box


class TokenSettings(LocalSettings):
    """A backend setting that is a secret, to show that ``config`` never prints it."""

    backend: Literal["tokened"] = "tokened"  # type: ignore[assignment]
    token: str | None = None
    secret_keys: ClassVar[frozenset[str]] = frozenset({"token"})


backends.register(backends.BackendEntry("tokened", "a local backend with a token setting (tests)",
                                        "test_backends:TokenSettings",
                                        "hermes_sandboxes.backends.local.factory:build_backend"))
backends.register(backends.BackendEntry("needs-extra", "a backend whose SDK is not installed (tests)",
                                        "test_backends:TokenSettings", "no_such_module_hs:build",
                                        extra="needs-extra", requires=("no_such_module_hs",)))


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=env)


def one_line_error(result: Result, says: str, exit_code: int = 1) -> None:
    assert result.exit_code == exit_code, (result.exit_code, result.stdout, result.stderr)
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert says in result.stderr, result.stderr


def test_an_unknown_backend_is_one_line_listing_the_known_ones() -> None:
    one_line_error(invoke("--backend", "docker", "ls"), "unknown backend 'docker'; known backends: local, sprites, e2b",
                   2)  # the flag: bad usage
    one_line_error(invoke("ls", env={"HERMES_SANDBOXES_BACKEND": "nope"}), "unknown backend 'nope'")


def test_a_backend_without_its_extra_is_one_line_naming_the_pip_extra() -> None:
    one_line_error(invoke("--backend", "needs-extra", "ls"), "pip install -e '/path/to/checkout[needs-extra]'")
    with pytest.raises(MissingDependency, match="no_such_module_hs"):
        backends.build(TokenSettings(), "needs-extra")


def test_doctor_reports_per_backend_and_what_to_install(home: Path) -> None:
    data = as_json(home, "doctor")
    rows = {r["backend"]: r for r in data["checks"] if r["label"] == "installed"}
    assert "[needs-extra] extra" in rows["needs-extra"]["detail"]
    assert not rows["needs-extra"]["ok"]


def test_an_invalid_setting_in_the_config_file_is_one_line_naming_file_table_and_key(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[local]\nnetwork = "wifi"\n')
    one_line_error(invoke("--config", str(config), "ls"), f"{config}: [local].network: 'wifi' is not a network mode")
    config.write_text("[local\n")
    one_line_error(invoke("--config", str(config), "ls"), "cannot be parsed")
    one_line_error(invoke("-o", "cpus=4096", "ls"), "cpus", exit_code=2)  # the command line's: bad usage


def test_flags_override_the_file_and_the_file_overrides_defaults(tmp_path: Path, home: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'backend = "local"\n[local]\nhome = "{home}"\nnetwork = "loopback"\nretention = 3\n')
    shown = json.loads(invoke("--config", str(config), "config", "--json").stdout)
    assert shown["backend"] == "local" and shown["config_file_found"] is True
    assert shown["settings"]["network"] == "loopback" and shown["settings"]["retention"] == 3
    assert shown["settings"]["auto_checkpoint"] == "risky"  # a default
    overridden = json.loads(invoke("--config", str(config), "-o", "network=host", "config", "--json").stdout)
    assert overridden["settings"]["network"] == "host" and overridden["settings"]["retention"] == 3
    name = unique_name("cfg")
    try:
        assert invoke("--config", str(config), "create", name).exit_code == 0
        assert invoke("--config", str(config), "create", f"{name}-x", "--network", "none").exit_code == 0
        listed = {s["name"]: s["spec"]["network"] for s in as_json(home, "ls")}
        assert listed[name] == "loopback" and listed[f"{name}-x"] == "none"
    finally:
        hs(home, "rm", name, "--yes")
        hs(home, "rm", f"{name}-x", "--yes")


def test_a_disk_limit_comes_from_the_config_file_or_disk_and_shows_in_ls(tmp_path: Path, home: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[local]\ndisk = 64\n')  # a bare number: bytes or megabytes?
    one_line_error(invoke("--config", str(config), "ls"), "[local].disk: 64 has no unit")
    config.write_text(f'[local]\nhome = "{home}"\ndisk = "64M"\n')
    name = unique_name("disk")
    try:
        assert invoke("--config", str(config), "create", name).exit_code == 0
        assert invoke("--config", str(config), "create", f"{name}-x", "--disk", "2G").exit_code == 0
        one_line_error(invoke("--config", str(config), "create", f"{name}-y", "--disk", "64"), "no unit", 2)
        listed = {s["name"]: s["spec"]["limits"]["disk_bytes"] for s in as_json(home, "ls")}
        assert listed[name] == 64 << 20 and listed[f"{name}-x"] == 2 << 30
    finally:
        hs(home, "rm", name, "--yes")
        hs(home, "rm", f"{name}-x", "--yes")
    assert LocalSettings.model_validate({"disk": "10G"}).spec().limits.disk_bytes == 10 << 30


def test_config_shows_the_effective_settings_with_secrets_redacted(tmp_path: Path, home: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'backend = "tokened"\n[tokened]\nhome = "{home}"\ntoken = "s3cr3t-value"\n')
    plain = invoke("--config", str(config), "config")
    data = json.loads(invoke("--config", str(config), "config", "--json").stdout)
    assert plain.exit_code == 0 and "tokened" in plain.stdout
    assert data["settings"]["token"] == "[redacted]"
    assert "s3cr3t-value" not in plain.stdout + plain.stderr + json.dumps(data)


def test_fork_makes_a_new_sandbox_from_a_checkpoint_and_records_where_it_came_from(home: Path,
                                                                                 box: LocalSandbox) -> None:
    ok(home, "exec", box.name, "--", "echo original > /root/state")
    taken = ok(home, "checkpoint", "create", box.name).stdout.strip()
    ok(home, "exec", box.name, "--", "echo later > /root/state")
    new = unique_name("fork")
    try:
        assert ok(home, "fork", box.name, taken, new).stdout == f"{new}\n"
        assert ok(home, "exec", new, "--", "cat /root/state").stdout == "original\n"
        assert ok(home, "exec", box.name, "--", "cat /root/state").stdout == "later\n"
        created = as_json(home, "log", new)[0]
        assert created["type"] == "create" and created["forked_from"] == f"{box.name}@{taken}"
        one_line_error(hs(home, "fork", box.name, taken, new), "already exists")
        one_line_error(hs(home, "fork", box.name, "ck-nosuch", unique_name("fork")), "no checkpoint")
    finally:
        hs(home, "rm", new, "--yes")


def test_journals_live_in_the_host_state_directory_keyed_by_backend(home: Path, box: LocalSandbox) -> None:
    ok(home, "exec", box.name, "--", "true")
    state = HostState()
    assert state.journal_path(box.backend.key, box.name).exists()
    assert not (home / "journals").exists() and not (home / "audit.jsonl").exists()
