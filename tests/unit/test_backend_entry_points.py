"""A third-party backend declared by an installed distribution (the entry-point group
``hermes_sandboxes.backends``) is found by the registry and built with what the face passes
(``BuildContext``), like the built-in ones; a declaration that cannot be loaded is skipped.

The distribution is real: a package and its ``.dist-info`` (metadata and entry points) written into
a directory put on ``sys.path``, which is what installing it does."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_sandboxes import backends
from hermes_sandboxes.backends.local import LocalBackend

PACKAGE = '''
from typing import Literal

from hermes_sandboxes.backends import BackendEntry, BuildContext
from hermes_sandboxes.backends.local.factory import build_backend
from hermes_sandboxes.backends.local.settings import LocalSettings


class DemoSettings(LocalSettings):
    backend: Literal["ep-demo"] = "ep-demo"


def build(settings: DemoSettings, context: BuildContext):
    return build_backend(settings, context)


ENTRY = BackendEntry("ep-demo", "a backend a distribution declares (tests)", "hs_ep_demo:DemoSettings",
                     "hs_ep_demo:build", takes_context=True)
'''
ENTRY_POINTS = """[hermes_sandboxes.backends]
ep-demo = hs_ep_demo:ENTRY
ep-broken = hs_ep_missing_module:ENTRY
"""


@pytest.fixture
def installed(tmp_path: Path) -> Iterator[Path]:
    site = tmp_path / "site"
    (site / "hs_ep_demo").mkdir(parents=True)
    (site / "hs_ep_demo" / "__init__.py").write_text(PACKAGE)
    dist = site / "hs_ep_demo-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hs-ep-demo\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    sys.path.insert(0, str(site))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(site))
        sys.modules.pop("hs_ep_demo", None)


def test_a_declared_backend_is_found_and_built_with_the_context(installed: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="hermes_sandboxes.backends"):
        found = backends.discover()
    assert found == ["ep-demo"]  # the broken declaration is skipped...
    assert "ep-broken" in caplog.text and "cannot be loaded" in caplog.text  # ...and said
    assert "ep-demo" in backends.names()
    settings = backends.validate("ep-demo", {"home": str(installed / "home")}, where="a test")
    audit = installed / "state" / "audit.jsonl"
    backend = backends.build(settings, context=backends.BuildContext(audit_path=lambda key: audit))
    assert isinstance(backend, LocalBackend) and backend.home == installed / "home"
    assert backend.audit_log() == audit  # the face's state directory, not the default one


def test_the_built_in_backends_take_the_context_and_default_without_it(tmp_path: Path) -> None:
    settings = backends.validate("local", {"home": str(tmp_path / "home")}, where="a test")
    audit = tmp_path / "mine" / "audit.jsonl"
    told = backends.build(settings, context=backends.BuildContext(audit_path=lambda key: audit))
    assert isinstance(told, LocalBackend) and told.audit_log() == audit
    default = backends.build(settings)
    assert isinstance(default, LocalBackend) and default.audit_log().name == "audit.jsonl"
    assert default.audit_log().parent.name == default.key  # the host state's layout
