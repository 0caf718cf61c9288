"""Names and lifecycle errors: bad input changes nothing, destroyed means gone, ephemeral is never adopted."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox
from hermes_sandboxes.errors import InvalidInput, SandboxExists, SandboxNotFound, SpecMismatch, Unsupported
from hermes_sandboxes.sandbox import Limits, SandboxSpec
from tests.local.kit import RUN_PREFIX, fresh_name, init_state, new_sandbox, pid_alive, sh

INVALID = ["", "UPPER", "under_score", "-lead", "trail-", "dou--ble", "a" * 64, "sp ace", "../up", "a/b",
           "dot.ted", "é", "new\nline"]


def _home_listing(backend: LocalBackend) -> set[str]:
    return {str(p.relative_to(backend.home)) for p in backend.home.rglob("*")
            if not str(p.relative_to(backend.home)).startswith(("mnt", "store"))}


@pytest.mark.parametrize("name", INVALID, ids=repr)
def test_invalid_names_are_rejected_and_change_nothing(local_backend: LocalBackend, name: str) -> None:
    before = _home_listing(local_backend)
    for call in (local_backend.create, local_backend.open, local_backend.get):
        with pytest.raises(InvalidInput):
            call(name)
    assert _home_listing(local_backend) == before


def test_the_longest_valid_name_works(local_backend: LocalBackend) -> None:
    name = (RUN_PREFIX + "-" + "x" * 63)[:63]
    sb = local_backend.create(name)
    try:
        assert sh(sb, "hostname").stdout.strip() == name
    finally:
        sb.destroy()


def test_an_unknown_sandbox_is_not_found(local_backend: LocalBackend) -> None:
    with pytest.raises(SandboxNotFound):
        local_backend.get(fresh_name())


def test_creating_an_existing_name_fails_and_keeps_the_sandbox(sandbox: LocalSandbox,
                                                               local_backend: LocalBackend) -> None:
    sh(sandbox, "echo mine > /root/mine")
    with pytest.raises(SandboxExists):
        local_backend.create(sandbox.name)
    assert sandbox.read_file("/root/mine") == b"mine\n"


def test_everything_fails_cleanly_on_a_destroyed_sandbox(local_backend: LocalBackend) -> None:
    sb = local_backend.create(fresh_name())
    ck = sb.checkpoint()
    sb.destroy()
    calls: list[Callable[[], object]] = [
        lambda: sb.exec("true"), lambda: sb.start("true"), lambda: sb.read_file("/etc/hostname"),
        lambda: sb.write_file("/root/x", b"x"), lambda: sb.checkpoint(), lambda: sb.checkpoints(),
        lambda: sb.restore(ck.id), lambda: sb.info(), lambda: local_backend.get(sb.name)]
    for call in calls:
        with pytest.raises(SandboxNotFound):
            call()
    assert sb.name not in local_backend.names()


def test_open_refuses_to_adopt_an_ephemeral_sandbox(local_backend: LocalBackend) -> None:
    sb = local_backend.create_ephemeral(prefix=RUN_PREFIX)
    try:
        assert sb.ephemeral and sb.name.startswith(RUN_PREFIX + "-")
        with pytest.raises(SandboxExists):
            local_backend.open(sb.name)
        assert local_backend.get(sb.name).ephemeral  # found, but not adopted
    finally:
        sb.destroy()


def test_open_creates_then_resumes_a_persistent_sandbox(local_backend: LocalBackend) -> None:
    name = fresh_name()
    try:
        first = local_backend.open(name, SandboxSpec(network="loopback"))
        sh(first, "echo persisted > /root/p")
        again = local_backend.open(name)  # no spec: as it was made
        assert again.spec.network == "loopback" and not again.ephemeral and not again.created
        assert again.read_file("/root/p") == b"persisted\n"
        assert local_backend.open(name, SandboxSpec(network="loopback")).created is False  # the same spec
        # another spec is refused, never silently ignored (asked for host, it would get loopback)
        with pytest.raises(SpecMismatch, match=f"sandbox {name} exists with network loopback, not host"):
            local_backend.open(name, SandboxSpec(network="host"))
        with pytest.raises(SpecMismatch, match=r"memory_bytes unset, not 1073741824"):
            local_backend.open(name, SandboxSpec(network="loopback", limits=Limits(memory_bytes=1 << 30)))
    finally:
        local_backend.get(name).destroy()


def test_destroy_is_idempotent_and_leaves_nothing_behind(local_backend: LocalBackend) -> None:
    with new_sandbox(local_backend) as sb:
        sh(sb, "nohup sleep 7601 >/dev/null 2>&1 & echo data > /root/data")
        sb.checkpoint()
        state = init_state(sb)
        store = local_backend.store
        layout = local_backend.layout
        places = [Path(p) for p in state["cgroups"]["dirs"].values()] + [
            layout.run_dir(sb.name), layout.meta_dir(sb.name), store.sandbox_dir(sb.name)]
        assert all(p.exists() for p in places)
        sb.destroy()
        sb.destroy()  # again: nothing to do, no error
        assert [p for p in places if p.exists()] == []
        assert not pid_alive(state["pid"])
        assert sb.name not in local_backend.names()
        with pytest.raises(SandboxNotFound):
            local_backend.get(sb.name)
    # new_sandbox's own destroy() ran a third time on exit


def test_a_sandbox_that_never_ran_can_be_destroyed(local_backend: LocalBackend) -> None:
    sb = local_backend.create(fresh_name())
    sb.destroy()
    assert not local_backend.store.sandbox_dir(sb.name).exists()
    assert not local_backend.layout.meta_dir(sb.name).exists()


def test_a_destroyed_name_can_be_created_again_from_scratch(local_backend: LocalBackend) -> None:
    with new_sandbox(local_backend) as sb:
        sh(sb, "echo old > /root/old")
        sb.checkpoint()
        sb.destroy()
        again = local_backend.create(sb.name)
        assert again.exec("cat /root/old").exit_code != 0
        assert again.checkpoints() == []


@pytest.mark.parametrize("spec", [SandboxSpec(network="wifi"),  # type: ignore[arg-type]
                                  SandboxSpec(image="ubuntu:24.04"),
                                  SandboxSpec(allow=("pypi.org",)),
                                  SandboxSpec(idle_timeout=0.0)],
                         ids=["network", "image", "allow-without-proxy", "idle-timeout"])
def test_a_bad_spec_is_rejected_before_anything_is_created(local_backend: LocalBackend,
                                                           spec: SandboxSpec) -> None:
    before = _home_listing(local_backend)
    with pytest.raises((InvalidInput, Unsupported)):
        local_backend.create(fresh_name(), spec)
    assert _home_listing(local_backend) == before


@pytest.mark.parametrize("settings", [{"masks": ("relative/path",)}, {"base": "/nonexistent-rootfs"}],
                         ids=["mask", "base"])
def test_bad_local_settings_are_rejected_before_anything_is_created(local_backend: LocalBackend,
                                                                   settings: dict[str, object]) -> None:
    before = _home_listing(local_backend)
    with pytest.raises(InvalidInput):
        LocalBackend(local_backend.home, **settings)  # type: ignore[arg-type]
    assert _home_listing(local_backend) == before


def test_relative_paths_are_rejected_for_file_operations(sandbox: LocalSandbox) -> None:
    for call in (lambda: sandbox.read_file("etc/hostname"), lambda: sandbox.write_file("x", b""),
                 lambda: sandbox.delete_file("x")):
        with pytest.raises(InvalidInput):
            call()


def test_file_operations_resolve_symlinks_inside_the_sandbox(sandbox: LocalSandbox) -> None:
    sh(sandbox, "ln -s /etc/shadow /root/to-shadow && ln -s /root /root/loop")
    assert b"$" not in sandbox.read_file("/root/to-shadow").split(b"\n")[0].split(b":")[1]
    sandbox.write_file("/root/loop/written", b"inside\n", mode=0o600)
    assert sh(sandbox, "stat -c %a /root/written; cat /root/written").stdout == "600\ninside\n"
    sandbox.delete_file("/root/written")
    with pytest.raises(FileNotFoundError):
        sandbox.read_file("/root/written")
    assert not Path("/root/written").exists()
