"""Which shell commands deserve an automatic checkpoint before they run.

``classify`` reads a command line as a shell would (quotes, ``; && || | &``, newlines, ``( )``,
``{ }``, ``$( )``, backticks, heredocs), looks past prefixes (``sudo``, ``env``, ``VAR=x``,
``timeout 10``, ``xargs`` ...), reads the code given to ``bash -c``, ``eval``, ``su -c`` or piped
into a shell, then judges each simple command by its program and arguments. Text that is only an
argument (``echo "rm -rf /"``, ``grep -r "DROP TABLE" .``) is never taken for a command.

Choices, fail-closed because a needless checkpoint is cheap and a lost file is not:
- a recursive rm is risky wherever it points (``/tmp`` too); a plain or forced rm only with a
  wildcard, an operand known only at run time (``$VAR``, ``$( )``, ``xargs``, ``find -exec {}``) or
  a target under a protected path, so ``rm -f /tmp/x.log`` is harmless;
- ``make clean``/``distclean`` is risky: the recipe is unseen and exists to delete things;
- ``ssh host 'cmd'``, ``docker exec``/``run`` and ``kubectl exec`` act elsewhere: not risky here;
- input that is not valid shell (an unbalanced quote) is scanned for dangerous program names and
  SQL anywhere, then read again without its quotes, so ``echo 'rm -rf /`` counts as risky.

Commands Hermes Agent sends by itself (its file helpers, ``execute_code`` kernel, background polls,
shell snapshot) are recognised by their exact shape (``risk.internal``) and are never risky, except
its write helper over a protected path; the verdict names them in ``internal``.

Blind spots: stdin we cannot see (``psql < dump.sql``, ``cat f | sh``); scripts, Makefile recipes,
aliases and functions defined earlier; the values of variables; other languages beyond a few
deletion calls in ``python -c``/``node -e``/``perl -e``; ``~``, and relative paths when no ``cwd``
is given (a ``cd`` inside the command is followed).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from hermes_sandboxes.errors import InvalidInput
from hermes_sandboxes.risk.internal import HERMES_SCRATCH_GLOBS, hermes_internal, internal_write_target
from hermes_sandboxes.util.values import dataclass

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hot path of a CLI exec)
if TYPE_CHECKING:
    from typing import Literal

    CheckpointPolicy = Literal["off", "risky", "always"]

__all__ = ["CHECKPOINT_POLICIES", "HERMES_SCRATCH_GLOBS", "CheckpointPolicy", "RiskVerdict", "classify",
           "hermes_internal", "wants_checkpoint"]

CHECKPOINT_POLICIES: tuple[CheckpointPolicy, ...] = ("off", "risky", "always")


def __getattr__(name: str) -> object:
    """The type alias ``CheckpointPolicy``, made when first asked for (by pydantic, or a
    user's annotations): they need ``typing``, which the hot path of a CLI exec does not import."""
    if name == "CheckpointPolicy":
        from typing import Literal

        return Literal[CHECKPOINT_POLICIES]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# A command line this plain cannot destroy anything: one program from a short list of ones that
# only read or print, and arguments with no quote, expansion, redirection, glob or separator. It
# is answered without loading the parser (the hot path of every exec); anything else is parsed.
_READ_ONLY = frozenset({"true", "false", "pwd", "ls", "echo", "cat", "id", "whoami", "uname", "date",
                        "hostname", "head", "tail", "wc", "grep", "sleep", "stat", "du", "df", "which",
                        "sha256sum", "md5sum", "test"})
_PLAIN = re.compile(r"[A-Za-z0-9 _./:=,@%+-]*")


def _plainly_harmless(command: str) -> bool:
    words = command.split(" ")
    return bool(words) and words[0] in _READ_ONLY and _PLAIN.fullmatch(command) is not None


@dataclass(frozen=True)
class RiskVerdict:
    risky: bool
    reasons: tuple[str, ...] = ()  # short and human-readable: "recursive rm of /root/app"
    internal: str | None = None  # which part of Hermes sent the command by itself (see risk.internal)


def classify(
    command: str,
    *,
    protected_paths: Sequence[str] = (),
    exists: Callable[[str], bool] | None = None,
    cwd: str | None = None,
) -> RiskVerdict:
    """Whether the shell string ``command`` may destroy something a checkpoint could bring back.

    ``protected_paths``: absolute paths whose files must not be removed, moved or overwritten.
    ``exists`` tells whether a path exists; without it any ``>`` onto a protected path counts.
    ``cwd`` is where the command starts, to match relative paths against protected ones.
    """
    if not isinstance(command, str):
        raise InvalidInput(f"classify takes a shell string, not {type(command).__name__}: use shlex.join")
    for path in [*protected_paths, *([cwd] if cwd is not None else [])]:
        if not path.startswith("/"):
            raise InvalidInput(f"path {path!r} is relative: give protected paths and cwd as absolute paths")
    kind = hermes_internal(command)
    if kind is None and _plainly_harmless(command):
        return RiskVerdict(False)
    from hermes_sandboxes.risk._context import Context, normalise
    from hermes_sandboxes.risk._scan import scan_command

    ctx = Context(tuple(normalise(p) for p in protected_paths), exists, cwd and normalise(cwd))
    if kind:
        # Hermes's housekeeping is never risky; its write helper is the agent's write_file, which
        # protected paths still guard.
        target = internal_write_target(command)
        if target and (hit := ctx.protected_hit(target)):
            ctx.add(f"write_file over protected path {hit}")
        return RiskVerdict(bool(ctx.reasons), tuple(ctx.reasons), internal=kind)
    scan_command(command, ctx, 0)
    return RiskVerdict(bool(ctx.reasons), tuple(ctx.reasons))


def wants_checkpoint(
    policy: CheckpointPolicy,
    command: str,
    *,
    protected_paths: Sequence[str] = (),
    exists: Callable[[str], bool] | None = None,
    cwd: str | None = None,
) -> RiskVerdict:
    """Whether to checkpoint before ``command``: never (off), always, or when it is risky."""
    if policy == "off":
        return RiskVerdict(False)
    if policy == "always" and hermes_internal(command) is None:  # "every command" means the agent's
        return RiskVerdict(True, ("policy always",))
    if policy == "always":
        return classify(command, protected_paths=protected_paths, exists=exists, cwd=cwd)
    if policy == "risky":
        return classify(command, protected_paths=protected_paths, exists=exists, cwd=cwd)
    raise InvalidInput(f"unknown checkpoint policy {policy!r}: use one of {', '.join(CHECKPOINT_POLICIES)}")
