"""The sandbox of the conversation a ``/sandbox`` command is typed in, and what its agent must hear.

A slash command carries no task id: Hermes runs it in the CLI chat's process, or in a gateway with
the message's session bound (``HERMES_SESSION_KEY``). Its sandbox is found as the terminal tool
finds it: Hermes keys environments by ``tools.terminal_tool._resolve_container_task_id`` (``default``
for the CLI and cron, ``session:<key>`` in a gateway), so that key picks the live environment of
ours (``live_environments``) or, when none runs in this process, the persistent sandbox that key
resumes, opened by name without creating anything.

After ``/sandbox undo`` the agent must not go on working on files that are gone. The undo writes a
note beside the sandbox's journal (``<journal>.undone``); the plugin's ``pre_llm_call`` hook, which
Hermes runs before every turn and whose text it adds to the user's message, takes the note (once:
it is renamed away first, so two sessions of one sandbox cannot both take it) and tells the agent
what was thrown away. A note on disk reaches the next turn whichever process runs it (the CLI chat,
a gateway, the next ``hermes chat``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermes_sandboxes.errors import SandboxError, SandboxNotFound
from hermes_sandboxes.hermes import naming
from hermes_sandboxes.hermes.providers.registry import active
from hermes_sandboxes.hermes.runtime import RUNTIME
from hermes_sandboxes.recorder.credentials import Redactor
from hermes_sandboxes.recorder.records import ExecRecord
from hermes_sandboxes.recorder.sandbox import RecordedSandbox

if TYPE_CHECKING:
    from hermes_sandboxes.hermes.environment import SandboxEnvironment
    from hermes_sandboxes.hermes.providers.base import SandboxProvider

logger = logging.getLogger(__name__)

NOTE_SUFFIX = ".undone"
MAX_NOTE_COMMANDS = 10

_live_lock = threading.Lock()
_live: weakref.WeakSet[SandboxEnvironment] = weakref.WeakSet()


def track(env: SandboxEnvironment) -> None:
    """Remember a live environment of this process (the environment calls it when made)."""
    with _live_lock:
        _live.add(env)


def live_environments() -> list[SandboxEnvironment]:
    """This process's environments that are not cleaned up, Hermes's system-prompt probe left out."""
    from hermes_sandboxes.hermes.providers.base import PROBE_TASK_ID

    with _live_lock:
        return [e for e in _live if not e.closed and e.options.task_key != PROBE_TASK_ID]


class NoSandbox(SandboxError):
    """The conversation has no sandbox of ours (another terminal backend, or none made yet)."""


@dataclass
class Target:
    """The conversation's sandbox: its recorder, and its environment when one is live here."""

    provider: SandboxProvider
    recorded: RecordedSandbox
    env: SandboxEnvironment | None

    @property
    def name(self) -> str:
        return self.recorded.name

    def busy(self) -> contextlib.AbstractContextManager[None]:
        """Hold off the environment's cleanup while the command works on the sandbox."""
        return self.env.busy() if self.env is not None else contextlib.nullcontext()


def session_key(task_id: str | None = None) -> str:
    """Hermes's key of the environment ``task_id`` (None: the conversation bound now) would use."""
    try:
        from tools.terminal_tool import _resolve_container_task_id  # Hermes's own rule, not a copy

        return str(_resolve_container_task_id(task_id))
    except Exception:  # an older or newer Hermes: the documented keys
        from gateway.session_context import get_session_env

        session = str(get_session_env("HERMES_SESSION_KEY", "") or "")
        return f"session:{session}" if session else "default"


def _locate(task_id: str | None) -> tuple[SandboxProvider, SandboxEnvironment | None, str]:
    """Our active provider, the conversation's live environment (if any) and its sandbox's name,
    found without touching the sandbox (a cloud one is not resumed by looking)."""
    provider = active()
    if provider is None:
        raise NoSandbox("the terminal backend is not one of the hermes-sandboxes backends "
                        "(terminal.backend: sandbox, sprites or e2b), so /sandbox has nothing to act on")
    key = session_key(task_id)
    envs = [e for e in live_environments() if e.options.task_key == key and _serves(e, provider)]
    if not envs and key == "default":  # the CLI chat with container_persistent: false keys its session
        envs = [e for e in live_environments() if _serves(e, provider)]
        envs = envs if len(envs) == 1 else []
    if envs:
        return provider, envs[0], envs[0].sandbox_name
    settings = provider.settings()
    prefix = settings.name_prefix
    name = provider.persistent_name(prefix, naming.resolve_profile(), naming.task_key_for_scope(key, settings.scope))
    return provider, None, naming.require_within_prefix(prefix, name)


def find(task_id: str | None = None) -> Target:
    """The sandbox of the conversation (``task_id``: an agent turn's; None: the one bound now)."""
    provider, env, name = _locate(task_id)
    if env is not None:
        return Target(provider, env.recorded, env)
    settings = provider.settings()
    try:
        sandbox = provider.backend(settings).get(name)
    except SandboxNotFound:
        raise NoSandbox(f"this conversation has no sandbox yet ({name} is made at the agent's first "
                        "command)") from None
    return Target(provider, provider.recorded(sandbox, settings, Redactor()), None)


def _serves(env: SandboxEnvironment, provider: SandboxProvider) -> bool:
    return env.sandbox.backend.name == provider.backend_name


# --- the note of an undo, for the agent's next turn ------------------------------------------------
def _note_path(journal: Path) -> Path:
    return journal.with_name(journal.name + NOTE_SUFFIX)


def leave_note(recorded: RecordedSandbox, checkpoint_id: str, discarded: Sequence[ExecRecord] | None,
               changes: str) -> None:
    """What the agent must hear on its next turn about this undo (replaces an older, untaken note)."""
    note = {"sandbox": recorded.name, "checkpoint": checkpoint_id, "changes": changes,
            "discarded": None if discarded is None else [r.command for r in discarded]}
    path = _note_path(recorded.journal.path)
    temp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    temp.write_text(json.dumps(note))
    os.replace(temp, path)


def take_note(journal: Path) -> dict[str, Any] | None:
    """The untaken note of the last undo of the sandbox whose journal is ``journal``, taken (None
    when there is none)."""
    path = _note_path(journal)
    claimed = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.taking")
    try:
        os.rename(path, claimed)
    except FileNotFoundError:
        return None
    try:
        with contextlib.suppress(ValueError, OSError):
            note = json.loads(claimed.read_text())
            return note if isinstance(note, dict) else None
        return None
    finally:
        claimed.unlink(missing_ok=True)


def agent_text(note: dict[str, Any]) -> str:
    """The note as the agent reads it at the start of its turn."""
    lines = [f"[sandbox: the user undid work in your sandbox {note.get('sandbox')}: its files are back at "
             f"checkpoint {note.get('checkpoint')} and processes that were running were stopped.]"]
    discarded = note.get("discarded")
    if discarded:
        shown = discarded[-MAX_NOTE_COMMANDS:]
        more = f" (and {len(discarded) - len(shown)} earlier)" if len(discarded) > len(shown) else ""
        lines.append(f"[sandbox: the effects of these {len(discarded)} command(s) are gone{more}:]")
        lines += [f"  {c}" for c in shown]
    if note.get("changes"):
        lines.append(f"[sandbox: files: {note['changes']}]")
    lines.append("[sandbox: check the current state before you go on; do not assume files you made since "
                 "that checkpoint still exist.]")
    return "\n".join(lines)


def pre_llm_call(task_id: str | None = None, **_: Any) -> dict[str, str] | None:
    """Hermes's pre-turn hook: the undo note of the turn's sandbox, once. It reads a file of the
    host state only (a cloud sandbox is not resumed for it) and never raises (a failing hook must
    not cost the user the turn)."""
    try:
        provider, env, name = _locate(task_id)
        if env is not None:
            journal = env.recorded.journal.path
        else:
            journal = RUNTIME.state.journal_path(provider.backend(provider.settings(), check=False).key, name)
        note = take_note(journal)
    except (SandboxError, LookupError):
        return None
    except Exception:
        logger.exception("hermes-sandboxes: the undo note could not be read")
        return None
    return {"context": agent_text(note)} if note else None
