"""Diffs from btrfs generations give exactly what a walk of both whole layers gives.

On the btrfs store a diff compares only the directories that changed since the checkpoint's
transaction; each case here checks that it yields the same FileChange list as the full walk
(kept for the copy store), and that the generation path was really taken.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox
from hermes_sandboxes.backends.local.store import treediff
from hermes_sandboxes.sandbox import FileChange
from tests.local.kit import new_sandbox, sh, temp_backend

SETUP = """
set -e
mkdir -p /root/p/a/b/c /root/p/keep/deep/er /root/p/swap1/s1 /root/p/swap2/s2 /root/p/gone/x/y
for d in /root/p/a /root/p/a/b /root/p/a/b/c /root/p/keep/deep/er /root/p/gone/x/y; do
  for i in 1 2 3; do echo "$d $i" > "$d/f$i"; done
done
echo one > /root/p/swap1/s1/inner && echo two > /root/p/swap2/s2/inner
echo linked > /root/p/a/h1 && ln /root/p/a/h1 /root/p/a/b/h2 && ln /root/p/a/h1 /root/p/keep/h3
ln -s /etc/hostname /root/p/link && echo same > /root/p/meta && echo x > /root/p/xattr
echo file > /root/p/becomes-dir && mkdir /root/p/becomes-file && echo in > /root/p/becomes-file/in
echo base-edit >> /etc/debian_version
"""
CHANGE = """
set -e
echo added > /root/p/a/new && mkdir -p /root/p/n1/n2/n3 && echo deep > /root/p/n1/n2/n3/leaf
rm /root/p/a/f1 && rm -rf /root/p/gone
mv /root/p/a/f2 /root/p/a/b/moved && mv /root/p/keep/deep /root/p/deep-moved
mv /root/p/swap1 /root/p/tmp && mv /root/p/swap2 /root/p/swap1 && mv /root/p/tmp /root/p/swap2
chmod 600 /root/p/meta && chown 123:456 /root/p/a/b/f3 && touch -m -d @0 /root/p/a/b/c/f1
python3 -c "import os; os.setxattr('/root/p/xattr', 'user.k', b'v')"
echo more >> /root/p/a/b/h2 && ln /root/p/a/h1 /root/p/a/b/c/h4 && rm /root/p/keep/h3
ln -sfn /etc/passwd /root/p/link
rm /root/p/becomes-dir && mkdir /root/p/becomes-dir && echo d > /root/p/becomes-dir/d
rm -rf /root/p/becomes-file && echo now-a-file > /root/p/becomes-file
rm /etc/issue && rm -rf /etc/apt/apt.conf.d && mkdir /etc/apt/apt.conf.d && echo mine > /etc/apt/apt.conf.d/m
echo edited-again >> /etc/debian_version && mkdir -p /usr/share/hsb-test/sub && echo x > /usr/share/hsb-test/sub/x
dd if=/dev/zero of=/root/p/a/b/c/f2 bs=1 count=3 conv=notrunc status=none
"""
UNDO_SOME = """
set -e
echo back > /etc/issue && rm -rf /usr/share/hsb-test && echo again > /root/p/a/f1 && rm -rf /root/p/n1
"""


@pytest.fixture(scope="module")
def btrfs(local_backend: LocalBackend) -> LocalBackend:
    assert local_backend.store.kind == "btrfs", "this machine has btrfs: the default store must use it"
    return local_backend


def _both_ways(sb: LocalSandbox, old_id: str, new_id: str | None = None) -> list[FileChange]:
    """sb.diff(), checked against the full walk of the same two layers."""
    got = sb.diff(old_id, new_id)
    store = sb.backend.store
    old = store.checkpoint_path(sb.name, old_id)
    lower = Path("/")
    if new_id is not None:
        new = store.checkpoint_path(sb.name, new_id)
        assert store.change_hint(sb.name, old, new) is not None, "the generation path was not taken"
        full = treediff.diff_layers(old / "upper", new / "upper", lower)
    else:
        layer = store.readable_layer(sb.name)
        assert store.change_hint(sb.name, old, layer) is not None, "the generation path was not taken"
        full = treediff.diff_layers(old / "upper", layer / "upper", lower)
    assert got == full
    return got


def test_generation_diff_equals_the_full_walk_in_every_direction(btrfs: LocalBackend) -> None:
    with new_sandbox(btrfs) as sb:
        sh(sb, SETUP)
        ck0 = sb.checkpoint("before")
        assert _both_ways(sb, ck0.id) == []
        sh(sb, CHANGE)
        forward = _both_ways(sb, ck0.id)
        paths = {c.path for c in forward}
        for expected in ("/root/p/a/new", "/root/p/n1/n2/n3/leaf", "/root/p/gone/x/y/f1", "/root/p/a/b/moved",
                         "/root/p/deep-moved/er/f3", "/root/p/keep/deep/er/f3", "/root/p/swap1/s2/inner",
                         "/root/p/swap2/s1/inner", "/root/p/meta", "/root/p/a/b/f3", "/root/p/a/b/c/f1",
                         "/root/p/a/h1", "/root/p/a/b/h2", "/root/p/a/b/c/h4", "/root/p/keep/h3", "/root/p/link",
                         "/root/p/becomes-dir/d", "/root/p/becomes-file/in", "/etc/issue", "/etc/apt/apt.conf.d/m",
                         "/usr/share/hsb-test/sub/x", "/root/p/a/b/c/f2"):
            assert expected in paths, expected
        ck1 = sb.checkpoint("after")
        assert _both_ways(sb, ck0.id, ck1.id) == forward
        assert _both_ways(sb, ck1.id) == []
        assert _both_ways(sb, ck1.id, ck0.id)  # backwards: what the older checkpoint had

        sb.restore(ck0.id)  # a new layer, descended from ck0; ck1 came from the old one
        assert _both_ways(sb, ck0.id) == []
        assert _both_ways(sb, ck1.id)
        sh(sb, CHANGE)
        sh(sb, UNDO_SOME)
        _both_ways(sb, ck0.id)
        _both_ways(sb, ck1.id)
        ck2 = sb.checkpoint("after the restore")
        for a, b in ((ck0, ck2), (ck2, ck0), (ck1, ck2), (ck2, ck1)):
            _both_ways(sb, a.id, b.id)


def test_changed_since_tells_from_generations(btrfs: LocalBackend) -> None:
    with new_sandbox(btrfs) as sb:
        sh(sb, "echo 12345 > /root/file && mkdir /root/dir")
        ck = sb.checkpoint()
        assert sb.changed_since(ck.id) is False
        sb.stop()
        sh(sb, "cat /root/file >/dev/null")  # a restart mounts the layer again: not a change
        assert sb.changed_since(ck.id) is False
        sh(sb, "dd if=/dev/zero of=/root/file bs=1 count=2 conv=notrunc status=none")  # same size
        assert sb.changed_since(ck.id) is True
        sb.restore(ck.id)
        assert sb.changed_since(ck.id) is False
        sh(sb, "chmod 700 /root/dir")  # metadata only
        assert sb.changed_since(ck.id) is True
        ck2 = sb.checkpoint()
        assert sb.changed_since(ck2.id) is False
        assert sb.changed_since(ck.id) is True


def test_changed_since_is_unknown_on_the_copy_store() -> None:
    with temp_backend(store="copy") as backend, new_sandbox(backend) as sb:
        ck = sb.checkpoint()
        assert sb.changed_since(ck.id) is None
