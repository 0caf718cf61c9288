"""Packaging: the version is written once, the licence ships, the test extra is built from the others."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import hermes_sandboxes

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_version_is_written_once_in_the_package_and_read_by_the_metadata() -> None:
    assert "version" not in PYPROJECT["project"]
    assert "version" in PYPROJECT["project"]["dynamic"]
    assert importlib.metadata.version("hermes-sandboxes") == hermes_sandboxes.__version__


def test_the_licence_file_ships_and_the_metadata_names_it() -> None:
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    assert PYPROJECT["project"]["license"] == "MIT"
    assert PYPROJECT["project"]["license-files"] == ["LICENSE"]


def test_the_test_extra_is_the_other_extras_plus_the_test_tools() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    others = {name for name in extras if name != "test"}
    selves = [req for req in extras["test"] if req.startswith("hermes-sandboxes[")]
    assert len(selves) == 1, extras["test"]
    assert set(selves[0].removeprefix("hermes-sandboxes[").removesuffix("]").split(",")) == others


def test_the_readme_keeps_to_what_a_user_needs_and_starts_with_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text().splitlines()
    assert len(readme) < 350, "history and method belong in docs/ (docs/benchmarks.md), not the README"
    first_block = readme[readme.index("```sh") + 1:readme.index("```", readme.index("```sh") + 1)]
    assert first_block[0].startswith("bash scripts/setup.sh && .venv/bin/hermes-sandboxes demo")
    assert first_block[1].startswith("bash scripts/test.sh")
    assert (ROOT / ".ci" / "run").read_text().strip().endswith("exec bash scripts/test.sh")
