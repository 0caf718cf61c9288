"""One Sprite behind the contract: commands over the exec WebSocket, files, checkpoints.

Diffs run in the Sprite against the service's mounts of its newest five checkpoints (diff.py).
Files: a write is one ``PUT .../fs/write?path=&mode=&mkdirParents=true`` (the service creates the
parents; no stat, list or mkdir requests). Reads and deletes go through exec (``cat``, ``rm -f --``),
because the Sprites 2.0 runtime keeps only fs/write of the filesystem API. Checkpoints: the service
creates, lists and restores them; it cannot delete them.
Images without ``$HOME`` exist, so every command gets ``HOME=/root`` explicitly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from hermes_sandboxes import allowlist
from hermes_sandboxes.backends.sprites import network, shapes
from hermes_sandboxes.backends.sprites.api import MAX_RETRY_SLEEP_S
from hermes_sandboxes.backends.sprites.diff import diff as checkpoint_diff
from hermes_sandboxes.backends.sprites.process import (
    KILL_GRACE_S,
    KILL_SIGNAL,
    SpritesProcess,
    TerminalProcess,
    terminal_size,
)
from hermes_sandboxes.backends.sprites.wire import ExecCall, ExecSocket, Lost, UpgradeRefused
from hermes_sandboxes.errors import (
    CheckpointNotFound,
    InvalidInput,
    SandboxError,
    SandboxFileNotFound,
    SandboxNotFound,
    SandboxUnreachable,
    Unsupported,
)
from hermes_sandboxes.sandbox import (
    Checkpoint,
    Command,
    FileChange,
    OutputSink,
    Process,
    Sandbox,
    SandboxInfo,
    SandboxSpec,
    SandboxState,
    Stdin,
    check_tag,
)

if TYPE_CHECKING:
    from sprites import Sprite

    from hermes_sandboxes.backends.sprites.backend import SpritesBackend

EPHEMERAL_LABEL = "hermes-sandboxes-ephemeral"
PROXY_LABEL = "hermes-sandboxes-network=proxy"  # made with an allow-list (network "proxy")
ALLOW_INDEX = "/root/.cache/hermes-sandboxes/allow.json"  # the allow-list's entries as last set
RESTORE_MARKER_DIR = "/var/tmp/hermes-sandboxes-restore"  # written before a restore, gone after it
RESTORE_WAIT_S = 120.0
NOT_FOUND_EXIT = 66
_READ = 'if [ -d "$1" ]; then echo "$1: is a directory" >&2; exit 65; fi; [ -e "$1" ] || exit 66; exec cat -- "$1"'
_DELETE = '[ -e "$1" ] || [ -L "$1" ] || exit 66; rm -f -- "$1"'
_STATES = {"running": SandboxState.RUNNING, "warm": SandboxState.PAUSED, "cold": SandboxState.STOPPED}


@dataclass(frozen=True)
class Remote:
    """What the API says about one Sprite."""

    name: str
    status: str = ""
    labels: tuple[str, ...] = ()
    created_at: float = 0.0
    # the size the service reports (cpus, ram_mb, storage_gb; sprites-go's SpriteInfo.Config, which
    # it may omit), None when the answer has none: sprites-py's Sprite info drops it, so it is read
    # from the REST answer itself
    config: Mapping[str, Any] | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Remote:
        created = _timestamp(data.get("created_at"))
        config = data.get("config")
        return cls(name=str(data.get("name", "")), status=str(data.get("status", "")),
                   labels=tuple(data.get("labels") or ()), created_at=created,
                   config=dict(config) if isinstance(config, Mapping) else None)

    @classmethod
    def from_sdk(cls, info: Any) -> Remote:
        created = info.created_at.timestamp() if info.created_at else 0.0
        return cls(name=info.name, status=info.status or "", labels=tuple(info.labels or ()), created_at=created)

    @property
    def ephemeral(self) -> bool:
        return EPHEMERAL_LABEL in self.labels

    @property
    def fenced(self) -> bool:
        return PROXY_LABEL in self.labels

    @property
    def user_labels(self) -> dict[str, str]:
        """The ``key=value`` labels a spec gave (``SandboxSpec.labels``), without this backend's own."""
        own = (EPHEMERAL_LABEL, PROXY_LABEL)
        return dict(label.partition("=")[::2] for label in self.labels if "=" in label and label not in own)

    def info(self, checkpoint_count: int = 0) -> SandboxInfo:
        return SandboxInfo(name=self.name, backend="sprites", ephemeral=self.ephemeral,
                           state=_STATES.get(self.status, SandboxState.UNKNOWN), created_at=self.created_at,
                           spec=SandboxSpec(network="proxy" if self.fenced else "host"),
                           checkpoint_count=checkpoint_count)


class SpritesSandbox(Sandbox):
    home = "/root"  # the home directory commands get (HOME), whatever the image says
    created = False  # True when the open()/create() that returned this handle made the Sprite

    def __init__(self, backend: SpritesBackend, remote: Remote, *, created: bool = False) -> None:
        self._backend = backend
        self.name = remote.name
        self.ephemeral = remote.ephemeral
        self.fenced = remote.fenced
        self.created = created
        self.sdk_sprite: Sprite = backend.api.client.sprite(remote.name)

    @property
    def backend(self) -> SpritesBackend:
        return self._backend

    def _call(self, what: str, fn: Any, *, retry: bool = True) -> Any:
        return self._backend.api.call(what, fn, sprite=self.name, retry=retry)

    def info(self) -> SandboxInfo:
        remote = Remote.from_sdk(self._call("lookup", lambda: self._backend.api.client.get_sprite(self.name)))
        info = remote.info(checkpoint_count=len(self.checkpoints()))
        if not remote.fenced:
            return info
        return dataclasses.replace(info, spec=SandboxSpec(network="proxy", allow=self.allow_in_force()))

    # the network policy ----------------------------------------------------------------------------
    def policy(self) -> list[dict[str, str]]:
        answer = self._backend.api.request("GET", f"/v1/sprites/{self.name}/policy/network", "network policy",
                                           sprite=self.name)
        return network.rules_in(answer.json() if answer.content else {})

    def allow_in_force(self) -> tuple[str, ...]:
        """The entries as last set when the service enforces them, else the names it allows."""
        try:
            recorded = json.loads(self.read_file(ALLOW_INDEX))
        except (SandboxError, ValueError):
            recorded = None
        entries = [str(e) for e in recorded] if isinstance(recorded, list) else None
        return network.allow_in_effect(entries, self.policy())

    def set_allow(self, allow: Sequence[str]) -> None:
        """Replace the Sprite's network policy with the allow-list's rules (network.py): the
        service reloads it live, dropping connections to names it no longer allows. The entries
        are kept in a small file in the Sprite, for ``info()`` (which reports the service's own
        rules instead should the two disagree)."""
        if not self.fenced:
            raise InvalidInput(f"Sprite {self.name} has network 'host'; an allow-list applies only to network "
                               "'proxy' (create the Sprite with one)")
        entries = allowlist.validate(allow)
        rules = network.policy_rules(entries)
        self._backend.api.request("POST", f"/v1/sprites/{self.name}/policy/network", "network policy update",
                                  sprite=self.name, json_body={"rules": rules})
        self.write_file(ALLOW_INDEX, json.dumps(list(entries)).encode())

    def stop(self) -> None:
        """Kill every running exec session; the service pauses an idle Sprite by itself."""
        from sprites.session import kill_session

        for session in self.sessions():
            if session.active:
                self._call(f"kill of exec session {session.id}",
                           lambda s=session.id: list(kill_session(self.sdk_sprite, s, timeout=3)))

    def sessions(self) -> list[shapes.ExecSession]:
        """The exec sessions, in whichever published shape the service answers (shapes.py)."""
        answer = self._backend.api.request("GET", f"/v1/sprites/{self.name}/exec", "session list", sprite=self.name)
        return shapes.exec_sessions(answer.json())

    # commands ------------------------------------------------------------------------------------
    def start(self, command: Command, *, cwd: str | None = None, env: Mapping[str, str] | None = None,
              stdin: Stdin = None, on_stdout: OutputSink | None = None,
              on_stderr: OutputSink | None = None, tag: str | None = None) -> Process:
        call = ExecCall(argv=_tagged(_argv(command), tag), env=self._env(env), cwd=_checked_dir(cwd))
        return SpritesProcess(self, self._connect(call), stdin, on_stdout, on_stderr)

    def kill_tagged(self, tag: str) -> bool:
        """The service lists each exec session with its command line, where a tagged command carries
        its tag (see ``_tagged``): the active sessions that do are killed, with the grace a kill
        gets here (``process.KILL_GRACE_S``)."""
        from sprites.session import kill_session

        token = _tag_token(check_tag(tag))
        sessions = [s for s in self.sessions() if s.active and token in s.words]
        for session in sessions:
            self._call(f"kill of exec session {session.id}", lambda s=session.id: list(
                kill_session(self.sdk_sprite, s, signal=KILL_SIGNAL, timeout=KILL_GRACE_S)))
        return bool(sessions)

    def attach(self, command: Command, fds: tuple[int, int, int], *, cwd: str | None = None,
               env: Mapping[str, str] | None = None, tag: str | None = None) -> Process:
        """An interactive command over the exec WebSocket's TTY mode, on the caller's descriptors
        (``fds[0]`` read for input, ``fds[1]`` written with output), sized like the terminal on
        ``fds[1]``."""
        rows, cols = terminal_size(fds[1])
        merged = {"TERM": os.environ.get("TERM", "xterm-256color"), **(env or {})}
        call = ExecCall(argv=_tagged(_argv(command), tag), env=self._env(merged), cwd=_checked_dir(cwd), tty=True,
                        rows=rows, cols=cols)
        return TerminalProcess(self, self._connect(call), fds)

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        merged = {"HOME": self.home, **(env or {})}
        for key, value in merged.items():
            if not key or "=" in key or "\0" in key or "\0" in str(value):
                raise InvalidInput(f"invalid environment variable {key!r}")
        return merged

    def _connect(self, call: ExecCall) -> ExecSocket:
        """Open the exec socket. A refusal (429, 5xx) is retried: nothing ran. A connection that
        fails during the handshake is not: the service may have started the command already."""
        api = self._backend.api
        for attempt in range(1, api.attempts + 1):
            try:
                return ExecSocket(api.base_url, api.token, self.name, call)
            except UpgradeRefused as refused:
                error = api.from_status(refused.status, refused.body, "exec", self.name, headers=refused.headers)
            except Lost as exc:
                raise SandboxUnreachable(api.redact(
                    f"Sprite {self.name}: {exc}; the command was not re-tried (it may have started)")) from None
            if not error.retryable or attempt == api.attempts:
                raise error
            time.sleep(min(getattr(error, "retry_after", None) or 0.25 * 2**attempt, MAX_RETRY_SLEEP_S))
        raise AssertionError("unreachable")

    def _run_quiet(self, argv: list[str], stdin: bytes | None = None) -> tuple[int, bytes, bytes]:
        out, err = bytearray(), bytearray()
        proc = self.start(argv, stdin=stdin, on_stdout=out.extend, on_stderr=err.extend)
        code = proc.wait()
        assert code is not None
        return code, bytes(out), bytes(err)

    # files ---------------------------------------------------------------------------------------
    def read_file(self, path: str) -> bytes:
        code, out, err = self._run_quiet(["sh", "-c", _READ, "sh", _absolute(path)])
        if code == NOT_FOUND_EXIT:
            raise SandboxFileNotFound(f"Sprite {self.name}: no file {path}")
        if code != 0:
            raise SandboxError(f"Sprite {self.name}: reading {path} failed: {err.decode(errors='replace').strip()}")
        return out

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """One fs/write request; the service creates missing parent directories."""
        target = self.sdk_sprite.filesystem("/").path(_absolute(path))
        self._call(f"writing {path}", lambda: target.write_bytes(data, mode=mode, mkdir_parents=True))

    def delete_file(self, path: str) -> None:
        code, _, _ = self._run_quiet(["sh", "-c", _DELETE, "sh", _absolute(path)])
        if code == NOT_FOUND_EXIT:
            raise SandboxFileNotFound(f"Sprite {self.name}: no file {path}")
        if code != 0:
            self.delete_files([path])  # retried as root (sudo -n): fs/write makes root-owned files

    def delete_files(self, paths: Sequence[str]) -> None:
        """Delete many files with one exec (``rm -f --``), retried once with ``sudo -n`` for files
        the command user may not remove. Missing files are fine; any other failure raises."""
        if not paths:
            return
        targets = [_absolute(p) for p in paths]
        code, _, err = self._run_quiet(["rm", "-f", "--", *targets])
        if code != 0:
            code, _, err = self._run_quiet(["sudo", "-n", "rm", "-f", "--", *targets])
        if code != 0:
            raise SandboxError(f"Sprite {self.name}: deleting {len(targets)} file(s) failed: "
                               f"{err.decode(errors='replace').strip()[:300]}")

    # checkpoints ---------------------------------------------------------------------------------
    def checkpoint(self, comment: str = "") -> Checkpoint:
        """Create one (not retried: a repeat would make two). The service's progress stream names
        the new id only in the text of a message ("Checkpoint v8 created"): no id, no checkpoint."""
        api = self._backend.api
        answer = api.request("POST", f"/v1/sprites/{self.name}/checkpoint", "checkpoint", sprite=self.name,
                             retry=False, json_body={"comment": comment} if comment else {}, timeout=600)
        messages = shapes.ndjson(answer.text)
        failed = shapes.stream_error(messages)
        if failed is not None:
            raise SandboxError(f"Sprite {self.name}: checkpoint failed: {api.redact(failed)}")
        new_id = shapes.created_checkpoint_id(messages)
        if new_id is None:
            raise SandboxError(f"Sprite {self.name}: the checkpoint stream ended without naming a checkpoint; "
                               "list checkpoints before trying again")
        listed = {c.id: c for c in self._listed(include_auto=True)}
        found = listed.get(new_id)
        return Checkpoint(id=new_id, created_at=found.created_at if found else time.time(),
                          comment=found.comment if found and found.comment else comment)

    def _listed(self, *, include_auto: bool = False) -> list[shapes.ListedCheckpoint]:
        params = {"includeAuto": "true"} if include_auto else None
        answer = self._backend.api.request("GET", f"/v1/sprites/{self.name}/checkpoints", "checkpoint list",
                                           sprite=self.name, params=params)
        return sorted(shapes.listed_checkpoints(answer.json()), key=lambda c: c.created_at)

    def checkpoints(self) -> list[Checkpoint]:
        """Ours and the user's, oldest first; the service's automatic ones are hidden, as the API
        hides them by default (see ``all_checkpoints``)."""
        return [Checkpoint(id=c.id, created_at=c.created_at, comment=c.comment) for c in self._listed()]

    def all_checkpoints(self) -> list[Checkpoint]:
        """With the service's automatic checkpoints (``auto-`` ids, ``includeAuto=true``)."""
        return [Checkpoint(id=c.id, created_at=c.created_at, comment=c.comment or ("automatic" if c.auto else ""))
                for c in self._listed(include_auto=True)]

    def restore(self, checkpoint_id: str) -> None:
        """Restore, then wait until the Sprite is back. The service answers at once and restarts
        the environment afterwards (active sessions end), so a marker file written just before
        (absent from every checkpoint) tells a Sprite that has restored from one that has not yet
        begun; until it is gone, or while exec is refused, the next command would be too early."""
        if checkpoint_id not in {c.id for c in self._listed(include_auto=True)}:
            raise CheckpointNotFound(f"Sprite {self.name} has no checkpoint {checkpoint_id!r}", sandbox=self.name)
        marker = f"{RESTORE_MARKER_DIR}/{secrets.token_hex(8)}"
        self.write_file(marker, b"")
        api = self._backend.api
        answer = api.request("POST", f"/v1/sprites/{self.name}/checkpoints/{checkpoint_id}/restore",
                             f"restore of {checkpoint_id}", sprite=self.name, retry=False, timeout=600)
        failed = shapes.stream_error(shapes.ndjson(answer.text))
        if failed is not None:
            with contextlib.suppress(SandboxError):
                self.delete_file(marker)
            raise SandboxError(f"Sprite {self.name}: restore of {checkpoint_id} failed: {api.redact(failed)}")
        self._await_restored(marker, checkpoint_id)

    def _await_restored(self, marker: str, checkpoint_id: str) -> None:
        deadline = time.monotonic() + RESTORE_WAIT_S
        pause = 0.1
        while True:
            try:
                code, _, _ = self._run_quiet(["sh", "-c", '[ ! -e "$1" ]', "sh", marker])
                if code == 0:
                    return
            except SandboxError:  # refused or cut off while the environment restarts
                pass
            if time.monotonic() + pause > deadline:
                raise SandboxUnreachable(f"Sprite {self.name} was still restoring {checkpoint_id} after "
                                         f"{RESTORE_WAIT_S:g}s; try the next command in a moment")
            time.sleep(pause)
            pause = min(pause * 2, 0.5)  # a restart takes seconds: look often, each look is one exec

    def diff(self, from_id: str, to_id: str | None = None) -> list[FileChange]:
        """Computed in the Sprite against the service's read-only mounts of its newest five
        checkpoints (diff.py); an older checkpoint is ``Unsupported``, saying why."""
        known = {c.id for c in self._listed(include_auto=True)}
        for checkpoint_id in (from_id, to_id):
            if checkpoint_id is not None and checkpoint_id not in known:
                raise CheckpointNotFound(f"Sprite {self.name} has no checkpoint {checkpoint_id!r}")
        return checkpoint_diff(self, from_id, to_id, skip=(RESTORE_MARKER_DIR,))

    def delete_checkpoint(self, checkpoint_id: str) -> None:
        raise Unsupported("Sprites cannot delete checkpoints; they stay until the Sprite is deleted")

    def destroy(self) -> None:
        try:
            self._call("delete", lambda: self._backend.api.client.delete_sprite(self.name))
        except SandboxNotFound:
            return


def _argv(command: Command) -> list[str]:
    if isinstance(command, str):
        return ["bash", "-c", command]
    argv = [str(a) for a in command]
    if not argv:
        raise InvalidInput("empty command: give a program to run")
    return argv


def _tag_token(tag: str) -> str:
    return f"hermes-sandboxes-tag:{tag}"


def _tagged(argv: list[str], tag: str | None) -> list[str]:
    """``argv`` run through ``sh -c 'exec "$@"'`` with the tag's token as ``$0``, so the session's
    command line (which the service lists) names the tag while the command runs exactly as given
    (``exec`` replaces the shell; an argv needs no quoting)."""
    if tag is None:
        return argv
    return ["sh", "-c", 'exec "$@"', _tag_token(check_tag(tag)), *argv]


def _checked_dir(cwd: str | None) -> str | None:
    if cwd is not None and not cwd.startswith("/"):
        raise InvalidInput(f"working directory must be absolute, got {cwd!r}")
    return cwd


def _absolute(path: str) -> str:
    if not path.startswith("/"):
        raise InvalidInput(f"sandbox paths must be absolute, got {path!r}")
    return path


def _timestamp(value: Any) -> float:
    if not value:
        return 0.0
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0

