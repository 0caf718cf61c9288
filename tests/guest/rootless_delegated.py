"""Run inside the cgroup v2 guest only (tests/guest/test_rootless_guest.py passes it to the guest's
pytest): a rootless sandbox in a cgroup subtree delegated to a test user the way systemd does it
(root makes the group, hands the controllers down, chowns the group and its cgroup.procs,
cgroup.subtree_control and cgroup.threads to the user, and starts the user's process in it). The
sandbox's memory and pids limits hold there: a memory hog is killed, a fork bomb is contained."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.rootless import kit

CGROUP = Path("/sys/fs/cgroup")
SCENARIO = r"""
import json, sys
from hermes_sandboxes.backends.local import LocalBackend, cgroups
from hermes_sandboxes.sandbox import Limits, SandboxSpec

found = cgroups.probe()
backend = LocalBackend(sys.argv[1], base=sys.argv[2])
sb = backend.create("deleg", SandboxSpec(limits=Limits(memory_bytes=64 << 20, pids=32)))
seen = {"version": found.version, "limits": sorted(found.limits), "fatal": found.fatal,
        "tree_kill": "TREE_KILL" in {c.name for c in backend.capabilities}}
hog = sb.exec("x=$(head -c 300000000 /dev/zero | tr '\\0' a); echo survived", timeout=300)
seen["hog"] = [hog.exit_code, hog.stdout]
seen["oom_kills"] = sb.oom_kills()
bomb = sb.exec("b() { b | b & }; b; sleep 600", timeout=20)  # its timeout kills the command's group
seen["bomb"] = bomb.exit_code
groups = cgroups.from_state(sb._runtime()["cgroups"])
seen["pids_max"] = open(f"{groups.dirs['unified']}/pids.max").read().strip()
seen["pids_peak"] = open(f"{groups.dirs['unified']}/pids.peak").read().strip() if \
    __import__("os").path.exists(f"{groups.dirs['unified']}/pids.peak") else None
seen["after"] = sb.exec("echo alive").stdout
sb.destroy()
print(json.dumps(seen))
"""


def _busybox_base(user: kit.TestUser) -> Path:
    """A tiny base of the user's own: static busybox and its applets."""
    base = user.home / "bb"
    script = (f"mkdir -p {base}/bin {base}/etc {base}/root {base}/tmp {base}/proc {base}/sys {base}/dev && "
              f"cp /bin/busybox {base}/bin/ && cd {base}/bin && for a in sh head tr echo sleep cat ps kill true; "
              "do ln -s busybox $a; done && echo root:x:0:0::/root:/bin/sh > ../etc/passwd")
    out = user.run(["sh", "-c", script])
    assert out.returncode == 0, out.stderr
    return base


@pytest.fixture(scope="module")
def delegated_user() -> Iterator[tuple[kit.TestUser, Path, Path]]:
    name = f"{kit.PREFIX}g{os.getpid()}"
    store_img, store = Path("/tmp/hs-rootless-store.img"), Path("/tmp/hs-rootless-store")
    group = CGROUP / "hs-rootless-deleg"
    try:
        user = kit.create_user(name)
        kit.provision(user, with_base=False)
        for controller in ("memory", "pids", "cpu"):
            (CGROUP / "cgroup.subtree_control").write_text(f"+{controller}")
        group.mkdir()
        for path in (group, group / "cgroup.procs", group / "cgroup.subtree_control", group / "cgroup.threads"):
            os.chown(path, user.uid, user.gid)
        subprocess.run(["truncate", "-s", "700M", str(store_img)], check=True)
        subprocess.run(["mkfs.btrfs", "-q", str(store_img)], check=True)
        store.mkdir()
        subprocess.run(["mount", "-o", "loop,user_subvol_rm_allowed", str(store_img), str(store)], check=True)
        os.chown(store, user.uid, user.gid)
        yield user, group, store
    finally:
        kit.remove_user(name)
        subprocess.run(["umount", str(store)], check=False)
        for leftover in sorted(group.glob("**/"), key=lambda p: len(p.parts), reverse=True) if group.exists() else []:
            leftover.rmdir()


def test_memory_and_pids_limits_hold_in_a_delegated_subtree(delegated_user: tuple[kit.TestUser, Path, Path]) -> None:
    user, group, store = delegated_user
    base = _busybox_base(user)
    env = " ".join(f"{k}={v}" for k, v in user.env().items())
    script = user.home / "scenario.py"
    script.write_text(SCENARIO)
    # root puts the user's process into the delegated group, as systemd starts a delegated unit's
    command = (f"echo $$ > {group}/cgroup.procs && exec runuser -u {user.name} -- env -i {env} "
               f"{user.python} {script} {store}/home {base}")
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=900, cwd=str(kit.REPO))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["version"] == 2 and seen["limits"] == ["cpu", "memory", "pids"] and not seen["fatal"], seen
    assert seen["tree_kill"]
    assert seen["hog"][0] == 137 and "survived" not in seen["hog"][1], seen
    assert seen["oom_kills"] and seen["oom_kills"] > 0
    assert seen["pids_max"] == "32"
    assert seen["pids_peak"] is None or int(seen["pids_peak"]) <= 32
    assert seen["after"] == "alive\n"
