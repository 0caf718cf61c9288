"""Through a real Hermes: every automatic checkpoint named in a terminal result is recorded as the
agent's undo, retention keeps the newest one, and a result says so when an older named one had to go."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from hermes_sandboxes.recorder.journal import CheckpointNamedRecord

if TYPE_CHECKING:
    from tests.hermes.conftest import HermesHarness

NAMED = re.compile(r"checkpoint (\S+) was taken before this command")


def test_retention_keeps_the_named_checkpoint_and_tells_the_model_what_it_dropped(hermes: HermesHarness) -> None:
    hermes.configure(retention=1, retention_min_age=0)
    outputs = [hermes.run(f"echo {i} > /root/f{i} && rm -rf /root/d{i}")["output"] for i in range(3)]
    first, second, third = (NAMED.search(o).group(1) for o in outputs)  # type: ignore[union-attr]
    recorded = hermes.env().recorded
    assert [r.id for r in recorded.journal.records_of(CheckpointNamedRecord)] == [first, second, third]
    # the second command's pruning kept the first (then the newest named); the third's could not
    assert "deleted" not in outputs[1]
    assert f"checkpoint {first}, named to you earlier, was deleted" in outputs[2]
    assert [c.id for c in recorded.checkpoints()] == [second, third]


def test_commands_that_change_only_hermess_scratch_files_add_no_checkpoint_even_under_always(
        hermes: HermesHarness) -> None:
    hermes.configure(auto_checkpoint="always")
    hermes.run("mkdir -p /root/app && echo v1 > /root/app/main.py")
    saved = hermes.call("sandbox_checkpoint", {"comment": "v1"})["checkpoint"]
    reads = ["cat /root/app/main.py", "ls /root", "pwd", "echo hi"]
    named = {NAMED.search(hermes.run(reads[i % 4])["output"]).group(1) for i in range(20)}  # type: ignore[union-attr]
    assert named == {saved}  # Hermes rewrote its shell snapshot after each: nothing of the agent's changed
    recorded = hermes.env().recorded
    before = [c.id for c in recorded.checkpoints()]  # the first command's and the agent's
    assert before[-1] == saved and len(before) == 2
    hermes.run("echo v2 > /root/app/main.py")
    after = NAMED.search(hermes.run("cat /root/app/main.py")["output"]).group(1)  # type: ignore[union-attr]
    assert after != saved and [c.id for c in recorded.checkpoints()] == [*before, after]
