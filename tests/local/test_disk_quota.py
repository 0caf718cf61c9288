"""Disk limits: a sandbox cannot write past its own, across restores; others are not touched."""

from __future__ import annotations

import pytest

from hermes_sandboxes.backends.local import LocalBackend
from hermes_sandboxes.errors import InvalidInput, Unsupported
from hermes_sandboxes.sandbox import DoctorCheck, Limits, SandboxSpec
from tests.local.kit import new_sandbox, sh, temp_backend

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
