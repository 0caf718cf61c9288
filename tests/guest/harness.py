"""Run a part of this test suite inside a small QEMU guest whose only cgroup hierarchy is cgroup v2.

This machine kind keeps its cgroup controllers on v1 hierarchies and has no usable hardware
virtualisation, so the v2 code path is tested under software emulation: Debian's kernel, a busybox
initramfs (build.sh), the host's root shared read-only over 9p with a writable overlay on top
(init.sh), and a second 9p share, ``out``, that carries the script in and the results back. The
guest runs this very checkout and virtualenv, unchanged.
"""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GUEST_DIR = REPO / "build" / "guest"
QEMU = "qemu-system-x86_64"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]|\x1bc")


@dataclass
class GuestRun:
    exit_code: int | None  # the script's exit code inside the guest (None: it never reported one)
    console: str
    seconds: float
    outcomes: dict[str, str]  # test id -> "passed" / "failed" / "error" / "skipped", from JUnit XML
    out_dir: Path

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.console.splitlines()[-lines:])


def build() -> None:
    """Build (or reuse) the kernel and initramfs under build/guest: one build at a time (a lock
    there), so a copy of the suite that starts meanwhile waits for it and reuses it, rather than
    removing the kernel another copy's build is writing."""
    GUEST_DIR.mkdir(parents=True, exist_ok=True)
    with open(GUEST_DIR / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = subprocess.run(["bash", str(Path(__file__).with_name("build.sh"))], capture_output=True, text=True,
                              timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"building the guest failed:\n{done.stdout}\n{done.stderr}")


def _junit_outcomes(path: Path) -> dict[str, str]:
    outcomes: dict[str, str] = {}
    if not path.exists():
        return outcomes
    for case in ET.parse(path).iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = "failed" if tag == "failure" else tag
        outcomes[name] = outcome
    return outcomes


def _script(tests: list[str], out: str) -> str:
    python = shlex.quote(str(REPO / ".venv" / "bin" / "python"))
    return "\n".join([
        "set -u",
        f"cd {shlex.quote(str(REPO))}",
        f"{python} -c 'from hermes_sandboxes.backends.local import cgroups; p = cgroups.probe(); "
        "print(\"hsg: cgroup version\", p.version, \"limits\", sorted(p.limits), \"missing\", p.missing)'",
        # -p no:cacheprovider: the checkout is read-only in the guest (its writes would be lost anyway)
        f"{python} -m pytest -q -p no:cacheprovider -o addopts= --durations=10 --junitxml={out}/junit.xml "
        + " ".join(shlex.quote(t) for t in tests),
    ]) + "\n"


def run(tests: list[str], *, timeout: float = 360, memory_mb: int = 2048) -> GuestRun:
    """Boot the guest, run pytest on ``tests`` (ids relative to the repository) inside it."""
    build()
    GUEST_DIR.mkdir(parents=True, exist_ok=True)
    out_dir = Path(tempfile.mkdtemp(prefix="run-", dir=GUEST_DIR))
    (out_dir / "run.sh").write_text(_script(tests, "/run/hsg-out"))
    command = [
        "timeout", "--kill-after=10", str(int(timeout)),  # never an endless guest
        QEMU, "-accel", "tcg", "-cpu", "max", "-m", str(memory_mb), "-smp", "2",
        "-nographic", "-no-reboot", "-nic", "none",
        "-kernel", str(GUEST_DIR / "vmlinux"), "-initrd", str(GUEST_DIR / "initramfs.cpio.gz"),
        # hsg_repo: where this checkout lives, so the guest can show it again if /tmp hides it
        "-append", f"console=ttyS0 quiet panic=-1 hsg_repo={REPO}",
        "-virtfs", "local,path=/,mount_tag=host,security_model=passthrough,readonly=on,multidevs=remap",
        "-virtfs", f"local,path={out_dir},mount_tag=out,security_model=passthrough",
    ]
    started = time.monotonic()
    done = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=timeout + 30, check=False)
    seconds = time.monotonic() - started
    console = _ANSI.sub("", done.stdout.decode(errors="replace")).replace("\r", "")
    (out_dir / "console.log").write_text(console)
    exit_code = None
    for line in console.splitlines():
        if line.startswith("hsg: exit "):
            exit_code = int(line.split()[-1])
    return GuestRun(exit_code, console, seconds, _junit_outcomes(out_dir / "junit.xml"), out_dir)


def forget(result: GuestRun) -> None:
    """Remove a run's directory (its console log and results)."""
    shutil.rmtree(result.out_dir, ignore_errors=True)


def available() -> str | None:
    """Why the guest cannot run here, or None."""
    if os.geteuid() != 0:
        return "the guest shares / over 9p and the tests inside need root"
    missing = [tool for tool in (QEMU, "busybox", "cpio", "depmod", "timeout") if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)}: run bash scripts/setup.sh test"
    return None
