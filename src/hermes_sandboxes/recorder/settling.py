"""Settling: writing the end of what processes that died (kill -9, a crash, a lost host) left open
in a sandbox's journal.

Their commands end as lost, each stopped inside first if it still runs (``lost.end_of_lost``; one
the sandbox cannot be reached to stop stays open for a later call), and their restores and
checkpoints as the sandbox shows them (``writeahead.settle``). The markers of what was settled go.
"""

from __future__ import annotations

from collections.abc import Callable

from hermes_sandboxes.recorder import liveness, lost, writeahead
from hermes_sandboxes.recorder.records import CheckpointRecord, Record, RecordBase
from hermes_sandboxes.recorder.story import Story
from hermes_sandboxes.sandbox import Sandbox


def settle(sandbox: Sandbox, story: Story, markers: writeahead.Markers,
           record: Callable[[RecordBase], None]) -> list[Record]:
    """Settle what ``story`` (folded with the internal commands) shows open and unowned; each end is
    written through ``record``. Returns the records written."""
    written: list[Record] = []
    still_open: set[str] = set()
    for start in story.orphans():
        end = lost.end_of_lost(sandbox, start)
        if end is None:
            still_open.add(start.id)
            continue
        record(end)
        written.append(end)
    journaled = set(story.checkpoints)
    for intent in list(story.intents.values()):
        if intent.owner is not None and liveness.alive(intent.owner):
            continue
        ended = writeahead.settle(sandbox, intent, journaled)
        record(ended)
        written.append(ended)
        if isinstance(ended, CheckpointRecord):
            journaled.add(ended.id)
    for dead in set(markers.dead()) - still_open:
        markers.remove(dead)
    return written
