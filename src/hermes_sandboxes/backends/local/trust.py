"""The egress proxy's CA in a sandbox's system trust store, for tools that read only that store.

When credentials are brokered, the proxy terminates TLS with the store's CA. Commands get
variables that point at a bundle holding it (egress.py), but a tool that ignores those variables
(``wget``, a program started with a cleared environment, anything that reads OpenSSL's default
paths) reads the system store: ``/etc/ssl/certs/ca-certificates.crt`` and the hashed links in
``/etc/ssl/certs``. So the CA is put there too, the way Debian's update-ca-certificates would:

    usr/local/share/ca-certificates/hermes-sandboxes-egress.crt   the CA certificate
    etc/ssl/certs/hermes-sandboxes-egress.pem                     a link to it
    etc/ssl/certs/<subject hash>.0                                a link to that (OpenSSL's lookup)
    etc/ssl/certs/ca-certificates.crt                             the base's bundle plus the CA

Where: not in the sandbox's writable layer, but in a small read-only overlay layer of its own,
stacked between the writable layer and the base each time the sandbox starts, and only while
brokering is on. Overlay refuses a lower layer inside another one (the base ``/`` holds every host
directory), so the layer is a tmpfs the init fills in its own mount namespace, from entries the
host computes here (``layer_entries``); nothing of it exists on the host. Hence:

- it is never part of a checkpoint or a diff: the agent did not make it;
- a restore, which starts the sandbox again, finds it there again; a sandbox whose store no longer
  brokers starts without it, and nothing is left to remove;
- ``apt upgrade ca-certificates`` (or ``update-ca-certificates``) inside sees the .crt like any
  local CA and keeps it in the bundle it writes to the writable layer.

That last case is the one where the writable layer holds a bundle of its own, which hides the
layer's. ``reconcile_upper`` then edits that bundle from the host before the sandbox starts: adds
the CA when brokering is on and the bundle lacks it, takes it out when brokering is off. Those two
edits do show in diffs (rarely: only after the agent rebuilt its store). The edit runs as root on
the host in a layer the sandbox owns, so every path is opened below a directory descriptor without
following symlinks, and the file is replaced by a new one, never written in place.

Only the certificate enters the sandbox; the CA's key stays in the store's home (tls.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

NAME = "hermes-sandboxes-egress"
CERT_DIRS = ("usr", "local", "share", "ca-certificates")
CERTS = ("etc", "ssl", "certs")  # the system store: without it in the base, there is nothing to add to
BUNDLE = "ca-certificates.crt"
_TMP = f".{NAME}.tmp"
_MAX_BUNDLE = 16 << 20  # Debian's bundle is ~220 KB


def subject_hash(ca_dir: Path, ca_pem: bytes) -> str | None:
    """OpenSSL's subject hash of the CA (the name of its link in a hashed directory), asked of the
    host's ``openssl`` once per CA and kept beside it; None without an ``openssl`` command."""
    digest = hashlib.sha256(ca_pem).hexdigest()
    cache = ca_dir / "ca.subject-hash"
    with contextlib.suppress(OSError):
        known, _, value = cache.read_text().partition(" ")
        if known == digest and value.strip():
            return value.strip()
    try:
        out = subprocess.run(["openssl", "x509", "-noout", "-subject_hash"], input=ca_pem, capture_output=True,
                             check=True, timeout=30).stdout.decode().strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if len(out) != 8 or any(c not in "0123456789abcdef" for c in out):
        return None
    with contextlib.suppress(OSError):
        cache.write_text(f"{digest} {out}\n")
    return out


# One entry of a layer: (relative path, kind "d" | "f" | "l", content or link target, mode, uid, gid,
# atime_ns, mtime_ns). The init builds the layer from these (rootfs.build_layer).
Entry = tuple[str, str, bytes, int, int, int, int, int]


def _dirs(lower: Path, parts: tuple[str, ...]) -> list[Entry] | None:
    """Entries for the directories ``parts`` with the base's owner, mode and times (the merged view
    of those directories looks as before); None when the base has something else than a real
    directory there. A directory the base lacks is 0755 root."""
    out: list[Entry] = []
    for depth in range(1, len(parts) + 1):
        rel = "/".join(parts[:depth])
        try:
            st = os.lstat(lower / rel)
        except FileNotFoundError:
            out.append((rel, "d", b"", 0o755, 0, 0, 0, 0))
            continue
        if not stat.S_ISDIR(st.st_mode):
            return None
        out.append((rel, "d", b"", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_atime_ns, st.st_mtime_ns))
    return out


def _base_bundle(lower: Path) -> bytes | None:
    """The base's bundle, if it is a regular file (a symlink would be read against the host's root)."""
    path = lower.joinpath(*CERTS, BUNDLE)
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        return path.read_bytes()
    except OSError:
        return None


def _free_hash_name(lower: Path, hashed: str) -> str:
    """``<hash>.N`` with the first N the base's store does not use (two CAs may share a hash)."""
    certs = lower.joinpath(*CERTS)
    n = 0
    while os.path.lexists(certs / f"{hashed}.{n}"):
        n += 1
    return f"{hashed}.{n}"


def layer_entries(lower: Path, ca_pem: bytes, hashed: str | None) -> list[Entry] | None:
    """What the trust layer holds for the base ``lower``; None when the base has no system store."""
    store = lower.joinpath(*CERTS)
    if store.is_symlink() or not store.is_dir():
        return None
    certs_dirs, local_dirs = _dirs(lower, CERTS), _dirs(lower, CERT_DIRS)
    if certs_dirs is None or local_dirs is None:
        return None
    certs, local = "/".join(CERTS), "/".join(CERT_DIRS)
    files: list[Entry] = [
        (f"{local}/{NAME}.crt", "f", ca_pem, 0o644, 0, 0, 0, 0),
        (f"{certs}/{NAME}.pem", "l", f"/{local}/{NAME}.crt".encode(), 0o777, 0, 0, 0, 0),
    ]
    if hashed is not None:
        files.append((f"{certs}/{_free_hash_name(lower, hashed)}", "l", f"{NAME}.pem".encode(), 0o777, 0, 0, 0, 0))
    base = _base_bundle(lower)
    if base is not None:
        files.append((f"{certs}/{BUNDLE}", "f", with_ca(base, ca_pem), 0o644, 0, 0, 0, 0))
    return [*certs_dirs, *local_dirs, *files]


def with_ca(bundle: bytes, ca_pem: bytes) -> bytes:
    """``bundle`` with the CA at its end (unchanged if it holds it already)."""
    if ca_pem.strip() in bundle:
        return bundle
    return (bundle.rstrip(b"\n") + b"\n" if bundle.strip() else b"") + ca_pem.rstrip(b"\n") + b"\n"


def without_ca(bundle: bytes, ca_pem: bytes) -> bytes:
    """``bundle`` without the CA, however many times it was added."""
    block = ca_pem.strip()
    while block in bundle:
        before, _, after = bundle.partition(block)
        bundle = before + after.removeprefix(b"\n")
    return bundle


@contextlib.contextmanager
def _open_dir(root_fd: int, parts: tuple[str, ...]) -> Iterator[int | None]:
    """A descriptor of ``parts`` below ``root_fd``, never following a symlink; None if it is not a
    real directory there."""
    fd: int | None = os.dup(root_fd)
    try:
        for part in parts:
            assert fd is not None
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError:
                os.close(fd)
                fd = None
                break
            os.close(fd)
            fd = child
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def _read_regular(dir_fd: int, name: str) -> tuple[bytes, os.stat_result] | None:
    """A regular file's content, if it is one of a sane size (the sandbox wrote it: a FIFO, a
    device or a file of gigabytes is left alone)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_BUNDLE:
            return None
        return f.read(_MAX_BUNDLE + 1), st


def _replace(dir_fd: int, name: str, data: bytes, like: os.stat_result) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_TMP, dir_fd=dir_fd)
    fd = os.open(_TMP, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        os.fchown(f.fileno(), like.st_uid, like.st_gid)
        os.fchmod(f.fileno(), stat.S_IMODE(like.st_mode))
    os.replace(_TMP, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def reconcile_upper(upper: Path, ca_pem: bytes, trusted: bool) -> None:
    """Make a bundle the sandbox wrote itself (in its writable layer ``upper``) agree with
    ``trusted``; when not trusted, also drop a copy of the .crt the sandbox kept. Runs while the
    sandbox is stopped. Touches nothing the sandbox did not write."""
    root = os.open(upper, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        with _open_dir(root, CERTS) as certs:
            found = _read_regular(certs, BUNDLE) if certs is not None else None
            if certs is not None and found is not None:
                data, st = found
                wanted = with_ca(data, ca_pem) if trusted else without_ca(data, ca_pem)
                if wanted != data:
                    _replace(certs, BUNDLE, wanted, st)
        if trusted:
            return
        with _open_dir(root, CERT_DIRS) as local:
            found = _read_regular(local, f"{NAME}.crt") if local is not None else None
            if local is not None and found is not None and found[0].strip() == ca_pem.strip():
                os.unlink(f"{NAME}.crt", dir_fd=local)
    finally:
        os.close(root)


def prepare(*, upper: Path, lower: Path, ca_dir: Path, brokering: bool) -> list[Entry] | None:
    """Before a proxy sandbox starts: its trust layer when brokering is on (None when the base has
    no system store, or brokering is off), with a bundle of the sandbox's own brought in line
    either way."""
    if brokering:
        from hermes_sandboxes.egress import tls  # cryptography: only when a brokering sandbox starts

        ca_pem = tls.ensure_ca(ca_dir)
        reconcile_upper(upper, ca_pem, trusted=True)
        return layer_entries(lower, ca_pem, subject_hash(ca_dir, ca_pem))
    try:
        ca_pem = (ca_dir / "ca.pem").read_bytes()
    except OSError:
        return None  # this store never had a CA: nothing of it can be in the sandbox
    reconcile_upper(upper, ca_pem, trusted=False)
    return None
