"""Restores and checkpoints written ahead, and how a later call settles one whose process died.

Like a command, a restore or a checkpoint is written ahead: a ``restore_start`` or
``checkpoint_start`` record (an ``intent`` id and the identity of the process doing it) goes to the
journal first, and its end (the ``restore`` or ``checkpoint`` record with the same intent, or an
``abandoned`` one) completes it. A marker file beside the sandbox's journal
(``<journal>.pending/<intent>``, holding that identity) says one is under way, so the recorder can
settle a dead process's operation before it changes the sandbox again (the verdicts below look at
the sandbox as the dead process left it) for the price of one failed ``listdir`` when there is none.
A command has one too, under its record's id, so that the next call stops and ends a command whose
process died (see lost.py).

A dead process's intent is settled by looking at the sandbox:

- a restore was applied when the sandbox's files are the checkpoint's (``changed_since`` says
  unchanged, else an empty diff): its ``restore`` record is written then, and otherwise an
  ``abandoned`` one, so the record says restored exactly when the files were;
- a checkpoint was taken when the backend lists one the journal has no record of, with the intent's
  comment, not older than the intent: it is adopted (its ``checkpoint`` record is written, with the
  intent's trigger); otherwise the intent is abandoned.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from hermes_sandboxes.errors import CheckpointNotFound, Unsupported
from hermes_sandboxes.recorder import liveness
from hermes_sandboxes.recorder.journal import utf8_safe
from hermes_sandboxes.recorder.records import (
    AbandonedRecord,
    CheckpointRecord,
    CheckpointStartRecord,
    Intent,
    RestoreRecord,
    RestoreStartRecord,
)
from hermes_sandboxes.sandbox import Capability, Sandbox

CLOCK_SLACK_S = 60.0  # a remote service's clock may run behind ours when it dates a checkpoint


class Markers:
    """The ``<journal>.pending`` directory: one empty file per command, restore or checkpoint under
    way, named ``<id or intent>@<pid>.<start>.<boot>`` after the process doing it (see liveness), so
    that creating it publishes it whole and a reader needs no more than the listing. (A marker named
    by its intent alone holds that identity as JSON: the form earlier versions wrote.) The directory
    stays once made: a command costs one create and one unlink."""

    def __init__(self, journal_path: Path) -> None:
        self.directory = journal_path.with_name(journal_path.name + ".pending")

    @staticmethod
    def _name(intent: str, owner: liveness.ProcessIdentity) -> str:
        return f"{intent}@{owner.pid}.{owner.start or '-'}.{owner.boot or '-'}"

    def add(self, intent: str) -> None:
        path = os.path.join(self.directory, self._name(intent, liveness.current()))
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.close(fd)

    def remove(self, intent: str) -> None:
        try:
            os.unlink(os.path.join(self.directory, self._name(intent, liveness.current())))
            return
        except FileNotFoundError:
            pass  # another process's (settled here), or one of an earlier version
        with contextlib.suppress(FileNotFoundError):
            for entry in os.listdir(self.directory):
                if entry.partition("@")[0] == intent:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(self.directory, entry))

    def clear(self) -> None:
        """Remove every marker and the directory: the sandbox is gone, and all that ran in it."""
        with contextlib.suppress(FileNotFoundError):
            for entry in os.listdir(self.directory):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.directory, entry))
        with contextlib.suppress(OSError):  # a process still adding one: its own unlink removes it
            self.directory.rmdir()

    def any(self) -> bool:
        try:
            return bool(os.listdir(self.directory))
        except FileNotFoundError:
            return False

    def dead(self) -> list[str]:
        """The intents whose process died (an unreadable marker of the JSON form: it died writing it)."""
        try:
            entries = sorted(os.listdir(self.directory))
        except FileNotFoundError:
            return []
        found = []
        for entry in entries:
            intent, _, named = entry.partition("@")
            owner = _named_owner(named) if named else self._written_owner(entry)
            if owner is None or not liveness.alive(owner):
                found.append(intent)
        return found

    def _written_owner(self, entry: str) -> liveness.ProcessIdentity | None:
        try:
            return liveness.ProcessIdentity.from_dict(json.loads((self.directory / entry).read_text()))
        except (OSError, ValueError):
            return None


def _named_owner(named: str) -> liveness.ProcessIdentity | None:
    pid, _, rest = named.partition(".")
    start, _, boot = rest.partition(".")
    if not pid.isdigit() or not start or not boot:
        return None
    return liveness.ProcessIdentity(int(pid), None if start == "-" else start, None if boot == "-" else boot)


def token() -> str:
    return os.urandom(8).hex()


def _who(intent: Intent) -> str:
    return f"pid {intent.owner.pid}" if intent.owner is not None else "an unknown process"


def restore_applied(sandbox: Sandbox, checkpoint_id: str) -> bool | None:
    """Whether the sandbox's files are now checkpoint ``checkpoint_id``'s (None: cannot tell)."""
    try:
        changed = sandbox.changed_since(checkpoint_id)
        if changed is None and Capability.DIFF in sandbox.backend.capabilities:
            changed = bool(sandbox.diff(checkpoint_id))
    except (CheckpointNotFound, Unsupported):
        return None
    return None if changed is None else not changed


def end_of_restore(sandbox: Sandbox, intent: RestoreStartRecord, why: str) -> RestoreRecord | AbandonedRecord:
    """The record that ends a restore whose process stopped before recording it (``why``)."""
    applied = restore_applied(sandbox, intent.id)
    if applied:
        return RestoreRecord(sandbox=intent.sandbox, id=intent.id, discarded=intent.discarded, intent=intent.intent,
                             note=f"recorded by a later call: {why}")
    verdict = "not applied" if applied is False else "unknown whether it was applied"
    return AbandonedRecord(sandbox=intent.sandbox, intent=intent.intent,
                           reason=f"restore to {intent.id} {verdict}: {why}")


def end_of_checkpoint(sandbox: Sandbox, intent: CheckpointStartRecord, journaled: set[str],
                      why: str) -> CheckpointRecord | AbandonedRecord:
    """The record that ends a checkpoint whose process stopped before recording it (``why``):
    the checkpoint it took, adopted, or abandoned when it took none."""
    # the journal keeps a comment as valid UTF-8 (utf8_safe): compare it in that form
    taken = [c for c in sandbox.checkpoints() if c.id not in journaled and utf8_safe(c.comment) == intent.comment
             and c.created_at >= intent.ts - CLOCK_SLACK_S]
    if not taken:
        return AbandonedRecord(sandbox=intent.sandbox, intent=intent.intent, reason=f"checkpoint not taken: {why}")
    newest = max(taken, key=lambda c: c.created_at)
    return CheckpointRecord(sandbox=intent.sandbox, id=newest.id, comment=intent.comment, trigger=intent.trigger,
                            trigger_command=intent.trigger_command, layer_bytes=newest.size_bytes,
                            intent=intent.intent)


def settle(sandbox: Sandbox, intent: Intent, journaled: set[str],
           why: str | None = None) -> RestoreRecord | CheckpointRecord | AbandonedRecord:
    """The end of a restore or checkpoint that stopped before recording it, judged from the sandbox;
    ``why`` it stopped (default: its process died). ``journaled``: the checkpoints with a record."""
    why = why or f"the process doing it ({_who(intent)}) died before recording its end"
    if isinstance(intent, RestoreStartRecord):
        return end_of_restore(sandbox, intent, why)
    return end_of_checkpoint(sandbox, intent, journaled, why)
