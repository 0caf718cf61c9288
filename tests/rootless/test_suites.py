"""The suites of the local sandbox, run rootless: as a normal user this session makes, on a base
root filesystem of that user's own (the conformance suite's ``local-rootless`` target, and the
escape, isolation, mask and egress files of root mode, whose every attack runs for real as that user)."""

from __future__ import annotations

import re

from tests.conftest import ROOTLESS_ENV
from tests.rootless import kit


def _pytest(user: kit.TestUser, *selectors: str) -> str:
    env = user.env(**{ROOTLESS_ENV: "1"})
    out = user.run([str(user.python), "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *selectors],
                   cwd=str(kit.REPO), env=env, timeout=1200)
    tail = "\n".join((out.stdout + out.stderr).splitlines()[-60:])
    assert out.returncode == 0, f"as {user.name}:\n{tail}"
    return tail


def test_the_contract_suite_passes_rootless_as_a_normal_user(rootless_user: kit.TestUser) -> None:
    tail = _pytest(rootless_user, "tests/contract")
    passed = re.search(r"(\d+) passed", tail)
    assert passed and int(passed.group(1)) >= 25 and "skipped" not in tail, tail


# what cannot run rootless, each with its reason in the file (a new skip makes this test fail)
ROOT_ONLY = {
    "test_escapes.py:test_each_denied_call_gets_another_answer_from_the_kernel_without_the_filter",
    "test_escapes.py:test_strace_still_traces_the_sandbox_s_own_processes",
    "test_escapes.py:test_shadow_backups_are_scrubbed_too",
    "test_isolation.py:test_password_hashes_of_a_rootfs_base_are_scrubbed",
}


def test_the_escape_isolation_and_mask_files_pass_rootless_as_a_normal_user(rootless_user: kit.TestUser) -> None:
    tail = _pytest(rootless_user, "tests/local/test_escapes.py", "tests/local/test_isolation.py",
                   "tests/local/test_mask_symlinks.py")
    passed = re.search(r"(\d+) passed", tail)
    assert passed and int(passed.group(1)) >= 44, tail
    skipped = re.search(r"(\d+) skipped", tail)
    assert skipped and int(skipped.group(1)) == len(ROOT_ONLY), tail


def test_the_egress_proxy_and_its_brokered_credentials_work_rootless_as_a_normal_user(
        rootless_user: kit.TestUser) -> None:
    """tests/local/test_egress.py as the user: allow-lists, the loopback TLS servers' brokered
    credentials (placeholder in, secret out to the credential's hosts only), the CA in the system
    store, and no host path in the mount table. One skip (no pip in the rootless base), named there."""
    tail = _pytest(rootless_user, "tests/local/test_egress.py")
    passed = re.search(r"(\d+) passed", tail)
    assert passed and int(passed.group(1)) >= 24, tail
    assert re.search(r"\b1 skipped\b", tail) and "xfail" not in tail and "xpass" not in tail, tail
