"""Stopping one incarnation of a sandbox (its init and everything it started), fast and whole.

The init is PID 1 of the sandbox's pid namespace. When it dies the kernel kills every other process
of that namespace (daemons that detached, double-forked or started sessions of their own included,
and any nested pid namespace) and reports the init dead only once all of them are gone. So one
SIGKILL through a pidfd and a wait on that pidfd stop the whole tree, without freezing the cgroup
and polling it (that took 15-20 ms on cgroup v1). The cgroup kill stays as the backstop: nothing is
put into a sandbox's groups from outside its namespace, but whatever is found there afterwards is
killed the old way, so "stopped" never depends on that. Consecutive incarnations use alternate
cgroup boxes (see cgroups.base): stopping one kills what is in its box only, never a new
incarnation's already starting in the other.

The last process to leave the sandbox's mount namespace unmounts its overlay root, and an overlay's
unmount syncs the filesystem under it: the whole store, ~10 ms and more on a busy store, inside the
init's death. A restore throws the old layer away, so it holds the old mount namespace open across
the kill (``stop(hold_mounts=True)``) and lets go of it in the background once the new init runs.
"""

from __future__ import annotations

import contextlib
import os
import queue
import select
import signal
import threading
from collections.abc import Callable
from pathlib import Path

from hermes_sandboxes.backends.local import cgroups, paths
from hermes_sandboxes.errors import SandboxError


def open_init(pid: int, started: object) -> int | None:
    """A pidfd of the init recorded as ``pid`` started at ``started``; None if it is gone (or the
    pid now belongs to another process). Checked after opening: then the descriptor is that init."""
    if pid <= 0:
        return None
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    if paths.process_start_time(pid) != started:
        os.close(fd)
        return None
    return fd


def kill_init(pidfd: int) -> None:
    """Send the init SIGKILL (its namespace dies with it); returns at once."""
    with contextlib.suppress(ProcessLookupError):
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)


def wait_dead(pidfd: int, timeout: float = 10.0) -> None:
    """Wait until the init has exited, which the kernel allows only once every other process of its
    namespace has been reaped."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    if not poller.poll(timeout * 1000):
        raise SandboxError(f"the sandbox's init (pid fd {pidfd}) survived SIGKILL for {timeout:.0f}s")


def stop(pid: int, started: object, groups: cgroups.SandboxCgroups, *, hold_mounts: bool = False) -> int | None:
    """Kill the incarnation whose init is ``pid`` (its box: ``groups``) and wait until none of its
    processes is left. With ``hold_mounts``, returns a descriptor of its mount namespace (or None)
    for release_later."""
    thaw_if_frozen(groups)
    pidfd = open_init(pid, started)
    held = None
    if pidfd is not None:
        try:
            held = _mount_namespace(pid, pidfd) if hold_mounts else None
            kill_init(pidfd)
            wait_dead(pidfd)
        finally:
            os.close(pidfd)
    clear_groups(groups)
    return held


def _mount_namespace(pid: int, pidfd: int) -> int | None:
    """A descriptor of the mount namespace of the init behind ``pidfd`` (None if it died meanwhile:
    its pid may then name another process already)."""
    try:
        fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    if select.select([pidfd], [], [], 0)[0]:  # exited: the descriptor may be someone else's namespace
        os.close(fd)
        return None
    return fd


def release_later(fd: int | None) -> None:
    """Let go of a held mount namespace on the background thread: closing it unmounts the old root
    and syncs the store, which nobody needs to wait for (if this process exits first, the kernel
    closes it then)."""
    if fd is not None:
        _later(lambda: os.close(fd))


# One long-lived background thread per process for the work above: starting a thread per restore
# cost up to milliseconds on a busy machine.
_jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
_worker: threading.Thread | None = None
_worker_lock = threading.Lock()


def _later(job: Callable[[], None]) -> None:
    global _worker
    _jobs.put(job)
    with _worker_lock:
        if _worker is None:
            _worker = threading.Thread(target=_work_forever, name="hermes-sandboxes-background", daemon=True)
            _worker.start()


def _work_forever() -> None:
    while True:
        job = _jobs.get()
        with contextlib.suppress(Exception):  # best effort: the next stop or destroy tries again
            job()


def settle(timeout: float = 30.0) -> None:
    """Wait until the background work queued so far is done. Before a sandbox or its store goes:
    a held mount namespace keeps the store's filesystem (and its loop device) alive."""
    if _worker is None:
        return
    done = threading.Event()
    _later(done.set)
    done.wait(timeout)


def thaw_if_frozen(groups: cgroups.SandboxCgroups) -> None:
    """Thaw a sandbox left frozen (a checkpoint killed midway): on cgroup v1 a frozen process does
    not act on SIGKILL until thawed."""
    with contextlib.suppress(FileNotFoundError):  # the groups are gone: nothing in them to thaw
        if groups.is_frozen():
            groups.thaw()


def clear_groups(groups: cgroups.SandboxCgroups) -> None:
    """Kill whatever is still in the incarnation's box and wait until it is empty (normally nothing
    is left, so this only looks)."""
    if not groups.tracks_trees:
        return  # no group: killing the init ends its pid namespace, all of it
    if cgroups.procs(groups.freezer):
        cgroups.kill_group(groups.freezer, reaped=False)


def clear_others(groups: cgroups.SandboxCgroups, keep: str | None = None) -> None:
    """Kill what runs in any box of the sandbox but ``keep`` (normally nothing: an init whose
    starter was killed before recording it)."""
    for box in cgroups.BOXES:
        if box != keep:
            clear_groups(groups.with_box(box))


def prune_later(groups: cgroups.SandboxCgroups) -> None:
    """Remove the commands' groups a stopped incarnation left in its box, on the background thread
    (removing a cgroup took milliseconds each on a busy host; nothing waits for these)."""
    leftovers = groups.leftovers()
    if leftovers:
        _later(lambda: _remove(leftovers))


def _remove(groups: list[Path]) -> None:
    for group in groups:
        with contextlib.suppress(OSError):  # in use again, or gone already: a later stop tries again
            cgroups.remove_tree(group)
