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

For sandboxes that outlive a host process (remote backends), three more:

* ``recover()`` runs the core recovery (``hermes_sandboxes.hermes.sync.recovery``) before the first push into a
  resumed sandbox, with Hermes's credential files as host-only paths;
* the archive of the teardown pull, and recovery's, are capped while they stream
  (``hermes_sandboxes.hermes.sync.archive``) at Hermes's own cap, ``terminal.sync_back_max_bytes`` (2 GiB by
  default): one over it fails closed (nothing written on the host, nothing pushed after a failed
  recovery) with a message naming the key, and a pull is not tried again (the same tree would be
  just as big); Hermes extracts what passes with tarfile's data filter;
* ``learn_remote()`` lists what the sandbox's ``~/.hermes`` already holds (one command, digests), so
  the full push after a resume or a checkpoint restore sends only files that differ: Hermes's manager
  believes it sent everything, and the sandbox does hold everything.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import importlib
import logging
import os
import shlex
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hermes_sandboxes.errors import SandboxError, SandboxNotFound
from hermes_sandboxes.hermes.config import SYNC_BACK_MAX_BYTES_KEY, sync_back_max_bytes
from hermes_sandboxes.hermes.sync import archive, recovery
from hermes_sandboxes.sandbox import Sandbox
from hermes_sandboxes.settings import InvalidSettings

logger = logging.getLogger(__name__)

_TRANSFER_TIMEOUT_S = 120.0
_LISTING_LIMIT = 64 << 20  # a bigger digest listing is ignored: everything is sent instead
# Digests of every regular file below the base, NUL-terminated records "<sha256>  <path>" (GNU -z:
# names are not escaped). Any failure only means the push sends everything.
_LIST_SCRIPT = r"""
[ -d "$1" ] || exit 0
find "$1" -type f -print0 | xargs -0 -r sha256sum -z --
"""


class SyncFailed(SandboxError):
    """Files could not be pushed into the sandbox; running a command now would use stale state."""


class Pulled(enum.Enum):
    DONE = "done"
    FAILED = "failed"
    GONE = "gone"  # the sandbox no longer exists: nothing to pull


class _Gone(BaseException):
    """Raised through Hermes's sync-back, which retries every ``Exception`` with pauses in between:
    when the sandbox is gone no retry can help, so this must not be one."""


class _ArchiveOverCap(BaseException):
    """Raised through Hermes's sync-back like ``_Gone``: the archive was over the cap (or the cap's
    setting is invalid), and trying again would only meet the same refusal."""

    def __init__(self, error: SandboxError) -> None:
        super().__init__(str(error))
        self.error = error


class SandboxFileSync:
    """Pushes ``~/.hermes`` content into ``remote_base`` in the sandbox and pulls agent edits back."""

    def __init__(self, sandbox: Callable[[], Sandbox], remote_base: str, lock: threading.Lock, *,
                 archive_limit: int | None = None) -> None:
        file_sync = importlib.import_module("tools.environments.file_sync")
        self._fixed_limit = archive_limit  # None: Hermes's terminal.sync_back_max_bytes, read at each use
        self._remote_digests: dict[str, str] = {}  # remote path -> sha256, from learn_remote()
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
            known, self._remote_digests = self._remote_digests, {}  # good for one push only
            for host_path, remote_path in files:
                data = Path(host_path).read_bytes()
                if known.get(remote_path) == hashlib.sha256(data).hexdigest():
                    continue  # the sandbox holds these bytes already
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
        """The teardown pull's archive, capped while it streams, then reduced to the regular files
        that pass the tar data filter (Hermes extracts it whole, with that filter: one agent-made
        link would otherwise fail the whole pull)."""
        try:
            # Hermes maps archive members back as "/" + member, so archive paths relative to "/".
            script = f"tar cf - --exclude='*.sock' -C / {shlex.quote(self._remote_base.lstrip('/'))}"
            with tempfile.TemporaryFile(prefix="hermes-sandboxes-pull-") as spool, _capped():
                code, err = archive.capture(self._sandbox(), ["sh", "-c", script], spool, what="pulling ~/.hermes back",
                                            limit=self._archive_limit(), timeout=_TRANSFER_TIMEOUT_S)
                if code != 0:
                    raise SyncFailed(f"pulling ~/.hermes out of the sandbox failed (tar exit {code}: {err})")
                spool.seek(0)
                refused: list[archive.RefusedMember] = []
                with dest.open("wb") as out:
                    archive.keep_regular_files(spool, out, refused, self._behind_host_link)
            for item in refused:
                logger.warning("pulling ~/.hermes back: %s was not taken (%s)", item.name, item.reason)
        except SandboxNotFound as exc:
            raise _Gone() from exc
        except (archive.ArchiveTooLarge, InvalidSettings) as exc:
            self._errors.append(exc)
            raise _ArchiveOverCap(exc) from exc
        except BaseException as exc:
            self._errors.append(exc)
            raise

    def _archive_limit(self) -> int:
        return self._fixed_limit if self._fixed_limit is not None else sync_back_max_bytes()

    def _behind_host_link(self, member: str) -> str:
        """Why Hermes must not get ``member`` (a path relative to "/"): its host copy below the Hermes
        home would be written through a symlink there (Hermes's pull copies by path name)."""
        base = self._remote_base.lstrip("/")
        if not member.startswith(base + "/"):
            return ""
        home = os.path.realpath(importlib.import_module("hermes_constants").get_hermes_home())
        path = home
        for name in member[len(base) + 1:].split("/"):
            path = os.path.join(path, name)
            if os.path.islink(path):
                return "its host path passes a symlink; pulling it would write through the link"
            if not os.path.isdir(path):
                break
        return ""

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
            self._remote_digests = {}  # learnt for this push only
            if self._errors:
                error = self._errors[0]
                self._errors.clear()
                raise SyncFailed(f"file sync into the sandbox failed, command not run: {error}") from error

    def recover(self) -> recovery.RecoveryReport:
        """Take the agent's skills/ and memories/ back before a push buries them (see sync/recovery.py);
        raises (StateUnreadable, RecoveryFailed) when that cannot be done safely."""
        hermes_home = importlib.import_module("hermes_constants").get_hermes_home()
        with self._lock, _capped():
            report = recovery.recover(self._sandbox(), remote_base=self._remote_base, host_home=hermes_home,
                                      protected=self._host_only(hermes_home), limit=self._archive_limit())
        report.log()
        return report

    def _host_only(self, hermes_home: Path) -> set[str]:
        """Hermes's credential files, as paths below the physical Hermes home."""
        credential_files = importlib.import_module("tools.credential_files")
        home = os.path.realpath(hermes_home)
        found = set()
        for mount in credential_files.get_credential_file_mounts():
            path = os.path.realpath(mount["host_path"])
            if path.startswith(home + os.sep):
                found.add(os.path.relpath(path, home).replace(os.sep, "/"))
        return found

    def learn_remote(self) -> bool:
        """Read what the sandbox's ``~/.hermes`` holds (digests), so the next push skips files that
        are there already. False (and the next push sends everything) when the listing fails."""
        self._remote_digests = {}
        try:
            with tempfile.TemporaryFile() as out:
                code, _ = archive.capture(self._sandbox(), ["sh", "-c", _LIST_SCRIPT, "sh", self._remote_base], out,
                                          what="listing ~/.hermes", limit=_LISTING_LIMIT)
                out.seek(0)
                listing = out.read()
        except SandboxError as exc:
            logger.info("could not list ~/.hermes in the sandbox (%s): pushing everything", exc)
            return False
        if code != 0:
            logger.info("listing ~/.hermes in the sandbox failed (exit %s): pushing everything", code)
            return False
        for record in listing.split(b"\0"):
            digest, sep, path = record.partition(b"  ")
            if sep and len(digest) == 64:
                self._remote_digests[path.decode("utf-8", "surrogateescape")] = digest.decode()
        return True

    def pull(self) -> Pulled:
        """Copy agent-authored changes (skills, caches) back to the host."""
        with self._lock:
            self._errors.clear()
            try:
                self._manager.sync_back()
            except _Gone:
                return Pulled.GONE
            except _ArchiveOverCap as refused:
                logger.error("%s", refused.error)
                return Pulled.FAILED
            except Exception:
                logger.warning("pulling files back from the sandbox failed", exc_info=True)
                return Pulled.FAILED
            ok = not self._errors
            self._errors.clear()
            return Pulled.DONE if ok else Pulled.FAILED


@contextlib.contextmanager
def _capped() -> Iterator[None]:
    """An archive over the cap says which setting sets the cap, and how to raise it."""
    try:
        yield
    except archive.ArchiveTooLarge as exc:
        raise archive.ArchiveTooLarge(
            f"{exc}; the cap is Hermes's {SYNC_BACK_MAX_BYTES_KEY} in config.yaml: raise it if the sandbox's "
            "~/.hermes is meant to be that big") from exc


def _remote_key(remote_path: str, remote_base: str) -> str:
    """Hermes names credential files by their ``/root/.hermes`` path whatever the real base is."""
    if remote_path.startswith(remote_base + "/"):
        return "/root/.hermes" + remote_path[len(remote_base):]
    return remote_path
