"""Hide a store that appears while other stores' sandboxes run, in those sandboxes, at once.

An init hides the other stores it knows of when it starts (launcher.py, rootfs.hide). A store
registered later would stay readable to the sandboxes already running (their root is an overlay
of the host's /, which shows new host directories) until their next start. So the first
registration of a store covers its home in every running sandbox's mount namespace too.

That is done by a short-lived helper process: it opens every target's mount namespace while it
still sees the host's /proc, checks each descriptor belongs to the init it expects (the pid's start
time, and never the host's own namespace), then enters each with setns and mounts there. It runs no
program and imports nothing after entering a sandbox's namespace, whose files the sandbox controls.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

from hermes_sandboxes.backends.local import paths
from hermes_sandboxes.backends.local.guest import masks
from hermes_sandboxes.util import isolated

log = logging.getLogger(__name__)
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[3])
_HELPER = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
from hermes_sandboxes.backends.local.guest import rootfs, syscalls as sc
target = sys.argv[2]
own = os.open("/proc/self/ns/mnt", os.O_RDONLY)
own_ino = os.fstat(own).st_ino
entries = []
for item in sys.argv[3:]:
    pid, start = item.split(":")
    try:
        ns = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY)
        with open(f"/proc/{pid}/stat") as f:
            same = f.read().rsplit(")", 1)[1].split()[19] == start
    except OSError:
        continue
    if same and os.fstat(ns).st_ino != own_ino:
        entries.append(ns)
    else:
        os.close(ns)
done = 0
for ns in entries:
    try:
        sc.setns(ns, sc.CLONE_NEWNS)
    except OSError as exc:  # that sandbox is going away
        sys.stderr.write(f"{exc}\n")
        continue
    try:
        rootfs.hide([target])
        done += 1
    except OSError as exc:
        sys.stderr.write(f"{exc}\n")
    sc.setns(own, sc.CLONE_NEWNS)
print(done)
"""


def running_inits(but: str = "") -> list[tuple[int, int]]:
    """(pid, start time) of every live init of every registered store except the one at ``but``."""
    found = []
    for home in masks.registered_stores():
        if home == but:
            continue
        for state_file in Path(home, "run").glob("*/init.json"):
            state = paths.read_json(state_file)
            if not isinstance(state, dict) or state.get("boot") != paths.boot_id():
                continue
            pid, start = int(state.get("pid", 0)), state.get("start")
            if pid > 0 and start is not None and paths.process_start_time(pid) == start:
                found.append((pid, int(start)))
    return found


def hide_store_from_running_sandboxes(home: Path) -> int:
    """Cover ``home`` in every running sandbox of the other stores; returns how many it reached.

    A failure is logged, not raised: it must not stop this store's own work, and a sandbox it
    missed still hides the store from its next start on (the registry entry stays)."""
    own = str(Path(home).resolve())
    targets = running_inits(but=own)  # the store's own sandboxes mask it in their layers
    if not targets:
        return 0
    try:
        proc = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _HELPER, _PACKAGE_PARENT, own, *(f"{p}:{s}" for p, s in targets)],
            capture_output=True, text=True, timeout=30, cwd=isolated.CWD,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("could not hide the new store %s from running sandboxes: %s", own, exc)
        return 0
    if proc.returncode != 0 or proc.stderr.strip():
        log.warning("hiding the new store %s from running sandboxes: %s", own, proc.stderr.strip()[-400:])
    try:
        return int(proc.stdout.strip())
    except ValueError:
        return 0
