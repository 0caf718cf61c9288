"""The rootless store tests' harness, also used by benchmarks/bench_rootless.py: an unprivileged user
(with an /etc/subuid block) made and removed by root, scenarios run as that user, and filesystems on
loop images handed to it. Users, mounts and loop devices go at the end, also on failure."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.rootless import kit

REPO = Path(__file__).resolve().parents[2]
# kind -> (mkfs argv, extra mount options); each made on a loop image the harness (root) mounts
FILESYSTEMS: dict[str, tuple[list[str], str]] = {
    "btrfs": (["mkfs.btrfs", "-q", "-f"], ""),
    "btrfs-rm": (["mkfs.btrfs", "-q", "-f"], "user_subvol_rm_allowed"),
    # the benchmark's: mounted as the root store mounts its image (noatime), to compare like with like
    "btrfs-bench": (["mkfs.btrfs", "-q", "-f"], "user_subvol_rm_allowed,noatime"),
    "xfs": (["mkfs.xfs", "-q", "-f", "-m", "reflink=1"], ""),
    "ext4": (["mkfs.ext4", "-q", "-F"], ""),
}


@dataclass(frozen=True)
class TestUser:
    __test__ = False  # not a test class
    name: str
    uid: int
    gid: int
    home: Path

    def run(self, *args: str, timeout: float = 240, module: str = "tests.store_rootless.kit") -> dict[str, Any]:
        """Run a kit scenario (``module``'s main) as this user; its JSON answer (AssertionError
        with its stderr when it fails)."""
        # the system's python: the venv's interpreter may live where the user cannot go (/root/.pyenv);
        # the same 3.11, so the venv's packages (pyseccomp for a sandbox's start) load from it
        site = next((REPO / ".venv" / "lib").glob("python3*/site-packages"))
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(self.home), "LANG": "C.UTF-8",
               "PYTHONPATH": f"{REPO / 'src'}:{REPO}:{site}", "XDG_CACHE_HOME": str(self.home / ".cache")}
        # a session of its own: on a timeout the scenario's processes go too, not only runuser
        proc = subprocess.Popen(["runuser", "-u", self.name, "--", "/usr/bin/python3", "-m", module, *args],
                                cwd=str(self.home), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        assert proc.returncode == 0, f"kit {args[0]} failed as {self.name}:\n{stderr[-4000:]}"
        answer: dict[str, Any] = json.loads(stdout.splitlines()[-1])
        return answer


@contextlib.contextmanager
def unprivileged_user(prefix: str = "hs-rootstore") -> Iterator[TestUser]:
    """A new user ``<prefix>-<pid>`` with a subordinate id block, removed (with its block) at the end."""
    for tool in ("newuidmap", "mmdebstrap", "mkfs.xfs"):
        assert shutil.which(tool), f"{tool} missing: scripts/setup.sh test installs uidmap, mmdebstrap, xfsprogs"
    kit.remove_orphans(f"{prefix}-")
    name = f"{prefix}-{os.getpid()}"
    home = Path(tempfile.mkdtemp(prefix=f"{name}-home-", dir="/tmp"))
    try:
        made = kit.create_user(name, home)
        assert any(line.startswith(f"{name}:") for line in Path("/etc/subuid").read_text().splitlines()), \
            "useradd gave the test user no /etc/subuid block"
        yield TestUser(name, made.uid, made.gid, home)
    finally:
        kit.remove_user(name)
        _remove_as_root(home)


def _remove_as_root(path: Path) -> None:
    subprocess.run(["rm", "-rf", "--", str(path)], check=False)


@contextlib.contextmanager
def user_filesystem(kind: str, user: TestUser, size: str = "1G") -> Iterator[Path]:
    """A fresh ``kind`` filesystem on a loop image, mounted and owned by ``user``."""
    mkfs, options = FILESYSTEMS[kind]
    scratch = Path(tempfile.mkdtemp(prefix=f"hs-rootstore-{kind}-", dir="/tmp"))
    image, mountpoint = scratch / "fs.img", scratch / "mnt"
    mountpoint.mkdir()
    mounted = False
    try:
        subprocess.run(["truncate", "-s", size, str(image)], check=True)
        subprocess.run([*mkfs, str(image)], check=True, capture_output=True)
        opts = ",".join(o for o in ("loop", options) if o)
        subprocess.run(["mount", "-o", opts, str(image), str(mountpoint)], check=True, capture_output=True)
        mounted = True
        os.chown(mountpoint, user.uid, user.gid)
        os.chmod(scratch, 0o755)
        yield mountpoint
    finally:
        kit.kill_processes_of(user.uid)  # a sandbox a failed scenario left running would hold the mount
        # mount -o loop made an auto-clearing loop device: it goes with the unmount
        if mounted and subprocess.run(["umount", str(mountpoint)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mountpoint)], check=False)
        _detach_loops(image)
        _remove_as_root(scratch)


def _detach_loops(image: Path) -> None:
    found = subprocess.run(["losetup", "-j", str(image), "-O", "NAME", "-n"], capture_output=True, text=True)
    for device in found.stdout.split():
        subprocess.run(["losetup", "-d", device], check=False)

