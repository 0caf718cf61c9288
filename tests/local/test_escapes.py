"""The escape suite: each attack found against the local sandbox, tried again from root inside a real one.

Every test fails if the attempt succeeds. Where the defence is the syscall filter, the test reads
the kernel's own answer (a raw system call through ctypes, see syscall_probe.py) and a host-side
test shows that the very same call, unfiltered, gets a different answer: no test here can pass
because a call was refused for another reason. The classic escapes blocked from the start (mknod,
mounting cgroups or /proc/sys, the chroot escape, open_by_handle_at, /proc/1, setuid files, signals
to the host) live in test_isolation.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox, launcher, syscall_filter
from hermes_sandboxes.backends.local.guest import syscalls as sc
from hermes_sandboxes.errors import SandboxError
from hermes_sandboxes.sandbox import SandboxSpec
from tests.conftest import teardown_backend
from tests.local.kit import (
    ROOTLESS,
    cgroup_dir,
    fresh_name,
    init_state,
    new_sandbox,
    pid_alive,
    register_home,
    sh,
)

# Root mode: on the root filesystem and masked by nothing, what a sandbox sees of the host. Rootless
# (run as tests/rootless's user), a sandbox sees none of the host: other stores go to the host's /tmp.
VISIBLE_PARENT = "/tmp" if ROOTLESS else "/srv"
PROBE = Path(__file__).with_name("syscall_probe.py")
NOWHERE = "/nonexistent-hsl-probe"
CLONE_NEWUSER, SIGCHLD = 0x10000000, 17

# label, system call, arguments, made in a forked child. Arguments are chosen so that, unfiltered,
# the kernel answers with success or an error other than EPERM/ENOSYS (a bad descriptor, a missing
# path, an invalid flag), and so that none changes the host when it succeeds there.
DENIED_PROBES: list[tuple[str, str, list[Any], bool]] = [
    ("unshare CLONE_NEWUSER", "unshare", [CLONE_NEWUSER], True),
    ("clone CLONE_NEWUSER", "clone", [CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0], True),
    ("setns", "setns", [-1, 0], False),
    ("mount", "mount", ["none", NOWHERE, "tmpfs", 0, None], False),
    ("umount2", "umount2", [NOWHERE, 0], False),
    ("pivot_root", "pivot_root", [NOWHERE, NOWHERE], False),
    ("move_mount", "move_mount", [-1, "", -1, "", 0], False),
    ("open_tree", "open_tree", [-100, NOWHERE, 0], False),
    ("fsopen", "fsopen", [None, 0], False),
    ("fsconfig", "fsconfig", [-1, 0, None, None, 0], False),
    ("fsmount", "fsmount", [-1, 0, 0], False),
    ("fspick", "fspick", [-100, NOWHERE, 0], False),
    ("mount_setattr", "mount_setattr", [-100, NOWHERE, 0, None, 0], False),
    ("keyctl", "keyctl", [0, -4, 0], False),  # KEYCTL_GET_KEYRING_ID of the user keyring
    ("add_key", "add_key", [None, None, None, 0, 0], False),
    ("request_key", "request_key", [None, None, None, 0], False),
    ("io_uring_setup", "io_uring_setup", [1, {"buf": 120}], False),
    ("io_uring_enter", "io_uring_enter", [-1, 0, 0, 0, None, 0], False),
    ("io_uring_register", "io_uring_register", [-1, 0, None, 0], False),
    ("userfaultfd user-mode", "userfaultfd", [1 | os.O_CLOEXEC], False),  # UFFD_USER_MODE_ONLY
    ("bpf", "bpf", [9999, None, 0], False),
    ("perf_event_open", "perf_event_open", [None, 0, -1, -1, 0], False),
    ("fanotify_init", "fanotify_init", [0xFFFFFFFF, 0], False),
    ("lookup_dcookie", "lookup_dcookie", [0, None, 0], False),
    ("init_module", "init_module", [None, 0, None], False),
    ("finit_module", "finit_module", [-1, None, 0], False),
    ("delete_module", "delete_module", [None, 0], False),
    ("kexec_load", "kexec_load", [0, 0, None, 0xDEAD0000], False),
    ("kexec_file_load", "kexec_file_load", [-1, -1, 0, None, 0xDEAD0000], False),
    ("reboot", "reboot", [0, 0, 0, None], False),
    ("acct", "acct", [f"{NOWHERE}/x"], False),
    ("quotactl", "quotactl", [0, None, 0, None], False),
    ("quotactl_fd", "quotactl_fd", [-1, 0, 0, None], False),
    ("swapon", "swapon", [NOWHERE, 0], False),
    ("swapoff", "swapoff", [NOWHERE], False),
    ("syslog", "syslog", [10, None, 0], False),  # SYSLOG_ACTION_SIZE_BUFFER: reads a size
    ("settimeofday", "settimeofday", [None, None], False),  # sets nothing
    ("clock_settime", "clock_settime", [-1, None], False),
    ("clock_adjtime", "clock_adjtime", [-1, None], False),
    ("iopl", "iopl", [4], False),
    ("ioperm", "ioperm", [0, 0, 0], False),
    ("sethostname", "sethostname", [None, 100000], False),
    ("setdomainname", "setdomainname", [None, 100000], False),
    ("vhangup", "vhangup", [], True),  # the prober has no terminal: hangs up nothing
    ("open_by_handle_at", "open_by_handle_at", [-1, None, 0], False),
    ("name_to_handle_at", "name_to_handle_at", [-100, "/", None, None, 0], False),
    ("kcmp", "kcmp", [0, 0, 99, 0, 0], False),
    ("pidfd_getfd", "pidfd_getfd", [-1, 0, 0], False),
    ("process_madvise", "process_madvise", [-1, None, 0, 0, 0], False),
    ("get_mempolicy", "get_mempolicy", [None, None, 0, 0, 0], False),
    ("set_mempolicy", "set_mempolicy", [0, None, 0], True),
    ("mbind", "mbind", [0, 0, 0, None, 0, 0], False),
    ("move_pages", "move_pages", [0, 0, None, None, None, 0], False),
    ("migrate_pages", "migrate_pages", [0, 0, None, None], False),
    ("set_mempolicy_home_node", "set_mempolicy_home_node", [0, 0, 0, 0], False),
    ("socket AF_VSOCK", "socket", [40, 1, 0], False),
    *[(name, name, [0, 0, 0], False)
      for name in ("uselib", "ustat", "sysfs", "_sysctl", "nfsservctl", "afs_syscall", "tuxcall", "security",
                   "putpmsg", "getpmsg", "vserver")],
]
ENOSYS_PROBES: list[tuple[str, str, list[Any], bool]] = [
    ("clone3", "clone3", [None, 0], False),
    ("personality odd", "personality", [0x12345], True),
]
# what must keep working under the filter
ALLOWED_PROBES: list[tuple[str, str, list[Any], bool]] = [
    ("clone without namespaces", "clone", [SIGCHLD, 0, 0, 0, 0], True),
    ("personality query", "personality", [0xFFFFFFFF], False),
    ("socket AF_UNIX", "socket", [1, 1, 0], False),
    ("getpid", "getpid", [], False),
    ("ptrace TRACEME", "ptrace", [0, 0, 0, 0], True),  # tracing one's own processes
]


def _syscall_number(name: str) -> int:
    """The native number of a call, from libseccomp (negative: this architecture has none)."""
    import pyseccomp

    number = pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)
    assert isinstance(number, int)
    return number


def _numbered(probes: list[tuple[str, str, list[Any], bool]]) -> list[list[Any]]:
    out = []
    for label, name, args, child in probes:
        number = _syscall_number(name)
        if number >= 0:  # a call this architecture has
            out.append([label, name, number, args, child])
    return out


ALL_PROBES = _numbered(DENIED_PROBES + ENOSYS_PROBES + ALLOWED_PROBES)
EXPECTED_INSIDE = {**{label: errno.EPERM for label, *_ in _numbered(DENIED_PROBES)},
                   **{label: errno.ENOSYS for label, *_ in _numbered(ENOSYS_PROBES)},
                   **{label: 0 for label, *_ in _numbered(ALLOWED_PROBES)}}


def _load_filter() -> None:
    """In a child of the test, before it execs: what the init does to itself."""
    sc.prctl(sc.PR_SET_NO_NEW_PRIVS, 1)
    sc.load_seccomp_filter(syscall_filter.compiled())


def _probe_on_host(*, filtered: bool) -> dict[str, int]:
    syscall_filter.compiled()  # compiled here, not in the forked child
    proc = subprocess.run(["/usr/bin/python3", str(PROBE), json.dumps(ALL_PROBES)], capture_output=True,
                          text=True, start_new_session=True, timeout=60,
                          preexec_fn=_load_filter if filtered else None)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert isinstance(result, dict)
    return result


def _probe_inside(sb: LocalSandbox) -> dict[str, int]:
    sb.write_file("/root/syscall_probe.py", PROBE.read_bytes())
    result = sh(sb, f"python3 /root/syscall_probe.py '{json.dumps(ALL_PROBES)}'")
    data = json.loads(result.stdout)
    assert isinstance(data, dict)
    return data


@dataclass
class Victims:
    """Other stores on the machine, with a secret each, and a loop image outside any store (root
    mode: a copy store and a btrfs one; rootless: two stores of the same user, and a plain image,
    since only root attaches loop devices)."""

    copy_home: Path
    btrfs_home: Path  # rootless: the user's second store, of the kind its filesystem gives
    secret_file: str  # the path, inside the copy store's sandbox, of a file holding `secret`
    secret: str
    loop_image: Path


@pytest.fixture(scope="module")
def victims() -> Iterator[Victims]:
    secret = f"hsl-victim-secret-{secrets.token_hex(6)}"
    backends: list[LocalBackend] = []
    loop_dev = ""
    image = Path(tempfile.mkstemp(prefix="hsl-loop-", suffix=".img", dir=VISIBLE_PARENT)[1])
    try:
        for kind in ("copy", "btrfs"):
            home = register_home(Path(tempfile.mkdtemp(prefix=f"hsl-v{kind}-", dir=VISIBLE_PARENT)))
            backend = LocalBackend(home, image_size="1G") if ROOTLESS else LocalBackend(home, store=kind,
                                                                                        image_size="1G")
            backends.append(backend)
            sb = backend.create(fresh_name())  # unique: cgroup paths are shared by every store's sandboxes
            sb.write_file("/root/secret.txt", secret.encode())
            sb.stop()
        image.write_bytes(secret.encode() * 1024)
        if not ROOTLESS:
            loop_dev = subprocess.run(["losetup", "-r", "-f", "--show", str(image)], capture_output=True,
                                      text=True, check=True).stdout.strip()
        yield Victims(backends[0].home, backends[1].home, "/root/secret.txt", secret, image)
    finally:
        if loop_dev:
            subprocess.run(["losetup", "-d", loop_dev], check=False)
        image.unlink(missing_ok=True)
        for backend in backends:
            teardown_backend(backend)


@pytest.fixture(scope="module")
def attacker(local_backend: LocalBackend, victims: Victims) -> Iterator[LocalSandbox]:
    """A sandbox started after the victims exist: what it can reach is what an attacker gets."""
    with new_sandbox(local_backend) as sb:
        sh(sb, "true")
        yield sb


@pytest.fixture(scope="module")
def probed(attacker: LocalSandbox) -> dict[str, int]:
    return _probe_inside(attacker)


# the filter, proved non-vacuous on the host ------------------------------------------------------
@pytest.mark.skipif(ROOTLESS, reason="the proof needs full host root (unfiltered, a normal user gets EPERM for "
                    "these calls too); root mode proves it for the very filter rootless sandboxes load")
def test_each_denied_call_gets_another_answer_from_the_kernel_without_the_filter() -> None:
    """The same calls, as full host root: unfiltered, none gets EPERM or ENOSYS where the sandbox
    gets it; under the very filter sandboxes get (loaded here in a child), every one does."""
    unfiltered = _probe_on_host(filtered=False)
    filtered = _probe_on_host(filtered=True)
    assert filtered == EXPECTED_INSIDE
    same = {label: code for label, code in unfiltered.items()
            if code == EXPECTED_INSIDE[label] and EXPECTED_INSIDE[label] != 0}
    assert same == {}, f"these calls fail unfiltered too, so their probe proves nothing: {same}"


def test_a_python_process_starts_and_works_under_the_filter() -> None:
    proc = subprocess.run(["/usr/bin/python3", "-c", "import subprocess, threading; "
                           "t = threading.Thread(target=print, args=('thread',)); t.start(); t.join(); "
                           "print(subprocess.run(['sh', '-c', 'echo child'], capture_output=True, text=True).stdout)"],
                          capture_output=True, text=True, timeout=60, preexec_fn=_load_filter)
    assert proc.stdout.split() == ["thread", "child"], proc.stderr


# finding 1: a user namespace lifted the sandbox's own cgroup limits ------------------------------
def test_no_user_namespace_so_no_cgroup_mount_that_lifts_the_limits(attacker: LocalSandbox,
                                                                    probed: dict[str, int]) -> None:
    # rootless here has no delegated cgroup, so no pids.max to lift (the QEMU guest's tests have one)
    pids_max = cgroup_dir(attacker, "pids") / "pids.max"
    before = pids_max.read_text() if pids_max.exists() or not ROOTLESS else "no cgroup"
    result = attacker.exec(
        "unshare -UrmC --fork sh -c 'mkdir -p /root/cg && mount -t cgroup -o pids cgroup /root/cg && "
        "echo max > /root/cg/pids.max && echo LIFTED'; echo rc=$?")
    assert "LIFTED" not in result.stdout and "rc=0" not in result.stdout, result.stdout + result.stderr
    assert "Operation not permitted" in result.stderr
    assert (pids_max.read_text() if pids_max.exists() or not ROOTLESS else "no cgroup") == before
    assert probed["unshare CLONE_NEWUSER"] == errno.EPERM
    assert probed["clone CLONE_NEWUSER"] == errno.EPERM
    assert probed["clone3"] == errno.ENOSYS  # so libc falls back to clone, whose flags the filter reads


# finding 2: kernel keyrings shared with the host and between sandboxes ---------------------------
def test_kernel_keyrings_of_the_host_and_other_sandboxes_are_out_of_reach(attacker: LocalSandbox,
                                                                         probed: dict[str, int]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    description = f"hsl-key-{secrets.token_hex(4)}"
    payload = b"host keyring secret"
    add_key, keyctl = _syscall_number("add_key"), _syscall_number("keyctl")
    key = libc.syscall(add_key, b"user", description.encode(), payload, len(payload), -4)  # the user keyring
    assert key > 0, ctypes.get_errno()
    try:
        result = attacker.exec(f"cat /proc/keys; grep -r {description} /proc/keys; echo done")
        assert description not in result.stdout and result.stdout.endswith("done\n")
        for call in ("keyctl", "add_key", "request_key"):  # no key of anyone's, no key to share
            assert probed[call] == errno.EPERM, call
    finally:
        libc.syscall(keyctl, 21, key)  # KEYCTL_INVALIDATE


def test_io_uring_and_user_mode_userfaultfd_are_denied(probed: dict[str, int]) -> None:
    for call in ("io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd user-mode"):
        assert probed[call] == errno.EPERM, call


def test_every_call_of_the_container_profile_s_deny_list_fails_inside(attacker: LocalSandbox,
                                                                      probed: dict[str, int]) -> None:
    assert probed == EXPECTED_INSIDE
    status = sh(attacker, "grep ^Seccomp /proc/self/status").stdout.split()
    assert status == ["Seccomp:", "2", "Seccomp_filters:", "1"]


@pytest.mark.skipif(ROOTLESS, reason="the rootless base has no strace; ptrace of its own processes is probed "
                    "rootless too ('ptrace TRACEME' above)")
def test_strace_still_traces_the_sandbox_s_own_processes(attacker: LocalSandbox) -> None:
    result = sh(attacker, "strace -f -e trace=execve -o /root/trace sh -c 'echo traced' && grep -c execve /root/trace")
    assert result.stdout.split() == ["traced", "1"], result.stdout + result.stderr


# finding 4: other stores (homes, copy-store files, btrfs images) were readable ---------------------
def test_other_stores_homes_images_and_loop_files_are_unreadable(attacker: LocalSandbox, victims: Victims) -> None:
    assert victims.secret.encode() in (victims.loop_image.read_bytes())  # the host sees them...
    copies = list(victims.copy_home.rglob("secret.txt"))
    assert copies and copies[0].read_text() == victims.secret
    assert ROOTLESS or (victims.btrfs_home / "store.img").exists()
    assert list(victims.btrfs_home.rglob("secret.txt"))
    for home in (victims.copy_home, victims.btrfs_home, Path("/var/lib/hermes-sandboxes-stores")):
        assert sh(attacker, f"ls -A {home} 2>/dev/null; true").stdout == "", home  # ...the sandbox, nothing
    searched = "/ --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev" if ROOTLESS else VISIBLE_PARENT  # all it sees
    result = attacker.exec(
        f"grep -rl {victims.secret} {searched}; echo grep=$?; "
        f"echo image=$(cat {victims.btrfs_home}/store.img | wc -c) loop=$(cat {victims.loop_image} | wc -c); "
        "echo done", timeout=300)
    assert victims.secret not in result.stdout, result.stdout
    assert "grep=1" in result.stdout  # searched, found nothing
    assert "image=0 loop=0" in result.stdout, result.stdout  # no image to `btrfs restore` from
    assert result.stdout.endswith("done\n")


def test_a_store_created_while_a_sandbox_runs_is_hidden_from_it_at_once(attacker: LocalSandbox) -> None:
    sh(attacker, "true")
    secret = f"hsl-late-secret-{secrets.token_hex(6)}"
    home = register_home(Path(tempfile.mkdtemp(prefix="hsl-late-", dir=VISIBLE_PARENT)))
    seen = attacker.exec(f"ls -d {home}").stdout.strip()
    assert seen == ("" if ROOTLESS else str(home))  # root mode: new host directories show inside
    with contextlib.ExitStack() as cleanup:
        backend = LocalBackend(home, store="copy")
        cleanup.callback(teardown_backend, backend)
        sb = backend.create(fresh_name())  # the store's first sandbox registers it
        sb.write_file("/root/late.txt", secret.encode())
        assert any(p.read_text() == secret for p in home.rglob("late.txt"))
        result = attacker.exec(f"ls -A {home}; grep -rl {secret} {home}; echo grep=$?")
        assert result.stdout == ("grep=2\n" if ROOTLESS else "grep=1\n"), result.stdout  # rootless: not there


# finding 6: the smaller ones ---------------------------------------------------------------------
def test_the_file_helper_reads_only_regular_files_and_holds_a_command_s_capabilities(sandbox: LocalSandbox) -> None:
    sh(sandbox, "mkfifo /root/fifo")
    outcome: dict[str, Any] = {}

    def read_fifo() -> None:
        try:
            outcome["data"] = sandbox.read_file("/root/fifo")
        except SandboxError as exc:
            outcome["error"] = str(exc)

    reader = threading.Thread(target=read_fifo, daemon=True)
    reader.start()
    reader.join(60)  # a liveness bound, not a timing: unfixed, this read blocks until a writer comes
    assert not reader.is_alive(), "read_file blocked on a FIFO"
    assert "not a regular file" in outcome.get("error", ""), outcome
    init_fds = sh(sandbox, "ls /proc/1/fd 2>/dev/null; echo 0 1 2 3 4 5 6 7 8").stdout.split()
    for fd in sorted(set(init_fds)):
        with pytest.raises(SandboxError):
            sandbox.read_file(f"/proc/1/fd/{fd}")
    for device in ("/dev/zero", "/dev/tty", "/dev/null"):
        with pytest.raises(SandboxError, match="not a regular file"):
            sandbox.read_file(device)
    helper = dict(line.split(":\t", 1) for line in sandbox.read_file("/proc/self/status").decode().splitlines()
                  if ":\t" in line)
    command = dict(line.split(":\t", 1) for line in sh(sandbox, "cat /proc/self/status").stdout.splitlines()
                   if ":\t" in line)
    for field in ("CapEff", "CapPrm", "CapBnd", "Seccomp", "NoNewPrivs"):
        assert helper[field] == command[field], field
    assert sandbox.read_file("/etc/hostname") == Path("/etc/hostname").read_bytes()  # files still read


def test_sigint_and_sigterm_from_inside_do_not_end_the_init(sandbox: LocalSandbox) -> None:
    sh(sandbox, "true")
    init = init_state(sandbox)["pid"]
    for sig in ("INT", "TERM", "HUP", "QUIT", "USR1", "USR2", "ALRM", "CHLD", "PIPE"):
        assert sandbox.exec(f"kill -{sig} 1; echo sent").stdout == "sent\n", sig
    assert pid_alive(init) and init_state(sandbox)["pid"] == init
    assert sh(sandbox, "echo alive").stdout == "alive\n"


def _free_privileged_port() -> int:
    """A privileged port nothing on the host listens on (read from /proc: rootless, the test itself
    may not bind one either)."""
    used = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            used.add(int(line.split()[1].rsplit(":", 1)[1], 16))
    port = next(p for p in range(1000, 600, -1) if p not in used)
    if not ROOTLESS:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))  # free indeed: full root binds it
    return port


def test_host_network_mode_cannot_bind_a_privileged_port(local_backend: LocalBackend) -> None:
    assert Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text().strip() == "1024"
    port = _free_privileged_port()
    with new_sandbox(local_backend, SandboxSpec(network="host")) as sb:
        bind = "python3 -c 'import socket; s = socket.socket(); s.bind((\"127.0.0.1\", {})); print(\"bound\")'"
        result = sb.exec(f"{bind.format(port)}; {bind.format(0)}")
        assert "PermissionError" in result.stderr, result.stderr
        assert result.stdout == "bound\n"  # an unprivileged port still binds
        status = sh(sb, "grep CapEff /proc/self/status").stdout.split()[1]
        assert not int(status, 16) & (1 << 10)  # CAP_NET_BIND_SERVICE
    with new_sandbox(local_backend) as sb:  # in its own network, root inside keeps its usual ports
        sh(sb, f"python3 -c 'import socket; s = socket.socket(); s.bind((\"127.0.0.1\", {port}))'")


def test_host_paths_are_absent_from_what_the_sandbox_reads_about_itself(attacker: LocalSandbox) -> None:
    backend = attacker.backend
    package = str(Path(launcher.__file__).resolve().parents[3])
    host_paths = {str(backend.home), package, os.path.realpath(sys.executable), str(Path(sys.executable).parent),
                  str(backend.layout.run_dir(attacker.name))}
    for source in ("/proc/1/cmdline", "/proc/self/cmdline", "/proc/self/mountinfo", "/proc/self/mounts",
                   "/proc/self/cgroup", "/proc/1/cgroup"):
        text = sh(attacker, f"tr '\\0' ' ' < {source}").stdout
        leaked = [p for p in host_paths if p in text]
        assert leaked == [], f"{source} shows {leaked}:\n{text}"
    assert "hermes-sandboxes/" not in sh(attacker, "cat /proc/self/cgroup").stdout


@contextlib.contextmanager
def _rootfs_base(files: dict[str, str]) -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="hsl-base-", dir="/tmp"))
    try:
        (base / "bin").mkdir()
        (base / "etc").mkdir()
        for name, text in files.items():
            (base / "etc" / name).write_text(text)
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.skipif(ROOTLESS, reason="rootless, a base is the user's own files, shown as they are: no "
                    "hash in it is more secret than what the user reads already (root mode's base is the host's)")
def test_shadow_backups_are_scrubbed_too(local_backend: LocalBackend) -> None:
    hashed = "$6$salt$0123456789abcdefghijklmnopqrstuvwxyz"
    files = {"shadow-": f"root:{hashed}:19000:0:99999:7:::\n", "gshadow-": f"root:{hashed}::\n"}
    with _rootfs_base(files) as base, new_sandbox(LocalBackend(local_backend.home, base=str(base))) as sb:
        assert sb.read_file("/etc/shadow-").decode().splitlines() == ["root:*:19000:0:99999:7:::"]
        assert sb.read_file("/etc/gshadow-").decode().splitlines() == ["root:*::"]
        assert hashed in (base / "etc" / "shadow-").read_text()
