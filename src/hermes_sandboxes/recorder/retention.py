"""Which automatic checkpoints retention deletes: beyond the newest ``keep``, and then, oldest first,
while the checkpoints' bytes are over the budget.

The budget counts every checkpoint of the sandbox (manual and agent ones included) by its
``size_bytes``, the size of the layer it captured: on a store whose snapshots share unchanged data
(btrfs) that is more than they take on disk, so the budget is an upper bound of their disk use
(``hermes-sandboxes df`` shows what they really take). Only automatic checkpoints are ever chosen,
and never one younger than the minimum age, the newest one named to the agent, nor (for the budget)
the newest automatic one, which was just taken for the command about to run: a budget those
keep over is left over (their bytes are the price of keeping what was promised).
"""

from __future__ import annotations

from collections.abc import Sequence

from hermes_sandboxes.sandbox import Checkpoint


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
