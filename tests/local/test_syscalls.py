"""The ctypes wrappers the init and the launcher rely on report what the kernel does."""

from __future__ import annotations

import os

from hermes_sandboxes.backends.local.guest import syscalls as sc


def _status_mask(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1], 16) for line in f if line.startswith(field))


def test_the_permitted_capabilities_are_the_kernels_also_after_some_are_dropped() -> None:
    assert sc.permitted_capabilities() == _status_mask("CapPrm:")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # dropping capabilities is for good: in a child
        try:
            sc.set_capabilities(frozenset({0, 1, 5, 33}))  # bits of both words
            os.write(w, f"{sc.permitted_capabilities()} {_status_mask('CapPrm:')}".encode())
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    with os.fdopen(r) as f:
        ours, kernels = (int(n) for n in f.read().split())
    assert ours == kernels == (1 << 0 | 1 << 1 | 1 << 5 | 1 << 33)
