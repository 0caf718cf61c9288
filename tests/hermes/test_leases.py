"""Writer leases between real processes: a child process holds (or marks) a scope's lease while this
process contends for it. The child is driven line by line over its stdin, so nothing sleeps."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_sandboxes.hermes.sync.leases import NotAdmitted, WriterLease

_CHILD = textwrap.dedent("""
    import sys
    from hermes_sandboxes.hermes.sync.leases import WriterLease
    lease = WriterLease(sys.argv[1], sys.argv[2], label="box")
    print("writer" if lease.try_acquire() else "reader", flush=True)
    for line in sys.stdin:
        getattr(lease, line.strip())()
        print("done", flush=True)
""")


class Child:
    """Another process with its own view of the lease; ``do("mark_dirty")`` calls that method there."""

    def __init__(self, directory: Path, scope: str, prelude: str = "") -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", prelude + _CHILD, str(directory), scope],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout is not None
        self.role = self.proc.stdout.readline().strip()

    def do(self, method: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(method + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "done", self.proc.stderr

    def exit(self) -> str:
        _, err = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, err
        return err


@pytest.fixture
def child(tmp_path: Path) -> Iterator[Child]:
    started = Child(tmp_path, "e2b-123/work")
    try:
        yield started
    finally:
        if started.proc.poll() is None:
            started.proc.kill()
            started.proc.wait()


def test_one_writer_per_scope_and_a_reader_takes_over_when_it_exits(tmp_path: Path, child: Child) -> None:
    assert child.role == "writer"
    mine = WriterLease(tmp_path, "e2b-123/work", label="box")
    assert not mine.try_acquire() and not mine.is_writer
    other = WriterLease(tmp_path, "e2b-123/other")  # another scope has its own writer
    assert other.try_acquire()
    other.release()
    child.exit()  # the writer's process ends: its lease goes with it
    assert mine.try_acquire() and mine.is_writer
    again = Child(tmp_path, "e2b-123/work")
    try:
        assert again.role == "reader"
    finally:
        mine.release()
        again.exit()
    assert mine.try_acquire()  # released explicitly too
    mine.release()


def test_a_reader_is_admitted_only_to_prepared_clean_state(tmp_path: Path, child: Child) -> None:
    reader = WriterLease(tmp_path, "e2b-123/work", label="box")
    assert not reader.try_acquire()
    with pytest.raises(NotAdmitted, match=r"still being prepared.*retry"):
        reader.admit()
    child.do("mark_prepared")
    reader.admit()
    child.do("mark_dirty")  # the writer's sync failed: fail closed until it succeeds again
    with pytest.raises(NotAdmitted, match=r"marked dirty.*retry"):
        reader.admit()
    child.do("mark_clean")
    reader.admit()
    child.do("begin_prepare")  # a new initial push (after a restore, a takeover) gates readers again
    with pytest.raises(NotAdmitted):
        reader.admit()
    with pytest.raises(RuntimeError, match="only the writer"):
        reader.mark_dirty()
    child.exit()


def test_without_flock_one_warning_and_every_process_writes(tmp_path: Path) -> None:
    # a platform without fcntl: the child hides the module before importing ours
    no_fcntl = "import sys\nsys.modules['fcntl'] = None\n"
    first = Child(tmp_path, "e2b-123/work", prelude=no_fcntl)
    second = Child(tmp_path, "e2b-123/work", prelude=no_fcntl)
    second.do("try_acquire")  # asking again does not warn again
    assert (first.role, second.role) == ("writer", "writer")
    for proc in (first, second):
        err = proc.exit()
        assert err.count("flock is not available") == 1, err


def _files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_the_last_holder_removes_the_lease_files_and_a_crashed_ones_are_removed_by_the_next(
        tmp_path: Path) -> None:
    writer = Child(tmp_path, "e2b-123/work")
    assert writer.role == "writer"
    writer.do("mark_prepared")
    writer.do("mark_dirty")
    assert len(_files(tmp_path)) == 3  # lock, prepared, dirty
    reader = WriterLease(tmp_path, "e2b-123/work", label="box")
    assert not reader.try_acquire()
    writer.do("release")
    assert _files(tmp_path) == []  # nothing left behind
    writer.exit()
    crashed = Child(tmp_path, "e2b-123/work")
    crashed.do("mark_prepared")
    crashed.proc.kill()  # no release: its files stay, its lock goes with the process
    crashed.proc.wait()
    assert len(_files(tmp_path)) == 2
    assert reader.try_acquire()  # the next writer takes over the files ...
    reader.release()
    assert _files(tmp_path) == []  # ... and removes them when it lets go


def test_a_destroyed_sandboxs_lease_files_are_discarded_unless_held(tmp_path: Path, child: Child) -> None:
    child.do("mark_prepared")
    mine = WriterLease(tmp_path, "e2b-123/work")
    assert not mine.discard() and len(_files(tmp_path)) == 2  # a writer holds them: left alone
    child.proc.kill()
    child.proc.wait()
    assert mine.discard() and _files(tmp_path) == []
    assert mine.discard()  # nothing there: nothing to do


_HAMMER = textwrap.dedent("""
    import os, sys
    from hermes_sandboxes.hermes.sync.leases import WriterLease
    directory, rounds = sys.argv[1], int(sys.argv[2])
    lease = WriterLease(directory, "e2b-123/work")
    held = 0
    for _ in range(rounds):
        if not lease.try_acquire():
            continue
        try:  # only one process may be the writer: a second one here is the bug this guards against
            fd = os.open(os.path.join(directory, "holder"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            print("two writers at once", flush=True)
            sys.exit(1)
        os.close(fd)
        os.unlink(os.path.join(directory, "holder"))
        held += 1
        lease.release()  # removes the lock file every time: contenders race the removal
    print(held, flush=True)
""")


def test_removing_the_lock_file_never_lets_two_processes_be_the_writer(tmp_path: Path) -> None:
    leases = tmp_path / "leases"
    procs = [subprocess.Popen([sys.executable, "-c", _HAMMER, str(leases), "1500"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outcomes = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outcomes
    assert sum(int(out) for out, _ in outcomes) > 0  # they did take turns
    assert sorted(p.name for p in leases.iterdir()) == []


_HOLDER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from hermes_sandboxes.util.flock import exclusive
    with exclusive(Path(sys.argv[1]), what="holding"):
        print("held", flush=True)
        sys.stdin.readline()
""")


def test_an_exclusive_lock_waits_for_its_holder_and_names_what_it_guards(tmp_path: Path) -> None:
    from hermes_sandboxes.errors import SandboxError
    from hermes_sandboxes.util.flock import exclusive

    path = tmp_path / "locks" / "box.allow.lock"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n", holder.communicate()
        with pytest.raises(SandboxError, match="changing box: another process has held the lock"), \
                exclusive(path, what="changing box", timeout=0.2):
            pytest.fail("entered a lock another process holds")
        holder.communicate("go\n", timeout=60)
        entered = False
        with exclusive(path, what="changing box", timeout=30):
            entered = True
        assert entered
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
