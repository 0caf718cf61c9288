"""A pseudo-terminal allocated in a running sandbox's own devpts, for ``shell``.

A pty of the host works as the shell's terminal, but inside the sandbox ``tty`` cannot name it (its
/dev/pts entry is the host's, which the sandbox does not see), so programs that look their terminal
up by name (``tty``, ``ps``, ``screen``, ``sudo``-like tools) fail. The sandbox mounts a devpts
instance of its own; we open that instance's ptmx through the init's root and take the slave with
TIOCGPTPEER, so the slave is /dev/pts/N inside.

The sandbox's root is theirs: its /dev/pts/ptmx could be a symlink or a bind of some host device,
and opening a device can act (a watchdog, a tape). So the path is first opened O_PATH (which opens
no device) without following a final symlink, checked to be the ptmx character device (5:2), and
only then reopened for reading and writing through /proc/self/fd. A pty from any devpts instance is
harmless: only we and the sandbox hold its ends.
"""

from __future__ import annotations

import fcntl
import os
import stat
import struct

from hermes_sandboxes.errors import SandboxError

_PTMX = os.makedev(5, 2)
_TIOCSPTLCK = 0x40045431  # unlock the slave (linux/asm-generic/ioctls.h); not in Python's termios
_TIOCGPTPEER = 0x5441  # open the slave from the master, in the master's devpts (Linux >= 4.13)


def open_in(init_pid: int, sandbox: str) -> tuple[int, int]:
    """(master, slave) of a new pty in the devpts of the sandbox whose init is ``init_pid``."""
    try:
        probe = os.open(f"/proc/{init_pid}/root/dev/pts/ptmx", os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise SandboxError(f"sandbox {sandbox}: no pseudo-terminals inside ({exc.strerror})") from exc
    try:
        st = os.fstat(probe)
        if not stat.S_ISCHR(st.st_mode) or st.st_rdev != _PTMX:
            raise SandboxError(f"sandbox {sandbox}: /dev/pts/ptmx inside is not the pty multiplexer")
        master = os.open(f"/proc/self/fd/{probe}", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    finally:
        os.close(probe)
    try:
        fcntl.ioctl(master, _TIOCSPTLCK, struct.pack("i", 0))
        slave = fcntl.ioctl(master, _TIOCGPTPEER, os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except BaseException:
        os.close(master)
        raise
    _give_to_root_inside(init_pid, slave)
    return master, slave


def _give_to_root_inside(init_pid: int, slave: int) -> None:
    """The slave belongs to whoever opened ptmx (host root, in root mode): give it to the host ids
    of the sandbox's root, which differ in a user namespace of its own, or the shell inside could
    not open it by name to make it its controlling terminal (and would never see a hang-up)."""
    try:
        with open(f"/proc/{init_pid}/status") as f:
            ids = {line.split(":")[0]: int(line.split()[1]) for line in f if line.startswith(("Uid:", "Gid:"))}
    except (OSError, ValueError, IndexError):
        return
    uid, gid = ids.get("Uid"), ids.get("Gid")
    if uid is not None and gid is not None and uid != os.geteuid():
        os.fchown(slave, uid, gid)
