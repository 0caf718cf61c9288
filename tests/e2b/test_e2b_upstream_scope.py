"""E2B as a true drop-in for the existing E2B plugin (e2b-dev/hermes-plugin-e2b): our Hermes path
stamps every sandbox with the ``hermes_scope`` that plugin computes for the same profile, task id and
settings, and adopts a sandbox that plugin made.

The expected values come from ``upstream_scope`` below, written here from a reading of the existing
plugin's ``sandbox.py`` (``scope_id``: sha256 over NUL-joined home key from
``hermes_constants.hermes_home_key()``, task id or "default", template, persistent/ephemeral,
net/nonet, secure/insecure, cut to 32 hex digits), independently of our ``identity.py``; a few digests
are pinned as literals so that a change to both at once still fails.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import e2b
import pytest
import yaml

from hermes_sandboxes.backends.e2b import E2BBackend, scope_digest
from hermes_sandboxes.backends.e2b.settings import E2BSettings
from hermes_sandboxes.names import unique_name
from tests.fakes.e2b import API_KEY, FakeE2B


def upstream_scope(home_key: str, task_id: str, template: str, *, persistent: bool, internet: bool,
                   secure: bool) -> str:
    fields = (home_key, task_id or "default", template, "persistent" if persistent else "ephemeral",
              "net" if internet else "nonet", "secure" if secure else "insecure")
    return hashlib.sha256("\x00".join(fields).encode("utf-8")).hexdigest()[:32]


PROFILES = ("/root/.hermes", "/root/.hermes/profiles/work", "/root/.hermes/profiles/Work.Old", "/srv/hermes",
            "/home/åsa/.hermes")
TASKS = ("default", "", "session:agent:main:telegram:dm:42", "cron_nightly", "profile:work:session:x",
         "prompt-backend-probe", "t" * 300, "ünïcode/task id")
TEMPLATES = ("base", "code-interpreter-v1", "k8s9f2tmpl", "desktop")


@pytest.mark.parametrize(("home", "task", "template"), list(itertools.product(PROFILES, TASKS, TEMPLATES)))
def test_our_scope_is_upstreams_over_the_grid(home: str, task: str, template: str) -> None:
    for persistent, internet, secure in itertools.product((True, False), repeat=3):
        settings = E2BSettings(template=template, allow_internet_access=internet, secure=secure)
        assert scope_digest(home, task, settings, persistent=persistent) == upstream_scope(
            home, task, template, persistent=persistent, internet=internet, secure=secure)


@pytest.mark.parametrize(("args", "digest"), [
    (("/root/.hermes", "default", "base", True, True, True), "bfcda7e4210c3ec1de5b2062926c25cf"),
    (("/root/.hermes", "", "base", True, True, True), "bfcda7e4210c3ec1de5b2062926c25cf"),  # "" is "default"
    (("/root/.hermes/profiles/work", "session:abc", "code-interpreter-v1", False, False, True),
     "27bb62b057b7eb9ac1d0c9518da40019"),
    (("/srv/hermes", "cron_nightly", "base", True, True, False), "4a3348a6221cf4728623e467549b1db6"),
])
def test_pinned_upstream_digests(args: tuple[str, str, str, bool, bool, bool], digest: str) -> None:
    home, task, template, persistent, internet, secure = args
    assert upstream_scope(home, task, template, persistent=persistent, internet=internet, secure=secure) == digest
    settings = E2BSettings(template=template, allow_internet_access=internet, secure=secure)
    assert scope_digest(home, task, settings, persistent=persistent) == digest


# --- the backend: the Hermes form (a task) and the CLI form (a name) find each other's sandboxes ---

@pytest.fixture
def backend(fake: FakeE2B) -> Iterator[E2BBackend]:
    with E2BBackend(api_key=API_KEY, profile=f"/profiles/{unique_name('p')}", api_url=fake.url,
                    sandbox_url=fake.url) as chosen:
        yield chosen


def test_a_sandbox_opened_for_a_task_is_found_again_by_its_name_and_the_other_way_round(
        fake: FakeE2B, backend: E2BBackend) -> None:
    made = backend.open("hermes-work-1", task="session:abc")
    try:
        (create,) = fake.calls("POST", "/v2/sandboxes")
        assert create.body["metadata"]["hermes_scope"] == upstream_scope(
            backend.profile, "session:abc", "base", persistent=True, internet=True, secure=True)
        assert backend.open("hermes-work-1").sandbox_id == made.sandbox_id  # the CLI's form
        assert len(fake.calls("POST", "/v2/sandboxes")) == 1
    finally:
        made.destroy()
    legacy = backend.open("hermes-work-2")  # made by name, as our Hermes path did before task ids
    try:
        assert backend.open("hermes-work-2", task="session:def").sandbox_id == legacy.sandbox_id
        assert len(fake.calls("POST", "/v2/sandboxes")) == 2
    finally:
        legacy.destroy()


def test_ephemeral_runs_of_one_task_share_the_upstream_scope_but_never_a_sandbox(
        fake: FakeE2B, backend: E2BBackend) -> None:
    first = backend.create(unique_name("eph"), ephemeral=True, task="t-eph")
    second = backend.create(unique_name("eph"), ephemeral=True, task="t-eph")
    try:
        expected = upstream_scope(backend.profile, "t-eph", "base", persistent=False, internet=True, secure=True)
        assert first.scope == second.scope == expected and first.sandbox_id != second.sandbox_id
    finally:
        first.destroy()
        second.destroy()


# --- a real Hermes with our plugin on the fake --------------------------------------------------

@pytest.fixture
def hermes_home(fake: FakeE2B, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="hse2bup-", dir="/tmp"))
    home = root / "profiles" / "work"
    home.mkdir(parents=True)
    config = {"terminal": {"backend": "e2b"},
              "plugins": {"enabled": ["e2b"], "entries": {"e2b": {"settings": {"name_prefix": "he2bu"}}}}}
    (home / "config.yaml").write_text(yaml.safe_dump(config))
    (home / ".env").write_text(f"E2B_API_KEY={API_KEY}\n")
    monkeypatch.setenv("HERMES_HOME", str(home))
    monkeypatch.setenv("TERMINAL_ENV", "e2b")
    monkeypatch.setenv("TERMINAL_CONTAINER_PERSISTENT", "true")
    monkeypatch.setenv("E2B_API_URL", fake.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", fake.url)
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    from hermes_cli.plugins import _reset_plugin_managers_for_tests, discover_plugins

    _reset_plugin_managers_for_tests()
    discover_plugins(force=True)
    try:
        yield home
    finally:
        from tools.terminal_tool import cleanup_all_environments

        cleanup_all_environments()
        for sandbox in fake.sandboxes():
            fake.world.kill(sandbox)
        shutil.rmtree(root, ignore_errors=True)


def _terminal(command: str, task_id: str) -> dict[str, Any]:
    from model_tools import handle_function_call

    result = json.loads(handle_function_call("terminal", {"command": command}, task_id=task_id))
    assert isinstance(result, dict)
    return result


def test_a_real_hermes_stamps_the_scope_the_existing_plugin_computes(fake: FakeE2B, hermes_home: Path) -> None:
    """Hermes's CLI hands every tool call of a persistent backend the task id "default"; the
    provider gets the gateway's session keys and the empty id the same way, so those go through it
    as Hermes calls it."""
    from hermes_constants import hermes_home_key

    from hermes_sandboxes.hermes.providers.registry import registered

    def expected(task: str) -> str:
        return upstream_scope(hermes_home_key(), task, "base", persistent=True, internet=True, secure=True)

    assert _terminal("echo stamped", "t-up-1")["output"].strip() == "stamped"
    assert [s.metadata["hermes_scope"] for s in fake.sandboxes()] == [expected("default")]
    assert hermes_home_key() == str(hermes_home.resolve())
    provider = registered()["e2b"]
    for task in ("", "session:agent:main:telegram:dm:42", "cron_nightly"):
        env = provider.create_environment(cwd="", timeout=60, task_id=task,
                                          container_config={"container_persistent": True})
        try:
            made = fake.sandbox(env.recorded.inner.sandbox_id)  # type: ignore[attr-defined]
            assert made.metadata["hermes_scope"] == expected(task), task
        finally:
            env.cleanup()
    scopes = sorted(s.metadata["hermes_scope"] for s in fake.sandboxes())
    assert scopes == sorted({expected(t) for t in ("default", "session:agent:main:telegram:dm:42", "cron_nightly")})


def test_a_real_hermes_adopts_a_sandbox_the_existing_plugin_made(fake: FakeE2B, hermes_home: Path) -> None:
    """The existing plugin creates with only its two identity keys; ours must resume that sandbox
    (and its files) instead of making a second one."""
    from hermes_constants import hermes_home_key

    scope = upstream_scope(hermes_home_key(), "default", "base", persistent=True, internet=True, secure=True)
    theirs = e2b.Sandbox.create(template="base", timeout=300, api_key=API_KEY, api_url=fake.url,
                                sandbox_url=fake.url, allow_internet_access=True, secure=True,
                                metadata={"hermes_plugin": "e2b-terminal", "hermes_scope": scope},
                                lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"},
                                           "auto_resume": False})
    theirs.files.write("/home/user/made-by-upstream", "yes")
    result = _terminal("cat /home/user/made-by-upstream", "t-adopt")
    assert result["output"].strip() == "yes", result
    assert [s.sandbox_id for s in fake.sandboxes()] == [theirs.sandbox_id]


def test_a_real_hermes_stamps_an_ephemeral_run_as_the_existing_plugin_does(
        fake: FakeE2B, hermes_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hermes_constants import hermes_home_key

    from hermes_sandboxes.hermes.providers.registry import registered

    monkeypatch.setenv("TERMINAL_CONTAINER_PERSISTENT", "false")
    config = yaml.safe_load((hermes_home / "config.yaml").read_text())
    config["plugins"]["entries"]["e2b"]["settings"].update({"template": "base", "secure": False})
    (hermes_home / "config.yaml").write_text(yaml.safe_dump(config))
    provider = registered()["e2b"]
    env = provider.create_environment(cwd="", timeout=60, task_id="t-eph-hermes",
                                      container_config={"container_persistent": False})
    try:
        (made,) = fake.sandboxes()
        assert made.metadata["hermes_scope"] == upstream_scope(hermes_home_key(), "t-eph-hermes", "base",
                                                               persistent=False, internet=True, secure=False)
    finally:
        env.cleanup()
    assert fake.sandboxes() == []  # ephemeral: gone at cleanup
