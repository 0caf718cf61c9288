"""A tree built from inside must not block rollback (issue 24, finding 4).

4,000 nested directories made the host-side diff run past 300 s (its cost grew with the square of
the depth for every entry) and the restore with it, since a restore shows its preview first; a
flat tree of files grew one diff's memory without bound. The walk is linear in entries now, a
diff past its budget (entries, seconds) says so instead of running on, and a confirmed restore
(``checkpoint restore --yes``) takes no diff at all.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox
from hermes_sandboxes.backends.local.store import treediff
from hermes_sandboxes.sandbox import ChangeKind
from tests.cli.cli_kit import CLI, Pty, ok
from tests.local.kit import new_sandbox, sh, temp_backend, wait_for

DEPTH = 4000
# under a directory of the base that no mask makes opaque (an opaque /root hid the cost)
NESTED = f"""
import os
os.makedirs("/opt/hs-deep")
os.chdir("/opt/hs-deep")
for _ in range({DEPTH}):
    os.mkdir("d")
    os.chdir("d")
open("bottom", "w").write("deep")
"""


def test_a_tree_4000_deep_is_diffed_and_restored(sb: LocalSandbox) -> None:
    base = sb.checkpoint("before the tree")
    sh(sb, f"python3 -c '{NESTED}'", timeout=300)
    changes = sb.diff(base.id)
    added = [c for c in changes if c.kind == ChangeKind.ADDED and c.path.startswith("/opt/hs-deep/d")]
    assert len(added) == DEPTH + 1, len(added)  # every directory and the file at the bottom
    assert max(len(c.path) for c in added) > 8000  # deeper than any path the kernel takes whole
    sb.restore(base.id)
    assert sh(sb, "test -e /opt/hs-deep || echo gone").stdout == "gone\n"


def test_a_diff_past_its_budget_says_so_instead_of_running_on(sb: LocalSandbox) -> None:
    base = sb.checkpoint("before the files")
    sh(sb, "mkdir /root/many && cd /root/many && seq 3000 | xargs touch", timeout=300)
    layer = sb.backend.store.readable_layer(sb.name)
    with pytest.raises(treediff.TooBig, match="the diff stopped after 2,001 entries"):
        treediff.diff_layers(sb.backend.store.checkpoint_path(sb.name, base.id) / "upper", layer / "upper",
                             Path("/"), budget=treediff.Budget(entries=2000))
    assert len(sb.diff(base.id)) == 3001  # the default budget holds these


def test_the_btrfs_hint_before_the_walk_is_held_to_the_same_budget(sandbox: LocalSandbox) -> None:
    """The btrfs store first reads which inodes changed (about 600 bytes of memory each): that hint
    counts against the diff's budget too (on the previous main it held every changed inode, and
    spent its time, before any budget was looked at)."""
    store = sandbox.backend.store
    assert store.kind == "btrfs"
    base = sandbox.checkpoint("before the files")
    sh(sandbox, "mkdir /root/many && cd /root/many && seq 3000 | xargs touch", timeout=300)
    old, layer = store.checkpoint_path(sandbox.name, base.id), store.readable_layer(sandbox.name)
    with pytest.raises(treediff.TooBig, match="the diff stopped after 2,001 changed inodes"):
        store.change_hint(sandbox.name, old, layer, treediff.Budget(entries=2000).start())
    with pytest.raises(treediff.TooBig, match="its time limit"):  # a deadline passed: stops at once
        store.change_hint(sandbox.name, old, layer, treediff.Budget(seconds=0).start())
    hint = store.change_hint(sandbox.name, old, layer, treediff.Budget().start())
    assert hint is not None and len(hint.inodes) >= 3000


@pytest.mark.timeout(1200)  # generous: the walk's budget is 30 s, the restore needs no walk
def test_the_cli_previews_a_4000_deep_tree_within_its_budget_and_restore_yes_takes_it_away(
        sb: LocalSandbox) -> None:
    home = sb.backend.home
    base = ok(home, "checkpoint", "create", sb.name, "-m", "before the tree").stdout.strip()
    ok(home, "exec", sb.name, "--checkpoint", "off", "--", f"python3 -c '{NESTED}'")  # journaled

    # on a terminal, without --yes: the preview, within its budget, then the question (declined)
    term = Pty([*CLI, "--home", str(home), "checkpoint", "restore", sb.name, base])
    try:
        term.expect(b"[y/N]", timeout=600)
    finally:
        term.send(b"n\r")
        answered = term.finish()
    seen = term.seen.decode(errors="replace")
    assert answered == 1 and "restore cancelled" in seen, seen
    counted = re.search(r"total\W+(\d+)\W+(\d+)", seen)
    if counted is None:  # past its budget on a slow machine: it says what it could not count
        assert "file changes: unknown (sandbox " in seen and "the diff stopped after" in seen, seen
    else:  # every directory, the file at the bottom and /opt/hs-deep itself, all added
        assert (int(counted.group(1)), int(counted.group(2))) == (DEPTH + 2, DEPTH + 2), seen
    assert "python3 -c" in seen, seen  # the command that made it, from the journal
    assert sh(sb, "test -d /opt/hs-deep/d/d/d/d && echo kept").stdout == "kept\n"  # declined: nothing changed

    restored = ok(home, "checkpoint", "restore", sb.name, base, "--yes")
    assert "not counted with --yes" in restored.stdout and "python3 -c" in restored.stdout, restored.stdout
    assert sh(sb, "test -e /opt/hs-deep || echo gone").stdout == "gone\n"


DIFF_IN_A_PROCESS = """
import json, sys
from hermes_sandboxes.backends.local import LocalBackend
from hermes_sandboxes.errors import Unsupported
sb = LocalBackend(sys.argv[1]).get(sys.argv[2])
try:
    print(json.dumps({"changes": [c.path for c in sb.diff(sys.argv[3])]}))
except Unsupported as exc:
    print(json.dumps({"unsupported": str(exc)}))
"""


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("held_at", ["diff-pinned", "diff-walking"])
def test_restore_yes_does_not_wait_for_a_diff_of_a_hostile_tree_and_the_diff_reports_no_mix(
        sb: LocalSandbox, tmp_path: Path, held_at: str) -> None:
    """A diff of a 4,000-deep tree runs (in a process of its own) and is held mid-way: once it took
    the sandbox's layer, or in its walk with 2,048 entries read; ``checkpoint restore --yes``
    (another process) completes meanwhile, and the diff, let go after that, says it was
    interrupted instead of reporting what it read of a layer the restore threw away (on the
    previous main the restore waited for the diff's lock, a minute, then failed)."""
    home = sb.backend.home
    base = sb.checkpoint("before the tree").id
    sh(sb, f"python3 -c '{NESTED}'", timeout=300)
    marker, resume = tmp_path / "paused", tmp_path / "resume"
    os.mkfifo(resume)
    env = {**os.environ, "HERMES_SANDBOXES_TEST_PAUSE": held_at,
           "HERMES_SANDBOXES_TEST_PAUSE_MARKER": str(marker), "HERMES_SANDBOXES_TEST_RESUME": str(resume)}
    differ = subprocess.Popen([sys.executable, "-c", DIFF_IN_A_PROCESS, str(home), sb.name, base], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (marker.exists() and bool(marker.read_text().strip())) or differ.poll() is not None,
                 "the diff to hold the layer", 120)
        assert differ.poll() is None, differ.communicate()
        # a deadline only against a hang: the lock the restore waited on was given up after 60 s
        restored = subprocess.run([*CLI, "--home", str(home), "checkpoint", "restore", sb.name, base, "--yes"],
                                  capture_output=True, text=True, timeout=600)
        assert restored.returncode == 0, (restored.stdout, restored.stderr)
        assert differ.poll() is None, "the restore completed while the diff was still running"
        assert sh(sb, "test -e /opt/hs-deep || echo gone").stdout == "gone\n"
    finally:
        with open(resume, "wb"):  # let the diff go on (it walks what it held)
            pass
        out, err = differ.communicate(timeout=600)
    assert differ.returncode == 0, (out, err)
    said = json.loads(out)
    assert "changes" not in said, f"a diff across a restore reported a result: {str(said)[:300]}"
    assert "was restored while its files were being compared" in said["unsupported"], said
    # the next diff compares the restored files: the tree is gone from them
    assert not [c for c in sb.diff(base) if c.path.startswith("/opt/hs-deep")]


def _trash(root: Path) -> list[str]:
    trash = root / ".trash"
    return sorted(os.listdir(trash)) if trash.is_dir() else []


def test_the_copy_store_restores_without_removing_the_old_layer_first_and_sweeps_it_later() -> None:
    """A restore on the copy store moves the old layer (many files) to the store's .trash, which
    a detached sweeper empties; no sandbox is ever seen there, and the restored files are right.
    (The btrfs store removes an old layer with one ioctl: it needs no trash.)"""
    with temp_backend(store="copy") as backend, new_sandbox(backend) as sb:
        store = backend.store
        sh(sb, "echo kept > /root/state")
        base = sb.checkpoint("before the files")
        sh(sb, "echo changed > /root/state; mkdir /root/many && cd /root/many && seq 20000 | xargs touch",
           timeout=300)
        sb.restore(base.id)
        assert sh(sb, "cat /root/state; test -e /root/many || echo gone").stdout == "kept\ngone\n"
        assert not any(p.name.startswith(".") for p in store.sandbox_dir(sb.name).iterdir())
        assert backend.names() == [sb.name]  # .trash is no sandbox
        assert [c.id for c in sb.checkpoints()] == [base.id]
        wait_for(lambda: _trash(store.root) == [], "the sweeper to empty the trash")
        assert sh(sb, "cat /root/state").stdout == "kept\n"


def test_what_a_killed_sweeper_left_in_the_trash_is_removed_by_the_next_open_of_the_store() -> None:
    with temp_backend(store="copy") as backend:
        backend.store.ensure()
        left = backend.store.root / ".trash" / "gone-layer"
        (left / "upper" / "deep").mkdir(parents=True)
        (left / "upper" / "deep" / "file").write_text("x")
        again = LocalBackend(backend.home, store="copy")
        again.store.ensure()  # a new process's first open
        wait_for(lambda: _trash(backend.store.root) == [], "the next open to sweep the trash")
