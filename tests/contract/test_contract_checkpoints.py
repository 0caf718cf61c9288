"""The contract for checkpoints, diff and fork, run against every backend; what a backend does not
claim in its capabilities must be refused with ``Unsupported``, never half done."""

from __future__ import annotations

import pytest

from hermes_sandboxes.errors import CheckpointNotFound, InvalidInput, Unsupported
from hermes_sandboxes.names import unique_name
from hermes_sandboxes.sandbox import Backend, Capability, ChangeKind, Sandbox, SandboxSpec


def test_restore_brings_back_exactly_the_checkpointed_files(sandbox: Sandbox) -> None:
    sandbox.exec("mkdir -p /root/app && echo v1 > /root/app/VERSION")
    taken = sandbox.checkpoint("v1")
    sandbox.exec("echo v2 > /root/app/VERSION && echo new > /root/app/NEW && rm -rf /usr/bin/git")
    sandbox.restore(taken.id)
    assert sandbox.exec("cat /root/app/VERSION; test -e /root/app/NEW || echo no-new").stdout == "v1\nno-new\n"
    assert sandbox.exec("git --version").exit_code == 0
    listed = sandbox.checkpoints()
    assert [c.id for c in listed] == [taken.id] and listed[0].comment == "v1"


def test_an_unknown_checkpoint_is_refused(sandbox: Sandbox) -> None:
    with pytest.raises(CheckpointNotFound):
        sandbox.restore("ck-nosuch")


def test_deleting_a_checkpoint_works_or_is_refused_as_unsupported(backend: Backend, sandbox: Sandbox) -> None:
    taken = sandbox.checkpoint()
    if Capability.DELETE_CHECKPOINTS in backend.capabilities:
        sandbox.delete_checkpoint(taken.id)
        assert sandbox.checkpoints() == []
    else:
        with pytest.raises(Unsupported):
            sandbox.delete_checkpoint(taken.id)
        assert [c.id for c in sandbox.checkpoints()] == [taken.id]


def test_diff_lists_changes_or_is_refused_as_unsupported(backend: Backend, sandbox: Sandbox) -> None:
    sandbox.exec("echo a > /root/a")
    taken = sandbox.checkpoint()
    sandbox.exec("echo b > /root/b && rm /root/a")
    if Capability.DIFF not in backend.capabilities:
        with pytest.raises(Unsupported):
            sandbox.diff(taken.id)
        return
    changes = {(c.path, c.kind) for c in sandbox.diff(taken.id)}
    assert ("/root/b", ChangeKind.ADDED) in changes and ("/root/a", ChangeKind.DELETED) in changes


def test_changed_since_is_true_false_or_unknown(sandbox: Sandbox) -> None:
    taken = sandbox.checkpoint()
    before = sandbox.changed_since(taken.id)
    sandbox.exec("echo changed > /root/changed")
    after = sandbox.changed_since(taken.id)
    assert before in (False, None) and after in (True, None)


def test_a_fork_has_the_checkpoints_files_and_both_run_independently(backend: Backend, sandbox: Sandbox) -> None:
    sandbox.exec("echo original > /root/state")
    taken = sandbox.checkpoint("original")
    sandbox.exec("echo later > /root/state")
    new_name = unique_name("fork")
    if Capability.FORK not in backend.capabilities:
        with pytest.raises(Unsupported):
            sandbox.fork(new_name, taken.id)
        assert new_name not in {i.name for i in backend.list()}
        return
    fork = sandbox.fork(new_name, taken.id)
    try:
        assert fork.created and fork.name == new_name and not fork.ephemeral
        assert fork.exec("cat /root/state").stdout == "original\n"
        assert sandbox.exec("cat /root/state").stdout == "later\n"  # the source is untouched
        fork.exec("echo forked > /root/state && sleep 300 &")
        assert sandbox.exec("cat /root/state").stdout == "later\n"
        assert sandbox.exec("pgrep -x sleep || echo none").stdout == "none\n"
        assert fork.checkpoints() == []
        now = sandbox.fork(unique_name("fork"))  # without a checkpoint: the source as it is now
        try:
            assert now.exec("cat /root/state").stdout == "later\n"
        finally:
            now.destroy()
    finally:
        fork.destroy()


def test_a_spec_value_the_backend_cannot_honour_is_refused(backend: Backend) -> None:
    with pytest.raises((Unsupported, InvalidInput)):
        backend.create(unique_name("ct"), SandboxSpec(image="definitely-not-an-image-here:0"))
    with pytest.raises(InvalidInput):
        backend.create(unique_name("ct"), SandboxSpec(allow=("pypi.org",)))  # an allow-list needs "proxy"


def test_the_allow_list_of_a_sandbox_changes_in_place_or_is_refused_as_unsupported(
        backend: Backend, sandbox: Sandbox) -> None:
    if Capability.EGRESS_ALLOWLIST not in backend.capabilities:
        with pytest.raises(Unsupported):
            sandbox.set_allow(["pypi.org"])
        return
    with pytest.raises(InvalidInput):  # the sandbox's network is "none": no list applies to it
        sandbox.set_allow(["pypi.org"])
    proxied = backend.create(unique_name("ct"), SandboxSpec(network="proxy", allow=("pypi.org",)))
    try:
        assert proxied.exec("true").exit_code == 0  # running: the change must not need a restart
        proxied.set_allow(["@github", "127.0.0.1:8080"])
        assert backend.get(proxied.name).info().spec.allow == ("@github", "127.0.0.1:8080")
        with pytest.raises(InvalidInput):
            proxied.set_allow(["not a host!"])
        assert proxied.info().spec.allow == ("@github", "127.0.0.1:8080")  # a refused list changes nothing
        assert proxied.exec("true").exit_code == 0
    finally:
        proxied.destroy()
