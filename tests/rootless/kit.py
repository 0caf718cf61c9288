"""A normal user for the rootless tests: made with useradd (with its /etc/subuid block), given a
Python that sees this checkout and its installed packages, and a base root filesystem of its own;
removed afterwards with everything it ran, even when a test fails.

The suite runs as root; these helpers drop to the user with runuser. The user must be able to read
the checkout and its .venv (they are world-readable here), and its interpreter cannot be the one
under /root (not reachable by anyone else), so its venv is made from Debian's python3 (the same
3.11, so the compiled packages of .venv load) with a .pth that adds .venv's site-packages.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"
PREFIX = "hs-rootless-"


class TestUser:
    def __init__(self, name: str) -> None:
        self.name = name
        entry = pwd.getpwnam(name)
        self.uid, self.gid, self.home = entry.pw_uid, entry.pw_gid, Path(entry.pw_dir)
        self.python = self.home / "venv" / "bin" / "python"
        self.base = Path()  # the built rootless base, once provisioned

    def env(self, **more: str) -> dict[str, str]:
        return {"HOME": str(self.home), "USER": self.name, "LOGNAME": self.name, "LANG": "C.UTF-8",
                "PATH": f"{self.home}/venv/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", **more}

    def run(self, argv: list[str], *, timeout: float = 600, env: dict[str, str] | None = None,
            cwd: str | None = None, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """``argv`` as the user (runuser: no setuid wrapper of ours, no root left in the process)."""
        variables = [f"{k}={v}" for k, v in (env or self.env()).items()]
        return subprocess.run(["runuser", "-u", self.name, "--", "env", "-i", *variables, *argv], capture_output=True,
                              text=True, timeout=timeout, cwd=cwd or str(self.home), input=input)

    def scenario(self, name: str) -> dict[str, Any]:
        """``python -m tests.rootless.scenarios NAME`` as the user: the JSON it printed last."""
        out = self.run([str(self.python), "-m", "tests.rootless.scenarios", name], cwd=str(REPO))
        assert out.returncode == 0, out.stderr[-3000:]
        result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        return result

    def processes(self) -> list[int]:
        return processes_of(self.uid)

    def kill_all(self) -> None:
        kill_processes_of(self.uid)


def processes_of(uid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    found.append(int(entry))
            except OSError:
                continue
    return found


def kill_processes_of(uid: int) -> None:
    """Every process the user runs (its sandboxes' inits included), by pid: all of them started by
    this session, as that user."""
    for _ in range(50):
        pids = processes_of(uid)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def create_user(name: str, home: Path | None = None) -> TestUser:
    """useradd (its home made, or ``home``, which exists, given to it), again while another
    helper's useradd or userdel holds /etc/passwd's lock. The one way the suite makes test users."""
    where = ["--create-home"] if home is None else ["-M", "-d", str(home)]
    deadline = time.monotonic() + 60
    while True:
        made = subprocess.run(["useradd", *where, "--shell", "/bin/bash", name], capture_output=True,
                              text=True, check=False)
        if made.returncode == 0:
            break
        assert "lock" in made.stderr and time.monotonic() < deadline, made.stderr
        time.sleep(0.2)
    user = TestUser(name)
    if home is not None:
        os.chown(home, user.uid, user.gid)
    user.home.chmod(0o700)
    return user


def remove_user(name: str) -> None:
    with contextlib.suppress(KeyError):
        TestUser(name).kill_all()
    deadline = time.monotonic() + 60
    while subprocess.run(["userdel", "--remove", "--force", name], capture_output=True, text=True,
                         check=False).stderr.find("lock") >= 0 and time.monotonic() < deadline:
        time.sleep(0.2)  # another helper's useradd or userdel holds /etc/passwd's lock
    for path in ("/etc/subuid", "/etc/subgid"):  # userdel removes them; left only if it failed
        text = Path(path).read_text()
        kept = "".join(line for line in text.splitlines(keepends=True) if not line.startswith(f"{name}:"))
        if kept != text:
            Path(path).write_text(kept)


def remove_orphans(prefix: str) -> None:
    """Users ``<prefix><pid>`` of runs killed before their clean-up (no process ``pid`` now), with
    the /tmp home a harness gave them; a live run's user (another copy of the suite) is left alone."""
    for line in Path("/etc/passwd").read_text().splitlines():
        fields = line.split(":")
        name, pid = fields[0], fields[0].removeprefix(prefix)
        if name.startswith(prefix) and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            remove_user(name)
            home = fields[5] if len(fields) > 5 else ""
            if home.startswith(f"/tmp/{name}-home-"):
                subprocess.run(["rm", "-rf", "--", home], check=False)


_SITE = next((REPO / ".venv" / "lib").glob("python3*/site-packages"))
_UNPACK = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from hermes_sandboxes.backends.local.store import baseimage
print(baseimage.ensure(tarball=Path(sys.argv[2])))
"""


def provision(user: TestUser, *, with_base: bool = True) -> None:
    """The user's venv, and its rootless base unpacked from the machine's cached tarball (what
    `hermes-sandboxes store base` makes, without fetching it again)."""
    from tests.store_rootless.base_cache import cached_tarball

    out = user.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(user.home / "venv")])
    assert out.returncode == 0, out.stderr
    pth = next((user.home / "venv" / "lib").glob("python3*/site-packages")) / "hs_checkout.pth"
    pth.write_text(f"import site; site.addsitedir({str(_SITE)!r})\n")
    for script in ("hermes", "hermes-sandboxes"):  # the checkout's entry points, on the user's python
        text = (REPO / ".venv" / "bin" / script).read_text().split("\n", 1)[1]
        target = user.home / "venv" / "bin" / script
        target.write_text(f"#!{user.python}\n{text}")
        target.chmod(0o755)
    if not with_base:
        return
    out = user.run([str(user.python), "-I", "-c", _UNPACK, str(REPO / "src"), str(cached_tarball())])
    assert out.returncode == 0, out.stderr
    user.base = Path(out.stdout.strip().splitlines()[-1])
