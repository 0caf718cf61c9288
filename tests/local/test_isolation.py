"""Isolation: what the sandbox can see of the host, and what it can change there (nothing).

One sandbox is started after the host has been seeded with secrets (a marker in /root and /home,
a fake secret in the creating process's environment, a HERMES_HOME, a user mask, a host process)
and every read-only check runs against it. Tests that change the sandbox get a fresh one.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import secrets
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox
from hermes_sandboxes.sandbox import ExecResult
from tests.conftest import teardown_backend
from tests.local.kit import (
    ROOTLESS,
    init_state,
    inside,
    new_sandbox,
    pid_alive,
    sandbox_commands,
    sh,
    temp_home,
    view_root,
    visible_dir,
    wait_for,
)

# Run as root, and as tests/rootless's user (ROOTLESS): then "the host's root home" and "home
# directories" are that user's own home, and paths a sandbox would see unmasked are in the user's
# base (visible_dir; commands inside name them by inside(path)).


@dataclass
class World:
    sb: LocalSandbox
    backend: LocalBackend  # a copy-store backend whose home is on the visible root filesystem
    root_marker: Path
    home_dir: Path
    ssh_key: Path
    hermes_home: Path
    user_mask_dir: Path
    user_mask_file: Path
    user_mask_sibling: Path
    backend_mask_dir: Path
    secret_value: str
    host_sleep_arg: str


def _sha(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    token = secrets.token_hex(6)
    made: list[Path] = []
    env_before = {k: os.environ.get(k) for k in ("HERMES_HOME", "HSL_TEST_SECRET")}
    host_sleep: subprocess.Popen[bytes] | None = None
    backend: LocalBackend | None = None
    sb: LocalSandbox | None = None
    try:
        root_marker = (Path.home() if ROOTLESS else Path("/root")) / f"hsl-marker-{token}"
        root_marker.write_text("host root's secret\n")
        made.append(root_marker)
        # rootless, the user's own home, shared with the tests before this one (a ~/.ssh may be there
        # already): a key of this run's own name in it, removed afterwards, and ~/.ssh if made here
        home_dir = Path.home() if ROOTLESS else Path(f"/home/hsl-{token}")
        if not ROOTLESS:
            home_dir.mkdir()
            made.append(home_dir)
        ssh_dir = home_dir / ".ssh"
        if not ssh_dir.exists():
            ssh_dir.mkdir(mode=0o700)
            made.append(ssh_dir)
        ssh_key = ssh_dir / f"id_ed25519-hsl-{token}"
        ssh_key.write_text(f"PRIVATE KEY {token}\n")
        made.append(ssh_key)
        mkd = visible_dir

        hermes_home = Path(tempfile.mkdtemp(prefix="hsl-hh-", dir=Path.home())) if ROOTLESS else mkd("hh")
        made.append(hermes_home)
        (hermes_home / "auth.json").write_text('{"token": "hermes secret"}\n')
        user_mask_dir = mkd("um")
        made.append(user_mask_dir)
        (user_mask_dir / "secret.txt").write_text("user-masked\n")
        file_parent = mkd("uf")
        made.append(file_parent)
        user_mask_file = file_parent / "credentials"
        user_mask_file.write_text("user-masked file\n")
        user_mask_sibling = file_parent / "readme"
        user_mask_sibling.write_text("visible\n")
        backend_mask_dir = mkd("bm")
        made.append(backend_mask_dir)
        (backend_mask_dir / "secret.txt").write_text("backend-masked\n")
        secret_value = f"hsl-secret-{token}"
        os.environ["HSL_TEST_SECRET"] = secret_value
        os.environ["HERMES_HOME"] = str(hermes_home)
        host_sleep_arg = f"3141.{int(token[:6], 16)}"
        host_sleep = subprocess.Popen(["sleep", host_sleep_arg])

        home = temp_home("/tmp" if ROOTLESS else "/srv")  # root mode: on the root filesystem sandboxes see
        backend = LocalBackend(home, store="copy", masks=[inside(backend_mask_dir), inside(user_mask_dir),
                                                          inside(user_mask_file)])
        with new_sandbox(backend) as sb:
            sh(sb, "true")  # the init starts now, with the secrets above in place
            for key, value in env_before.items():  # masks were applied; the host env goes back
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            yield World(sb, backend, root_marker, home_dir, ssh_key, hermes_home, user_mask_dir, user_mask_file,
                        user_mask_sibling, backend_mask_dir, secret_value, host_sleep_arg)
    finally:
        for key, value in env_before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if host_sleep is not None:
            host_sleep.kill()
            host_sleep.wait()
        for path in made:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        if backend is not None:
            teardown_backend(backend)


# what the sandbox sees ---------------------------------------------------------------------------
def test_the_host_root_home_is_empty_inside(world: World) -> None:
    assert world.root_marker.exists()
    result = world.sb.exec(f"ls -A /root; cat {world.root_marker}")
    assert world.root_marker.name not in result.stdout
    assert "secret" not in result.stdout
    assert result.exit_code != 0  # cat found nothing


def test_home_directories_and_their_ssh_keys_are_invisible(world: World) -> None:
    key = world.ssh_key
    assert key.read_text().startswith("PRIVATE KEY ")  # planted on the host, readable there
    result = world.sb.exec(f"ls -A /home; ls -A {key.parent} 2>/dev/null; cat {key}")
    assert result.stdout.strip() == ""
    assert key.read_text().strip() not in result.stdout
    assert result.exit_code != 0  # cat found nothing


def test_etc_shadow_keeps_its_users_but_no_password_hash(world: World) -> None:
    shadow = world.sb.read_file("/etc/shadow").decode()
    users_of = world.sb.read_file("/etc/passwd").decode() if ROOTLESS else Path("/etc/shadow").read_text()
    host_users = [line.split(":")[0] for line in users_of.splitlines() if line]  # rootless: its base's
    assert [line.split(":")[0] for line in shadow.splitlines() if line] == host_users
    for line in shadow.splitlines():
        assert "$" not in line.split(":")[1], line


@pytest.mark.skipif(ROOTLESS, reason="rootless, a base is the user's own files, shown as they are: no "
                    "hash in it is more secret than what the user reads already (root mode's base is the host's)")
def test_password_hashes_of_a_rootfs_base_are_scrubbed(local_backend: LocalBackend) -> None:
    """The host's shadow here holds no hash, so a base with real-looking hashes proves the scrub."""
    base = Path(tempfile.mkdtemp(prefix="hsl-base-", dir="/tmp"))
    try:
        (base / "bin").mkdir()
        (base / "etc").mkdir()
        hashed = "$6$salt$0123456789abcdefghijklmnopqrstuvwxyz"
        (base / "etc" / "shadow").write_text(f"root:{hashed}:19000:0:99999:7:::\nbob:!:19000::::::\n")
        (base / "etc" / "gshadow").write_text(f"root:{hashed}::\n")
        with new_sandbox(LocalBackend(local_backend.home, base=str(base))) as sb:
            shadow = sb.read_file("/etc/shadow").decode()
            gshadow = sb.read_file("/etc/gshadow").decode()
        assert shadow.splitlines() == ["root:*:19000:0:99999:7:::", "bob:!:19000::::::"]
        assert gshadow.splitlines() == ["root:*::"]
        assert hashed in (base / "etc" / "shadow").read_text()  # the base itself is untouched
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_sandbox_store_is_invisible(world: World, store_home: Path) -> None:
    home = world.backend.home
    assert any(home.iterdir())  # the host sees store.json, sandboxes/, run/, copy-store/
    result = world.sb.exec(f"ls -A {home} /tmp; ls {home}/run")
    # root mode: the home shows as an empty directory; rootless, nothing of the host shows
    assert result.stdout.split() == ([] if ROOTLESS else [f"{home}:"]) + ["/tmp:"]
    assert result.exit_code != 0
    assert sh(world.sb, f"ls -A {store_home} 2>/dev/null; true").stdout == ""


def test_another_sandbox_s_journal_and_the_host_state_directory_are_out_of_reach(world: World) -> None:
    """#24 finding 9: every sandbox's journal and audit log are in the host state directory, which
    no sandbox sees (root mode masks it; rootless it is in the user's XDG state or, here, /tmp)."""
    from hermes_sandboxes.recorder.state import HostState

    token = f"hsl-journal-{secrets.token_hex(6)}"
    state = HostState()
    with new_sandbox(world.backend) as other:
        recorded = state.recorded(other)
        try:
            assert recorded.exec(f"echo {token} > /dev/null").exit_code == 0
        finally:
            recorded.close()
        journal = state.journal_path(world.backend.key, other.name)
        assert token in journal.read_text()  # the host has it...
        root = state.trusted()
        # rootless: all it sees (its base); root mode: where the host keeps state (all of / takes minutes)
        where = "/ --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev" if ROOTLESS else f"{root} /tmp /var /root"
        seen = world.sb.exec(f"ls -A {root} {journal.parent} 2>/dev/null; grep -rlsF {token} {where}; true",
                             timeout=300)
        assert seen.stdout == "", seen.stdout  # ...no other sandbox does, anywhere it looks


def test_hermes_home_of_the_creating_process_is_invisible(world: World) -> None:
    result = world.sb.exec(f"ls -A {world.hermes_home}; cat {world.hermes_home}/auth.json")
    assert "hermes secret" not in result.stdout
    assert "auth.json" not in result.stdout
    assert result.exit_code != 0


def test_user_mask_entries_hide_a_directory_and_a_file(world: World) -> None:
    listing = sh(world.sb, f"ls -A {inside(world.user_mask_dir)}").stdout
    assert listing == ""
    result = world.sb.exec(f"cat {inside(world.user_mask_file)}")
    assert "user-masked" not in result.stdout and _hidden_file(result)
    assert sh(world.sb, f"cat {inside(world.user_mask_sibling)}").stdout == "visible\n"


def _hidden_file(cat: ExecResult) -> bool:
    """Root mode whites a masked file out (cat fails); rootless masks are mounts, /dev/null over it."""
    return cat.stdout == "" if ROOTLESS else cat.exit_code != 0


def test_a_backend_wide_extra_mask_hides_its_directory(world: World) -> None:
    assert sh(world.sb, f"ls -A {inside(world.backend_mask_dir)}").stdout == ""


def test_host_processes_are_invisible(world: World) -> None:
    with open("/proc/self/stat") as f:
        assert f.read()  # the host has processes...
    commands = sandbox_commands(world.sb)
    assert not any(world.host_sleep_arg in c for c in commands), commands
    assert not any("process_api" in c or "pytest" in c for c in commands), commands
    assert sh(world.sb, "cat /proc/1/comm").stdout.strip().startswith("python")  # the init is PID 1


def test_the_host_environment_does_not_reach_the_sandbox(world: World) -> None:
    env = sh(world.sb, "env").stdout
    assert world.secret_value not in env
    assert "HSL_TEST_SECRET" not in env
    assert "HERMES_HOME" not in env
    environ = Path(f"/proc/{init_state(world.sb)['pid']}/environ")  # seen from the host
    if ROOTLESS:  # the init is not dumpable: its own user cannot read it either
        with pytest.raises(PermissionError):
            environ.read_bytes()
    else:
        assert world.secret_value.encode() not in environ.read_bytes() and b"HERMES_HOME" not in environ.read_bytes()
    every_environ = world.sb.exec("cat /proc/[0-9]*/environ").stdout  # /proc/1 is unreadable
    assert world.secret_value not in every_environ
    assert world.sb.exec("cat /proc/1/environ").stdout.count(world.secret_value) == 0


def test_commands_inherit_no_descriptor_of_the_init(world: World) -> None:
    fds = sh(world.sb, "ls /proc/self/fd").stdout.split()
    assert sorted(fds, key=int) == ["0", "1", "2", "3"]  # 3 is ls's own directory handle


def test_the_sandbox_has_its_own_hostname(world: World) -> None:
    assert sh(world.sb, "hostname").stdout.strip() == world.sb.name
    world.sb.exec("hostname changed-inside")  # refused (no CAP_SYS_ADMIN); harmless in its own UTS
    assert os.uname().nodename != "changed-inside"


# what the sandbox cannot do ------------------------------------------------------------------------
def test_device_nodes_cannot_be_created(world: World) -> None:
    vda = os.stat("/dev/vda").st_rdev
    result = world.sb.exec(
        f"mknod /root/blk b {os.major(vda)} {os.minor(vda)}; echo rc=$?; "
        "mknod /root/mem c 1 1; echo rc=$?; "
        f"python3 -c 'import os; os.mknod(\"/root/blk2\", 0o60600, os.makedev({os.major(vda)}, {os.minor(vda)}))';"
        "echo rc=$?; ls /root"
    )
    assert result.stdout.count("rc=0") == 0, result.stdout
    assert "Operation not permitted" in result.stderr
    assert "blk" not in result.stdout and "mem" not in result.stdout
    assert sh(world.sb, "mkfifo /root/fifo && test -p /root/fifo && rm /root/fifo").exit_code == 0


def test_the_host_disk_cannot_be_read(world: World) -> None:
    result = world.sb.exec("dd if=/dev/vda of=/dev/null bs=512 count=1; echo rc=$?; "
                           "cat /sys/dev/block/*/dev; ls /dev")
    assert "rc=0" not in result.stdout
    assert "No such file" in result.stderr
    devices = set(sh(world.sb, "ls /dev").stdout.split())
    assert devices <= {"fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout",
                       "tty", "urandom", "zero"}, devices


def test_the_cgroup_hierarchy_cannot_be_mounted(world: World) -> None:
    result = world.sb.exec(
        "mkdir -p /root/cg; "
        "mount -t cgroup -o memory cgroup /root/cg; echo rc=$?; "
        "mount -t cgroup -o none,name=hsl cgroup /root/cg; echo rc=$?; "
        "mount -t cgroup2 cgroup2 /root/cg; echo rc=$?; "
        "mount -t tmpfs tmpfs /root/cg; echo rc=$?; "
        "ls -A /root/cg /sys/fs/cgroup"
    )
    assert "rc=0" not in result.stdout, result.stdout + result.stderr
    assert "release_agent" not in result.stdout and "cgroup.procs" not in result.stdout


def test_proc_sys_cannot_be_remounted_writable_or_written(world: World) -> None:
    knobs = ("core_pattern", "panic_on_oops", "domainname")
    before = {k: Path(f"/proc/sys/kernel/{k}").read_text() for k in knobs}
    result = world.sb.exec(
        "mount -o remount,rw /proc/sys; echo rc=$?; "
        "mount -o remount,rw /proc; echo rc=$?; "
        "echo '|/root/evil' > /proc/sys/kernel/core_pattern; echo rc=$?; "
        "echo 1 > /proc/sys/kernel/panic_on_oops; echo rc=$?; "
        "sysctl -w kernel.domainname=evil; echo rc=$?"
    )
    codes = [line for line in result.stdout.splitlines() if line.startswith("rc=")]
    assert len(codes) == 5 and "rc=0" not in codes, result.stdout + result.stderr
    assert {k: Path(f"/proc/sys/kernel/{k}").read_text() for k in knobs} == before
    assert "|/root/evil" not in sh(world.sb, "cat /proc/sys/kernel/core_pattern").stdout
    lines = sh(world.sb, "cat /proc/mounts").stdout.splitlines()
    mounts = {line.split()[1]: line.split()[3].split(",") for line in lines}
    assert "ro" in mounts["/proc/sys"] and "ro" in mounts["/sys"]
    # kernel knobs and leaks under /proc are masked by /dev/null (never write to them here: where a
    # mask were missing, that would act on the host)
    masked = [f"/proc/{n}" for n in ("kcore", "keys", "timer_list", "sysrq-trigger") if Path(f"/proc/{n}").exists()]
    assert masked  # this kernel has /proc/keys and /proc/timer_list
    devices = sh(world.sb, "stat -c %t:%T " + " ".join(masked)).stdout.split()
    assert devices == ["1:3"] * len(masked)


def test_the_init_s_root_and_descriptors_are_out_of_reach(world: World) -> None:
    result = world.sb.exec(
        "ls /proc/1/root/; echo rc=$?; readlink /proc/1/root; echo rc=$?; readlink /proc/1/cwd; echo rc=$?; "
        "for fd in /proc/1/fd/*; do readlink $fd && echo LINK; cat $fd </dev/null >/dev/null 2>&1 "
        "&& echo OPENED; ls $fd/ >/dev/null 2>&1 && echo LISTED; done; "
        "cat /proc/1/environ; echo rc=$?; cat /proc/1/maps; echo rc=$?; "
        "nsenter -t 1 -m -p true; echo rc=$?"
    )
    assert "rc=0" not in result.stdout, result.stdout + result.stderr
    for word in ("LINK", "OPENED", "LISTED"):
        assert word not in result.stdout, result.stdout


def test_unshare_and_nsenter_do_not_lead_out(world: World) -> None:
    result = world.sb.exec(
        "unshare -m true; echo rc=$?; unshare -p -f true; echo rc=$?; unshare -n true; echo rc=$?; "
        "nsenter -t 1 -a true; echo rc=$?; nsenter --mount=/proc/1/ns/mnt true; echo rc=$?"
    )
    assert "rc=0" not in result.stdout, result.stdout + result.stderr
    # No user namespace can be created (the syscall filter); were one made, the privileges it
    # granted would stop at its borders.
    inner = world.sb.exec(
        "unshare -U -r -m sh -c '"
        "mkdir -p /root/u; mount -t cgroup -o memory cgroup /root/u; echo rc=$?; "
        "mount -o remount,rw /proc/sys; echo rc=$?; "
        "echo evil > /proc/sys/kernel/core_pattern; echo rc=$?; "
        f"ls -A /root/u {world.root_marker.parent} {world.hermes_home}'"
    )
    assert "rc=0" not in inner.stdout, inner.stdout + inner.stderr
    assert world.root_marker.name not in inner.stdout and "auth.json" not in inner.stdout


CHROOT_ESCAPE = r"""
import os
os.makedirs("/root/jail", exist_ok=True)
outside = os.open("/", os.O_RDONLY)
os.chroot("/root/jail")
os.fchdir(outside)  # the classic: a directory handle outside the new root...
for _ in range(64):
    os.chdir("..")  # ...from which ".." climbs past it
os.chroot(".")
print("\n".join(sorted(os.listdir("/root"))))
print("--")
print("\n".join(sorted(os.listdir("/"))))
"""


def test_the_classic_chroot_escape_ends_at_the_sandbox_root(world: World) -> None:
    result = sh(world.sb, f"python3 -c '{CHROOT_ESCAPE}'")
    root_listing, slash = result.stdout.split("--\n")
    assert world.root_marker.name not in root_listing  # still the sandbox's /root
    assert slash.split() == sh(world.sb, "ls -A / | sort").stdout.split()
    host_only = {p.name for p in world.backend.home.iterdir()}
    assert not host_only & set(root_listing.split())


OPEN_BY_HANDLE = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(8 + 128)
ctypes.c_uint.from_buffer(buf).value = 128
mount_id = ctypes.c_int()
open("/dev/shm/h", "w").close()  # tmpfs hands out file handles (the overlay root does not)
made = libc.name_to_handle_at(-100, b"/dev/shm/h", buf, ctypes.byref(mount_id), 0)
print("handle", "made" if made == 0 else ctypes.get_errno())
fd = libc.open_by_handle_at(os.open("/dev/shm", os.O_RDONLY), buf, os.O_RDONLY)
print("opened" if fd >= 0 else f"denied {ctypes.get_errno()}")
os.unlink("/dev/shm/h")
"""


def test_open_by_handle_at_is_denied(world: World) -> None:
    """The "shocker" escape: open_by_handle_at needs CAP_DAC_READ_SEARCH, which root inside lacks;
    the syscall filter refuses it and name_to_handle_at as well (see test_escapes.py)."""
    result = sh(world.sb, f"python3 -c '{OPEN_BY_HANDLE}'")
    assert result.stdout.split("\n") == ["handle 1", "denied 1", ""], result.stdout  # EPERM both


# capability numbers (linux/capability.h) root inside must not hold
DANGEROUS_CAPABILITIES = {
    "CAP_DAC_READ_SEARCH": 2, "CAP_LINUX_IMMUTABLE": 9, "CAP_NET_ADMIN": 12, "CAP_IPC_LOCK": 14,
    "CAP_SYS_MODULE": 16, "CAP_SYS_RAWIO": 17, "CAP_SYS_PTRACE": 19, "CAP_SYS_PACCT": 20,
    "CAP_SYS_ADMIN": 21, "CAP_SYS_BOOT": 22, "CAP_SYS_NICE": 23, "CAP_SYS_RESOURCE": 24, "CAP_SYS_TIME": 25,
    "CAP_SYS_TTY_CONFIG": 26, "CAP_MKNOD": 27, "CAP_AUDIT_CONTROL": 30, "CAP_MAC_OVERRIDE": 32,
    "CAP_MAC_ADMIN": 33, "CAP_SYSLOG": 34, "CAP_WAKE_ALARM": 35, "CAP_BLOCK_SUSPEND": 36, "CAP_PERFMON": 38,
    "CAP_BPF": 39, "CAP_CHECKPOINT_RESTORE": 40,
}


def test_root_inside_lacks_every_dangerous_capability_for_good(world: World) -> None:
    status = dict(line.split(":\t", 1) for line in sh(world.sb, "cat /proc/self/status").stdout.splitlines()
                  if ":\t" in line)
    for field in ("CapBnd", "CapEff", "CapPrm"):
        mask = int(status[field], 16)
        held = [name for name, bit in DANGEROUS_CAPABILITIES.items() if mask & (1 << bit)]
        assert held == [], f"{field}: {held}"
    assert status["NoNewPrivs"].strip() == "1"
    result = world.sb.exec("date -s '2001-01-01' >/dev/null; echo rc=$?; dmesg >/dev/null; echo rc=$?; "
                           "insmod /nonexistent.ko; echo rc=$?")
    assert "rc=0" not in result.stdout


def test_symlinks_planted_inside_do_not_steer_the_host_s_mask_writes(local_backend: LocalBackend) -> None:
    """Each start re-applies the masks to the writable layer, on the host, as root. If the sandbox
    replaced a parent of a masked path with a symlink to a host directory, following it would make
    the host write there (a scrubbed shadow file, a whiteout device, a directory)."""
    token = secrets.token_hex(4)
    victim = Path(tempfile.mkdtemp(prefix=f"hsl-victim-{token}-", dir="/tmp"))
    masked = visible_dir(f"mt-{token}")
    (masked / "secret").write_text("masked file\n")
    (masked / "subdir").mkdir()
    seen = inside(masked)
    try:
        masking = LocalBackend(local_backend.home, masks=(f"{seen}/secret", f"{seen}/subdir"))
        with new_sandbox(masking) as sb:
            assert _hidden_file(sb.exec(f"cat {seen}/secret"))  # masked at the first start
            if ROOTLESS:  # masks are mounts there: the sandbox cannot take them away to plant a symlink
                assert "Device or resource busy" in sb.exec(f"rm -rf {seen}").stderr
                sh(sb, f"rm -rf /etc && ln -s {victim} /etc")
            else:
                sh(sb, f"rm -rf {seen} && ln -s {victim} {seen} && rm -rf /etc && ln -s {victim} /etc")
            sb.stop()
            result = sb.exec("echo restarted")  # the next start applies the masks again
            planted = sorted(p.name for p in victim.iterdir())
            assert planted == [], f"the host wrote {planted} into {victim}"
            assert result.stdout == "restarted\n"
            assert not os.listxattr(victim)
            assert not ROOTLESS or _hidden_file(sb.exec(f"cat {seen}/secret"))
    finally:
        shutil.rmtree(victim, ignore_errors=True)
        shutil.rmtree(masked, ignore_errors=True)


# rootless: the one kind of store the user's filesystem gives (tests/store_rootless covers each)
@pytest.mark.parametrize("kind", ["auto"] if ROOTLESS else ["btrfs", "copy"])
def test_a_setuid_file_planted_inside_gives_no_host_user_root(kind: str) -> None:
    """The writable layer lives in the store on the host: a setuid-root file made inside must not
    be a way to root for an unprivileged host user (the store is unreachable, or mounted nosuid).
    The home is created by the backend in a world-readable parent, as /var/lib/hermes-sandboxes is.
    Rootless, the user itself runs it: root inside is the user, so the file is only ever the user's."""
    parent = temp_home("/tmp" if ROOTLESS else "/srv")
    parent.chmod(0o755)
    backend = LocalBackend(parent / "home", store=kind, image_size="2G")  # type: ignore[arg-type]
    try:
        with new_sandbox(backend) as sb:
            sh(sb, "cp /usr/bin/id /usr/local/bin/suid-id && chmod 4755 /usr/local/bin/suid-id")
            planted = backend.store.layer(sb.name) / "upper/usr/local/bin/suid-id"
            assert planted.stat().st_mode & stat.S_ISUID  # there on the host, setuid (to root inside)
            # a shell of the unprivileged user runs it (setpriv itself would resolve the path as root)
            drop = [] if ROOTLESS else ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
            as_nobody = subprocess.run([*drop, "sh", "-c", '"$0" -u', str(planted)], capture_output=True, text=True)
            assert as_nobody.returncode != 0 or as_nobody.stdout.strip() == str(os.getuid() if ROOTLESS else 65534)
    finally:
        teardown_backend(backend)
        shutil.rmtree(parent, ignore_errors=True)


def test_a_setuid_binary_gives_no_privilege_back(sandbox: LocalSandbox) -> None:
    """no_new_privs: an unprivileged user inside cannot climb back to root through a setuid file."""
    result = sh(sandbox, "cp /usr/bin/id /usr/local/bin/suid-id && chmod 4755 /usr/local/bin/suid-id && "
                         "setpriv --reuid 4321 --regid 4321 --clear-groups /usr/local/bin/suid-id -u; "
                         "setpriv --reuid 4321 --regid 4321 --clear-groups cat /etc/shadow; echo rc=$?")
    assert result.stdout.split() == ["4321", "rc=1"]


def test_shared_memory_and_ipc_of_the_host_are_invisible(world: World) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    ipc_private, ipc_creat, ipc_rmid = 0, 0o1000, 0
    segment = libc.shmget(ipc_private, 4096, ipc_creat | 0o600)  # a System V segment of the host
    assert segment >= 0, ctypes.get_errno()
    host_file = Path(f"/dev/shm/hsl-{secrets.token_hex(4)}")
    host_file.write_text("host shm")
    try:
        assert len(Path("/proc/sysvipc/shm").read_text().splitlines()) > 1
        assert host_file.name not in sh(world.sb, "ls -A /dev/shm").stdout
        assert sh(world.sb, "cat /proc/sysvipc/shm | wc -l").stdout.split() == ["1"]  # the header only
    finally:
        host_file.unlink()
        libc.shmctl(segment, ipc_rmid, None)


def test_signals_from_inside_reach_neither_the_init_nor_the_host(sandbox: LocalSandbox) -> None:
    host_sleep = subprocess.Popen(["sleep", "600"])
    try:
        sh(sandbox, "nohup sleep 7801 >/dev/null 2>&1 &")
        init = init_state(sandbox)["pid"]
        assert sandbox.exec("kill -KILL 1; kill -TERM 1; echo sent").stdout == "sent\n"
        # kill(-1): every process it may signal but itself (and the namespace's init)
        assert sandbox.exec("kill -KILL -1; echo survived").stdout == "survived\n"
        assert pid_alive(init) and init_state(sandbox)["pid"] == init
        # a killed process shows in /proc until it has finished exiting: poll (it lagged under load)
        wait_for(lambda: "sleep 7801" not in " ".join(sandbox_commands(sandbox)), "the killed sleep to go")
        assert host_sleep.poll() is None
        assert sandbox.exec(f"kill -KILL {host_sleep.pid}").exit_code != 0 or host_sleep.poll() is None
        assert host_sleep.poll() is None
    finally:
        host_sleep.kill()
        host_sleep.wait()


def test_host_users_cannot_reach_a_sandbox_s_control_socket(world: World) -> None:
    sockets = [p for p in (world.backend.home / "s").iterdir() if stat.S_ISSOCK(p.lstat().st_mode)]
    assert sockets
    assert stat.S_IMODE((world.backend.home / "s").stat().st_mode) & 0o077 == 0
    for path in sockets:
        assert stat.S_IMODE(path.lstat().st_mode) & 0o077 == 0
        if ROOTLESS:
            continue  # becoming another user takes root: the modes above are what keeps them out
        probe = subprocess.run(
            ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "/usr/bin/python3", "-c",
             "import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])", str(path)],
            capture_output=True, text=True)
        assert probe.returncode != 0 and "PermissionError" in probe.stderr, probe


# what root inside can do, and what that changes on the host (nothing) ------------------------------
def test_deleting_and_overwriting_host_files_inside_leaves_the_host_untouched(sandbox: LocalSandbox) -> None:
    host = view_root()  # rootless: the user's base, which holds what the sandbox sees
    before = {p: _sha(str(host / p)) for p in ("usr/bin/git", "etc/os-release", "etc/passwd")}
    sh(sandbox, "rm -rf /usr/bin/git /usr/share/git-core && echo overwritten > /etc/os-release && "
                "echo 'evil:x:0:0::/:/bin/sh' >> /etc/passwd && touch /etc/hsl-created-inside && "
                "chmod 777 /usr/bin && rm -rf /usr/lib/python3")
    assert sandbox.exec("git --version").exit_code == 127
    assert sh(sandbox, "cat /etc/os-release").stdout == "overwritten\n"
    assert {p: _sha(str(host / p)) for p in before} == before
    assert (host / "usr/share/git-core").is_dir() and (host / "usr/lib/python3").is_dir()
    assert not (host / "etc/hsl-created-inside").exists()
    assert oct(os.stat(host / "usr/bin").st_mode & 0o777) == oct(0o755)
    assert subprocess.run(["git", "--version"], capture_output=True).returncode == 0


def test_root_inside_administers_its_own_system(sandbox: LocalSandbox) -> None:
    result = sh(sandbox, """
        set -e
        useradd -m -u 4321 -s /bin/bash alice
        getent passwd alice
        test -d /home/alice
        setpriv --reuid 4321 --regid 4321 --clear-groups id -u
        mkdir -p /srv/app && echo data > /srv/app/file
        chown -R alice:alice /srv/app && chmod 0640 /srv/app/file
        stat -c '%U:%G %a' /srv/app/file
        mkdir /root/repo && cd /root/repo && git init -q . && echo hi > f && git add f
        git -c user.email=a@b -c user.name=a commit -qm first && git log --oneline | wc -l
        python3 -c 'print(sum(range(10)))'
    """)
    lines = result.stdout.split()
    assert lines[0].startswith("alice:x:4321:4321")
    assert lines[1:5] == ["4321", "alice:alice", "640", "1"]
    assert lines[5] == "45"
    assert "alice" not in Path("/etc/passwd").read_text()
    assert not Path("/srv/app").exists()


def test_root_inside_can_install_a_debian_package(sandbox: LocalSandbox) -> None:
    """What `apt-get install` does once it has the .deb: dpkg unpacks, chowns and records it."""
    result = sh(sandbox, """
        set -e
        mkdir -p /root/pkg/DEBIAN /root/pkg/usr/local/bin
        printf 'Package: hsl-hello\\nVersion: 1.0\\nArchitecture: all\\nMaintainer: t <t@t>\\n'\
'Description: test\\n' > /root/pkg/DEBIAN/control
        printf '#!/bin/sh\\necho hello from a package\\n' > /root/pkg/usr/local/bin/hsl-hello
        chmod 755 /root/pkg/usr/local/bin/hsl-hello
        dpkg-deb --root-owner-group -b /root/pkg /root/hsl-hello.deb >/dev/null
        dpkg -i /root/hsl-hello.deb >/dev/null
        hsl-hello
        dpkg -s hsl-hello | grep Status
    """, timeout=120)
    assert "hello from a package" in result.stdout
    assert "install ok installed" in result.stdout
    assert not Path("/usr/local/bin/hsl-hello").exists()
    host_status = subprocess.run(["dpkg", "-s", "hsl-hello"], capture_output=True)
    assert host_status.returncode != 0
