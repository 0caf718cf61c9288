"""Egress allow-lists on Sprites: network "proxy" as the Sprite's network policy (one allow rule
per name, presets expanded, everything else denied), changed live, enforced by the fake through
name resolution (a refused name does not resolve inside the Sprite); credential brokering refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from hermes_sandboxes.backends.sprites import SpritesBackend
from hermes_sandboxes.backends.sprites.network import policy_rules
from hermes_sandboxes.backends.sprites.settings import SpritesSettings
from hermes_sandboxes.cli import cli
from hermes_sandboxes.errors import InvalidInput
from hermes_sandboxes.sandbox import Capability, SandboxSpec
from hermes_sandboxes.settings import InvalidSettings, validate_settings
from tests.fakes.sprites import FakeSprites
from tests.local.egress_kit import http_server_process

DENY = {"domain": "*", "action": "deny"}


def allow(*names: str) -> list[dict[str, str]]:
    return [{"domain": n, "action": "allow"} for n in names]


def test_an_allow_list_becomes_one_allow_rule_per_name_and_a_final_deny() -> None:
    assert policy_rules(["@pypi", "*.example.com", "api.test:8080", "203.0.113.7", "pypi.org"]) == [
        *allow("pypi.org", "files.pythonhosted.org", "*.example.com", "api.test"), DENY]
    assert policy_rules(["*"]) == allow("*")  # any public name: the service blocks private addresses itself
    assert policy_rules([]) == [DENY]  # an empty list reaches nothing (no rules would mean no restriction)
    with pytest.raises(InvalidInput):
        policy_rules(["not a host!"])


@pytest.fixture
def backend(fake: FakeSprites) -> Iterator[SpritesBackend]:
    with SpritesBackend(SpritesSettings(api_url=fake.url), token=fake.token) as sprites:
        assert Capability.EGRESS_ALLOWLIST in sprites.capabilities
        yield sprites


@pytest.mark.parametrize("update_status", [204, 200])
def test_a_fenced_sprite_gets_its_policy_and_changes_it_live(backend: SpritesBackend, fake: FakeSprites,
                                                            update_status: int) -> None:
    fake.policy_update_status = update_status
    try:
        sprite = backend.create("sp-fenced", SandboxSpec(network="proxy", allow=("@pypi", "api.test:8080")))
        (first,) = fake.recorded("POST", "/v1/sprites/sp-fenced/policy/network")
        assert json.loads(first.body) == {"rules": [*allow("pypi.org", "files.pythonhosted.org", "api.test"), DENY]}
        assert sprite.info().spec == SandboxSpec(network="proxy", allow=("@pypi", "api.test:8080"))
        assert [i.spec.network for i in backend.list()] == ["proxy"]
        sprite.set_allow(["@github"])  # no restart: the service reloads the policy
        assert fake.world.sprites["sp-fenced"].rules == [
            *allow("github.com", "api.github.com", "codeload.github.com", "*.githubusercontent.com"), DENY]
        assert backend.get("sp-fenced").info().spec.allow == ("@github",)
        # the entries as set live in the Sprite: a command rewriting them cannot make info() lie
        sprite.exec("echo '[\"evil.example\"]' > /root/.cache/hermes-sandboxes/allow.json")
        assert sprite.info().spec.allow == ("github.com", "api.github.com", "codeload.github.com",
                                            "*.githubusercontent.com")
        inside = json.loads(sprite.exec("cat /.sprite/policy/network.json").stdout)
        assert inside["rules"][-1] == DENY  # readable from inside, as on the service
    finally:
        fake.policy_update_status = 204
    with pytest.raises(InvalidInput, match="only to network 'proxy'"):
        backend.open("sp-open").set_allow(["pypi.org"])


def test_a_curl_inside_reaches_only_allowed_names_and_network_allow_opens_one(
        fake: FakeSprites, tmp_path: Path) -> None:
    (tmp_path / "hello.txt").write_text("hello\n")
    fake.world.hosts.update({"allowed.test": "127.0.0.1", "later.test": "127.0.0.1"})
    env = {"SPRITES_TOKEN": fake.token, "SPRITES_API_URL": fake.url, "HERMES_SANDBOXES_BACKEND": "sprites",
           "HERMES_SANDBOXES_STATE": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "config")}

    def hs(*args: str) -> tuple[int, str]:
        result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
        return result.exit_code, result.stdout + result.stderr

    try:
        with http_server_process(tmp_path) as port:
            assert hs("create", "cli-fence", "--network", "proxy", "--allow", f"allowed.test:{port}")[0] == 0
            fetch = "curl -sS -f -m 10 http://{host}:" + str(port) + "/hello.txt"
            assert hs("exec", "cli-fence", "--", "sh", "-c", fetch.format(host="allowed.test")) == (0, "hello\n")
            code, said = hs("exec", "cli-fence", "--", "sh", "-c", fetch.format(host="later.test"))
            assert code != 0 and "hello" not in said and "resolve" in said.lower(), said
            assert hs("network", "allow", "cli-fence", "later.test")[0] == 0
            assert hs("exec", "cli-fence", "--", "sh", "-c", fetch.format(host="later.test")) == (0, "hello\n")
            assert hs("network", "deny", "cli-fence", f"allowed.test:{port}")[0] == 0
            assert hs("exec", "cli-fence", "--", "sh", "-c", fetch.format(host="allowed.test"))[0] != 0
            assert hs("rm", "cli-fence", "--yes")[0] == 0
    finally:
        fake.world.hosts.clear()


@pytest.mark.parametrize("model", ["sprites", "e2b"])
def test_credential_brokering_is_refused_on_the_cloud_backends_saying_why(model: str) -> None:
    from hermes_sandboxes.backends.e2b.settings import E2BSettings

    chosen = SpritesSettings if model == "sprites" else E2BSettings
    with pytest.raises(InvalidSettings) as caught:
        validate_settings(chosen, {"brokered": {"gh": {"hosts": ["api.github.com"], "env": "GH_TOKEN"}}}, where="s")
    text = str(caught.value)
    assert caught.value.key == "s.brokered" and "egress proxy" in text and "credentials setting" in text
    assert "\n" not in text


def test_the_allow_setting_gives_a_proxy_spec() -> None:
    settings = validate_settings(SpritesSettings, {"allow": ["@pypi"]}, where="s")
    assert settings.spec().network == "proxy" and settings.spec().allow == ("@pypi",)


def test_an_open_sprite_opened_with_an_allow_list_is_fenced_in_place(backend: SpritesBackend,
                                                                     fake: FakeSprites) -> None:
    """A Sprite's name is its identity (the existing plugin's names), so a Sprite made before the
    allow setting was added must get the list, never stay open unnoticed."""
    backend.open("sp-later")
    fenced = backend.open("sp-later", SandboxSpec(network="proxy", allow=("@pypi",)))
    assert fenced.fenced and fake.world.sprites["sp-later"].rules == [
        *allow("pypi.org", "files.pythonhosted.org"), DENY]
    assert backend.get("sp-later").info().spec == SandboxSpec(network="proxy", allow=("@pypi",))
    assert backend.open("sp-later", SandboxSpec(network="proxy", allow=("@pypi",))).fenced
    assert len(fake.recorded("POST", "/v1/sprites/sp-later/policy/network")) == 1  # once, not at every open


def test_a_real_hermes_with_the_allow_setting_fences_its_sprite_and_hermes_sandbox_network_opens_a_name(
        fake: FakeSprites, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil
    import subprocess
    import sys
    import tempfile

    import yaml
    from hermes_cli.plugins import _reset_plugin_managers_for_tests, discover_plugins

    from hermes_sandboxes.hermes.providers.registry import registered

    (tmp_path / "hello.txt").write_text("hello\n")
    home = Path(tempfile.mkdtemp(prefix="hs-cloud-egress-", dir="/tmp"))
    config = {"terminal": {"backend": "sprites"},
              "plugins": {"enabled": ["sprites"], "entries": {"sprites": {"settings": {
                  "api_url": fake.url, "name_prefix": "hse", "allow": ["allowed.test"]}}}}}
    (home / "config.yaml").write_text(yaml.safe_dump(config))
    (home / ".env").write_text(f"SPRITES_TOKEN={fake.token}\n")
    monkeypatch.setenv("HERMES_HOME", str(home))
    monkeypatch.setenv("TERMINAL_ENV", "sprites")
    for name in ("SPRITES_TOKEN", "SPRITE_TOKEN", "SPRITES_API_URL"):
        monkeypatch.delenv(name, raising=False)
    _reset_plugin_managers_for_tests()
    discover_plugins(force=True)
    fake.world.hosts.update({"allowed.test": "127.0.0.1", "later.test": "127.0.0.1"})
    env = registered()["sprites"].create_environment(cwd="", timeout=60, task_id="t-egress",
                                                     container_config={"container_persistent": True})
    try:
        with http_server_process(tmp_path) as port:
            fetch = "curl -sS -f -m 10 http://{host}:" + str(port) + "/hello.txt"
            assert env.execute(fetch.format(host="allowed.test"))["output"].strip() == "hello"
            refused = env.execute(fetch.format(host="later.test"))
            assert refused["returncode"] != 0 and "hello" not in refused["output"], refused
            hermes = Path(sys.executable).parent / "hermes"
            done = subprocess.run([str(hermes), "sandbox", "network", "allow", "later.test", "--sandbox",
                                   env.recorded.name], capture_output=True, text=True, timeout=120, check=False)
            assert done.returncode == 0, done.stdout + done.stderr
            assert done.stdout == f"{env.recorded.name}: network proxy, allowed: allowed.test later.test\n", done
            shown = subprocess.run([str(hermes), "sandbox", "network", "show", "--sandbox", env.recorded.name,
                                    "--json"], capture_output=True, text=True, timeout=120, check=False)
            assert shown.returncode == 0 and json.loads(shown.stdout) == {
                "sandbox": env.recorded.name, "network": "proxy", "allow": ["allowed.test", "later.test"]}, shown
            assert env.execute(fetch.format(host="later.test"))["output"].strip() == "hello"
    finally:
        env.cleanup()
        fake.world.hosts.clear()
        shutil.rmtree(home, ignore_errors=True)
