"""Diffs against the read-only base: files of the base that a change deletes or brings back."""

from __future__ import annotations

import os

from hermes_sandboxes.backends.local import LocalSandbox
from hermes_sandboxes.sandbox import ChangeKind


def test_a_base_file_that_comes_back_is_added_with_its_size(sandbox: LocalSandbox) -> None:
    before = sandbox.checkpoint("git present")
    assert sandbox.exec("rm /usr/bin/git").exit_code == 0
    deleted = sandbox.checkpoint("git deleted")
    [change] = sandbox.diff(before.id, deleted.id)
    assert (change.path, change.kind, change.old_size) == (
        "/usr/bin/git", ChangeKind.DELETED, os.path.getsize("/usr/bin/git"))
    sandbox.restore(before.id)
    [back] = sandbox.diff(deleted.id)
    assert (back.path, back.kind, back.size) == ("/usr/bin/git", ChangeKind.ADDED, os.path.getsize("/usr/bin/git"))
