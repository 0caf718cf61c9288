"""Sprite names equal to the existing Sprites plugin's (NousResearch/hermes-plugin-sprites), over a
grid of profiles and task ids, including an empty task id on a named profile and HERMES_HOME
directories Hermes itself would not create; and the one place where we deliberately differ.

``upstream_name`` is written here from a reading of that plugin's ``sprites_environment.py``
(``_resolve_profile_identity``, ``_resolve_sprite_name``, ``_slugify_name_component``,
``_identity_digest``, ``_bounded_name``), independently of our providers/sprites.py; a few names
are pinned as literals.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import tempfile
from pathlib import Path, PurePosixPath

import pytest

from hermes_sandboxes.hermes.naming import Profile
from hermes_sandboxes.hermes.providers.sprites import sprite_name
from tests.fakes.sprites import FakeSprites

NATIVE = "/root/.hermes"  # the platform default home of the tests' user (root)
_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")  # Hermes's profile ids


def _collapse(value: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", value.lower()).strip("-")


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        raw = part.encode("utf-8")
        h.update(len(raw).to_bytes(4, "big") + raw)
    return h.hexdigest()[:12]


def _bounded(display: str, digest: str) -> str:
    display = display[:63 - len("hermes-") - 1 - len(digest)].strip("-")
    return f"hermes-{display}-{digest}" if display else f"hermes-{digest}"


def _slug(value: str) -> str:
    slug = _collapse(value)
    if slug == value:
        return slug
    tag = hashlib.sha256(value.encode("utf-8")).hexdigest()[:6]
    return f"{slug}-{tag}" if slug else tag


def _root(home: str) -> str:
    """Hermes's root for a HERMES_HOME (hermes_constants.get_default_hermes_root)."""
    path = PurePosixPath(home)
    if path == PurePosixPath(NATIVE) or PurePosixPath(NATIVE) in path.parents:
        return NATIVE
    return str(path.parent.parent) if path.parent.name == "profiles" else home


def _upstream_identity(home: str) -> str | None:
    root = PurePosixPath(_root(home))
    if PurePosixPath(home) == root:
        return None
    try:
        rel = PurePosixPath(home).relative_to(root / "profiles")
    except ValueError:
        return f"home:{home}"
    return None if rel.parts[0] == "default" else rel.parts[0]


def upstream_name(home: str, task: str) -> str:
    profile = _upstream_identity(home)
    if profile is None:
        legacy = f"hermes-{_slug(task) or 'default'}"
        return legacy if len(legacy) <= 63 else _bounded(_collapse(task), _digest("", task))
    return _bounded(f"{_collapse(profile) or 'profile'}-{_collapse(task) or 'default'}", _digest(profile, task))


def hermes_profile(home: str) -> Profile:
    """The Profile our resolve_profile() builds, with Hermes's own profile-name rule."""
    root = _root(home)
    if home == root:
        name = "default"
    else:
        rel = PurePosixPath(home).relative_to(root) if PurePosixPath(root) in PurePosixPath(home).parents else None
        parts = rel.parts if rel is not None else ()
        name = parts[1] if len(parts) == 2 and parts[0] == "profiles" and _ID.match(parts[1]) else "custom"
    return Profile(name, home, root)


HOMES = (NATIVE, f"{NATIVE}/profiles/default", f"{NATIVE}/profiles/work", f"{NATIVE}/profiles/team_prod",
         f"{NATIVE}/profiles/Work.Old",  # a directory Hermes would not create (upper case, a dot)
         f"{NATIVE}/profiles/" + "p" * 70,  # too long for a Hermes profile id
         f"{NATIVE}/elsewhere",  # a home under the root that is no profile
         "/srv/hermes", "/srv/hermes/profiles/ops", "/srv/hermes/profiles/Ops Team", "/opt/data")
TASKS = ("default", "", "session:abc", "session:agent:main:telegram:dm:42", "team_prod", "team-prod",
         "cron_nightly", "x" * 70, "ünïcode", "profile:work", "-")


@pytest.mark.parametrize(("home", "task"), list(itertools.product(HOMES, TASKS)))
def test_sprite_names_are_upstreams(home: str, task: str) -> None:
    assert sprite_name("hermes", hermes_profile(home), task) == upstream_name(home, task)


@pytest.mark.parametrize(("home", "task", "name"), [
    (NATIVE, "", "hermes-default"),
    (f"{NATIVE}/profiles/work", "", "hermes-work-default-6371b1d939ed"),  # "" is digested as "", not "default"
    (f"{NATIVE}/profiles/work", "default", "hermes-work-default-a092ad600654"),
    (f"{NATIVE}/profiles/Work.Old", "default", "hermes-work-old-default-9253a86fdb36"),
])
def test_pinned_names(home: str, task: str, name: str) -> None:
    assert upstream_name(home, task) == name
    assert sprite_name("hermes", hermes_profile(home), task) == name


@pytest.mark.parametrize("home", [f"{NATIVE}/profiles/work/nested", f"{NATIVE}/profiles/default/nested"])
def test_a_nested_home_keeps_its_own_sprites_where_upstream_would_share_another_profiles(home: str) -> None:
    """Upstream takes the first directory under profiles/, so this home would resume the Sprites of
    profile ``work`` (or of the default profile): another trust domain's VM. We keep it apart."""
    ours = sprite_name("hermes", hermes_profile(home), "default")
    assert ours != upstream_name(home, "default")
    assert upstream_name(home, "default") in (upstream_name(f"{NATIVE}/profiles/work", "default"),
                                              upstream_name(NATIVE, "default"))
    assert ours == sprite_name("hermes", Profile("custom", home, NATIVE), "default")
    assert ours.startswith("hermes-home-root-hermes-profiles-")


def test_resolve_profile_gives_hermes_profiles_their_upstream_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real Hermes resolution (hermes_constants, hermes_cli.profiles) on homes that exist."""
    from hermes_sandboxes.hermes.naming import resolve_profile

    root = Path(tempfile.mkdtemp(prefix="hs-cloud-names-", dir="/tmp"))
    try:
        for rel in ("profiles/work", "profiles/Work.Old", ""):
            home = root / rel if rel else root
            home.mkdir(parents=True, exist_ok=True)
            monkeypatch.setenv("HERMES_HOME", str(home))
            profile = resolve_profile()
            for task in ("", "default", "session:abc"):
                resolved = str(home.resolve())
                expected_root = str(root.resolve())
                assert profile.root == expected_root
                identity = None if resolved == expected_root else Path(resolved).name
                want = (upstream_name(NATIVE, task) if identity is None else
                        _bounded(f"{_collapse(identity)}-{_collapse(task) or 'default'}", _digest(identity, task)))
                assert sprite_name("hermes", profile, task) == want, (rel, task)
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)


def test_a_real_hermes_on_a_named_profile_adopts_the_sprite_the_existing_plugin_made(
        fake: FakeSprites, monkeypatch: pytest.MonkeyPatch) -> None:
    """The existing plugin creates ``hermes-<profile>-default-<digest>`` for an empty task id on a
    named profile; ours, loaded by a real Hermes, resumes that very Sprite and its files."""
    import shutil

    import yaml
    from hermes_cli.plugins import _reset_plugin_managers_for_tests, discover_plugins
    from sprites import SpritesClient

    from hermes_sandboxes.hermes.providers.registry import registered

    root = Path(tempfile.mkdtemp(prefix="hs-cloud-sprite-", dir="/tmp")).resolve()
    home = root / "profiles" / "work"
    home.mkdir(parents=True)
    config = {"terminal": {"backend": "sprites"},
              "plugins": {"enabled": ["sprites"], "entries": {"sprites": {"settings": {"api_url": fake.url}}}}}
    (home / "config.yaml").write_text(yaml.safe_dump(config))
    (home / ".env").write_text(f"SPRITES_TOKEN={fake.token}\n")
    monkeypatch.setenv("HERMES_HOME", str(home))
    monkeypatch.setenv("TERMINAL_ENV", "sprites")
    for name in ("SPRITES_TOKEN", "SPRITE_TOKEN", "SPRITES_API_URL"):
        monkeypatch.delenv(name, raising=False)
    _reset_plugin_managers_for_tests()
    discover_plugins(force=True)
    theirs = _bounded("work-default", _digest("work", ""))
    with SpritesClient(fake.token, base_url=fake.url) as sdk:
        sdk.create_sprite(theirs)
        sdk.sprite(theirs).filesystem("/").path("/root/made-by-upstream").write_text("yes")
    env = registered()["sprites"].create_environment(cwd="", timeout=60, task_id="",
                                                     container_config={"container_persistent": True})
    try:
        assert env.execute("cat /root/made-by-upstream")["output"].strip() == "yes"
        assert sorted(fake.world.sprites) == [theirs]
    finally:
        env.cleanup()
        shutil.rmtree(root, ignore_errors=True)
