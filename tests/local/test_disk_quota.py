"""Disk limits: a sandbox cannot write past its own, across restores (whenever one is killed);
others are not touched; root inside cannot lift it."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox
from hermes_sandboxes.backends.local.store import btrfstree
from hermes_sandboxes.errors import InvalidInput, Unsupported
from hermes_sandboxes.sandbox import DoctorCheck, Limits, SandboxSpec
from tests.local.kit import killed_at, new_sandbox, sh, temp_backend

LIMIT = 32 << 20
WRITE_64M = "head -c 64M /dev/urandom > {path}; echo exit=$?; stat -c %s {path}"


def _write_64m(sb_exec: object, path: str) -> tuple[str, int]:
    assert callable(sb_exec)
    result = sb_exec(WRITE_64M.format(path=path))
    lines = result.stdout.split()
    return result.stderr, int(lines[-1])


def test_a_sandbox_cannot_write_past_its_disk_limit(local_backend: LocalBackend) -> None:
    assert local_backend.store.kind == "btrfs"
    with new_sandbox(local_backend, SandboxSpec(limits=Limits(disk_bytes=LIMIT))) as sb:
        assert sb.info().spec.limits.disk_bytes == LIMIT
        err, size = _write_64m(sb.exec, "/root/big")
        assert "Disk quota exceeded" in err
        assert size <= LIMIT
        sh(sb, "rm /root/big && echo small > /root/small")
        ck = sb.checkpoint()
        sb.restore(ck.id)  # a new layer: capped too, before anything runs in it
        err, size = _write_64m(sb.exec, "/root/again")
        assert "Disk quota exceeded" in err
        assert size <= LIMIT
        assert sh(sb, "cat /root/small").stdout == "small\n"
        with new_sandbox(local_backend) as other:  # the limit is this sandbox's, not the store's
            err, size = _write_64m(other.exec, "/root/big")
            assert size == 64 << 20, err


def test_disk_limits_are_refused_where_they_cannot_hold(local_backend: LocalBackend) -> None:
    with pytest.raises(InvalidInput):
        local_backend.create("too-small", SandboxSpec(limits=Limits(disk_bytes=4096)))
    with temp_backend(store="copy") as backend:
        with pytest.raises(Unsupported, match="btrfs"):
            backend.create("on-copies", SandboxSpec(limits=Limits(disk_bytes=LIMIT)))
        row = _disk_row(backend)
        assert row.ok and row.detail.startswith("not available: the copy store"), row


def _disk_row(backend: LocalBackend) -> DoctorCheck:
    (row,) = [c for c in backend.doctor() if c.label.startswith("disk limits")]
    return row


def test_doctor_says_disk_limits_are_available_here(local_backend: LocalBackend) -> None:
    # this machine's kernel (>= 6.7) has btrfs simple quotas, which the limit test above relies on
    row = _disk_row(local_backend)
    assert row.ok and row.detail.startswith("available"), row


def _qgroups(backend: LocalBackend) -> dict[str, tuple[int | None, list[str]]]:
    """Each qgroup of the store (``0/257``, ``1/256``...) -> its referenced-bytes limit and its
    parents, as btrfs-progs reads them from the filesystem."""
    proc = subprocess.run(["btrfs", "qgroup", "show", "-pre", "--raw", str(backend.store.root)],
                          capture_output=True, text=True, check=True)
    lines = proc.stdout.splitlines()
    rows = lines[lines.index(next(line for line in lines if line.startswith("---"))) + 1:]
    found: dict[str, tuple[int | None, list[str]]] = {}
    for row in rows:
        qgroup, _, _, max_rfer, _, parents, *_ = row.split()
        found[qgroup] = (None if max_rfer == "none" else int(max_rfer),
                         [] if parents == "-" else parents.split(","))
    return found


def _limit_of(backend: LocalBackend, volume: Path) -> int | None:
    """The smallest limit on a group the subvolume ``volume`` is a member of (None: unlimited)."""
    fd = os.open(volume, os.O_RDONLY | os.O_DIRECTORY)
    try:
        treeid = btrfstree.subvol_info(fd).treeid
    finally:
        os.close(fd)
    groups = _qgroups(backend)
    limits = [groups[parent][0] for parent in groups[f"0/{treeid}"][1]]
    return min((limit for limit in limits if limit is not None), default=None)


def _layers(sb: LocalSandbox) -> list[Path]:
    """The sandbox's live layer and any layer a restore has staged or set aside."""
    store = sb.backend.store
    return [store.layer(sb.name), *(p for p in store.sandbox_dir(sb.name).glob(".*-*") if p.is_dir())]


def _assert_limited(sb: LocalSandbox) -> None:
    assert _limit_of(sb.backend, sb.backend.store.layer(sb.name)) == LIMIT
    err, size = _write_64m(sb.exec, "/root/big")
    assert "Disk quota exceeded" in err
    assert size <= LIMIT
    sh(sb, "rm /root/big")


def test_a_restore_before_the_first_command_makes_the_limit_and_the_new_layer_is_under_it(
        local_backend: LocalBackend) -> None:
    with new_sandbox(local_backend, SandboxSpec(limits=Limits(disk_bytes=LIMIT))) as sb:
        ck = sb.checkpoint()  # nothing has run: the sandbox's quota group does not exist yet
        sb.restore(ck.id)
        _assert_limited(sb)


@pytest.mark.parametrize(("point", "state"), [("restore-staged", "after\n"),  # old init dead, new layer staged
                                              ("restore-published", "at-checkpoint\n"),  # in place, no init
                                              ("start-unrecorded", "at-checkpoint\n")])  # its init runs
def test_a_restore_killed_at_any_point_leaves_the_old_or_the_new_layer_limited(
        local_backend: LocalBackend, point: str, state: str) -> None:
    with new_sandbox(local_backend, SandboxSpec(limits=Limits(disk_bytes=LIMIT))) as sb:
        sh(sb, "echo at-checkpoint > /root/state")
        ck = sb.checkpoint()
        sh(sb, "echo after > /root/state")
        seen: list[Path] = []

        def every_layer_is_limited() -> None:
            layers = _layers(sb)
            assert len(layers) == 2, layers  # the live one and the staged (or the old) one
            for layer in layers:
                assert _limit_of(local_backend, layer) == LIMIT, layer
            seen.extend(layers)

        killed_at(point, sb, f"sb.restore({ck.id!r})", every_layer_is_limited)
        assert seen
        assert sh(sb, "cat /root/state").stdout == state
        _assert_limited(sb)
        sb.restore(ck.id)  # and restores go on
        _assert_limited(sb)


PROBE = """
import errno, fcntl, os, struct, sys
group, layer = int(sys.argv[1]), int(sys.argv[2])
calls = {  # the btrfs ioctls that could lift the limit, as the host would make them
    "quota disable": (0xC0109428, struct.pack("=QQ", 2, 0)),
    "limit none": (0x8030942B, struct.pack("=6Q", group, 1, 2**64 - 1, 0, 0, 0)),
    "leave group": (0x40189429, struct.pack("=QQQ", 0, layer, group)),
    "remove group": (0x4010942A, struct.pack("=QQ", 0, group)),
}
for line in open("/proc/self/mountinfo"):  # none: nothing inside to aim them at
    if " - btrfs " in line:
        print("btrfs mounted at", line.split()[4])
open("/root/f", "w").close()
for path in ("/", "/root", "/root/f"):
    fd = os.open(path, os.O_RDONLY)
    for name, (request, arg) in calls.items():
        try:
            fcntl.ioctl(fd, request, bytearray(arg))
            print(name, path, "SUCCEEDED")
        except OSError as exc:
            print(name, path, errno.errorcode[exc.errno])
"""


def test_root_inside_cannot_lift_its_disk_limit(local_backend: LocalBackend) -> None:
    with new_sandbox(local_backend, SandboxSpec(limits=Limits(disk_bytes=LIMIT))) as sb:
        sh(sb, "true")
        store = local_backend.store
        group = (1 << 48) | int((store.sandbox_dir(sb.name) / "quota-group").read_text())
        fd = os.open(store.layer(sb.name), os.O_RDONLY | os.O_DIRECTORY)
        try:
            layer = btrfstree.subvol_info(fd).treeid
        finally:
            os.close(fd)
        probe = sh(sb, shlex.join(["python3", "-c", PROBE, str(group), str(layer)])).stdout
        # the overlay passes no btrfs ioctl on (ENOTTY), and without CAP_SYS_ADMIN the kernel
        # would refuse them anyway
        assert len(probe.splitlines()) == 12 and "SUCCEEDED" not in probe, probe
        tools = sb.exec("btrfs quota disable /; btrfs qgroup limit none 1/0 /root; quotacheck -m / ; echo done")
        assert tools.stdout.endswith("done\n"), tools
        _assert_limited(sb)
