"""What a ``RecordedSandbox`` is told when it is built, as a few value objects instead of a long
list of keywords: when to checkpoint (``Checkpointing``), how many automatic checkpoints to keep
(``Retention``), what to run before a checkpoint (``Health``), which secrets commands get
(``Credentials``) and what the face that drives it wants to hear or decide (``Hooks``).

Every one has defaults that mean "nothing special": no automatic checkpoints, ten kept, no health
command, no credentials, no hooks. ``Hooks`` is how a face teaches the recorder about its agent
framework without the recorder importing it: which commands and files are the framework's own
housekeeping, and what to do once a sandbox was restored or destroyed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from hermes_sandboxes.errors import InvalidInput
from hermes_sandboxes.recorder.credentials import Redactor, SecretLookup
from hermes_sandboxes.risk import CHECKPOINT_POLICIES
from hermes_sandboxes.util.values import dataclass, field

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hot path of a CLI exec)
if TYPE_CHECKING:
    from hermes_sandboxes.recorder.records import Trigger
    from hermes_sandboxes.recorder.sandbox import RecordedSandbox
    from hermes_sandboxes.risk import CheckpointPolicy
    from hermes_sandboxes.sandbox import Command

DEFAULT_RETENTION = 10
DEFAULT_MIN_AGE = 600.0  # seconds: an automatic checkpoint this young is never pruned


def _no_secret(name: str) -> str | None:
    return None


def not_internal(command: str) -> str | None:
    """The default command classifier: no command is an agent framework's own housekeeping."""
    return None


def not_scratch(path: str) -> bool:
    """The default file classifier: no file is an agent framework's scratch file."""
    return False


@dataclass(frozen=True)
class Checkpointing:
    """When to take an automatic checkpoint before a command: ``policy`` off | risky | always (judged
    by ``risk.wants_checkpoint``), ``protected_paths`` whose overwrite counts as risky."""

    policy: CheckpointPolicy = "off"
    protected_paths: tuple[str, ...] = ()

    def validated(self) -> Checkpointing:
        validate_policy(self.policy)
        return self


@dataclass(frozen=True)
class Retention:
    """Keep the newest ``keep`` automatic checkpoints, and prune older automatic ones while all the
    checkpoints' bytes are over ``budget`` (None: no budget); never prune one younger than
    ``min_age`` seconds (nor a manual or agent one, nor the newest one named to the agent: see
    ``retention``)."""

    keep: int = DEFAULT_RETENTION
    min_age: float = DEFAULT_MIN_AGE
    budget: int | None = None

    def validated(self) -> Retention:
        if self.keep < 1:
            raise InvalidInput(f"checkpoint retention must keep at least 1 automatic checkpoint, not {self.keep}")
        if self.min_age < 0:
            raise InvalidInput(f"the minimum age of a prunable checkpoint cannot be negative, not {self.min_age}")
        return self


@dataclass(frozen=True)
class Health:
    """``command`` runs inside the sandbox (for at most ``timeout`` seconds) before the checkpoints
    whose trigger is in ``on``: by default not before automatic ones, which would run the test suite
    before every risky command."""

    command: Command | None = None
    timeout: float | None = 600.0
    on: frozenset[Trigger] = frozenset({"manual", "agent"})


@dataclass(frozen=True)
class Credentials:
    """Per-command secrets: ``programs`` maps a program to the name of the secret it gets (in the
    environment of that one command only), ``lookup`` finds a secret's value (fail closed: None),
    ``redactor`` keeps the values out of records and output (one is made when not given)."""

    programs: Mapping[str, str] = field(default_factory=dict)
    lookup: SecretLookup = _no_secret
    redactor: Redactor | None = None


@dataclass(frozen=True)
class Hooks:
    """What the face driving the recorder passes in (the recorder imports no face).

    ``internal(command)`` names the part of the agent framework that sent ``command`` by itself, or
    None (such commands are recorded as internal, never checkpointed, hidden from stories by
    default); ``scratch(path)`` says whether a file is the framework's scratch (left out of previews,
    and a change to it alone does not make a new automatic checkpoint). ``on_restored(recorded)``
    runs after every restore, also a failed one (which may have changed files all the same); what it
    returns is kept as ``RecordedSandbox.restore_token``. ``on_destroyed(recorded)`` runs after the
    sandbox was destroyed."""

    internal: Callable[[str], str | None] = not_internal
    scratch: Callable[[str], bool] = not_scratch
    on_restored: Callable[[RecordedSandbox], str] | None = None
    on_destroyed: Callable[[RecordedSandbox], None] | None = None


def validate_policy(policy: str) -> CheckpointPolicy:
    if policy not in CHECKPOINT_POLICIES:
        raise InvalidInput(
            f"unknown checkpoint policy {policy!r}: use one of {', '.join(CHECKPOINT_POLICIES)}")
    return policy
