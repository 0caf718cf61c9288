"""The journal's records: one frozen dataclass per event type (a command, its start written ahead,
a checkpoint, a restore, ...), each knowing its own fields, and ``parse_record``, which reads one
back from a decoded line (skipping what it does not understand). ``journal.py`` keeps them on disk.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Mapping, Sequence

from hermes_sandboxes.errors import InvalidInput
from hermes_sandboxes.recorder.liveness import ProcessIdentity, alive
from hermes_sandboxes.util.values import dataclass, field

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hot path of a CLI exec)
if TYPE_CHECKING:
    from typing import Any, ClassVar, Literal

    Trigger = Literal["manual", "auto", "agent"]
    DeleteReason = Literal["manual", "retention"]

SCHEMA_VERSION = 1
TRIGGERS: tuple[Trigger, ...] = ("manual", "auto", "agent")
DELETE_REASONS: tuple[DeleteReason, ...] = ("manual", "retention")

# A health check keeps this much of its output's tail (the journal clips any field further).
MAX_OUTPUT_TAIL_CHARS = 2048


def command_text(command: str | Sequence[str]) -> str:
    """The one-line form a command is recorded under (argv lists are shell-quoted)."""
    return command if isinstance(command, str) else shlex.join(command)


def __getattr__(name: str) -> object:
    """The type aliases ``Trigger`` and ``DeleteReason``, made when first asked for (by pydantic, or a
    user's annotations): they need ``typing``, which the hot path of a CLI exec does not import."""
    if name in ("Trigger", "DeleteReason"):
        from typing import Literal

        return Literal[TRIGGERS if name == "Trigger" else DELETE_REASONS]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Invalid(Exception):
    """A line parsed as JSON but is not a record we understand; readers skip it."""


def _get(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], *, optional: bool = False) -> Any:
    value = data.get(key)
    if value is None and optional:
        return None
    # bool is an int subclass; a count or an exit code must not be True.
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _as_tuple(kind)):
        raise _Invalid(key)
    return value


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


@dataclass(frozen=True, kw_only=True)
class RecordBase:
    """What every record has; the concrete types below add their own fields."""

    TYPE: ClassVar[str]
    sandbox: str
    ts: float = field(default_factory=time.time)

    def fields(self) -> dict[str, Any]:
        return {}

    def to_dict(self) -> dict[str, Any]:
        return {"v": SCHEMA_VERSION, "ts": self.ts, "sandbox": self.sandbox, "type": self.TYPE,
                **self.fields()}


@dataclass(frozen=True, kw_only=True)
class CreateRecord(RecordBase):
    TYPE: ClassVar[str] = "create"
    backend: str | None = None
    ephemeral: bool | None = None
    forked_from: str | None = None  # "<sandbox>" or "<sandbox>@<checkpoint>" for a fork

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"backend": self.backend, "ephemeral": self.ephemeral}
        if self.forked_from is not None:
            out["forked_from"] = self.forked_from
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CreateRecord:
        return cls(sandbox=d["sandbox"], ts=d["ts"], backend=_get(d, "backend", str, optional=True),
                   ephemeral=_get(d, "ephemeral", bool, optional=True),
                   forked_from=_get(d, "forked_from", str, optional=True))


@dataclass(frozen=True, kw_only=True)
class ForkRecord(RecordBase):
    """The source's side of a fork: ``to`` was made from its ``checkpoint`` (None: as it was then)."""

    TYPE: ClassVar[str] = "fork"
    to: str
    checkpoint: str | None = None

    def fields(self) -> dict[str, Any]:
        return {"to": self.to, "checkpoint": self.checkpoint}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ForkRecord:
        return cls(sandbox=d["sandbox"], ts=d["ts"], to=_get(d, "to", str),
                   checkpoint=_get(d, "checkpoint", str, optional=True))


@dataclass(frozen=True, kw_only=True)
class ExecRecord(RecordBase):
    """A command and how it ended. ``exit_code`` is None when it could not run or its end is unknown
    (see ``error``). ``id`` names the ``ExecStartRecord`` written ahead of it."""

    TYPE: ClassVar[str] = "exec"
    command: str
    exit_code: int | None
    duration_s: float
    timed_out: bool = False
    origin: Mapping[str, str] = field(default_factory=dict)  # e.g. task id, session id
    error: str | None = None
    killed: bool = False  # stopped by us (a deadline, an interrupt, a broken pipe), not by itself
    internal: bool = False  # sent by the agent's own machinery, not by the agent (hidden by default)
    id: str | None = None
    unfinished: bool = False  # no end recorded yet: never written, readers make these (see ExecStartRecord)
    lost: bool = False  # the process recording it died before it ended: how it ended is unknown

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"command": self.command, "exit_code": self.exit_code,
                               "duration_s": self.duration_s, "timed_out": self.timed_out}
        if self.origin:
            out["origin"] = {str(k): str(v) for k, v in self.origin.items()}
        if self.error is not None:
            out["error"] = self.error
        for flag in ("killed", "internal", "unfinished", "lost"):
            if getattr(self, flag):
                out[flag] = True
        if self.id is not None:
            out["id"] = self.id
        return out

    def to_summary(self) -> dict[str, Any]:
        """The flat form a checkpoint's story and the agent tools show."""
        return {"command": self.command, "exit_code": self.exit_code, "duration_s": self.duration_s,
                "timed_out": self.timed_out, "killed": self.killed, "internal": self.internal, "ts": self.ts,
                "unfinished": self.unfinished, "lost": self.lost}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ExecRecord:
        origin = d.get("origin") or {}
        if not isinstance(origin, Mapping):
            raise _Invalid("origin")
        return cls(sandbox=d["sandbox"], ts=d["ts"], command=_get(d, "command", str),
                   exit_code=_get(d, "exit_code", int, optional=True),
                   duration_s=float(_get(d, "duration_s", (int, float))),
                   timed_out=bool(_get(d, "timed_out", bool, optional=True)),
                   origin={str(k): str(v) for k, v in origin.items()},
                   error=_get(d, "error", str, optional=True),
                   killed=bool(_get(d, "killed", bool, optional=True)),
                   internal=bool(_get(d, "internal", bool, optional=True)),
                   id=_get(d, "id", str, optional=True),
                   unfinished=bool(_get(d, "unfinished", bool, optional=True)),
                   lost=bool(_get(d, "lost", bool, optional=True)))


@dataclass(frozen=True, kw_only=True)
class ExecStartRecord(RecordBase):
    """Written ahead of a command, just before it starts, so that however the process recording it
    ends (kill -9 included) the journal knows the command may have run. Its end is the
    ``ExecRecord`` with the same ``id``; until there is one, readers show ``unfinished()``."""

    TYPE: ClassVar[str] = "exec_start"
    id: str
    command: str
    cwd: str | None = None
    checkpoint: str | None = None  # the automatic checkpoint taken just before it
    origin: Mapping[str, str] = field(default_factory=dict)
    internal: bool = False
    owner: ProcessIdentity | None = None  # the process recording it, which writes its end
    tag: str | None = None  # what the backend knows it by (Sandbox.kill_tagged), when it can

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "command": self.command, "cwd": self.cwd,
                               "checkpoint": self.checkpoint,
                               "owner": None if self.owner is None else self.owner.to_dict()}
        if self.origin:
            out["origin"] = {str(k): str(v) for k, v in self.origin.items()}
        if self.internal:
            out["internal"] = True
        if self.tag is not None:
            out["tag"] = self.tag
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ExecStartRecord:
        origin = d.get("origin") or {}
        if not isinstance(origin, Mapping):
            raise _Invalid("origin")
        return cls(sandbox=d["sandbox"], ts=d["ts"], id=_get(d, "id", str), command=_get(d, "command", str),
                   cwd=_get(d, "cwd", str, optional=True), checkpoint=_get(d, "checkpoint", str, optional=True),
                   origin={str(k): str(v) for k, v in origin.items()},
                   internal=bool(_get(d, "internal", bool, optional=True)),
                   owner=ProcessIdentity.from_dict(d.get("owner")), tag=_get(d, "tag", str, optional=True))

    def owner_alive(self) -> bool:
        return self.owner is not None and alive(self.owner)

    def ended(self, *, error: str, lost: bool = False, killed: bool = False, now: float | None = None) -> ExecRecord:
        """The end of this command as a later reader or process records it (its exit code unknown)."""
        ts = time.time() if now is None else now
        return ExecRecord(sandbox=self.sandbox, ts=ts, command=self.command, exit_code=None,
                          duration_s=max(0.0, ts - self.ts), origin=self.origin, error=error, killed=killed,
                          internal=self.internal, id=self.id, lost=lost)

    def unfinished(self, now: float | None = None) -> ExecRecord:
        """What a reader can say of this command while no end is recorded: still running, or lost
        with the process that recorded it. Dated when it started."""
        pid = self.owner.pid if self.owner is not None else "?"
        lost = not self.owner_alive()
        error = (f"lost: the process recording it (pid {pid}) died before it ended" if lost
                 else f"unfinished: still running (recorded by pid {pid})")
        duration = max(0.0, (time.time() if now is None else now) - self.ts)
        return ExecRecord(sandbox=self.sandbox, ts=self.ts, command=self.command, exit_code=None,
                          duration_s=duration, origin=self.origin, error=error, internal=self.internal,
                          id=self.id, unfinished=True, lost=lost)


@dataclass(frozen=True)
class HealthCheck:
    """The configured health command's result, taken just before a checkpoint."""

    command: str
    exit_code: int | None  # None: the health command could not be run at all
    passed: bool
    output_tail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"command": self.command, "exit_code": self.exit_code, "passed": self.passed,
                "output_tail": self.output_tail[-MAX_OUTPUT_TAIL_CHARS:]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HealthCheck:
        return cls(command=_get(d, "command", str), exit_code=_get(d, "exit_code", int, optional=True),
                   passed=_get(d, "passed", bool),
                   output_tail=_get(d, "output_tail", str, optional=True) or "")


@dataclass(frozen=True, kw_only=True)
class CheckpointRecord(RecordBase):
    TYPE: ClassVar[str] = "checkpoint"
    id: str
    comment: str = ""
    trigger: Trigger = "manual"
    trigger_command: str | None = None  # the risky command an automatic checkpoint protects against
    layer_bytes: int | None = None
    health: HealthCheck | None = None
    intent: str | None = None  # the CheckpointStartRecord written ahead of it

    def fields(self) -> dict[str, Any]:
        return {"id": self.id, "comment": self.comment, "trigger": self.trigger,
                "trigger_command": self.trigger_command, "layer_bytes": self.layer_bytes,
                "health": self.health.to_dict() if self.health else None,
                **({"intent": self.intent} if self.intent else {})}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CheckpointRecord:
        trigger = _get(d, "trigger", str)
        if trigger not in TRIGGERS:
            raise _Invalid("trigger")
        health = d.get("health")
        if health is not None and not isinstance(health, Mapping):
            raise _Invalid("health")
        return cls(sandbox=d["sandbox"], ts=d["ts"], id=_get(d, "id", str),
                   comment=_get(d, "comment", str, optional=True) or "", trigger=trigger,
                   trigger_command=_get(d, "trigger_command", str, optional=True),
                   layer_bytes=_get(d, "layer_bytes", int, optional=True),
                   health=HealthCheck.from_dict(health) if health is not None else None,
                   intent=_get(d, "intent", str, optional=True))


@dataclass(frozen=True, kw_only=True)
class RestoreRecord(RecordBase):
    TYPE: ClassVar[str] = "restore"
    id: str
    discarded: int  # commands whose effects the restore threw away
    intent: str | None = None  # the RestoreStartRecord written ahead of it
    note: str | None = None  # e.g. recorded by a later call, its restorer having died first

    def fields(self) -> dict[str, Any]:
        return {"id": self.id, "discarded": self.discarded, **({"intent": self.intent} if self.intent else {}),
                **({"note": self.note} if self.note else {})}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RestoreRecord:
        return cls(sandbox=d["sandbox"], ts=d["ts"], id=_get(d, "id", str),
                   discarded=_get(d, "discarded", int), intent=_get(d, "intent", str, optional=True),
                   note=_get(d, "note", str, optional=True))


@dataclass(frozen=True, kw_only=True)
class RestoreStartRecord(RecordBase):
    """Written ahead of a restore to checkpoint ``id``: its end is the ``RestoreRecord`` (applied) or
    the ``AbandonedRecord`` (not applied) with the same ``intent``."""

    TYPE: ClassVar[str] = "restore_start"
    id: str
    intent: str
    discarded: int
    owner: ProcessIdentity | None = None

    def fields(self) -> dict[str, Any]:
        return {"id": self.id, "intent": self.intent, "discarded": self.discarded,
                "owner": None if self.owner is None else self.owner.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RestoreStartRecord:
        return cls(sandbox=d["sandbox"], ts=d["ts"], id=_get(d, "id", str), intent=_get(d, "intent", str),
                   discarded=_get(d, "discarded", int), owner=ProcessIdentity.from_dict(d.get("owner")))


@dataclass(frozen=True, kw_only=True)
class CheckpointStartRecord(RecordBase):
    """Written ahead of a checkpoint: its end is the ``CheckpointRecord`` (taken) or the
    ``AbandonedRecord`` (never taken) with the same ``intent``."""

    TYPE: ClassVar[str] = "checkpoint_start"
    intent: str
    comment: str = ""
    trigger: Trigger = "manual"
    trigger_command: str | None = None
    owner: ProcessIdentity | None = None

    def fields(self) -> dict[str, Any]:
        return {"intent": self.intent, "comment": self.comment, "trigger": self.trigger,
                "trigger_command": self.trigger_command,
                "owner": None if self.owner is None else self.owner.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CheckpointStartRecord:
        trigger = _get(d, "trigger", str)
        if trigger not in TRIGGERS:
            raise _Invalid("trigger")
        return cls(sandbox=d["sandbox"], ts=d["ts"], intent=_get(d, "intent", str),
                   comment=_get(d, "comment", str, optional=True) or "", trigger=trigger,
                   trigger_command=_get(d, "trigger_command", str, optional=True),
                   owner=ProcessIdentity.from_dict(d.get("owner")))


@dataclass(frozen=True, kw_only=True)
class AbandonedRecord(RecordBase):
    """A restore or checkpoint written ahead that did not happen (``reason`` says why)."""

    TYPE: ClassVar[str] = "abandoned"
    intent: str
    reason: str

    def fields(self) -> dict[str, Any]:
        return {"intent": self.intent, "reason": self.reason}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AbandonedRecord:
        return cls(sandbox=d["sandbox"], ts=d["ts"], intent=_get(d, "intent", str), reason=_get(d, "reason", str))


Intent = RestoreStartRecord | CheckpointStartRecord


@dataclass(frozen=True, kw_only=True)
class CheckpointDeleteRecord(RecordBase):
    TYPE: ClassVar[str] = "checkpoint_delete"
    id: str
    reason: DeleteReason = "manual"

    def fields(self) -> dict[str, Any]:
        return {"id": self.id, "reason": self.reason}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CheckpointDeleteRecord:
        reason = _get(d, "reason", str)
        if reason not in DELETE_REASONS:
            raise _Invalid("reason")
        return cls(sandbox=d["sandbox"], ts=d["ts"], id=_get(d, "id", str), reason=reason)


@dataclass(frozen=True, kw_only=True)
class CheckpointNamedRecord(RecordBase):
    """A checkpoint was named to the agent as the way to undo a command: retention keeps the newest
    such checkpoint whatever its age."""

    TYPE: ClassVar[str] = "checkpoint_named"
    id: str

    def fields(self) -> dict[str, Any]:
        return {"id": self.id}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CheckpointNamedRecord:
        return cls(sandbox=d["sandbox"], ts=d["ts"], id=_get(d, "id", str))


@dataclass(frozen=True, kw_only=True)
class DestroyRecord(RecordBase):
    TYPE: ClassVar[str] = "destroy"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DestroyRecord:
        return cls(sandbox=d["sandbox"], ts=d["ts"])


@dataclass(frozen=True, kw_only=True)
class StopRecord(RecordBase):
    """The sandbox was stopped (its processes ended, files and checkpoints kept) for ``reason``:
    ``idle`` when no command ran for ``idle_timeout`` seconds; ``ts`` is when it stopped."""

    TYPE: ClassVar[str] = "stop"
    reason: str = "idle"
    idle_timeout: float | None = None

    def fields(self) -> dict[str, Any]:
        return {"reason": self.reason, "idle_timeout": self.idle_timeout}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StopRecord:
        timeout = _get(d, "idle_timeout", (int, float), optional=True)
        return cls(sandbox=d["sandbox"], ts=d["ts"], reason=_get(d, "reason", str), idle_timeout=timeout)


@dataclass(frozen=True, kw_only=True)
class EgressRecord(RecordBase):
    """One connection a sandbox's egress proxy let through or refused (never what it carried)."""

    TYPE: ClassVar[str] = "egress"
    host: str
    port: int
    verdict: Literal["allowed", "refused"]
    reason: str = ""  # why refused, or the allow-list entry that let it through
    bytes_out: int = 0  # sandbox -> upstream
    bytes_in: int = 0  # upstream -> sandbox
    credential: str | None = None  # name of the brokered credential added to the request
    count: int = 1  # connections this record stands for (like ones in a burst are aggregated)

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"host": self.host, "port": self.port, "verdict": self.verdict,
                               "reason": self.reason, "bytes_out": self.bytes_out, "bytes_in": self.bytes_in}
        if self.credential is not None:
            out["credential"] = self.credential
        if self.count != 1:
            out["count"] = self.count
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EgressRecord:
        verdict = _get(d, "verdict", str)
        if verdict not in ("allowed", "refused"):
            raise _Invalid("verdict")
        return cls(sandbox=d["sandbox"], ts=d["ts"], host=_get(d, "host", str), port=_get(d, "port", int),
                   verdict=verdict, reason=_get(d, "reason", str, optional=True) or "",
                   bytes_out=_get(d, "bytes_out", int), bytes_in=_get(d, "bytes_in", int),
                   credential=_get(d, "credential", str, optional=True),
                   count=_get(d, "count", int, optional=True) or 1)


@dataclass(frozen=True, kw_only=True)
class AllowRecord(RecordBase):
    """The egress allow-list of a sandbox was replaced (``Sandbox.set_allow``): the list before and after."""

    TYPE: ClassVar[str] = "allow"
    allow: tuple[str, ...]
    previous: tuple[str, ...] | None = None  # None: not known

    def fields(self) -> dict[str, Any]:
        return {"allow": list(self.allow), "previous": None if self.previous is None else list(self.previous)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AllowRecord:
        allow, previous = _get(d, "allow", list), _get(d, "previous", list, optional=True)
        if not all(isinstance(e, str) for e in [*allow, *(previous or ())]):
            raise _Invalid("allow")
        return cls(sandbox=d["sandbox"], ts=d["ts"], allow=tuple(allow),
                   previous=None if previous is None else tuple(previous))


Record = (CreateRecord | ExecRecord | ExecStartRecord | CheckpointRecord | RestoreRecord | CheckpointDeleteRecord
          | CheckpointNamedRecord | DestroyRecord | EgressRecord | AllowRecord | RestoreStartRecord
          | CheckpointStartRecord | AbandonedRecord | StopRecord | ForkRecord)
_KINDS: dict[str, Callable[[Mapping[str, Any]], Record]] = {
    kind.TYPE: kind.from_dict
    for kind in (CreateRecord, ExecRecord, ExecStartRecord, CheckpointRecord, RestoreRecord, CheckpointDeleteRecord,
                 CheckpointNamedRecord, DestroyRecord, EgressRecord, AllowRecord, RestoreStartRecord,
                 CheckpointStartRecord, AbandonedRecord, StopRecord, ForkRecord)
}


def parse_record(data: Any) -> Record | None:
    """The typed record for one decoded line, or None if it is not one we understand.

    Lines with a newer schema version are read as far as their known fields go (extra fields are
    ignored), so an older reader still shows a newer writer's story."""
    if not isinstance(data, Mapping):
        return None
    parse = _KINDS.get(str(data.get("type")))
    try:
        if (parse is None or not isinstance(data.get("sandbox"), str)
                or not isinstance(data.get("v"), int) or isinstance(data.get("v"), bool)
                or not isinstance(data.get("ts"), int | float) or isinstance(data.get("ts"), bool)):
            return None
        return parse({**data, "ts": float(data["ts"])})
    except (_Invalid, KeyError, TypeError, ValueError):
        return None


def validate_trigger(trigger: str) -> Trigger:
    if trigger not in TRIGGERS:
        raise InvalidInput(f"unknown checkpoint trigger {trigger!r}: use one of {', '.join(TRIGGERS)}")
    return trigger
