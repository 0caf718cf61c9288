"""scripts/setup.sh waits for another apt's lock with a visible message and a bounded timeout
(issue #22 point 5), through scripts/apt-wait.sh, run for real on a lock file this test holds the
way apt holds its own (an fcntl write lock); and it changes a working .venv in a copy swapped in
whole (point 9: scripts/venv_swap.py), so a CLI running from it meanwhile never breaks."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WAIT = ROOT / "scripts" / "apt-wait.sh"


def _run(lock: Path, seconds: str) -> subprocess.Popen[str]:
    env = {**os.environ, "HERMES_SANDBOXES_APT_LOCKS": f"{lock} {lock}.absent", "HERMES_SANDBOXES_APT_WAIT_S": seconds}
    return subprocess.Popen(["bash", str(WAIT)], env=env, stderr=subprocess.PIPE, text=True)


def test_a_held_lock_is_waited_for_visibly_and_the_wait_ends_when_it_is_released(tmp_path: Path) -> None:
    lock = tmp_path / "lock-frontend"
    with open(lock, "w") as held:
        fcntl.lockf(held, fcntl.LOCK_EX)
        proc = _run(lock, "600")
        assert proc.stderr is not None
        line = proc.stderr.readline()  # said at once, while we hold it
        assert line.startswith("setup: waiting for ") and f"(pid {os.getpid()}) to release {lock}" in line, line
        assert "at most 600s" in line and proc.poll() is None
    # (closed: released) the script goes on by itself
    assert proc.wait(timeout=60) == 0, proc.stderr.read()


def test_a_lock_held_too_long_is_a_bounded_wait_naming_its_holder(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    with open(lock, "w") as held:
        fcntl.lockf(held, fcntl.LOCK_EX)
        proc = _run(lock, "1")
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert "gave up after 1s: " in err and f"(pid {os.getpid()}) still holds {lock}" in err, err


def test_free_locks_cost_no_wait_and_say_nothing(tmp_path: Path) -> None:
    (tmp_path / "lock").write_text("")
    proc = _run(tmp_path / "lock", "1")
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (0, "")


def test_setup_waits_for_the_lock_before_apt_and_lets_apt_wait_too() -> None:
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert setup.index("bash scripts/apt-wait.sh") < setup.index("apt-get -o DPkg::Lock::Timeout")


SWAP = ROOT / "scripts" / "venv_swap.py"


def _venv(where: Path) -> Path:
    venv = where / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (venv / "MARK").write_text("old\n")
    return venv


def test_a_venv_is_changed_in_a_copy_and_swapped_in_whole(tmp_path: Path) -> None:
    """While the install runs, what runs from the venv sees the old packages, whole; after, the new."""
    venv = _venv(tmp_path)
    ready, go = tmp_path / "ready", tmp_path / "go"
    install = (f"echo new > {{venv}}/MARK; printf '#!{{venv}}/bin/python\\n' > {{venv}}/bin/newtool; "
               f"touch {ready}; while [ ! -e {go} ]; do sleep 0.05; done")
    proc = subprocess.Popen([sys.executable, str(SWAP), str(venv), "--", "sh", "-c", install])
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the install never started"
            time.sleep(0.05)
        assert (venv / "MARK").read_text() == "old\n"  # mid-install: the venv is untouched and works
        assert subprocess.run([str(venv / "bin" / "python"), "-c", "import sys; print(sys.prefix)"],
                              capture_output=True, text=True, check=True).stdout.strip() == str(venv)
        go.touch()
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (venv / "MARK").read_text() == "new\n"
    assert (venv / "bin" / "newtool").read_text() == f"#!{venv}/bin/python\n"  # its own name, not the copy's
    assert not (tmp_path / ".venv.next").exists()


def test_a_failed_install_leaves_the_venv_as_it_was(tmp_path: Path) -> None:
    venv = _venv(tmp_path)
    done = subprocess.run([sys.executable, str(SWAP), str(venv), "--", "sh", "-c", "echo new > {venv}/MARK; exit 3"],
                          timeout=120, check=False)
    assert done.returncode == 3
    assert (venv / "MARK").read_text() == "old\n" and not (tmp_path / ".venv.next").exists()
