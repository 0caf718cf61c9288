"""What a reboot does to a persistent sandbox, done for real short of rebooting: every process of
the sandbox dies and the store is unmounted (its loop device freed); the next command finds the
sandbox's files after mounting the store again and starting a new init."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from hermes_sandboxes.backends.local import LocalBackend
from hermes_sandboxes.backends.local.store.base import BtrfsStore
from tests.conftest import teardown_backend


def test_after_a_reboot_the_next_command_remounts_the_store_and_finds_the_files() -> None:
    home = Path(tempfile.mkdtemp(prefix="hsr-", dir="/tmp"))
    backend = LocalBackend(home, image_size="4G")
    try:
        sb = backend.create("survivor")
        assert sb.exec("echo kept > /root/state").exit_code == 0
        sb.stop()
        store = backend.store
        assert isinstance(store, BtrfsStore)
        store.unmount()
        assert not store.is_mounted()
        # a new process, as after the reboot
        script = (f"from hermes_sandboxes.backends.local import LocalBackend\n"
                  f"print(LocalBackend({str(home)!r}).get('survivor').exec('cat /root/state').stdout, end='')")
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout == "kept\n"
        assert store.is_mounted()
    finally:
        teardown_backend(backend)
