"""Settings that apply and errors that say where (issue #22, points 1-4), as a user sees them.

- every command option that has a setting takes its default from the effective settings (the config
  file, ``-o``, the environment): checked pair by pair with the flag unset and the setting set, on the
  full CLI and, for ``exec``, on the fast path and the warm path too;
- a config file named by ``--config`` or ``$HERMES_SANDBOXES_CONFIG`` must exist;
- each error names its true source (flag, variable, file + table + key) and its true cause;
- ``config`` shows the value in force, where it came from, and sizes for people (bytes in JSON).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from hermes_sandboxes.backends.local import LocalSandbox
from hermes_sandboxes.cli import cli
from hermes_sandboxes.names import unique_name
from tests.cli import cli_kit, warm_kit
from tests.cli.cli_kit import CLI, as_json, hs, ok

home, box = cli_kit.home, cli_kit.box


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=env)


def one_line_error(result: Result | subprocess.CompletedProcess[str], says: str, *, not_says: str = "",
                   exit_code: int = 1) -> str:
    """The one line of an error; exit 1 for an error, 2 for bad usage (a bad -o on the command line)."""
    code = result.exit_code if isinstance(result, Result) else result.returncode
    assert code == exit_code, (code, result.stdout, result.stderr)
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert says in result.stderr, result.stderr
    assert not not_says or not_says not in result.stderr, result.stderr
    return result.stderr


def config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


# -- point 1: options take their defaults from the settings ------------------------------------------


def _checkpoints(home: Path, name: str) -> list[dict[str, Any]]:
    return list(as_json(home, "checkpoint", "list", name))


WAYS = ["click", "in-process fast path", "warm"]


def _exec(way: str, home: Path, name: str, command: str, *settings: str) -> tuple[int, str]:
    """``exec NAME -- COMMAND`` with ``settings`` (global options) and no --checkpoint: code, stderr."""
    args = ["--home", str(home), *settings, "exec", name, "--", command]
    if way == "click":
        result = CliRunner().invoke(cli, args)
        return result.exit_code, result.stderr
    env = {**os.environ, **(warm_kit.WARM_OFF if way != "warm" else {})}
    done = subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=120, check=False)
    return done.returncode, done.stderr


@pytest.mark.parametrize("way", WAYS)
def test_exec_checkpoints_as_auto_checkpoint_says_when_checkpoint_is_not_given(
        home: Path, box: LocalSandbox, tmp_path: Path, way: str) -> None:
    file = config(tmp_path, '[local]\nauto_checkpoint = "always"\n')
    # twice each: the second call of a way may be the one a warm or cached path serves
    for _ in range(2):
        code, err = _exec(way, home, box.name, "rm -rf /root/gone", "-o", "auto_checkpoint=off")
        assert code == 0 and "checkpoint" not in err, err  # off: rm -rf got none
    assert _checkpoints(home, box.name) == []
    for n in (1, 2):
        code, err = _exec(way, home, box.name, f"touch /root/f{n}", "-o", "auto_checkpoint=always")
        assert code == 0 and "taken first (policy always)" in err, err  # always: even a touch
        assert len(_checkpoints(home, box.name)) == n
    code, err = _exec(way, home, box.name, "touch /root/f3", "--config", str(file))
    assert code == 0 and "taken first (policy always)" in err, err  # from the file as well
    code, err = _exec(way, home, box.name, "touch /root/f4")
    assert code == 0 and "checkpoint" not in err, err  # the default, risky: a touch is not risky
    code, err = _exec(way, home, box.name, "rm -rf /root/f4")
    assert code == 0 and "taken first (recursive rm" in err, err
    assert len(_checkpoints(home, box.name)) == 4


def test_an_explicit_checkpoint_flag_still_wins_over_the_setting(home: Path, box: LocalSandbox) -> None:
    result = ok(home, "-o", "auto_checkpoint=always", "exec", box.name, "--checkpoint", "off", "--", "touch /a")
    assert "checkpoint" not in result.stderr and _checkpoints(home, box.name) == []


def test_checkpoint_create_runs_the_health_command_setting_when_health_is_not_given(
        home: Path, box: LocalSandbox) -> None:
    result = hs(home, "-o", "health_command=exit 3", "checkpoint", "create", box.name)
    assert result.exit_code == 1 and "health check FAILED (exit 3): exit 3" in result.stderr, result.stderr
    [taken] = _checkpoints(home, box.name)
    assert taken["health"]["command"] == "exit 3" and not taken["health"]["passed"], taken


def test_create_takes_every_spec_option_from_the_settings(home: Path, tmp_path: Path) -> None:
    file = config(tmp_path, '[local]\nnetwork = "proxy"\nallow = ["pypi.org"]\nmemory = "256M"\npids = 64\n'
                            'cpus = 1\n')
    name = unique_name("spec")
    try:
        ok(home, "--config", str(file), "create", name)
        [info] = [s for s in as_json(home, "ls") if s["name"] == name]
        spec = info["spec"]
        assert (spec["network"], spec["allow"]) == ("proxy", ["pypi.org"]), spec
        assert spec["limits"]["memory_bytes"] == 256 << 20 and spec["limits"]["pids"] == 64, spec
        assert spec["limits"]["cpus"] == 1.0, spec
    finally:
        hs(home, "rm", name, "--yes")


def test_the_store_and_the_backend_come_from_the_file_when_no_flag_names_them(tmp_path: Path, home: Path) -> None:
    file = config(tmp_path, f'backend = "local"\n[local]\nhome = "{home}"\n')
    data = json.loads(invoke("--config", str(file), "config", "--json", env={"HERMES_SANDBOXES_HOME": "/elsewhere"})
                      .stdout)
    assert data["settings"]["home"] == str(home) and data["sources"]["home"] == f"{file} [local]", data
    assert data["backend_source"] == f"{file}: backend", data


# -- point 2: a named config file must exist ---------------------------------------------------------


def test_a_config_file_named_by_flag_or_variable_must_exist(tmp_path: Path, home: Path) -> None:
    missing = tmp_path / "typo.toml"
    one_line_error(hs(home, "--config", str(missing), "ls"), f"--config {missing}: no such file", exit_code=2)
    one_line_error(hs(home, "ls", env={"HERMES_SANDBOXES_CONFIG": str(missing)}),
                   f"$HERMES_SANDBOXES_CONFIG={missing}: no such file")
    # the default path may be missing: defaults apply
    env = {"HERMES_SANDBOXES_CONFIG": "", "XDG_CONFIG_HOME": str(tmp_path / "nothing-here")}
    assert hs(home, "ls", env=env).exit_code == 0
    # as a process too (the fast path and the warm path read the same rule)
    for extra in ({}, warm_kit.WARM_OFF):
        done = subprocess.run([*CLI, "--home", str(home), "--config", str(missing), "exec", "x", "--", "true"],
                              env={**os.environ, **extra}, capture_output=True, text=True, timeout=120, check=False)
        one_line_error(done, f"--config {missing}: no such file", exit_code=2)


# -- point 3: errors name their true source and cause ------------------------------------------------


def test_a_bad_override_is_blamed_on_the_override_not_on_a_file(home: Path, tmp_path: Path) -> None:
    # a bad -o is bad usage (exit 2, as click's own); the same value in a file is an error of the file
    one_line_error(hs(home, "-o", "network=wifi", "ls"), "-o network=wifi: 'wifi' is not a network mode",
                   not_says="config.toml", exit_code=2)
    file = config(tmp_path, '[local]\nnetwork = "loopback"\n')
    one_line_error(hs(home, "--config", str(file), "-o", "network=wifi", "ls"), "-o network=wifi:",
                   not_says=str(file), exit_code=2)
    one_line_error(hs(home, "-o", "bogus=1", "ls"), "-o bogus=1: unknown setting", exit_code=2)
    one_line_error(hs(home, "-o", "bogus", "ls"), "-o bogus: -o takes KEY=VALUE", exit_code=2)
    one_line_error(hs(home, "--config", str(config(tmp_path, '[local]\nnetwork = "wifi"\n')), "ls"),
                   "[local].network: 'wifi' is not a network mode")
    one_line_error(invoke("--home", "relative/dir", "ls"), "--home relative/dir: 'relative/dir' is not an absolute",
                   exit_code=2)


def test_a_bad_value_on_the_command_line_is_bad_usage_in_every_command(home: Path, tmp_path: Path) -> None:
    """Exit 2 (as click's own usage errors) for a setting given on the command line, also in the
    commands that exit 125 when the sandbox fails; 1 for the same value from a file or a variable."""
    for command in (["ls"], ["create", unique_name("cli")], ["run", "--", "true"], ["exec", "x", "--", "true"]):
        one_line_error(hs(home, "-o", "network=wifi", *command), "-o network=wifi: 'wifi' is not a network mode",
                       exit_code=2)
        one_line_error(hs(home, "--backend", "docker", *command), "--backend: unknown backend 'docker'",
                       exit_code=2)
    one_line_error(hs(home, "run", "--base", "relative", "--", "true"), "--base relative:", exit_code=2)
    # the same values from a file or a variable: errors of the file or the environment, exit 1 (not 125)
    file = config(tmp_path, '[local]\nnetwork = "wifi"\n')
    for command in (["ls"], ["run", "--", "true"], ["exec", "x", "--", "true"]):
        one_line_error(hs(home, "--config", str(file), *command), f"{file}: [local].network: 'wifi'")
        one_line_error(hs(home, *command, env={"HERMES_SANDBOXES_BACKEND": "nope"}), "$HERMES_SANDBOXES_BACKEND=nope:")


def test_a_size_without_a_unit_in_toml_says_so_without_yaml(home: Path, tmp_path: Path) -> None:
    file = config(tmp_path, "[local]\nmemory = 2048\n")
    one_line_error(hs(home, "--config", str(file), "ls"), f"{file}: [local].memory: 2048 has no unit",
                   not_says="YAML")
    file.write_text('[local]\nname_prefix = 7\n')
    one_line_error(hs(home, "--config", str(file), "ls"), "[local].name_prefix: 7 was read as a number, not text",
                   not_says="YAML")


def test_an_unknown_backend_names_where_it_was_written(tmp_path: Path) -> None:
    file = config(tmp_path, 'backend = "bogus"\n')
    one_line_error(invoke("--config", str(file), "ls"), f"{file}: backend: unknown backend 'bogus'; known backends")
    one_line_error(invoke("ls", env={"HERMES_SANDBOXES_BACKEND": "nope"}),
                   "$HERMES_SANDBOXES_BACKEND=nope: unknown backend 'nope'")
    one_line_error(invoke("--backend", "docker", "ls"), "--backend: unknown backend 'docker'", exit_code=2)


def test_a_base_that_is_not_a_root_filesystem_says_why(home: Path, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("")
    for base, why in ((tmp_path / "absent", "does not exist"), (tmp_path / "file", "is not a directory"),
                      (tmp_path / "empty", "has no bin/")):
        one_line_error(hs(home, "create", unique_name("base"), "--base", str(base)), f"--base {base}: '{base}' {why}",
                       not_says="must be an absolute path", exit_code=2)
        file = config(tmp_path, f'[local]\nbase = "{base}"\n')
        one_line_error(hs(home, "--config", str(file), "ls"), f"{file}: [local].base: '{base}' {why}")


# -- point 4: config shows what is in force and where it came from -----------------------------------


def test_config_shows_the_store_the_variable_chose_and_where_each_value_came_from(
        home: Path, tmp_path: Path) -> None:
    file = config(tmp_path, '[local]\nmemory = "2G"\nnetwork = "loopback"\n')
    env = {"HERMES_SANDBOXES_HOME": str(home)}
    result = invoke("--config", str(file), "-o", "disk=512M", "config", env=env)
    assert result.exit_code == 0, result.stderr
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()[1:]}
    assert rows["home"][1:] == [str(home), "$HERMES_SANDBOXES_HOME"], rows["home"]
    assert rows["memory"][1:] == ["2.0", "GiB", str(file), "[local]"], rows["memory"]
    assert rows["disk"][1:] == ["512.0", "MiB", "-o", "disk"], rows["disk"]
    assert rows["network"][1:] == ["loopback", str(file), "[local]"], rows["network"]
    assert rows["pids"][1:] == ["-", "default"], rows["pids"]
    data = json.loads(invoke("--config", str(file), "-o", "disk=512M", "config", "--json", env=env).stdout)
    assert data["settings"]["memory"] == 2 << 30 and data["settings"]["disk"] == 512 << 20, data  # bytes
    assert data["settings"]["home"] == str(home) and data["sources"]["home"] == "$HERMES_SANDBOXES_HOME", data
    flagged = json.loads(invoke("--home", str(home), "config", "--json").stdout)
    assert flagged["sources"]["home"] == "--home", flagged
