"""Host <-> sandbox file sync for the Hermes plugin, over Hermes's own ``FileSyncManager``.

Hermes decides what to sync (credential files, skills, caches; see ``iter_sync_files``) and keeps the
mtime/size bookkeeping; this module supplies the transport through the backend-neutral contract, for
any backend. Two things ``FileSyncManager`` does not do, done here:

* it swallows a failed push (logs, rolls back, retries next time). A command run after a failed
  push would see stale skills or credentials, so every transport error is remembered and
  ``push()`` raises ``SyncFailed``; the caller refuses to run the command.
* it never reports whether a pull-back worked; ``pull()`` says whether it did, failed, or found
  the sandbox gone. It also retries a failed pull-back with pauses: a sandbox that no longer
  exists stops those retries at once (nothing left to pull is not a failure).

Credential files are pushed with mode 0600 and never pulled back (Hermes skips them on pull-back;
the agent may have tampered with them inside the sandbox).
"""

from __future__ import annotations

import enum
import importlib
import logging
import shlex
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hermes_sandboxes.errors import SandboxError, SandboxNotFound
from hermes_sandboxes.sandbox import Sandbox

logger = logging.getLogger(__name__)

_TRANSFER_TIMEOUT_S = 120.0


class SyncFailed(SandboxError):
    """Files could not be pushed into the sandbox; running a command now would use stale state."""


class Pulled(enum.Enum):
    DONE = "done"
    FAILED = "failed"
    GONE = "gone"  # the sandbox no longer exists: nothing to pull


class _Gone(BaseException):
    """Raised through Hermes's sync-back, which retries every ``Exception`` with pauses in between:
    when the sandbox is gone no retry can help, so this must not be one."""


class SandboxFileSync:
    """Pushes ``~/.hermes`` content into ``remote_base`` in the sandbox and pulls agent edits back."""

    def __init__(self, sandbox: Callable[[], Sandbox], remote_base: str, lock: threading.Lock) -> None:
        file_sync = importlib.import_module("tools.environments.file_sync")
        self._sandbox = sandbox
        self._remote_base = remote_base.rstrip("/")
        self._lock = lock  # shared by every environment on the same sandbox in this process
        self._iter_sync_files: Callable[[str], list[tuple[str, str]]] = file_sync.iter_sync_files
        self._errors: list[BaseException] = []
        self._manager_class: Any = file_sync.FileSyncManager
        self._manager: Any = None
        self.reset()

    def reset(self) -> None:
        """Forget what was pushed (the sandbox was restored or recreated): the next push sends all."""
        self._manager = self._manager_class(
            get_files_fn=self._files,
            upload_fn=self._upload_one,
            delete_fn=self._delete,
            bulk_upload_fn=self._upload,
            bulk_download_fn=self._download,
        )

    def _files(self) -> list[tuple[str, str]]:
        return self._iter_sync_files(self._remote_base)

    def _credential_paths(self) -> set[str]:
        credential_files = importlib.import_module("tools.credential_files")
        return {m["container_path"] for m in credential_files.get_credential_file_mounts()}

    def _upload_one(self, host_path: str, remote_path: str) -> None:
        self._upload([(host_path, remote_path)])

    def _upload(self, files: list[tuple[str, str]]) -> None:
        try:
            sandbox = self._sandbox()  # write_file creates missing parents (the contract): one request a file
            secret_paths = self._credential_paths()
            for host_path, remote_path in files:
                data = Path(host_path).read_bytes()
                mode = 0o600 if _remote_key(remote_path, self._remote_base) in secret_paths else 0o644
                sandbox.write_file(remote_path, data, mode)
        except BaseException as exc:
            self._errors.append(exc)
            raise

    def _delete(self, remote_paths: list[str]) -> None:
        """One batched ``rm -f``; where the files belong to another user than the one commands run as
        (a cloud image's unprivileged user, files written by the service as root), again with
        ``sudo -n``. A missing file is fine; any other failure is retried at the next sync."""
        try:
            sandbox = self._sandbox()
            try:
                self._run(sandbox, ["rm", "-f", "--", *remote_paths])
            except SyncFailed:
                self._run(sandbox, ["sudo", "-n", "rm", "-f", "--", *remote_paths])
        except BaseException as exc:
            self._errors.append(exc)
            raise

    def _download(self, dest: Path) -> None:
        try:
            # Hermes maps archive members back as "/" + member, so archive paths relative to "/".
            script = f"tar cf - --exclude='*.sock' -C / {shlex.quote(self._remote_base.lstrip('/'))}"
            with dest.open("wb") as out:

                def write(chunk: bytes) -> None:
                    out.write(chunk)

                proc = self._sandbox().start(["sh", "-c", script], on_stdout=write)
                code = proc.wait(_TRANSFER_TIMEOUT_S)
                if code is None:
                    proc.kill()
                    raise SyncFailed("pulling ~/.hermes out of the sandbox timed out")
            if code != 0:
                raise SyncFailed(f"pulling ~/.hermes out of the sandbox failed (tar exit {code})")
        except SandboxNotFound as exc:
            raise _Gone() from exc
        except BaseException as exc:
            self._errors.append(exc)
            raise

    @staticmethod
    def _run(sandbox: Sandbox, argv: list[str]) -> None:
        result = sandbox.exec(argv, timeout=_TRANSFER_TIMEOUT_S)
        if result.exit_code != 0:
            detail = result.stderr.strip()
            raise SyncFailed(f"{argv[0]} failed in the sandbox (exit {result.exit_code}): {detail}")

    def push(self, *, force: bool = False) -> None:
        """Bring the sandbox's ``~/.hermes`` up to date, or raise SyncFailed."""
        with self._lock:
            self._errors.clear()
            self._manager.sync(force=force)
            if self._errors:
                error = self._errors[0]
                self._errors.clear()
                raise SyncFailed(f"file sync into the sandbox failed, command not run: {error}") from error

    def pull(self) -> Pulled:
        """Copy agent-authored changes (skills, caches) back to the host."""
        with self._lock:
            self._errors.clear()
            try:
                self._manager.sync_back()
            except _Gone:
                return Pulled.GONE
            except Exception:
                logger.warning("pulling files back from the sandbox failed", exc_info=True)
                return Pulled.FAILED
            ok = not self._errors
            self._errors.clear()
            return Pulled.DONE if ok else Pulled.FAILED


def _remote_key(remote_path: str, remote_base: str) -> str:
    """Hermes names credential files by their ``/root/.hermes`` path whatever the real base is."""
    if remote_path.startswith(remote_base + "/"):
        return "/root/.hermes" + remote_path[len(remote_base):]
    return remote_path
