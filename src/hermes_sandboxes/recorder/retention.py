"""Which automatic checkpoints retention deletes: beyond the newest ``keep``, and then, oldest first,
while the checkpoints' bytes are over the budget.

The budget counts every checkpoint of the sandbox (manual and agent ones included) by its
``size_bytes``, the size of the layer it captured: on a store whose snapshots share unchanged data
(btrfs) that is more than they take on disk, so the budget is an upper bound of their disk use
(``hermes-sandboxes df`` shows what they really take). Only automatic checkpoints are ever chosen,
and never one younger than the minimum age, the newest one named to the agent, nor (for the budget)
the newest automatic one, which was just taken for the command about to run: a budget those
keep over is left over (their bytes are the price of keeping what was promised).

Never a manual or agent checkpoint, and what a pruning deleted of what was named to the agent is a
broken promise, which the caller reports. A backend that cannot delete checkpoints keeps them all,
and the result says so (``Pruned.note``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from hermes_sandboxes.errors import CheckpointNotFound
from hermes_sandboxes.recorder.options import Retention
from hermes_sandboxes.recorder.records import CheckpointDeleteRecord, RecordBase
from hermes_sandboxes.recorder.story import Story
from hermes_sandboxes.sandbox import Capability, Checkpoint, Sandbox
from hermes_sandboxes.util.values import dataclass


def doomed(autos: Sequence[Checkpoint], listed: Sequence[Checkpoint], *, keep: int, budget: int | None,
           protected: str | None, young_after: float) -> list[Checkpoint]:
    """The automatic checkpoints (``autos``, oldest first, a part of ``listed``) to delete."""
    prunable = [c for c in autos if c.id != protected and c.created_at <= young_after]
    chosen = [c for c in prunable if c in autos[: max(0, len(autos) - keep)]]
    if budget is None:
        return chosen
    total = sum(c.size_bytes or 0 for c in listed) - sum(c.size_bytes or 0 for c in chosen)
    for checkpoint in prunable[:-1] if prunable and prunable[-1] == autos[-1] else prunable:
        if total <= budget:
            break
        if checkpoint not in chosen:
            chosen.append(checkpoint)
            total -= checkpoint.size_bytes or 0
    return sorted(chosen, key=lambda c: c.created_at)


def over(autos: Sequence[Checkpoint], listed: Sequence[Checkpoint], *, keep: int, budget: int | None) -> bool:
    """Whether retention asks for any deletion at all (before the protections)."""
    return len(autos) > keep or (budget is not None and sum(c.size_bytes or 0 for c in listed) > budget)


@dataclass(frozen=True)
class Pruned:
    """What one pruning did: the named checkpoints it deleted, and why it kept more than asked
    (``note``, "" when it did not)."""

    broken_promises: tuple[str, ...] = ()
    note: str = ""


def prune(sandbox: Sandbox, story: Story, rules: Retention, record: Callable[[RecordBase], None]) -> Pruned:
    """Delete ``sandbox``'s automatic checkpoints beyond the newest ``rules.keep``, then while the
    checkpoints' bytes are over ``rules.budget`` (see the module), each deletion recorded through
    ``record``."""
    listed = sandbox.checkpoints()
    autos = [c for c in listed if (told := story.get(c.id)) is not None and told.record.trigger == "auto"]
    backend = sandbox.backend
    wanted = over(autos, listed, keep=rules.keep, budget=rules.budget)
    if wanted and Capability.DELETE_CHECKPOINTS not in backend.capabilities:
        note = (f"the {backend.name} backend cannot delete checkpoints: all {len(autos)} automatic "
                f"checkpoints of {sandbox.name} are kept (retention asks for {rules.keep})")
        import logging  # not for the hot path of an exec

        logging.getLogger(__name__).info("%s", note)
        return Pruned(note=note)
    live = {c.id for c in listed}
    newest_named = next((i for i in reversed(story.named) if i in live), None)
    broken: list[str] = []
    for checkpoint in doomed(autos, listed, keep=rules.keep, budget=rules.budget, protected=newest_named,
                             young_after=time.time() - rules.min_age):
        try:
            sandbox.delete_checkpoint(checkpoint.id)
        except CheckpointNotFound:
            continue  # another process pruned it first
        record(CheckpointDeleteRecord(sandbox=sandbox.name, id=checkpoint.id, reason="retention"))
        if checkpoint.id in story.named:
            broken.append(checkpoint.id)
    return Pruned(tuple(broken))
