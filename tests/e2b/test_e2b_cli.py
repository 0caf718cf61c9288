"""The CLI with ``--backend e2b`` (through the registry, as a user runs it) against the fake E2B: the
SDK is pointed there by its own environment variables, the key comes from ``E2B_API_KEY``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from hermes_sandboxes.cli import cli
from hermes_sandboxes.names import unique_name
from tests.fakes.e2b import API_KEY, FakeE2B


@pytest.fixture
def env(fake: FakeE2B, tmp_path: Path) -> dict[str, str]:
    (tmp_path / "absent.toml").write_text("")  # no settings (a named config file must exist)
    return {"E2B_API_KEY": API_KEY, "E2B_API_URL": fake.url, "E2B_SANDBOX_URL": fake.url,
            "HERMES_SANDBOXES_BACKEND": "e2b", "HERMES_SANDBOXES_STATE": str(tmp_path / "state"),
            "HERMES_SANDBOXES_CONFIG": str(tmp_path / "absent.toml"), "HOME": str(tmp_path)}


def hs(env: dict[str, str], *args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def ok(env: dict[str, str], *args: str) -> Result:
    result = hs(env, *args)
    assert result.exit_code == 0, (args, result.exit_code, result.stdout, result.stderr)
    return result


def as_json(env: dict[str, str], *args: str) -> Any:
    return json.loads(ok(env, *args, "--json").stdout)


def test_the_cli_drives_an_e2b_sandbox_end_to_end(fake: FakeE2B, env: dict[str, str]) -> None:
    name = unique_name("cli")
    ok(env, "create", name)
    try:
        (create,) = fake.calls("POST", "/v2/sandboxes")
        assert create.body["autoPause"] is True and create.headers["x-api-key"] == API_KEY
        result = hs(env, "exec", name, "--", "sh", "-c", "echo out; echo err >&2; exit 3")
        assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
        assert hs(env, "exec", name, "--timeout", "1", "--", "sleep", "60").exit_code == 124
        assert fake.calls(rpc="Process/SendSignal")
        [listed] = [s for s in as_json(env, "ls") if s["name"] == name]
        assert (listed["backend"], listed["state"], listed["ephemeral"]) == ("e2b", "running", False)
        ok(env, "checkpoint", "create", name, "-m", "first")
        [checkpoint] = as_json(env, "checkpoint", "list", name)
        [sandbox] = fake.sandboxes()
        assert checkpoint["comment"] == "first"
        [snapshot] = fake.calls("POST", f"/sandboxes/{sandbox.sandbox_id}/snapshots")
        assert re.fullmatch(rf"hs-{sandbox.metadata['hermes_scope'][:16]}-\d+", snapshot.body["name"])
        ok(env, "stop", name)
        assert [s["state"] for s in as_json(env, "ls") if s["name"] == name] == ["paused"]
        assert ok(env, "exec", name, "--", "echo", "resumed").stdout == "resumed\n"
    finally:
        ok(env, "rm", name, "--yes")
    assert fake.sandboxes() == [] and API_KEY not in hs(env, "config").stdout


def test_the_network_commands_change_an_e2b_sandboxs_egress_rules(fake: FakeE2B, env: dict[str, str]) -> None:
    name = unique_name("cli")
    ok(env, "create", name, "--network", "proxy", "--allow", "pypi.org")
    try:
        [sandbox] = fake.sandboxes()
        assert sandbox.network == {"allowOut": ["pypi.org"], "denyOut": ["0.0.0.0/0"]}
        ok(env, "network", "allow", name, "@npm", "127.0.0.1")
        assert fake.sandbox(sandbox.sandbox_id).network["allowOut"] == [
            "pypi.org", "registry.npmjs.org", "registry.yarnpkg.com", "127.0.0.1"]
        ok(env, "network", "deny", name, "pypi.org")
        shown = as_json(env, "network", "show", name)
        assert json.dumps(shown).count("pypi.org") == 0 and "@npm" in json.dumps(shown), shown
        refused = hs(env, "network", "allow", name, "*")  # E2B has no rule for it: said, nothing changed
        assert refused.exit_code != 0 and "E2B" in refused.stderr, refused.stderr
        assert fake.sandbox(sandbox.sandbox_id).network["allowOut"] == [
            "registry.npmjs.org", "registry.yarnpkg.com", "127.0.0.1"]
    finally:
        ok(env, "rm", name, "--yes")
