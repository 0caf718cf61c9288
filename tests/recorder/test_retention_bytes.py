"""``retention_bytes``: automatic checkpoints are pruned, oldest first, while the checkpoints' bytes
are over the budget; the checkpoint named to the agent and the one just taken stay."""

from __future__ import annotations

from hermes_sandboxes.backends.local import LocalSandbox
from hermes_sandboxes.backends.local.settings import LocalSettings
from hermes_sandboxes.recorder.options import Checkpointing, Retention
from hermes_sandboxes.recorder.records import CheckpointDeleteRecord
from hermes_sandboxes.recorder.state import HostState
from hermes_sandboxes.settings import InvalidSettings, validate_settings

MB = 1_000_000


def test_retention_by_bytes_keeps_the_named_checkpoint(sandbox: LocalSandbox) -> None:
    budget = validate_settings(LocalSettings, {"retention_bytes": "4500K"}, where="s").retention_bytes
    assert budget == 4500 * 1024
    recorded = HostState().recorded(sandbox, checkpointing=Checkpointing("risky"),
                                    retention=Retention(keep=10, min_age=0, budget=budget))
    taken = []
    for i in range(1, 6):  # each checkpoint captures one more MB than the one before
        assert recorded.exec(f"head -c {MB} /dev/urandom > /root/f{i}").result.exit_code == 0
        ran = recorded.exec(f"rm -rf /root/gone{i}")
        assert ran.auto_checkpoint is not None
        taken.append(ran.auto_checkpoint.id)
        if i == 1:
            recorded.promise(taken[0])  # named to the agent as its undo
    left = [c.id for c in recorded.checkpoints()]
    assert left == [taken[0], taken[-1]], (left, taken)
    deleted = recorded.journal.records_of(CheckpointDeleteRecord, sandbox=sandbox.name)
    assert [r.id for r in deleted] == taken[1:4] and {r.reason for r in deleted} == {"retention"}
    assert recorded.broken_promises == ()


def test_a_retention_budget_needs_a_unit_and_a_megabyte() -> None:
    for bad, why in (("5", "has no unit"), ("10K", "too small"), (True, "as a boolean")):
        try:
            validate_settings(LocalSettings, {"retention_bytes": bad}, where="s")
        except InvalidSettings as exc:
            assert why in exc.reason, exc.reason
        else:
            raise AssertionError(f"{bad!r} was accepted")
