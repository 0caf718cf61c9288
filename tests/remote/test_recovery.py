"""Recovery on resume (hermes_sandboxes.hermes.sync.recovery) over each remote backend and its fake: what the
agent wrote in a sandbox's skills/ and memories/ comes back to the host before the host's state is
pushed over it, without ever writing through a host symlink or onto a host-only path, and nothing at
all is written when the sandbox's state cannot be read."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from hermes_sandboxes.hermes.sync.archive import ArchiveTooLarge, StateUnreadable
from hermes_sandboxes.hermes.sync.recovery import RECOVERED_DIR, RecoveryFailed, recover
from hermes_sandboxes.sandbox import Sandbox
from tests.remote.conftest import Remote


def put(sb: Sandbox, rel: str, data: bytes) -> None:
    sb.write_file(f"{sb.home}/.hermes/{rel}", data)


def run(sb: Sandbox, script: str) -> None:
    result = sb.exec(["sh", "-c", script])
    assert result.exit_code == 0, result


def files(root: Path) -> dict[str, bytes]:
    """Every regular file below ``root`` (symlinks not followed) with its content."""
    found = {}
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            found[str(path.relative_to(root))] = path.read_bytes()
    return found


def recovered(home: Path) -> Path:
    [where] = list(home.joinpath(*RECOVERED_DIR).iterdir())
    return where


@pytest.fixture
def home(tmp_path: Path) -> Path:
    made = tmp_path / "hermes"
    (made / "skills").mkdir(parents=True)
    return made


def test_missing_files_come_back_in_place_and_conflicts_are_kept_aside(remote_sandbox: Sandbox, home: Path) -> None:
    sb = remote_sandbox
    put(sb, "skills/new/SKILL.md", b"written by the agent\n")
    put(sb, "skills/both/SKILL.md", b"sandbox version\n")
    put(sb, "skills/same/SKILL.md", b"same\n")
    put(sb, "memories/MEMORY.md", b"remember this\n")
    put(sb, "cache/documents/doc.txt", b"not a recoverable tree\n")
    (home / "skills" / "both").mkdir()
    (home / "skills" / "both" / "SKILL.md").write_bytes(b"host version\n")
    (home / "skills" / "same").mkdir()
    (home / "skills" / "same" / "SKILL.md").write_bytes(b"same\n")

    report = recover(sb, remote_base=f"{sb.home}/.hermes", host_home=home)

    assert sorted(report.restored) == ["memories/MEMORY.md", "skills/new/SKILL.md"]
    assert (home / "skills/new/SKILL.md").read_bytes() == b"written by the agent\n"
    assert (home / "memories/MEMORY.md").read_bytes() == b"remember this\n"
    assert (home / "skills/both/SKILL.md").read_bytes() == b"host version\n"  # the host copy stays
    assert [path for path, _ in report.quarantined] == ["skills/both/SKILL.md"]
    assert "conflict" in report.quarantined[0][1]
    aside = recovered(home)
    assert report.quarantine_dir == aside and aside.name.startswith(sb.name)
    assert files(aside) == {"skills/both/SKILL.md": b"sandbox version\n"}
    assert not (home / "cache" / "documents").exists()
    again = recover(sb, remote_base=f"{sb.home}/.hermes", host_home=home)  # idempotent for what is in place
    assert again.restored == [] and [p for p, _ in again.quarantined] == ["skills/both/SKILL.md"]


def test_a_sandbox_without_hermes_state_has_nothing_to_recover(remote_sandbox: Sandbox, home: Path) -> None:
    report = recover(remote_sandbox, remote_base=f"{remote_sandbox.home}/.hermes", host_home=home)
    assert (report.restored, report.quarantined, report.left_in_sandbox) == ([], [], [])
    assert files(home) == {}


def test_host_symlinks_are_never_written_through(remote_sandbox: Sandbox, home: Path, tmp_path: Path) -> None:
    sb = remote_sandbox
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_bytes(b"host data outside the home\n")
    (home / "skills" / "linked").symlink_to(outside)  # a symlinked directory inside skills/
    (home / "skills" / "file-link").symlink_to(outside / "victim")  # a symlinked file
    (home / "memories").symlink_to(outside)  # a whole root redirected
    put(sb, "skills/linked/victim", b"from the sandbox 1\n")
    put(sb, "skills/linked/fresh", b"from the sandbox 2\n")
    put(sb, "skills/file-link", b"from the sandbox 3\n")
    put(sb, "memories/MEMORY.md", b"from the sandbox 4\n")

    report = recover(sb, remote_base=f"{sb.home}/.hermes", host_home=home)

    assert files(outside) == {"victim": b"host data outside the home\n"}  # nothing written through a link
    assert report.restored == []
    assert sorted(p for p, _ in report.quarantined) == [
        "memories/MEMORY.md", "skills/file-link", "skills/linked/fresh", "skills/linked/victim"]
    assert files(recovered(home))["skills/linked/fresh"] == b"from the sandbox 2\n"


def test_a_symlinked_hermes_home_itself_still_restores_in_place(remote_sandbox: Sandbox, home: Path,
                                                                tmp_path: Path) -> None:
    link = tmp_path / "home-link"
    link.symlink_to(home)
    put(remote_sandbox, "skills/a/SKILL.md", b"a\n")
    report = recover(remote_sandbox, remote_base=f"{remote_sandbox.home}/.hermes", host_home=link)
    assert report.restored == ["skills/a/SKILL.md"] and (home / "skills/a/SKILL.md").read_bytes() == b"a\n"


def test_credential_paths_are_never_created_from_sandbox_data(remote_sandbox: Sandbox, home: Path) -> None:
    put(remote_sandbox, "skills/tool/token.json", b'{"token": "planted"}')
    report = recover(remote_sandbox, remote_base=f"{remote_sandbox.home}/.hermes", host_home=home,
                     protected={"skills/tool/token.json"})
    assert not (home / "skills/tool/token.json").exists()
    assert [p for p, _ in report.quarantined] == ["skills/tool/token.json"]
    assert "credential" in report.quarantined[0][1]


def test_a_redirected_quarantine_fails_closed_before_anything_is_written(remote_sandbox: Sandbox, home: Path,
                                                                        tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (home / "cache").symlink_to(elsewhere)
    (home / "skills" / "both.md").write_bytes(b"host\n")
    put(remote_sandbox, "skills/both.md", b"sandbox\n")
    put(remote_sandbox, "skills/new.md", b"new\n")
    with pytest.raises(RecoveryFailed, match="not a plain directory"):
        recover(remote_sandbox, remote_base=f"{remote_sandbox.home}/.hermes", host_home=home)
    assert files(elsewhere) == {} and not (home / "skills" / "new.md").exists()


def test_a_host_path_that_cannot_exist_costs_only_that_file(remote_sandbox: Sandbox, home: Path) -> None:
    (home / "skills" / "blocked").write_bytes(b"a regular file where the sandbox has a directory\n")
    put(remote_sandbox, "skills/blocked/inner.md", b"x\n")
    put(remote_sandbox, "skills/fine.md", b"fine\n")
    report = recover(remote_sandbox, remote_base=f"{remote_sandbox.home}/.hermes", host_home=home)
    assert report.restored == ["skills/fine.md"]
    assert [p for p, _ in report.left_in_sandbox] == ["skills/blocked/inner.md"]


def _evil_tar() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        def add(name: str, data: bytes = b"x\n", **attrs: object) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            for key, value in attrs.items():
                setattr(info, key, value)
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)

        add("skills/../../escape.txt")
        add("/skills/absolute.txt")
        add("skills/link", type=tarfile.SYMTYPE, linkname="/etc")
        add("skills/fifo", type=tarfile.FIFOTYPE)
        add("skills/ok.md", b"the one good file\n")
    return buffer.getvalue()


def test_a_hostile_archive_is_filtered_member_by_member(remote_sandbox: Sandbox, home: Path) -> None:
    """The sandbox answers the read with its own ``tar``: unsafe members are skipped and named,
    links and fifos not taken, the good file restored, nothing lands outside the home."""
    sb = remote_sandbox
    sb.write_file("/tmp/evil.tar", _evil_tar())
    sb.write_file("/tmp/trojan/tar", b"#!/bin/sh\ncat /tmp/evil.tar\n", 0o755)
    put(sb, "skills/placeholder", b"")
    run(sb, "mkdir -p /usr/local/bin && cp /tmp/trojan/tar /usr/local/bin/tar && chmod 755 /usr/local/bin/tar")
    try:
        assert sb.exec(["sh", "-c", "command -v tar"]).stdout.strip() == "/usr/local/bin/tar"
        report = recover(sb, remote_base=f"{sb.home}/.hermes", host_home=home)
    finally:
        run(sb, "rm -f /usr/local/bin/tar")
    assert report.restored == ["skills/ok.md"]
    assert sorted(p for p, _ in report.left_in_sandbox) == ["/skills/absolute.txt", "skills/../../escape.txt"]
    assert files(home.parent) == {"hermes/skills/ok.md": b"the one good file\n"}


def test_an_unreadable_sandbox_state_fails_closed(remote_sandbox: Sandbox, home: Path) -> None:
    sb = remote_sandbox
    put(sb, "skills/new.md", b"new\n")
    sb.write_file("/tmp/trojan/tar", b"#!/bin/sh\necho 'tar: cannot read' >&2\nexit 2\n", 0o755)
    run(sb, "mkdir -p /usr/local/bin && cp /tmp/trojan/tar /usr/local/bin/tar")
    try:
        with pytest.raises(StateUnreadable, match="exit 2: tar: cannot read"):
            recover(sb, remote_base=f"{sb.home}/.hermes", host_home=home)
    finally:
        run(sb, "rm -f /usr/local/bin/tar")
    assert files(home) == {}


def test_a_transfer_cut_mid_stream_fails_closed(remote: Remote, remote_sandbox: Sandbox, home: Path) -> None:
    sb = remote_sandbox
    run(sb, f"mkdir -p {sb.home}/.hermes/skills && head -c 3000000 /dev/urandom > {sb.home}/.hermes/skills/big")
    put(sb, "skills/new.md", b"new\n")
    remote.cut_next_exec_stream()
    with pytest.raises(StateUnreadable):
        recover(sb, remote_base=f"{sb.home}/.hermes", host_home=home)
    assert files(home) == {}


def test_an_oversized_archive_is_cut_off_while_it_streams(remote_sandbox: Sandbox, home: Path) -> None:
    """The cap stops the transfer itself: an endless archive ends in ArchiveTooLarge, not in a
    timeout (the sender is killed at the cap), and nothing reaches the home."""
    sb = remote_sandbox
    sb.write_file("/tmp/trojan/tar", b"#!/bin/sh\nexec cat /dev/zero\n", 0o755)
    put(sb, "skills/new.md", b"new\n")
    run(sb, "mkdir -p /usr/local/bin && cp /tmp/trojan/tar /usr/local/bin/tar")
    try:
        with pytest.raises(ArchiveTooLarge, match="cut off"):
            recover(sb, remote_base=f"{sb.home}/.hermes", host_home=home, limit=4 << 20)
        assert sb.exec(["sh", "-c", "pgrep -x cat || true"]).stdout.strip() == ""  # the sender is gone
    finally:
        run(sb, "rm -f /usr/local/bin/tar")
    assert files(home) == {}
    assert os.listdir(home) == ["skills"]
