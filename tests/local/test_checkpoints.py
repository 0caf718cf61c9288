"""Checkpoint and restore, on both store kinds: btrfs snapshots (the default here) and full copies.

Fidelity is judged by a manifest the sandbox computes of its own files (type, mode, owner, link
count and structure, content hash, allocated blocks, xattrs, symlink targets, mtimes): what a
restore brings back must be indistinguishable from what was checkpointed.
"""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox
from hermes_sandboxes.errors import CheckpointNotFound, ExecFailed, SandboxError
from hermes_sandboxes.sandbox import ChangeKind, FileChange
from tests.local.kit import (
    init_state,
    manifest,
    pid_alive,
    sandbox_commands,
    sh,
    wait_for,
    without_inodes,
)

D = "/root/f"
STATE = f"""
set -e
mkdir -p {D}/emptydir {D}/dir700 && chmod 700 {D}/dir700
rm /etc/issue
rm -rf /etc/apt/apt.conf.d && mkdir /etc/apt/apt.conf.d && echo mine > /etc/apt/apt.conf.d/only
echo extra >> /etc/debian_version
ln -s /etc/hostname {D}/abs-link && ln -s ../f/h1 {D}/rel-link && ln -s /nowhere {D}/dangling
echo a > {D}/h1 && ln {D}/h1 {D}/h2
truncate -s 64M {D}/sparse && printf x | dd of={D}/sparse bs=1 seek=33554432 conv=notrunc status=none
echo note > {D}/xattr
python3 -c "import os; os.setxattr('{D}/xattr', 'user.note', b'hello'); \
os.setxattr('{D}/xattr', 'user.bin', bytes(range(256)))"
cp /usr/bin/true {D}/capbin
setcap cap_net_bind_service+ep {D}/capbin
echo owned > {D}/owned && chown 1234:5678 {D}/owned
cp /bin/true {D}/suid && chmod 4755 {D}/suid
echo secret > {D}/private && chmod 0600 {D}/private
mkfifo {D}/fifo
"""
MUTATE = f"""
set -e
echo back > /etc/issue
rm /etc/apt/apt.conf.d/only && echo other > /etc/apt/apt.conf.d/other
echo changed > /etc/debian_version
ln -sfn /etc/passwd {D}/abs-link && rm {D}/dangling
echo more >> {D}/h1
dd if=/dev/urandom of={D}/sparse bs=1M count=4 seek=8 conv=notrunc status=none
python3 -c "import os; os.removexattr('{D}/xattr', 'user.note')"
setcap -r {D}/capbin
chown 0:0 {D}/owned && chmod 0755 {D}/suid && chmod 0644 {D}/private
rm {D}/fifo && echo not-a-fifo > {D}/fifo
rmdir {D}/emptydir && chmod 755 {D}/dir700
echo after > {D}/after-checkpoint
"""
PATHS = ["/etc/issue", "/etc/apt/apt.conf.d", "/etc/apt/apt.conf.d/only", "/etc/apt/apt.conf.d/other",
         "/etc/apt/apt.conf.d/70debconf", "/etc/debian_version", D, f"{D}/emptydir", f"{D}/dir700",
         f"{D}/abs-link", f"{D}/rel-link", f"{D}/dangling", f"{D}/h1", f"{D}/h2", f"{D}/sparse", f"{D}/xattr",
         f"{D}/capbin", f"{D}/owned", f"{D}/suid", f"{D}/private", f"{D}/fifo", f"{D}/after-checkpoint"]
MUTATED = [p for p in PATHS if p not in (f"{D}/rel-link", "/etc/apt/apt.conf.d/70debconf")]


def _check_state(m: dict[str, Any]) -> None:
    """The state script did what the fidelity test relies on."""
    assert m["/etc/issue"] is None  # a whiteout hides the base file
    assert m["/etc/apt/apt.conf.d"]["entries"] == ["only"]  # an opaque directory hides the base's
    assert m["/etc/apt/apt.conf.d/70debconf"] is None
    assert m[f"{D}/h1"]["nlink"] == 2 and m[f"{D}/h1"]["ino"] == m[f"{D}/h2"]["ino"]
    assert m[f"{D}/sparse"]["size"] == 64 << 20 and m[f"{D}/sparse"]["blocks"] * 512 < 1 << 20
    assert m[f"{D}/xattr"]["xattrs"] == {"user.bin": bytes(range(256)).hex(), "user.note": b"hello".hex()}
    assert "security.capability" in m[f"{D}/capbin"]["xattrs"]  # setcap: libcap2-bin, installed by set-up
    assert (m[f"{D}/owned"]["uid"], m[f"{D}/owned"]["gid"]) == (1234, 5678)
    assert m[f"{D}/suid"]["mode"] == oct(0o4755) and m[f"{D}/private"]["mode"] == oct(0o600)
    assert m[f"{D}/dir700"]["mode"] == oct(0o700)
    assert m[f"{D}/fifo"]["type"] == stat.S_IFIFO
    assert m[f"{D}/abs-link"]["target"] == "/etc/hostname" and m[f"{D}/dangling"]["target"] == "/nowhere"


def test_restore_brings_back_every_kind_of_file_exactly(sb: LocalSandbox) -> None:
    clean = manifest(sb, PATHS)
    assert clean["/etc/issue"] is not None and clean[D] is None
    ck_clean = sb.checkpoint("clean")
    sh(sb, STATE)
    state = manifest(sb, PATHS)
    _check_state(state)
    ck_state = sb.checkpoint("state")

    sh(sb, MUTATE)
    mutated = manifest(sb, PATHS)
    for path in MUTATED:
        assert without_inodes(mutated)[path] != without_inodes(state)[path], path

    sb.restore(ck_state.id)
    restored = manifest(sb, PATHS)
    assert without_inodes(restored) == without_inodes(state)
    assert restored[f"{D}/h1"]["ino"] == restored[f"{D}/h2"]["ino"]  # still one file, two names
    assert sh(sb, f"cat {D}/h2").stdout == "a\n"  # the append after the checkpoint did not leak in
    assert sh(sb, f"{D}/suid && {D}/capbin && echo runs").stdout == "runs\n"
    assert "cap_net_bind_service" in sh(sb, f"getcap {D}/capbin").stdout

    sb.restore(ck_clean.id)
    assert without_inodes(manifest(sb, PATHS)) == without_inodes(clean)  # the deleted base file is back
    assert sh(sb, "cat /etc/issue").stdout == Path("/etc/issue").read_text()


def test_restore_after_deleting_git_and_python_brings_them_back(sb: LocalSandbox) -> None:
    ck = sb.checkpoint("before the damage")
    sh(sb, "rm -rf /usr/bin/git /usr/bin/python3* /usr/lib/git-core")
    assert sb.exec("git --version").exit_code == 127
    assert sb.exec("python3 --version").exit_code == 127
    sb.restore(ck.id)
    assert sh(sb, "git --version").stdout.startswith("git version")
    assert sh(sb, "python3 --version").stdout.startswith("Python 3")
    assert subprocess.run(["git", "--version"], capture_output=True).returncode == 0  # host untouched


def test_restore_stops_running_processes_and_the_sandbox_works_after(sb: LocalSandbox) -> None:
    sh(sb, "echo at-checkpoint > /root/state")
    ck = sb.checkpoint()
    sh(sb, "echo later > /root/state; nohup sleep 7401 >/dev/null 2>&1 &")
    out = bytearray()
    running = sb.start("echo go; sleep 7400", on_stdout=out.extend)
    wait_for(lambda: b"go" in out, "the command to start")
    old_init = init_state(sb)["pid"]
    sb.restore(ck.id)
    with pytest.raises(ExecFailed):
        running.wait(30)  # told, not left hanging
    assert not pid_alive(old_init)
    commands = sandbox_commands(sb)
    assert not any("sleep 740" in c for c in commands), commands
    assert sh(sb, "cat /root/state").stdout == "at-checkpoint\n"
    assert sh(sb, "echo works").stdout == "works\n"


def test_checkpoints_are_listed_with_their_comment_and_can_be_deleted(sb: LocalSandbox,
                                                                      store_backend: LocalBackend) -> None:
    assert sb.checkpoints() == []
    first = sb.checkpoint("first: before anything ran")  # a sandbox that never ran (no init)
    sh(sb, "head -c 1000000 /dev/urandom > /root/blob")
    second = sb.checkpoint("second")
    listed = sb.checkpoints()
    assert [c.id for c in listed] == [first.id, second.id]
    assert [c.comment for c in listed] == ["first: before anything ran", "second"]
    assert listed[0].created_at <= listed[1].created_at
    assert (listed[1].size_bytes or 0) >= 1_000_000 > (listed[0].size_bytes or 0)
    assert sb.info().checkpoint_count == 2
    sb.delete_checkpoint(first.id)
    assert [c.id for c in sb.checkpoints()] == [second.id]
    assert not store_backend.store.checkpoint_path(sb.name, first.id).exists()
    for call in (sb.restore, sb.delete_checkpoint, sb.diff):
        with pytest.raises(CheckpointNotFound):
            call(first.id)
    with pytest.raises(CheckpointNotFound):
        sb.diff(second.id, "ck-nonexistent")


def _changes(changes: list[FileChange]) -> set[tuple[str, str, int | None, int | None]]:
    return {(c.path, str(c.kind), c.size, c.old_size) for c in changes}


def test_diff_reports_added_modified_and_deleted_files_with_sizes(sb: LocalSandbox) -> None:
    sh(sb, "mkdir -p /root/d && cd /root/d && echo keep > keep && echo mod > mod && echo del > del && "
           "echo old > old-name && echo m > modefile && echo a > a && echo b > b && ln -s a link")
    ck0 = sb.checkpoint()
    assert sb.diff(ck0.id) == []
    sh(sb, "cd /root/d && echo more >> mod && rm del && mv old-name new-name && chmod 700 modefile && "
           "ln -sfn b link && echo new > added && rm /etc/issue")
    issue_size = Path("/etc/issue").stat().st_size  # the base's file, as the sandbox saw it
    expected = {
        ("/root/d/added", ChangeKind.ADDED, 4, None),
        ("/root/d/new-name", ChangeKind.ADDED, 4, None),  # a rename is a delete plus an add
        ("/root/d/old-name", ChangeKind.DELETED, None, 4),
        ("/root/d/del", ChangeKind.DELETED, None, 4),
        ("/root/d/mod", ChangeKind.MODIFIED, 9, 4),
        ("/root/d/modefile", ChangeKind.MODIFIED, 2, 2),  # a mode change is a modification
        ("/root/d/link", ChangeKind.MODIFIED, 1, 1),  # so is a symlink pointed elsewhere
        ("/etc/issue", ChangeKind.DELETED, None, issue_size),  # a base file deleted: a whiteout
    }
    expected_text = {(p, str(k), s, o) for p, k, s, o in expected}
    assert _changes(sb.diff(ck0.id)) == expected_text
    ck1 = sb.checkpoint()
    assert _changes(sb.diff(ck0.id, ck1.id)) == expected_text
    assert sb.diff(ck1.id) == []
    reverse = _changes(sb.diff(ck1.id, ck0.id))
    assert ("/root/d/added", "deleted", None, 4) in reverse
    assert ("/etc/issue", "added", issue_size, None) in reverse  # the whiteout went: the base file is back


DEEP = """
import os
os.chdir("/root")
for _ in range(2500):  # far deeper than PATH_MAX allows as one path, and than Python recursion
    os.mkdir("d")
    os.chdir("d")
open("bottom", "w").write("deep")
"""


def test_a_tree_deeper_than_any_path_limit_cannot_break_the_store(sb: LocalSandbox,
                                                                   store_backend: LocalBackend) -> None:
    """What root inside builds, the host must be able to checkpoint, restore or at least destroy."""
    sh(sb, f"python3 -c '{DEEP}'")
    try:
        ck = sb.checkpoint("deep")
    except SandboxError as exc:  # a full copy may refuse such a tree: then cleanly
        assert store_backend.store.kind == "copy", exc
        assert len(str(exc)) < 1000  # says what failed without a page of d/d/d/...
        assert sb.checkpoints() == []
        assert sh(sb, "echo still usable; rm -rf /root/d").stdout == "still usable\n"
    else:
        sh(sb, "rm -rf /root/d")
        sb.restore(ck.id)
        assert sh(sb, "find /root/d -name bottom | wc -l").stdout.strip() == "1"
    sh(sb, "echo shallow > /root/shallow")
    assert sb.checkpoint("after").comment == "after"  # what the failure left is cleared away
    name = sb.name
    sb.destroy()
    assert not store_backend.store.sandbox_dir(name).exists()
