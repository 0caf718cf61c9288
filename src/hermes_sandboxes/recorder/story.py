"""The story of a sandbox: what happened between its checkpoints, folded from its journal's records.

``fold_story`` replays the records, oldest first: commands chain into a lineage, a checkpoint marks
a point of it, a restore jumps back to an old point (so the commands it threw away leave the
current lineage), a create or a destroy starts a new life for the name.
"""

from __future__ import annotations

import heapq
import json
import time
from collections.abc import Callable, Iterable, Sequence

from hermes_sandboxes.recorder.lost import why_lost
from hermes_sandboxes.recorder.records import (
    AbandonedRecord,
    AllowRecord,
    CheckpointDeleteRecord,
    CheckpointNamedRecord,
    CheckpointRecord,
    CheckpointStartRecord,
    EgressRecord,
    ExecRecord,
    ExecStartRecord,
    Intent,
    Record,
    RestoreRecord,
    RestoreStartRecord,
    StopRecord,
)
from hermes_sandboxes.util.values import dataclass


@dataclass(frozen=True)
class CheckpointStory:
    record: CheckpointRecord
    previous: str | None  # the checkpoint this one's state grew from (taken or restored to)
    commands: tuple[ExecRecord, ...]  # run between ``previous`` and this checkpoint
    deleted: CheckpointDeleteRecord | None = None


@dataclass(frozen=True)
class _Node:
    """One step of a lineage: commands chain back to the start, restores jump to an old chain.

    Sharing the chains keeps the fold linear however many checkpoints there are."""

    parent: _Node | None
    depth: int
    command: ExecRecord | None  # None marks the start of a checkpoint the journal never saw taken


class Story:
    """The fold of one sandbox's records. Build it with ``fold_story``."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.checkpoints: dict[str, CheckpointStory] = {}
        self.restores: list[RestoreRecord] = []
        self._at: dict[str, _Node | None] = {}  # each checkpoint's lineage when it was taken
        self._head: _Node | None = None
        self._base: str | None = None
        self._pending: list[ExecRecord] = []
        self.named: list[str] = []  # checkpoints named to the agent as its undo, oldest first
        self.open: dict[str, ExecStartRecord] = {}  # commands written ahead whose end is not recorded
        self._ended: set[str] = set()
        self.intents: dict[str, Intent] = {}  # restores and checkpoints written ahead, no end recorded

    @property
    def base(self) -> str | None:
        """The checkpoint the current state grew from (the last one taken or restored to)."""
        return self._base

    def get(self, checkpoint_id: str) -> CheckpointStory | None:
        return self.checkpoints.get(checkpoint_id)

    def commands_since(
        self, checkpoint_id: str, *, created_at: float | None = None
    ) -> list[ExecRecord] | None:
        """The commands a restore to ``checkpoint_id`` would throw away, oldest first.

        Those are the commands of the current lineage that the checkpoint's lineage does not share,
        so commands already discarded by an earlier restore do not count twice. For a checkpoint
        the journal never saw, ``created_at`` (its creation time) selects the later commands;
        without it the answer is None (unknown)."""
        if checkpoint_id not in self._at:
            if created_at is None:
                return None
            return [n.command for n in self._walk(self._head, stop=lambda n: n.command is not None
                                                  and n.command.ts <= created_at) if n.command]
        target = self._at[checkpoint_id]
        ancestor = _common_ancestor(self._head, target)
        return [n.command for n in self._walk(self._head, stop=lambda n: n is ancestor) if n.command]

    @staticmethod
    def _walk(node: _Node | None, stop: Callable[[_Node], bool]) -> list[_Node]:
        out: list[_Node] = []
        while node is not None and not stop(node):
            out.append(node)
            node = node.parent
        out.reverse()
        return out

    def orphans(self) -> list[ExecStartRecord]:
        """The commands written ahead whose recording process died before they ended (never a live
        recorder's): ``lost.end_of_lost`` stops and ends them."""
        return [start for start in self.open.values() if not start.owner_alive()]

    def lost(self) -> list[ExecRecord]:
        """The ends a reader can give the ``orphans`` without looking inside the sandbox: lost,
        their exit code unknown, perhaps still running there."""
        return [start.ended(lost=True, error=f"{why_lost(start)}; it may have run on in the sandbox")
                for start in self.orphans()]

    def _apply(self, record: Record) -> None:
        if isinstance(record, RestoreStartRecord | CheckpointStartRecord):
            if record.intent not in self._ended:
                self.intents[record.intent] = record
            return
        if isinstance(record, RestoreRecord | CheckpointRecord | AbandonedRecord) and record.intent is not None:
            if record.intent in self._ended:
                return  # a second end (two processes settled it at once)
            self._ended.add(record.intent)
            self.intents.pop(record.intent, None)
        if isinstance(record, AbandonedRecord):
            return
        if isinstance(record, ExecStartRecord):
            if record.id not in self._ended:
                self.open[record.id] = record
        elif isinstance(record, ExecRecord):
            if record.id is not None:
                if record.id in self._ended:
                    return  # a second end of one command (two processes settled it at once)
                self._ended.add(record.id)
                self.open.pop(record.id, None)
            self._extend(record)
        elif isinstance(record, CheckpointRecord):
            self.checkpoints[record.id] = CheckpointStory(record, self._base, tuple(self._pending))
            self._at[record.id] = self._head
            self._base, self._pending = record.id, []
        elif isinstance(record, RestoreRecord):
            if record.id not in self._at:
                self._at[record.id] = _Node(None, 1, None)
            self._head = self._at[record.id]
            self._base, self._pending = record.id, []
            self.restores.append(record)
        elif isinstance(record, CheckpointDeleteRecord):
            told = self.checkpoints.get(record.id)
            if told is not None:
                self.checkpoints[record.id] = CheckpointStory(
                    told.record, told.previous, told.commands, deleted=record)
        elif isinstance(record, EgressRecord | AllowRecord | StopRecord):
            pass  # the network (its traffic, its allow-list) and stops are no part of a checkpoint's story
        elif isinstance(record, CheckpointNamedRecord):
            self.named.append(record.id)
        else:  # create or destroy: a new life for the name, the old checkpoints went with the old one
            self._reset()

    def _close(self) -> None:
        """Commands with no end recorded yet count as run to now: still running, or lost with the
        process that recorded them (their effects are in the sandbox's files either way)."""
        now = time.time()
        for start in self.open.values():
            self._extend(start.unfinished(now))

    def _extend(self, command: ExecRecord) -> None:
        depth = self._head.depth + 1 if self._head else 1
        self._head = _Node(self._head, depth, command)
        self._pending.append(command)


def _common_ancestor(a: _Node | None, b: _Node | None) -> _Node | None:
    def depth(n: _Node | None) -> int:
        return n.depth if n else 0

    while depth(a) > depth(b):
        a = a.parent if a else None
    while depth(b) > depth(a):
        b = b.parent if b else None
    while a is not b:
        a = a.parent if a else None
        b = b.parent if b else None
    return a


def fold_story(records: Iterable[Record], *, include_internal: bool = False) -> Story:
    """Replay records (oldest first) into the story of each checkpoint. Commands the agent framework
    sent by itself are left out unless ``include_internal``: they are not the agent's story."""
    story = Story()
    for record in records:
        if include_internal or not (isinstance(record, ExecRecord | ExecStartRecord) and record.internal):
            story._apply(record)
    story._close()
    return story


def as_shown(records: Iterable[Record]) -> list[Record]:
    """``records`` as a log shows them: what was written ahead and then ended appears once, at its
    end; a command with no end yet appears where it started, as unfinished (or lost), and a
    restore or checkpoint with no end yet as its start record."""
    listed = list(records)
    ended = {r.id for r in listed if isinstance(r, ExecRecord) and r.id is not None}
    ended |= {r.intent for r in listed
              if isinstance(r, RestoreRecord | CheckpointRecord | AbandonedRecord) and r.intent is not None}
    now = time.time()
    shown: list[Record] = []
    for r in listed:
        if isinstance(r, ExecStartRecord):
            if r.id not in ended:
                shown.append(r.unfinished(now))
        elif not (isinstance(r, RestoreStartRecord | CheckpointStartRecord) and r.intent in ended):
            shown.append(r)
    return shown


def with_journal(audit: Sequence[Record], journal: Iterable[Record]) -> list[Record]:
    """One sandbox's audit-log records completed by its journal's.

    The recorder appends each record to the journal, then to the audit log: two writes that a kill
    -9 can fall between. The journal then holds a command written ahead, its end, or an applied
    restore that the audit log never got (and ``settle`` cannot mend that: it reads the journal,
    which has it). Each journal record the audit log lacks is put in at its place in time, so a
    log shows the record either file holds."""
    seen = {_identity(r) for r in audit}
    missing = [r for r in journal if _identity(r) not in seen]
    if not missing:
        return list(audit)
    return list(heapq.merge(audit, missing, key=lambda r: r.ts))


def _identity(record: Record) -> str:
    # one record appended to both files is stored the same (same fields, same redaction)
    return json.dumps(record.to_dict(), sort_keys=True, default=str)
