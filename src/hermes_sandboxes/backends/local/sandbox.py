"""One local sandbox: its init's lifecycle, commands, files and checkpoints."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from hermes_sandboxes.backends.local import cgroups, client, incarnation, paths
from hermes_sandboxes.backends.local.guest import fileops, protocol
from hermes_sandboxes.errors import (
    CheckpointNotFound,
    ExecFailed,
    InvalidInput,
    SandboxError,
    SandboxFileNotFound,
    SandboxNotFound,
    SandboxUnreachable,
    Unsupported,
)
from hermes_sandboxes.sandbox import (
    Checkpoint,
    Command,
    FileChange,
    IdleStop,
    OutputSink,
    Process,
    Sandbox,
    SandboxInfo,
    SandboxSpec,
    SandboxState,
    check_tag,
)
from hermes_sandboxes.util import failpoints
from hermes_sandboxes.util.lazy import lazy_module
from hermes_sandboxes.util.values import replace

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hot path of a CLI exec)
if TYPE_CHECKING:
    from typing import Any

    from hermes_sandboxes import allowlist as policy
    from hermes_sandboxes.backends.local import egress, hiding, launcher, trust
    from hermes_sandboxes.backends.local.backend import LocalBackend
    from hermes_sandboxes.backends.local.guest import masks
    from hermes_sandboxes.backends.local.store import base as storage
    from hermes_sandboxes.backends.local.store import treediff
    from hermes_sandboxes.sandbox import Stdin
else:  # loaded when used: an exec in a running sandbox (the CLI's hot path) needs none of them
    egress = lazy_module("hermes_sandboxes.backends.local.egress")
    hiding = lazy_module("hermes_sandboxes.backends.local.hiding")
    launcher = lazy_module("hermes_sandboxes.backends.local.launcher")
    masks = lazy_module("hermes_sandboxes.backends.local.guest.masks")
    storage = lazy_module("hermes_sandboxes.backends.local.store.base")
    treediff = lazy_module("hermes_sandboxes.backends.local.store.treediff")
    trust = lazy_module("hermes_sandboxes.backends.local.trust")
    policy = lazy_module("hermes_sandboxes.allowlist")


# Commands start with this environment, never the host's; the caller's env is laid over it.
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "USER": "root",
    "LOGNAME": "root",
    "SHELL": "/bin/bash",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
}


class LocalSandbox(Sandbox):
    def __init__(self, backend: LocalBackend, name: str, meta: Mapping[str, Any]) -> None:
        self._backend = backend
        self.name = name
        self.ephemeral = bool(meta.get("ephemeral", False))
        self.spec = SandboxSpec.from_dict(meta.get("spec") or {})
        # what the backend's settings were at creation: older sandboxes kept base and masks in the spec
        local = meta.get("local") or meta.get("spec") or {}
        self.local_meta: dict[str, Any] = {"base": local.get("base"), "masks": list(local.get("masks") or ())}
        self.created_at = float(meta.get("created_at", 0.0))
        layout = backend.layout
        self._meta_file = layout.meta_file(name)
        self._run = layout.run_dir(name)
        self._lock = layout.lock_file(name)
        self._use_lock = self._lock.with_suffix(".use")  # held shared while a request is on its way
        self._stops = self._run / "stops.jsonl"  # the init's notes of its idle stops
        self._socket = layout.socket_file(name)
        self._cgroups: cgroups.SandboxCgroups | None = None
        self._runtime_cache: tuple[tuple[int, int], dict[str, Any]] | None = None

    @property
    def backend(self) -> LocalBackend:
        return self._backend

    def _network_env(self) -> Mapping[str, str]:
        if self.spec.network != "proxy":
            return {}
        return egress.command_env(self._run, self._backend.credentials)

    def _locked(self) -> Any:
        return paths.locked(self._lock, f"sandbox {self.name}")

    def _check_exists(self) -> None:
        if not self._meta_file.exists():
            if self.broken:
                raise SandboxNotFound(f"sandbox {self.name} is broken (a create or destroy that never finished "
                                      f"left it behind); remove it with: hermes-sandboxes rm {self.name}")
            raise SandboxNotFound(f"sandbox {self.name} does not exist (destroyed?); create it first")

    @property
    def broken(self) -> bool:
        """No record, but a layer or run directory left by a create or destroy killed midway (and
        nobody is creating it right now: a create holds the sandbox's lock throughout)."""
        return (not self._meta_file.exists() and self._backend.store_leftovers(self.name)
                and not paths.is_locked(self._lock))

    # lifecycle ---------------------------------------------------------------------------------
    def _runtime(self) -> dict[str, Any] | None:
        """The init's record if that init is alive (same boot, same process), else None."""
        path = self._run / "init.json"
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        key = (st.st_ino, st.st_mtime_ns)
        if self._runtime_cache is None or self._runtime_cache[0] != key:
            state = paths.read_json(path)
            if not isinstance(state, dict):
                return None
            self._runtime_cache = (key, state)
        state = self._runtime_cache[1]
        if state.get("boot") != paths.boot_id() or state.get("protocol") != protocol.VERSION:
            return None
        pid = int(state.get("pid", 0))
        if pid <= 0 or paths.process_start_time(pid) != state.get("start"):
            return None
        return state

    def is_running(self) -> bool:
        return self._runtime() is not None

    def _ensure_running(self) -> tuple[str, Path | None]:
        """Socket path and freezer group of a running init, starting one if needed."""
        state = self._runtime()
        if state is None:
            with self._locked():
                self._check_exists()
                state = self._runtime()
                if state is None:
                    self._stop()  # whatever is left of an init we cannot use (crashed, older version)
                    state = self._start()
        if self.spec.network == "proxy" and not egress.alive(state.get("egress")):
            with self._locked():
                state = self._restart_proxy()
        groups = cgroups.from_state(state["cgroups"])
        if groups.is_frozen() and not paths.is_locked(self._lock):
            groups.thaw()  # a checkpoint was killed while the sandbox was frozen
        return str(self._socket), groups.freezer if groups.tracks_trees else None

    def _prepare_start(self, current: cgroups.SandboxCgroups | None = None,
                       ) -> tuple[cgroups.SandboxCgroups, launcher.Launch]:
        """The next incarnation's groups (the box ``current``'s incarnation does not use) and its
        launcher, already joining them."""
        base = current or cgroups.for_sandbox(self._backend.home, self.name)
        groups = base.with_box(cgroups.next_box(current.box if current else None))
        groups.create(self._backend.effective_limits(self.spec.limits))
        incarnation.thaw_if_frozen(groups)  # left frozen by a checkpoint killed midway: the launcher would stop
        incarnation.clear_groups(groups)  # the launcher joins an empty box (a start cut short may have left one)
        extras = self._backend.launch_extras(self.name, self, groups)
        owner = extras["userns"]["outer"] if extras["userns"]["mode"] == "root" else None
        if owner is not None and groups.tracks_trees:
            groups.delegate(*owner)
        return groups, launcher.Launch(self.name, groups.join_dirs, self.spec.network, self._backend.home,
                                       self.lower, extras)

    def _recorded_groups(self) -> cgroups.SandboxCgroups | None:
        """The groups of the incarnation init.json records for this boot (running or not)."""
        state = paths.read_json(self._run / "init.json")
        if isinstance(state, dict) and state.get("boot") == paths.boot_id() and state.get("cgroups"):
            return cgroups.from_state(state["cgroups"])
        return None

    def _start(self, *, store_clean: bool = False, limited: bool = False,
               prepared: tuple[cgroups.SandboxCgroups, launcher.Launch] | None = None) -> dict[str, Any]:
        """Start the init (caller holds the lock; ``store_clean``: it has just run the store's gc;
        ``limited``: its layer is under the sandbox's disk limit already (a restore's);
        ``prepared``: what _prepare_start gave it, else made here)."""
        store = self._backend.store
        store.ensure()
        if not store_clean:
            store.gc(self.name)
        layer = store.layer(self.name)
        if not layer.is_dir():
            raise SandboxError(f"sandbox {self.name}: its writable layer is missing from the store")
        # the launcher joins the groups and makes the namespaces (a restore's has already) while
        # the masks, the disk limit and the run directory are made ready here
        groups, launch = prepared or self._prepare_start()
        try:
            self.apply_masks()  # again: masks added to the settings since creation take effect now
            if not limited:
                store.set_disk_limit(self.name, self.spec.limits.disk_bytes)
            self._run.mkdir(parents=True, exist_ok=True)
            (self._run / "root").mkdir(exist_ok=True)
            self._socket.parent.mkdir(mode=0o700, exist_ok=True)
            self._cgroups = groups
            pid = launch.finish(self._init_config(layer, groups))
        finally:
            launch.close()
        failpoints.pause("start-unrecorded")
        state: dict[str, Any] = {"pid": pid, "start": paths.process_start_time(pid), "boot": paths.boot_id(),
                                 "cgroups": groups.to_state(), "protocol": protocol.VERSION}
        if self.spec.network == "proxy":
            try:
                state["egress"] = self._start_proxy(pid)
            except BaseException:
                groups.kill_all()  # no half-started sandbox: the next command starts both again
                if not groups.tracks_trees:
                    incarnation.stop(pid, paths.process_start_time(pid), groups)
                raise
        paths.write_json(self._run / "init.json", state, durable=False)  # meaningless after a reboot
        return state

    def _trust_layer(self, upper: Path, lower: str) -> list[trust.Entry] | None:
        """The layer that puts the proxy's CA in the system trust store, when credentials are brokered."""
        if self.spec.network != "proxy":
            return None
        backend = self._backend
        entries = trust.prepare(upper=upper, lower=Path(lower), ca_dir=backend.home / "egress-ca",
                                brokering=bool(backend.credentials))
        if entries is None or not backend.rootless:
            return entries
        # the init makes this layer inside the user's namespace: the base's host ids, as ids inside
        # (else /etc/ssl/certs there is a subordinate id's, which the user cannot write once copied up)
        idmap = backend.rootless_map
        return [(rel, kind, data, mode, *idmap.inner_ids(uid, gid), at, mt)
                for rel, kind, data, mode, uid, gid, at, mt in entries]

    def _init_config(self, layer: Path, groups: cgroups.SandboxCgroups) -> dict[str, Any]:
        return {
            "name": self.name,
            "hostname": self.name,
            "lower": self.lower,
            "upper": str(layer / "upper"),
            "work": str(layer / "work"),
            "merged": str(self._run / "root"),
            "socket": str(self._socket),
            "log": str(self._run / "init.log"),
            "network": self.spec.network,
            "trust": self._trust_layer(layer / "upper", self.base or "/"),
            "cgroups": groups.join_dirs,
            "freezer": str(groups.freezer) if groups.tracks_trees else None,
            "idle_timeout": self.spec.idle_timeout,
            "stops": str(self._stops),
            "use_lock": str(self._use_lock),
            "shm_bytes": _shm_bytes(self._backend.effective_limits(self.spec.limits).memory_bytes),
        }

    def _reload_spec(self) -> None:
        """The spec as recorded now: another process (the CLI's ``network allow``) may have changed
        the allow-list since this object read it, and a stale copy must neither be reported nor
        handed to a proxy that starts."""
        meta = paths.read_json(self._meta_file)
        if isinstance(meta, dict) and meta.get("spec"):
            self.spec = SandboxSpec.from_dict(meta["spec"])

    def _start_proxy(self, init_pid: int) -> dict[str, Any]:
        backend = self._backend
        self._reload_spec()
        return egress.start_proxy(
            sandbox=self.name, init_pid=init_pid, run_dir=self._run, allow=self.spec.allow,
            audit=backend.audit_log(), ca_dir=backend.home / "egress-ca", lower=self.base or "/",
            credentials=backend.credentials, upstream_ca=backend.upstream_ca, lookup=backend.secret_lookup,
            via_init=str(self._socket) if backend.rootless else None)

    def _restart_proxy(self) -> dict[str, Any]:
        """Start the egress proxy again for a running init whose proxy died (caller holds the lock)."""
        state = self._runtime()
        if state is None:  # the init died meanwhile: start both again
            self._stop()
            return self._start()
        if not egress.alive(state.get("egress")):
            state = {**state, "egress": self._start_proxy(int(state["pid"]))}
            paths.write_json(self._run / "init.json", state, durable=False)
        return state

    def set_allow(self, allow: Sequence[str]) -> None:
        """Replace the sandbox's egress allow-list. A running sandbox's proxy applies it to the next
        connection it sees (connections already open keep going); the list is kept for restarts."""
        entries = policy.validate(allow)
        with self._locked():
            self._check_exists()
            if self.spec.network != "proxy":
                raise InvalidInput(f"sandbox {self.name} has network {self.spec.network!r}; an allow-list "
                                   "only applies to network 'proxy'")
            meta = paths.read_json(self._meta_file)
            assert isinstance(meta, dict)
            self.spec = replace(self.spec, allow=entries)
            meta["spec"] = self.spec.to_dict()
            paths.write_json(self._meta_file, meta)
            if self._run.is_dir():
                egress.EgressFiles(self._run).write_policy(entries)

    @property
    def lower(self) -> str:
        """What the overlay root is built on: the base, else the host's / (root mode)."""
        return self.base or "/"

    @property
    def base(self) -> str | None:
        """The root filesystem directory this sandbox was built on (None: the host's ``/``)."""
        base = self.local_meta.get("base")
        return str(base) if base else None

    def apply_masks(self) -> None:
        """Hide host secrets in the writable layer (idempotent). Done at creation, so that a
        checkpoint taken before the first command already has them and diffs never show them."""
        if self._backend.rootless:
            return  # its base is its own tree: masks are mounts the init makes (launch_extras)
        if masks.register_store(self._backend.home):  # other stores' sandboxes hide this one from now on
            hiding.hide_store_from_running_sandboxes(self._backend.home)
        extra = [*self.local_meta["masks"], *(m for m in self._backend.masks if m not in self.local_meta["masks"])]
        # The host state (journals and audit logs of every sandbox) is hidden wherever it is; made
        # now if missing, since a directory that appears later in the base would be seen at once.
        if self.base is None:
            mask_list = masks.mask_paths(self._backend.home, [*extra, str(self._backend.host_state_dir())])
        else:
            mask_list = extra
        masks.apply_masks(self._backend.store.layer(self.name) / "upper", Path(self.base or "/"), mask_list)

    def _groups(self) -> cgroups.SandboxCgroups:
        if self._cgroups is None:
            state = paths.read_json(self._run / "init.json")
            if isinstance(state, dict) and state.get("boot") == paths.boot_id() and state.get("cgroups"):
                self._cgroups = cgroups.from_state(state["cgroups"])
            else:
                self._cgroups = cgroups.for_sandbox(self._backend.home, self.name)
        return self._cgroups

    def oom_kills(self) -> int | None:
        return self._groups().oom_kills() if self.is_running() else 0

    def stop(self) -> None:
        """Kill every process of the sandbox; its files stay. The next command starts it again."""
        with self._locked():
            self._stop()

    def _stop(self, *, hold_mounts: bool = False, keep: str | None = None) -> int | None:
        """Stop the init, and whatever runs in the other box unless it is ``keep`` (a restore's new
        incarnation); with ``hold_mounts``, return its mount namespace held (see incarnation)."""
        state = paths.read_json(self._run / "init.json")
        held, recorded = None, None
        if isinstance(state, dict) and state.get("boot") == paths.boot_id() and state.get("cgroups"):
            recorded = cgroups.from_state(state["cgroups"])
            held = incarnation.stop(int(state.get("pid", 0)), state.get("start"), recorded,
                                    hold_mounts=hold_mounts)
            egress.stop_proxy(state.get("egress"))
            incarnation.prune_later(recorded)
        # without a record from this boot an init may still run (its starter killed before writing one)
        incarnation.clear_others(recorded or cgroups.for_sandbox(self._backend.home, self.name), keep)
        (self._run / "init.json").unlink(missing_ok=True)
        return held

    def _state(self) -> SandboxState:
        """Running, stopped, or paused while a checkpoint holds it frozen. A sandbox left frozen by a
        checkpoint that died (kill -9) is thawed here, as the next command would: never reported
        running while nothing in it can run."""
        runtime = self._runtime()
        if runtime is None:
            return SandboxState.STOPPED
        groups = cgroups.from_state(runtime["cgroups"])
        with contextlib.suppress(OSError):
            if groups.is_frozen():
                if paths.is_locked(self._lock):
                    return SandboxState.PAUSED  # a checkpoint is being taken right now
                groups.thaw()
        return SandboxState.RUNNING

    def info(self) -> SandboxInfo:
        if self.broken:
            left = self._backend.store.sandbox_dir(self.name)
            when = (left if left.exists() else self._run).stat().st_mtime  # about when it broke
            return SandboxInfo(name=self.name, backend=self._backend.name, ephemeral=False,
                               state=SandboxState.BROKEN, created_at=when, spec=self.spec)
        self._check_exists()
        self._reload_spec()
        store = self._backend.store
        store.ensure()
        layer = store.layer(self.name)
        return SandboxInfo(
            name=self.name,
            backend=self._backend.name,
            ephemeral=self.ephemeral,
            state=self._state(),
            created_at=self.created_at,
            spec=self.spec,
            layer_bytes=store.layer_bytes(self.name) if layer.is_dir() else None,
            checkpoint_count=len(store.checkpoint_ids(self.name)),
        )

    # commands ----------------------------------------------------------------------------------
    @staticmethod
    def _request(command: Command, cwd: str | None, env: Mapping[str, str] | None, name: str,
                 network_env: Mapping[str, str]) -> dict[str, Any]:
        if isinstance(command, str):
            request: dict[str, Any] = {"shell": command}
            _refuse_nul("command", command)
        else:
            argv = [str(a) for a in command]
            if not argv:
                raise InvalidInput("empty command: give a program to run")
            for arg in argv:
                _refuse_nul("command argument", arg)
            request = {"argv": argv}
        if cwd is not None and not cwd.startswith("/"):
            raise InvalidInput(f"working directory must be absolute, got {cwd!r}")
        if cwd is not None:
            _refuse_nul("working directory", cwd)
        for key, value in (env or {}).items():
            # what the kernel cannot pass to a program: refused here, before the init sees it
            if not key or "=" in key or "\0" in key:
                raise InvalidInput(f"invalid environment variable name {key!r}")
            _refuse_nul(f"environment variable {key}", str(value))
        request["cwd"] = cwd
        request["env"] = {**BASE_ENV, "HOSTNAME": name, **network_env, **(env or {})}
        return request

    def start(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: Stdin = None,
        on_stdout: OutputSink | None = None,
        on_stderr: OutputSink | None = None,
        tag: str | None = None,
    ) -> Process:
        request = self._request(command, cwd, env, self.name, self._network_env())
        return self._launch(request, stdin, on_stdout, on_stderr, background=True, tag=tag)

    def _start_for_exec(
        self,
        command: Command,
        *,
        cwd: str | None,
        env: Mapping[str, str] | None,
        stdin: Stdin,
        on_stdout: OutputSink,
        on_stderr: OutputSink,
        tag: str | None = None,
    ) -> Process:
        request = self._request(command, cwd, env, self.name, self._network_env())
        return self._launch(request, stdin, on_stdout, on_stderr, background=False, tag=tag)

    def attach(self, command: Command, fds: tuple[int, int, int], *, cwd: str | None = None,
               env: Mapping[str, str] | None = None, tag: str | None = None) -> client.LocalProcess:
        """Run ``command`` on the caller's own stdin, stdout and stderr descriptors (e.g. the slave
        side of a pseudo-terminal for an interactive shell). Output goes straight there, so the
        process has no sinks; ``wait()`` and ``kill()`` work as for ``start()``."""
        request = self._request(command, cwd, env, self.name, self._network_env())
        return self._launch(request, None, None, None, background=False, attach=fds, tag=tag)

    def kill_tagged(self, tag: str) -> bool:
        """The command's group is named after its tag (``x<tag>``, in the freezer hierarchy of the
        running incarnation), so it holds that command and all it started, and nothing else;
        a stopped sandbox runs nothing. The group itself is left to the init, which removes it."""
        check_tag(tag)
        self._check_exists()
        runtime = self._runtime()
        if runtime is None:
            return False
        groups = cgroups.from_state(runtime["cgroups"])
        if not groups.tracks_trees:
            return bool(cgroups.ask_init(str(self._socket), {"op": "kill", "id": tag}).get("killed"))
        group = groups.freezer / f"x{tag}"
        if not cgroups.procs(group):
            return False
        cgroups.kill_group(group)
        return True

    def open_terminal(self) -> tuple[int, int]:
        """A pty in the sandbox's own devpts, so ``tty`` inside names it (backends/local/pty.py)."""
        self._check_exists()
        self._ensure_running()
        state = self._runtime()
        if state is None:
            raise SandboxUnreachable(f"sandbox {self.name} stopped while a terminal was being opened")
        from hermes_sandboxes.backends.local import pty

        return pty.open_in(int(state["pid"]), self.name)

    def _launch(self, request: dict[str, Any], stdin: Stdin, on_stdout: OutputSink | None,
                on_stderr: OutputSink | None, *, background: bool,
                attach: tuple[int, int, int] | None = None, tag: str | None = None) -> client.LocalProcess:
        if tag is not None:
            check_tag(tag)
        self._check_exists()
        with self._in_use():
            sock, freezer = self._ensure_running()
            return client.LocalProcess(sandbox=self.name, socket_path=sock, freezer=freezer, request=request,
                                       stdin=stdin, on_stdout=on_stdout, on_stderr=on_stderr,
                                       background=background, attach=attach, exec_id=tag)

    @contextlib.contextmanager
    def _in_use(self, exclusive: bool = False) -> Iterator[None]:
        """The use lock, shared from the check that the init runs until the request is queued at
        its socket: an init whose idle time ran out stops only when it gets the lock exclusively,
        so it sees that request and stays, or this waits for it to be gone and starts another
        (see guest/init.py). Only sandboxes with an idle timeout pay for it (two flock calls)."""
        if not self.spec.idle_timeout:
            yield
            return
        self._use_lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._use_lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)

    def take_idle_stops(self) -> list[IdleStop]:
        """The init's notes of its idle stops, taken under the use lock held exclusively (an init
        writes one only while it holds that lock, right before it exits). One ``stat`` when none."""
        try:
            if os.stat(self._stops).st_size == 0:
                return []
        except FileNotFoundError:
            return []
        with self._in_use(exclusive=True):
            try:
                fd = os.open(self._stops, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                return []
            try:
                data = os.read(fd, 1 << 20)
                os.ftruncate(fd, 0)
            finally:
                os.close(fd)
        stops = []
        for line in data.decode(errors="replace").splitlines():
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                note = json.loads(line)
                stops.append(IdleStop(float(note["at"]), note.get("idle_timeout")))
        return stops

    def _file_op(self, op: str, path: str, data: bytes | None = None, mode: int = 0o644) -> bytes:
        if not path.startswith("/"):
            raise InvalidInput(f"sandbox paths must be absolute, got {path!r}")
        out, err = bytearray(), bytearray()
        proc = self._launch({"builtin": op, "path": path, "mode": mode}, data or None, out.extend, err.extend,
                            background=False)
        code = proc.wait(fileops.TIMEOUT_S + 10)  # the helper's alarm fires first; this is the backstop
        if code is None:
            proc.kill()
            raise ExecFailed(f"sandbox {self.name}: {op} {path} did not finish in {fileops.TIMEOUT_S} s")
        message = err.decode(errors="replace").strip()
        if code == fileops.NOT_FOUND:
            raise SandboxFileNotFound(f"sandbox {self.name}: {message}")
        if code != 0:
            raise ExecFailed(f"sandbox {self.name}: {op} {path} failed: {message}")
        return bytes(out)

    def read_file(self, path: str) -> bytes:
        return self._file_op("read", path)

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self._file_op("write", path, data, mode)

    def delete_file(self, path: str) -> None:
        self._file_op("delete", path)

    # checkpoints -------------------------------------------------------------------------------
    def checkpoint(self, comment: str = "") -> Checkpoint:
        with self._locked():
            self._check_exists()
            store = self._backend.store
            store.ensure()
            store.gc(self.name)
            checkpoint_id = f"ck-{os.urandom(4).hex()}"
            started = time.time()
            running = self._runtime() is not None
            if running:
                with self._groups().frozen():  # a consistent image: nothing writes meanwhile
                    store.snapshot(self.name, checkpoint_id)
            else:
                store.snapshot(self.name, checkpoint_id)
            # size_bytes is filled in by the first listing: walking a big layer here would make the
            # checkpoint's cost grow with the layer, which snapshots exist to avoid
            record = {"id": checkpoint_id, "created_at": started, "comment": comment,
                      "size_bytes": None, "store": store.kind}
            # the record is the commit point: a snapshot without it is never listed
            # Not fsynced (it costs more than the snapshot itself): after a host crash the newest
            # record may be missing, which drops that checkpoint whole, never half of it.
            paths.write_json(store.checkpoints_dir(self.name) / f"{checkpoint_id}.json", record, durable=False)
            return _checkpoint_from(record)

    def checkpoints(self) -> list[Checkpoint]:
        self._check_exists()
        store = self._backend.store
        store.ensure()
        records = []
        for checkpoint_id in store.checkpoint_ids(self.name):
            record_file = store.checkpoints_dir(self.name) / f"{checkpoint_id}.json"
            record = paths.read_json(record_file)
            if not isinstance(record, dict):
                continue
            if record.get("size_bytes") is None:  # snapshots never change: measure once, keep it
                snapshot = store.checkpoint_path(self.name, checkpoint_id) / "upper"
                record["size_bytes"] = store.tree_bytes(snapshot)
                with contextlib.suppress(OSError):
                    paths.write_json(record_file, record)
            records.append(_checkpoint_from(record))
        return sorted(records, key=lambda c: c.created_at)

    def _require_checkpoint(self, checkpoint_id: str) -> None:
        if checkpoint_id not in self._backend.store.checkpoint_ids(self.name):
            raise CheckpointNotFound(f"sandbox {self.name} has no checkpoint {checkpoint_id!r}", sandbox=self.name)

    def restore(self, checkpoint_id: str) -> None:
        with self._locked():
            self._check_exists()
            store = self._backend.store
            store.ensure()
            self._require_checkpoint(checkpoint_id)
            store.gc(self.name)
            # The new incarnation's launcher joins its groups while the copy is staged (born under
            # the disk limit) and the old incarnation stops; it sets up the sandbox only once the
            # copy is in place.
            groups, launch = prepared = self._prepare_start(self._recorded_groups())
            try:
                staged = store.stage_restore(self.name, checkpoint_id, disk_limit=self.spec.limits.disk_bytes)
                # the old root's unmount (a sync of the store) is left for later: nobody waits for it
                held = self._stop(hold_mounts=True, keep=groups.box)
                try:
                    old = store.publish_restore(self.name, checkpoint_id, staged)
                    failpoints.pause("restore-published")
                    self._start(store_clean=True, limited=True, prepared=prepared)
                    store.discard(old)
                finally:
                    incarnation.release_later(held)
            finally:
                launch.close()  # after the start: the sandbox is usable a few ms sooner

    def delete_checkpoint(self, checkpoint_id: str) -> None:
        with self._locked():
            self._check_exists()
            store = self._backend.store
            store.ensure()
            self._require_checkpoint(checkpoint_id)
            store.delete_checkpoint(self.name, checkpoint_id)

    def diff(self, from_id: str, to_id: str | None = None) -> list[FileChange]:
        self._check_exists()
        store = self._backend.store
        store.ensure()
        self._require_checkpoint(from_id)
        if to_id is not None:
            self._require_checkpoint(to_id)
        # The lock only while the live layer is pinned: a restore must not wait for a walk, which
        # a tree made to be slow to compare stretches to its whole budget (issue 24). The walk
        # reads the pinned layer to its end whatever is swapped in meanwhile, and a result whose
        # layer a restore replaced is not reported (it would be neither the old files nor the new).
        # A checkpoint's tree (a view of a delta chain on the overlay store) is made under the lock.
        with contextlib.ExitStack() as views:
            with self._locked():
                if to_id is None and store.changed_since(self.name, from_id) is False:
                    return []
                old = views.enter_context(store.checkpoint_tree(self.name, from_id))
                if to_id is not None:
                    return self._diff(old, views.enter_context(store.checkpoint_tree(self.name, to_id)))
                pinned = store.pin_layer(self.name)
                if pinned is None:  # a walk in another process: under the lock throughout
                    return self._diff(old, store.readable_layer(self.name))
            with pinned:
                failpoints.pause("diff-pinned")
                try:
                    changes = self._diff(old, pinned.path)
                except (OSError, Unsupported):
                    if not pinned.replaced():
                        raise
                    changes = None  # the old layer, removed under the walk
                if changes is None or pinned.replaced():
                    raise Unsupported(f"sandbox {self.name} was restored while its files were being compared "
                                      "(the diff was interrupted); diff again to compare the restored files")
                return changes

    def _diff(self, old: Path, new: Path) -> list[FileChange]:
        spend = treediff.Budget().start()  # one budget for the hint and the walk together
        try:
            hint = self._backend.store.change_hint(self.name, old, new, spend)
            return self._backend.store.diff_layers(old / "upper", new / "upper", Path(self.base or "/"), hint, spend)
        except treediff.TooBig as exc:  # a hostile layer: said, not walked to the end (a restore needs no diff)
            raise Unsupported(f"sandbox {self.name}: {exc}") from None

    def changed_since(self, checkpoint_id: str) -> bool | None:
        """Whether the sandbox's files may have changed since the checkpoint: False only when they
        certainly have not. Answered from btrfs generations (cost follows the change, not the
        layer); None on the copy store, which cannot tell without a full walk."""
        self._check_exists()
        store = self._backend.store
        store.ensure()
        self._require_checkpoint(checkpoint_id)
        return store.changed_since(self.name, checkpoint_id)

    def fork(self, new_name: str, checkpoint_id: str | None = None) -> LocalSandbox:
        with self._locked():
            self._check_exists()
            store = self._backend.store
            store.ensure()
            if checkpoint_id is not None:
                self._require_checkpoint(checkpoint_id)
                return self._backend.fork_from(self, checkpoint_id, new_name)
            if self._runtime() is None:
                return self._backend.fork_from(self, None, new_name)
            with self._groups().frozen():  # a consistent copy of the live layer
                return self._backend.fork_from(self, None, new_name)

    def destroy(self) -> None:
        with self._locked():
            if not self._meta_file.exists() and not self._backend.store_leftovers(self.name):
                return
            self._meta_file.unlink(missing_ok=True)  # from here on the sandbox no longer exists
            groups = self._groups()  # the recorded ones, read before _stop forgets them
            self._stop()
            incarnation.settle()  # an earlier restore's old root, still being let go of
            groups.remove()
            self._backend.store.ensure()
            self._backend.store.remove_sandbox(self.name)
            _rmtree(self._run)
            self._socket.unlink(missing_ok=True)
            _rmtree(self._meta_file.parent)
            self._backend.forget_ids(self.name)


def _refuse_nul(what: str, text: str) -> None:
    if "\0" in text:
        raise InvalidInput(f"{what} contains a NUL byte, which no program can receive: {text[:40]!r}")


def _checkpoint_from(record: Mapping[str, Any]) -> Checkpoint:
    return Checkpoint(
        id=str(record["id"]),
        created_at=float(record.get("created_at", 0.0)),
        comment=str(record.get("comment", "")),
        size_bytes=record.get("size_bytes"),
    )


def _shm_bytes(memory_bytes: int | None) -> int | None:
    """The size of the sandbox's /dev/shm: a quarter of its memory limit. A file there stays charged
    to the sandbox's memory after the command that wrote it is killed: one that may grow to the
    limit leaves the init no memory at all, and the OOM killer takes it (the whole sandbox)."""
    return None if memory_bytes is None else max(memory_bytes // 4, 1 << 20)


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
