"""A command killed by the sandbox's memory limit is recorded as that, and a command that succeeds
reads no cgroup file for it (issue 20: the exec overhead). Counted with the real counting backend
(tests/contract/counting.py) over the local backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_sandboxes.backends.local import LocalBackend
from hermes_sandboxes.names import unique_name
from hermes_sandboxes.recorder.command import MEMORY_KILL
from hermes_sandboxes.recorder.journal import ExecRecord
from hermes_sandboxes.recorder.state import HostState
from hermes_sandboxes.sandbox import Limits, Sandbox, SandboxSpec
from tests.contract.counting import CountingBackend

HOG = ["python3", "-c", "x = b'h' * (256 << 20); print('survived')"]


@pytest.fixture
def counted(local_backend: LocalBackend) -> CountingBackend:
    return CountingBackend(local_backend)


@pytest.fixture
def sandbox(counted: CountingBackend) -> Iterator[Sandbox]:
    made = counted.create(unique_name("oom"), SandboxSpec(limits=Limits(memory_bytes=64 << 20)))
    yield made
    made.destroy()


def test_the_memory_kill_count_is_read_once_then_only_after_a_failure(
        counted: CountingBackend, sandbox: Sandbox, tmp_path: Path) -> None:
    recorded = HostState(tmp_path, durable=False).recorded(sandbox)
    for _ in range(5):
        assert recorded.start(["true"]).wait() == 0
    assert counted.calls["oom_kills"] == 1  # the first command's count stands for the next ones
    hog = recorded.start(HOG)
    assert hog.wait(120) == 137 and hog.out_of_memory
    plain = recorded.start(["sh", "-c", "kill -9 $$"])  # SIGKILL from elsewhere: no memory kill
    assert plain.wait(60) == 137 and not plain.out_of_memory
    assert recorded.start(["true"]).wait() == 0
    assert counted.calls["oom_kills"] == 3  # once more after each failure, never after a success
    ends = [(e.exit_code, e.error) for e in recorded.journal.records_of(ExecRecord, sandbox=recorded.name)]
    assert ends[-3:] == [(137, MEMORY_KILL), (137, None), (0, None)], ends
