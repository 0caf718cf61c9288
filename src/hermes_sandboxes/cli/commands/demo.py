"""``hermes-sandboxes demo``: the rollback story, replayed for real on a local sandbox.

An agent builds an app, someone checkpoints it, then a command wipes the app together with git and
python3. Restoring the checkpoint brings all of it back in well under a second, and the host never
noticed. Every step is checked, not just shown: the demo exits non-zero if any of them does not
behave as told, and the sandbox is destroyed whatever happens (also on Ctrl-C).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

from hermes_sandboxes.cli.commands.checkpoints import show_preview
from hermes_sandboxes.cli.session import Session
from hermes_sandboxes.errors import SandboxError
from hermes_sandboxes.recorder.state import HostState
from hermes_sandboxes.sandbox import Backend, ChangeKind, ExecResult
from hermes_sandboxes.ui.output import Ui, error, one_line

APP = "/root/app"
MIGRATIONS = {
    "001_init.sql": b"CREATE TABLE schema_version (version INTEGER NOT NULL);\n"
                    b"INSERT INTO schema_version VALUES (1);\n",
    "002_users.sql": b"CREATE TABLE users (\n  id INTEGER PRIMARY KEY,\n  email TEXT NOT NULL UNIQUE\n);\n"
                     b"UPDATE schema_version SET version = 2;\n",
}
BREAK = f"rm -rf {APP} /usr/bin/python3 /usr/bin/git"
HOST_TOOLS = ("/usr/bin/git", "/usr/bin/python3")  # deleted inside; the host's (and the base's) must stay
STEPS = 10
COMMAND_TIMEOUT = 120.0


class DemoFailed(Exception):
    """A step did not behave as the story says."""


class Demo:
    def __init__(self, backend: Backend, ui: Ui, *, break_command: str = BREAK,
                 state: HostState | None = None) -> None:
        self.backend = backend
        self.state = state or HostState(durable=False)
        self.ui = ui
        self.break_command = break_command  # another command makes a demo that must fail (tests)
        self.session: Session | None = None
        self.base: str | None = None  # a local sandbox's base directory, once created
        self.step = 0
        self.timings: list[tuple[str, float]] = []

    # -- the story --------------------------------------------------------------------------------

    def run(self) -> int:
        failure: str | None = None
        try:
            self._preflight()
            self._create()
            self._build_app()
            checkpoint_id = self._checkpoint()
            self._break_it()
            self._show_damage()
            self._preview(checkpoint_id)
            self._restore(checkpoint_id)
            self._show_recovery()
            self._check_host()
        except (DemoFailed, SandboxError, OSError, subprocess.SubprocessError) as exc:
            failure = f"step {self.step}: {exc}" if self.step else str(exc)
        finally:
            cleanup_failure = self._destroy()
        failure = failure or cleanup_failure
        self._timings()
        if failure:
            error(f"demo failed at {failure}")
            return 1
        self.ui.line()
        self.ui.line("Demo passed: the sandbox was broken and restored, the host was never touched.",
                     style="bold green")
        return 0

    def _preflight(self) -> None:
        reason = self.backend.unavailable_reason()
        if reason:
            raise DemoFailed(f"{self.backend.name} sandboxes cannot run here: {reason}")
        missing = [tool for tool in HOST_TOOLS if not os.access(tool, os.X_OK)]
        if missing:
            raise DemoFailed(f"the demo deletes and restores {', '.join(missing)} inside the sandbox, "
                             "so the host needs them: apt-get install git python3")

    def _create(self) -> None:
        self._heading("Create a fresh sandbox",
                      "Its root filesystem is its base seen through a copy-on-write layer: "
                      "whatever happens inside lands in that layer only.")
        with self._timed("create", "creating the sandbox (the first one also prepares the store)…"):
            sandbox = self.backend.create_ephemeral(prefix="demo")
        self.session = Session(sandbox, self.state)
        self.session.record_create()
        self.ui.line(f"  sandbox {sandbox.name} (ephemeral: destroyed at the end, whatever happens)")
        lower = getattr(sandbox, "lower", None)  # a local sandbox's base (a cloud one's is the service's image)
        if isinstance(lower, str):
            self.base = lower
            self.ui.line("  its base: the host's own root filesystem" if lower == "/" else
                         f"  its base: {lower} (a tree of its own, not the host's root)")

    def _build_app(self) -> None:
        self._heading("Build a small app: two migrations in a git repository",
                      "The state worth protecting: the kind of work an agent does in a session.")
        session = self._session()
        with self._timed("build app", "writing the app…"):
            self._expect(f"mkdir -p {APP}/migrations", ok=True, quiet=True)
            for name, body in MIGRATIONS.items():
                session.sandbox.write_file(f"{APP}/migrations/{name}", body)
            self._expect(f"cd {APP} && git init -q -b main && git add -A && "
                         "git -c user.name=demo -c user.email=demo@localhost commit -q -m 'two migrations'",
                         ok=True, quiet=True)
        self._expect(f"find {APP}/migrations -type f | sort", ok=True)
        self._expect(f"git -C {APP} log --oneline", ok=True)

    def _checkpoint(self) -> str:
        self._heading("Checkpoint the healthy state",
                      "A snapshot of the sandbox's layer, with a comment saying what it holds.")
        with self._timed("checkpoint", "checkpointing…"):
            taken = self._session().checkpoint("app with two migrations; git and python3 work")
        self.ui.line(f"  checkpoint {taken.id}: {taken.comment}")
        return taken.id

    def _break_it(self) -> None:
        self._heading(f"Break it: {self.break_command}",
                      "One careless command deletes the app and the tools needed to rebuild it.")
        with self._timed("break", "deleting…"):
            self._expect(self.break_command, ok=True)

    def _show_damage(self) -> None:
        self._heading("Show that they are gone", "Each of these now fails inside the sandbox.")
        self._expect(f"ls {APP}/migrations", ok=False)
        self._expect("git --version", ok=False)
        self._expect("python3 --version", ok=False)

    def _preview(self, checkpoint_id: str) -> None:
        self._heading("See what a restore would throw away",
                      "Before rolling back, the files changed since the checkpoint and the commands run.")
        preview = self._session().preview(checkpoint_id)
        show_preview(self.ui, preview, max_rows=6)
        if preview.changes is not None:
            deleted = {c.path for c in preview.changes if c.kind is ChangeKind.DELETED}
            missing = [p for p in (APP, *HOST_TOOLS) if p not in deleted]
            if missing:
                raise DemoFailed(f"the diff does not show {', '.join(missing)} as deleted")

    def _restore(self, checkpoint_id: str) -> None:
        self._heading("Restore the checkpoint",
                      "The layer is swapped back atomically and the sandbox restarted.")
        with self._timed("restore", "restoring…"):
            self._session().restore(checkpoint_id)
        self.ui.line(f"  restored to {checkpoint_id}")

    def _show_recovery(self) -> None:
        self._heading("Show that everything is back", "The same commands succeed again.")
        self._expect("git --version", ok=True)
        self._expect("python3 --version", ok=True)
        self._expect(f"ls {APP}/migrations", ok=True)
        self._expect(f"git -C {APP} log --oneline", ok=True)
        sandbox = self._session().sandbox
        for name, body in MIGRATIONS.items():
            if sandbox.read_file(f"{APP}/migrations/{name}") != body:
                raise DemoFailed(f"{APP}/migrations/{name} came back with different contents")
        self.ui.line("  both migration files have their original contents", style="green")

    def _check_host(self) -> None:
        self._heading("Check that the host kept its own git and python3",
                      "The deletion happened in the sandbox's layer; run the host's tools to prove it.")
        for tool in HOST_TOOLS:
            done = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=30,
                                  check=False)
            self.ui.line(f"  host$ {tool} --version", style="bold")
            self.ui.line(f"    {one_line(done.stdout + done.stderr, 100)}", style="dim")
            if done.returncode != 0:
                raise DemoFailed(f"the host's {tool} failed (exit {done.returncode})")
        if self.base is not None and self.base != "/":  # the base under the sandbox's layer kept them too
            for tool in HOST_TOOLS:
                kept = os.path.join(self.base, tool.lstrip("/"))
                if not os.path.lexists(kept):
                    raise DemoFailed(f"the base lost {tool}: {kept} is gone")
                self.ui.line(f"  base: {kept} is still there", style="dim")
        self.ui.line("  the host is untouched", style="green")

    def _destroy(self) -> str | None:
        if self.session is None:
            return None
        self.step = STEPS - 1  # clean-up is always the last step, also after a failure
        self._heading("Clean up", "The demo's sandbox is destroyed with its checkpoints.")
        try:
            with self._timed("destroy", "destroying the sandbox…"):
                self.session.destroy()
        except SandboxError as exc:
            return f"clean-up: {exc}"
        finally:
            self.session.close()
        self.ui.line(f"  destroyed {self.session.name}")
        return None

    # -- helpers ----------------------------------------------------------------------------------

    def _session(self) -> Session:
        assert self.session is not None
        return self.session

    def _heading(self, title: str, why: str) -> None:
        self.step += 1
        self.ui.line()
        self.ui.line(f"[{self.step}/{STEPS}] {title}", style="bold cyan")
        self.ui.line(f"  {why}", style="dim")

    @contextmanager
    def _timed(self, label: str, status: str) -> Iterator[None]:
        started = time.monotonic()
        with self.ui.status(status):
            yield
        self.timings.append((label, time.monotonic() - started))

    def _expect(self, command: str, *, ok: bool, quiet: bool = False) -> ExecResult:
        """Run ``command`` in the sandbox; it must succeed (``ok``) or fail (not ``ok``)."""
        result = self._session().exec(command, policy="off", timeout=COMMAND_TIMEOUT).result
        if not quiet or result.ok != ok:
            self.ui.line(f"  $ {command}", style="bold")
            for text in (result.stdout + result.stderr).splitlines()[:12]:
                self.ui.line(f"    {text}", style="dim")
            mark = "as expected" if result.ok == ok else "NOT as expected"
            self.ui.line(f"    exit {result.exit_code} ({mark})", style="green" if result.ok == ok else "red")
        if result.ok != ok:
            wanted = "succeed" if ok else "fail"
            raise DemoFailed(f"`{one_line(command, 60)}` should {wanted} but exited {result.exit_code}")
        return result

    def _timings(self) -> None:
        if not self.timings:
            return
        self.ui.line()
        rows = [[label, f"{seconds * 1000:.0f} ms"] for label, seconds in self.timings]
        self.ui.table(["STEP", "TIME"], rows, title="Timings")


def run_demo(backend: Backend, ui: Ui, state: HostState | None = None) -> int:
    """Play the demo; 0 when every step behaved as told."""
    return Demo(backend, ui, state=state).run()
