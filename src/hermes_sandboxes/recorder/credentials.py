"""Secrets: lookup that fails closed, per-command credential injection, redaction, env stripping.

The pattern (from the "agents that don't break themselves" note): a user's token for one CLI lives on
the host and enters the sandbox only in the environment of the one command that runs that CLI. It is
never written to the sandbox's disk by us, never shown to the model (the command's output is redacted),
and the audit log records which secret was used by its name only.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Iterable, Mapping

from hermes_sandboxes.util.values import dataclass, field

SecretLookup = Callable[[str], str | None]

# Credentials of the cloud backends: stripped from every host subprocess Hermes starts, whether or not
# that backend is the active one, since a token in the process environment is readable either way.
CLOUD_SECRET_KEYS = frozenset({"SPRITES_TOKEN", "SPRITE_TOKEN", "E2B_API_KEY", "E2B_ACCESS_TOKEN"})

REDACTION_MARK = "[REDACTED:{name}]"

# Words that start a command but are not the program the user means: the program follows them.
_PREFIX_WORDS = frozenset({
    "sudo", "env", "command", "exec", "time", "nohup", "nice", "builtin", "xargs", "stdbuf", "ionice",
    "then", "do", "else", "if", "while", "until", "!", "{", "timeout",
})
_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "(", ")", "|&", ";;", "}"})


def programs_invoked(command: str) -> set[str]:
    """Program names a shell command runs, by their basename (``/usr/bin/flyctl`` -> ``flyctl``).

    A heuristic over the shell's grammar: words in command position after separators, with leading
    ``VAR=value`` assignments and wrappers such as ``sudo`` or ``env`` skipped. It errs towards
    missing a program (the command then runs without the credential) rather than finding one that
    is only an argument (``echo flyctl`` must not receive the token). Unparseable quoting yields
    nothing.
    """
    text = command.replace("\n", " ; ").replace("$(", " ; ").replace("`", " ; ")
    try:
        lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:
        return set()
    found: set[str] = set()
    expecting = True
    skip_option_args = False
    for token in tokens:
        if token in _SEPARATORS or set(token) <= set(";&|()"):
            expecting, skip_option_args = True, False
            continue
        if not expecting:
            continue
        if "=" in token and token.split("=", 1)[0].isidentifier():
            continue  # VAR=value before the program
        if skip_option_args and (token.startswith("-") or token[:1].isdigit()):
            continue  # options of a wrapper (sudo -u x is not handled: the program is then missed)
        program = token.rsplit("/", 1)[-1]
        if program in _PREFIX_WORDS:
            skip_option_args = True
            continue
        if program:
            found.add(program)
        expecting = False
    return found


@dataclass(frozen=True)
class CredentialPlan:
    """What one command receives: ``env`` (name -> value) and the names of secrets it wanted."""

    env: Mapping[str, str] = field(default_factory=dict)
    used: tuple[str, ...] = ()  # secret names injected
    missing: tuple[str, ...] = ()  # secret names a program wanted but the profile does not have

    def note(self) -> str:
        """A line for the model when a credential could not be provided, else empty."""
        if not self.missing:
            return ""
        names = ", ".join(self.missing)
        return f"[sandbox: secret {names} is not set in this Hermes profile; the command ran without it]"


def plan_credentials(command: str, credentials: Mapping[str, str], lookup: SecretLookup) -> CredentialPlan:
    """Decide which secrets ``command`` gets: those mapped to a program it invokes, nothing else."""
    if not credentials:
        return CredentialPlan()
    wanted = sorted({credentials[p] for p in programs_invoked(command) if p in credentials})
    env: dict[str, str] = {}
    missing: list[str] = []
    for name in wanted:
        value = lookup(name)
        if value:
            env[name] = value
        else:
            missing.append(name)
    return CredentialPlan(env=env, used=tuple(sorted(env)), missing=tuple(missing))


class Redactor:
    """Replaces known secret values with ``[REDACTED:NAME]``, longest value first."""

    def __init__(self, secrets: Mapping[str, str] | None = None) -> None:
        self._secrets: dict[str, str] = {}  # value -> name
        for name, value in (secrets or {}).items():
            self.add(name, value)

    def add(self, name: str, value: str) -> None:
        if value:
            self._secrets[value] = name

    def __bool__(self) -> bool:
        return bool(self._secrets)

    @property
    def longest(self) -> int:
        return max((len(v.encode()) for v in self._secrets), default=0)

    def redact(self, text: str) -> str:
        for value in sorted(self._secrets, key=len, reverse=True):
            if value in text:
                text = text.replace(value, REDACTION_MARK.format(name=self._secrets[value]))
        return text

    def redact_bytes(self, data: bytes) -> bytes:
        for value in sorted(self._secrets, key=len, reverse=True):
            raw = value.encode()
            if raw in data:
                data = data.replace(raw, REDACTION_MARK.format(name=self._secrets[value]).encode())
        return data


class StreamRedactor:
    """Redacts a byte stream chunk by chunk, holding back just enough bytes that a secret split
    across two chunks is still caught. ``flush()`` releases the held-back tail."""

    def __init__(self, redactor: Redactor, sink: Callable[[bytes], None]) -> None:
        self._redactor = redactor
        self._sink = sink
        self._keep = max(0, redactor.longest - 1)
        self._pending = b""

    def write(self, chunk: bytes) -> None:
        if not self._keep:
            self._sink(self._redactor.redact_bytes(chunk))
            return
        data = self._redactor.redact_bytes(self._pending + chunk)
        # Any secret not yet complete must start within the last `keep` bytes.
        cut = max(0, len(data) - self._keep)
        self._pending = data[cut:]
        if cut:
            self._sink(data[:cut])

    def flush(self) -> None:
        if self._pending:
            data, self._pending = self._redactor.redact_bytes(self._pending), b""
            self._sink(data)


def strip_env(env: Mapping[str, str], keys: Iterable[str]) -> dict[str, str]:
    """A copy of ``env`` without ``keys``."""
    drop = set(keys)
    return {k: v for k, v in env.items() if k not in drop}


def env_secret(name: str) -> str | None:
    """Secret lookup from this process's environment (the CLI and Python API, outside Hermes)."""
    return os.environ.get(name) or None
