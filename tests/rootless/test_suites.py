"""The suites of the local sandbox, run rootless: as a normal user this session makes, on a base
root filesystem of that user's own (the conformance suite's ``local-rootless`` target)."""

from __future__ import annotations

import re

from tests.conftest import ROOTLESS_ENV
from tests.rootless import kit


def _pytest(user: kit.TestUser, *selectors: str) -> str:
    env = user.env(**{ROOTLESS_ENV: "1"})
    out = user.run([str(user.python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *selectors],
                   cwd=str(kit.REPO), env=env, timeout=1200)
    tail = "\n".join((out.stdout + out.stderr).splitlines()[-60:])
    assert out.returncode == 0, f"as {user.name}:\n{tail}"
    return tail


def test_the_contract_suite_passes_rootless_as_a_normal_user(rootless_user: kit.TestUser) -> None:
    tail = _pytest(rootless_user, "tests/contract")
    passed = re.search(r"(\d+) passed", tail)
    assert passed and int(passed.group(1)) >= 25 and "skipped" not in tail, tail
