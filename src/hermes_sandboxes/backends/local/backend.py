"""The local backend: sandboxes on this machine from namespaces, an overlay root and a CoW store."""

from __future__ import annotations

import builtins
import contextlib
import os
import resource
import stat
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from hermes_sandboxes.backends.local import cgroups, paths, userns
from hermes_sandboxes.backends.local.paths import base_problem
from hermes_sandboxes.backends.local.sandbox import LocalSandbox
from hermes_sandboxes.errors import (
    BackendUnavailable,
    InvalidInput,
    SandboxBusy,
    SandboxExists,
    SandboxNotFound,
    Unsupported,
)
from hermes_sandboxes.names import digest, unique_name, validate_name
from hermes_sandboxes.sandbox import (
    NETWORK_MODES,
    Backend,
    Capability,
    DoctorCheck,
    Limits,
    SandboxInfo,
    SandboxSpec,
    SandboxUsage,
    StoreUsage,
    refuse_other_spec,
)
from hermes_sandboxes.util import failpoints
from hermes_sandboxes.util.lazy import lazy_module

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hot path of a CLI exec)
if TYPE_CHECKING:
    import logging
    from typing import Any, Literal

    StoreKind = Literal["auto", "btrfs", "copy"]

    from hermes_sandboxes import allowlist as policy
    from hermes_sandboxes.backends.local.store import base as storage
    from hermes_sandboxes.backends.local.store.base import Store
    from hermes_sandboxes.egress.broker import BrokeredCredential, SecretLookup
else:  # loaded when used: an exec in a running sandbox (the CLI's hot path) needs neither
    storage = lazy_module("hermes_sandboxes.backends.local.store.base")
    policy = lazy_module("hermes_sandboxes.allowlist")

STORE_KINDS: tuple[StoreKind, ...] = ("auto", "btrfs", "copy")


def _log() -> logging.Logger:
    import logging  # only to warn about the store: not for the hot path of an exec

    return logging.getLogger(__name__)


def default_limits() -> Limits:
    """Room for real work, with a margin for the host: a quarter of RAM (at most 8 GiB),
    1024 processes, and all cores but one (so a busy loop cannot starve the host)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cores = os.cpu_count() or 1
    return Limits(memory_bytes=min(total // 4, 8 << 30), pids=1024, cpus=float(max(1, cores - 1)))


class LocalBackend(Backend):
    """Sandboxes on this machine, in the store at ``home``.

    ``base`` (a root filesystem directory; None: the host's ``/``) and ``masks`` (host paths to hide,
    on top of the built-in list) are this backend's own settings, not part of the portable spec: a
    new sandbox records the base it was built on, and keeps the masks it was created with on top of
    whatever ``masks`` the backend has when it starts."""

    name = "local"

    def __init__(
        self,
        home: str | os.PathLike[str] | None = None,
        *,
        store: StoreKind = "auto",
        image_size: str = "64G",
        limits: Limits | None = None,
        base: str | None = None,
        masks: Sequence[str] = (),
        credentials: Sequence[BrokeredCredential] = (),
        upstream_ca: str | None = None,
        secret_lookup: SecretLookup | None = None,
        audit_path: Callable[[str], Path] | None = None,
    ) -> None:
        """``credentials``: secrets brokered by the egress proxy of ``proxy`` sandboxes (their source
        files are masked in every sandbox); ``upstream_ca``: a CA bundle that proxy trusts for
        upstream servers instead of the system's (a private registry's, or a test server's);
        ``secret_lookup``: where an ``env`` credential's value is read when a proxy starts (default
        this process's environment; the Hermes plugin passes the active profile's secrets);
        ``audit_path(key)``: the audit log the egress proxy appends to (default: the host state's
        under ``$HERMES_SANDBOXES_STATE``; a face with a state directory of its own passes it)."""
        if store not in STORE_KINDS:
            raise InvalidInput(f"store must be one of {', '.join(STORE_KINDS)}, got {store!r}")
        self.rootless = os.geteuid() != 0  # the two modes, chosen by who runs it (see userns.py)
        self.home = paths.resolve_home(home)
        if os.path.isdir(self.home):  # one not made yet (or out of reach) is made or refused by the store
            _check_home(self.home)
        self.layout = paths.Layout(self.home)
        self.base = _validate_base(base)
        self.credentials = tuple(credentials)
        # the brokered credentials' source files are hidden in every sandbox
        self.masks = _validate_masks([*masks, *(c.file for c in self.credentials if c.file)], self.base,
                                     rootless=self.rootless)
        self.upstream_ca = upstream_ca
        self.secret_lookup = secret_lookup
        self._audit_path = audit_path
        self._store_kind = store
        self._image_size = image_size
        self._limits = limits or default_limits()
        self._store: Store | None = None
        self._cgroups_ok: bool | None = None
        self._rootless_map: userns.IdMap | None = None
        self._trusted_state: tuple[Path, tuple[int, ...]] | None = None  # host_state_dir's last check

    @property
    def key(self) -> str:
        return "local-" + digest(str(self.home), 12)

    def audit_log(self) -> Path:
        """The audit log the egress proxies of this backend's sandboxes append to: the one the
        caller named (``audit_path``), else the host state's."""
        if self._audit_path is not None:
            return self._audit_path(self.key)
        from hermes_sandboxes.recorder.state import HostState  # only when a proxy starts

        return HostState().audit_path(self.key)

    def host_state_dir(self) -> Path:
        """The host state a sandbox must not see (every sandbox's journals and audit log): the host
        state directory, made if missing and refused if someone else controls it; with an audit log
        the caller named, that log's directory."""
        if self._audit_path is not None:
            return self._audit_path(self.key).parent
        from hermes_sandboxes.recorder.state import HostState

        state = HostState()
        if self._trusted_state is not None and self._trusted_state == (state.root, _dir_identity(state.root)):
            return state.root  # the directory checked last time, still there as it was (one lstat per start)
        trusted = state.trusted()
        identity = _dir_identity(trusted)
        self._trusted_state = (trusted, identity) if identity is not None else None
        return trusted

    # environment -------------------------------------------------------------------------------
    def unavailable_reason(self) -> str | None:
        if not self.rootless:
            return machine_unavailable_reason()
        return rootless_unavailable_reason() or (None if self.base or _built_base() else NO_BASE)

    def _require_usable(self) -> None:
        reason = self.unavailable_reason()
        if reason:
            raise BackendUnavailable(reason)

    @property
    def store(self) -> Store:
        if self._store is None:
            self._require_usable()
            self._store = self._choose_store()
        return self._store

    def describable_store(self) -> Store:
        """The store, to say what it is: also before a rootless user has built the base, which only
        starting a sandbox needs (``doctor`` and ``store info`` name the store, then the fix)."""
        if self._store is None and self.rootless and rootless_unavailable_reason() is None:
            self._store = self._choose_store()
        return self.store

    def _choose_store(self) -> Store:
        recorded = paths.read_json(self.home / "store.json")
        kind = recorded.get("kind") if isinstance(recorded, dict) else None
        if isinstance(recorded, dict) and recorded.get("migrating"):
            raise SandboxBusy(f"the store at {self.home} is being migrated to {recorded['migrating']}; wait for "
                              "`hermes-sandboxes store migrate` to finish, or run it again if it was interrupted")
        if os.geteuid() != 0:  # rootless: the best kind the home's filesystem gives this user
            return self._choose_rootless_store(kind)
        if kind is None:
            kind = self._store_kind
        if kind == "auto":
            kind = "btrfs" if _btrfs_possible() and not self.rootless else "copy"
        store: Store = (storage.BtrfsStore(self.home, self._image_size) if kind == "btrfs"
                        else storage.CopyStore(self.home))
        try:
            store.ensure()
        except Exception as exc:
            if self._store_kind != "auto" or recorded:
                raise
            _log().warning("btrfs store unusable (%s); falling back to full copies", exc)
            store = storage.CopyStore(self.home)
            store.ensure()
        if isinstance(store, storage.CopyStore):
            _log().warning("%s; %s", storage.CopyStore.warning,
                           "btrfs-progs is installed now: move the sandboxes to btrfs with "
                           "`hermes-sandboxes store migrate`" if _btrfs_possible() else
                           "for constant-time snapshots install btrfs-progs, then run `hermes-sandboxes store migrate`")
        if not recorded:
            paths.write_json(self.home / "store.json", {"kind": store.kind})
        return store

    def _choose_rootless_store(self, recorded: str | None) -> Store:
        from hermes_sandboxes.backends.local.store import rootless

        store = rootless.choose(self.home, recorded)  # Unsupported for a store that root made
        if recorded is None:
            paths.write_json(self.home / "store.json", {"kind": store.kind})
        return store

    def store_preview(self) -> tuple[str, str] | None:
        """None when the store exists (``store`` opens it) or is an ordinary user's (probing its
        filesystem makes nothing big: ``describable_store`` names its kind), else what the first
        sandbox will create there (its kind, a line): ``doctor`` creates and loop-mounts no 64 GiB image."""
        if self._store is not None or self.rootless or (self.home / "store.json").exists():
            return None
        kind = self._store_kind if self._store_kind != "auto" else ("btrfs" if _btrfs_possible() else "copy")
        what = (f"a btrfs store in a {self._image_size} sparse image file, loop-mounted" if kind == "btrfs"
                else "a full-copy store")
        return kind, f"none yet at {self.home}: the first sandbox creates {what} there"

    @property
    def capabilities(self) -> frozenset[Capability]:  # type: ignore[override]
        caps = {Capability.CHECKPOINTS, Capability.DIFF, Capability.LIMITS, Capability.TREE_KILL,
                Capability.DELETE_CHECKPOINTS, Capability.FORK, Capability.TERMINAL, Capability.EGRESS_ALLOWLIST,
                Capability.KILL_TAGGED}
        store = self._store
        if store is None and os.geteuid() != 0:  # rootless kinds differ: only the store itself can say
            with contextlib.suppress(Exception):
                store = self.store
        if store is None or store.cheap:
            caps.add(Capability.CHEAP_CHECKPOINTS)
        if self.rootless and not self._cgroups_usable():
            caps.discard(Capability.TREE_KILL)  # a command's session, not every process it started
        return frozenset(caps)

    def _cgroups_usable(self) -> bool:
        if self._cgroups_ok is None:
            found = cgroups.probe()
            self._cgroups_ok = not found.fatal and found.version is not None
        return self._cgroups_ok

    def launch_extras(self, name: str, sandbox: LocalSandbox, groups: cgroups.SandboxCgroups) -> dict[str, Any]:
        """What a launch of ``sandbox`` needs beyond the groups: its user namespace (root mode: the
        sandbox's own block of ids; rootless: the user's map), the masks the init mounts (rootless:
        its base is its own tree, so these are only the configured ones) and rlimits."""
        if self.rootless:
            idmap, mode = self.rootless_map, "rootless"
        else:
            idmap, mode = userns.root_range_map(userns.claim_slot(self.home, name)), "root"
        extras: dict[str, Any] = {"userns": {
            "mode": mode, "uids": idmap.uids, "gids": idmap.gids, "outer": (idmap.outer_uid(0), idmap.outer_gid(0))}}
        if self.rootless:
            own = sandbox.local_meta["masks"]
            extras["masks"] = [*own, *(m for m in self.masks if m not in own)]
        if not groups.tracks_trees:
            pids = self.effective_limits(sandbox.spec.limits).pids
            extras["rlimits"] = {resource.RLIMIT_NPROC: pids} if pids else {}
        return extras

    @property
    def rootless_map(self) -> userns.IdMap:
        if self._rootless_map is None:
            self._rootless_map = userns.rootless_map()
        return self._rootless_map

    def forget_ids(self, name: str) -> None:
        """Root mode: give a destroyed sandbox's block of ids back."""
        if not self.rootless:
            userns.release_slot(self.home, name)

    def effective_limits(self, requested: Limits) -> Limits:
        return Limits(
            memory_bytes=requested.memory_bytes or self._limits.memory_bytes,
            pids=requested.pids or self._limits.pids,
            cpus=requested.cpus or self._limits.cpus,
        )

    # sandboxes ---------------------------------------------------------------------------------
    def check_spec(self, spec: SandboxSpec) -> None:
        if spec.network not in NETWORK_MODES:
            raise InvalidInput(f"network must be one of {', '.join(NETWORK_MODES)}, got {spec.network!r}")
        super().check_spec(spec)
        policy.validate(spec.allow)
        limits = spec.limits
        for label, value in (("memory", limits.memory_bytes), ("pids", limits.pids), ("cpus", limits.cpus),
                             ("disk", limits.disk_bytes)):
            if value is not None and value <= 0:
                raise InvalidInput(f"{label} limit must be positive, got {value}")
        if limits.memory_bytes is not None and limits.memory_bytes < 16 << 20:
            raise InvalidInput("memory limit must be at least 16 MiB")
        if limits.disk_bytes is not None and limits.disk_bytes < 1 << 20:
            raise InvalidInput(f"disk limit must be at least 1 MiB, got {limits.disk_bytes}")
        self.store.check_disk_limit(limits.disk_bytes)  # Unsupported where it cannot be enforced
        if self.rootless and not self._cgroups_usable():
            refused = [label for label, value in (("memory", limits.memory_bytes), ("cpus", limits.cpus)) if value]
            if refused:
                raise Unsupported(f"rootless without a delegated cgroup cannot enforce a {' or '.join(refused)} "
                                  "limit (processes are limited per user id inside); see `hermes-sandboxes doctor`")
        if spec.image is not None:
            raise Unsupported("the local backend builds on a root filesystem directory, not an image: "
                              "set the local backend's 'base' setting instead")
        if spec.idle_timeout is not None and not spec.idle_timeout > 0:
            raise InvalidInput(f"an idle timeout is a positive number of seconds, not {spec.idle_timeout!r}")

    def _new_meta(self, name: str, spec: SandboxSpec, *, ephemeral: bool, **more: object) -> dict[str, object]:
        return {"name": name, "ephemeral": ephemeral, "created_at": time.time(), "spec": spec.to_dict(),
                "backend": self.name, "local": {"base": self._base_for_new(), "masks": list(self.masks)}, **more}

    def _base_for_new(self) -> str | None:
        """The base a new sandbox is built on. Rootless: never the host's / (the kernel refuses an
        overlay of it in a user namespace, and host root's files could not change through one)."""
        if self.base is not None or not self.rootless:
            return self.base
        built = getattr(self.store, "rootless_base", lambda: None)()
        if built is None:
            raise BackendUnavailable(NO_BASE)
        return str(built)

    def create(self, name: str, spec: SandboxSpec | None = None, *, ephemeral: bool = False) -> LocalSandbox:
        validate_name(name)
        spec = spec or SandboxSpec()
        self.check_spec(spec)
        store = self.store
        with paths.locked(self.layout.lock_file(name), f"sandbox {name}"):
            if self.layout.meta_file(name).exists():
                raise SandboxExists(f"sandbox {name} already exists; use it, or remove it first")
            # All or nothing: a create that fails removes what it made; one killed (kill -9) leaves
            # a layer without a record, which ls shows as broken and rm removes (LocalSandbox.broken).
            try:
                store.create_layer(name)
                failpoints.pause("create-layer")
                meta = self._new_meta(name, spec, ephemeral=ephemeral)
                sandbox = LocalSandbox(self, name, meta)
                sandbox.apply_masks()
                failpoints.pause("create-masked")
                paths.write_json(self.layout.meta_file(name), meta)  # the commit point of a create
            except BaseException:
                with contextlib.suppress(Exception):
                    store.remove_sandbox(name)
                raise
        sandbox.created = True
        return sandbox

    def fork_from(self, source: LocalSandbox, checkpoint_id: str | None, name: str) -> LocalSandbox:
        """The new sandbox ``name`` on ``source``'s checkpoint (or its live layer, frozen meanwhile);
        called by ``LocalSandbox.fork`` with the source's lock held."""
        validate_name(name)
        store = self.store
        with paths.locked(self.layout.lock_file(name), f"sandbox {name}"):
            if self.layout.meta_file(name).exists():
                raise SandboxExists(f"sandbox {name} already exists; choose another name for the fork")
            store.fork(source.name, checkpoint_id, name)
            meta = {**self._new_meta(name, source.spec, ephemeral=False),
                    "local": source.local_meta, "forked_from": {"sandbox": source.name, "checkpoint": checkpoint_id}}
            paths.write_json(self.layout.meta_file(name), meta)
        sandbox = LocalSandbox(self, name, meta)
        sandbox.created = True
        return sandbox

    def open(self, name: str, spec: SandboxSpec | None = None) -> LocalSandbox:
        validate_name(name)
        try:
            sandbox = self.get(name)
            if sandbox.broken:  # what a killed create left: creating it again replaces that
                raise SandboxNotFound(name)
        except SandboxNotFound:
            try:
                return self.create(name, spec)
            except SandboxExists:  # another process created it first
                sandbox = self.get(name)
        if sandbox.ephemeral:
            raise SandboxExists(f"sandbox {name} is ephemeral and belongs to another run; it is never adopted")
        refuse_other_spec(name, sandbox.spec, spec)
        return sandbox

    def create_ephemeral(self, spec: SandboxSpec | None = None, prefix: str = "tmp") -> LocalSandbox:
        return self.create(unique_name(prefix), spec, ephemeral=True)

    def get(self, name: str) -> LocalSandbox:
        """The sandbox ``name``; also a broken one (see LocalSandbox.broken), which only ``info()``
        and ``destroy()`` accept."""
        validate_name(name)
        meta = paths.read_json(self.layout.meta_file(name))
        if not isinstance(meta, dict):
            sandbox = LocalSandbox(self, name, {})
            if not sandbox.broken:
                raise SandboxNotFound(f"no sandbox named {name}; see `hermes-sandboxes ls`")
            return sandbox
        return LocalSandbox(self, name, meta)

    def names(self) -> builtins.list[str]:
        """Every sandbox with a record, and the broken ones (leftovers without a record)."""
        root = self.home / "sandboxes"
        found = {p.parent.name for p in root.glob("*/sandbox.json")} if root.is_dir() else set()
        leftovers: set[str] = set()
        for directory in (root, self.home / "run", self.store.root):
            if directory.is_dir():
                leftovers |= {p.name for p in directory.iterdir()}
        found |= {name for name in leftovers - found
                  if _valid_name(name) and LocalSandbox(self, name, {}).broken}
        return sorted(found)

    def list(self) -> builtins.list[SandboxInfo]:
        infos = []
        for name in self.names():
            try:
                infos.append(self.get(name).info())
            except SandboxNotFound:
                continue  # destroyed while we were listing
        return infos

    def migrate_store(self, *, stop_running: bool = False,
                      progress: Callable[[str], None] | None = None) -> builtins.list[str]:
        """A copy store becomes a btrfs store, sandbox by sandbox (backends/local/store/maintenance.py)."""
        from hermes_sandboxes.backends.local.store import maintenance

        self._require_usable()
        if os.geteuid() != 0:
            raise Unsupported("store migrate moves a root-mode copy store to btrfs; a rootless store's kind "
                              "follows the filesystem of its home (put the home on btrfs for snapshots)")
        moved = maintenance.migrate(self, self._image_size, stop_running=stop_running,
                                    progress=progress or (lambda _: None))
        self._store = None  # chosen again from store.json on next use
        return moved

    def disk_usage(self) -> StoreUsage:
        from hermes_sandboxes.backends.local.store import usage

        store = self.store
        store.ensure()
        used, host = usage.store_bytes(store)
        sandboxes = []
        for name in self.names():
            if not store.layer(name).is_dir():
                continue  # broken, or destroyed meanwhile
            layer, checkpoints, exclusive = usage.sandbox_bytes(store, name)
            sandboxes.append(SandboxUsage(name, layer, checkpoints, exclusive, len(store.checkpoint_ids(name))))
        return StoreUsage(str(store.root), used, host, tuple(sandboxes))

    def reclaim_store(self) -> int:
        from hermes_sandboxes.backends.local.store import maintenance

        return maintenance.reclaim(self.store)

    def unmount_store(self) -> bool:
        from hermes_sandboxes.backends.local.store import maintenance

        self._require_usable()
        recorded = paths.read_json(self.home / "store.json")
        if not isinstance(recorded, dict) or recorded.get("kind") != "btrfs":
            raise Unsupported(f"the store at {self.home} is not a mounted btrfs image: nothing to unmount")
        unmounted = maintenance.unmount(self, storage.BtrfsStore(self.home, self._image_size))
        self._store = None
        return unmounted

    def store_info(self) -> builtins.list[tuple[str, str]]:
        """What the store is, as (label, value) lines: kind, where, what it does, what it enforces."""
        store = self.describable_store()
        lines = [("kind", store.kind), ("root", str(store.root)), ("how", store.description),
                 ("cheap checkpoints", "yes" if store.cheap else "no (cost follows the layer)")]
        try:
            store.check_disk_limit(1 << 30)
            lines.append(("disk limits", "available"))
        except Unsupported as exc:
            lines.append(("disk limits", f"refused: {exc}"))
        if store.rootless:
            from hermes_sandboxes.backends.local.store import baseimage

            built = baseimage.built()
            lines.append(("rootless base", str(built) if built else
                          f"not built yet ({baseimage.root_of()}): run `hermes-sandboxes store base`"))
        return lines

    def build_base(self, progress: Callable[[str], None]) -> Path:
        """The rootless Debian base this user's sandboxes share, built first if it is not."""
        from hermes_sandboxes.backends.local.store import baseimage

        return baseimage.ensure(progress=progress)

    def store_leftovers(self, name: str) -> bool:
        """Whether anything of a (possibly half-destroyed) sandbox remains."""
        return self.layout.run_dir(name).exists() or self.store.sandbox_dir(name).exists()

    def doctor(self) -> builtins.list[DoctorCheck]:
        from hermes_sandboxes.backends.local.doctor import run_checks

        return run_checks(self)


NO_BASE = ("a rootless sandbox needs a base root filesystem you own: build one with `hermes-sandboxes store base`, "
           "or set the local backend's 'base' setting to a directory with bin/, usr/, etc/")


def _built_base() -> bool:
    """Whether the rootless base is built (a look at its cache, never a build)."""
    from hermes_sandboxes.backends.local.store import baseimage

    try:
        return baseimage.built() is not None
    except OSError:  # a cache directory this user cannot read (HOME left at another user's)
        return False


def rootless_unavailable_reason() -> str | None:
    """Why this user cannot run rootless sandboxes here, one line per missing prerequisite."""
    from hermes_sandboxes.backends.local import prereqs

    found = prereqs.blockers()
    return "; ".join(found) if found else None


def machine_unavailable_reason() -> str | None:
    """Why this machine cannot run local sandboxes, or None when it can (cheap: no store access)."""
    if os.geteuid() != 0:
        return ("the local sandbox needs root (to create namespaces, overlay mounts and cgroups); "
                "run as root. Nothing was run on the host.")
    if not Path("/proc/self/ns/pid").exists():
        return "this kernel has no pid namespaces"
    missing = missing_capabilities()
    if missing:
        return (f"root here lacks the capabilities {', '.join(missing)}, which the local sandbox needs "
                "(mounts and namespaces, the layer's owners and whiteouts, cgroups, the sandbox's own "
                "capability drop and network); run as full root, not under capsh/setpriv --drop or in a "
                "container without them")
    fatal = cgroups.probe().fatal
    return "; ".join(fatal) if fatal else None


# What creating and starting a sandbox was seen to fail without (each dropped alone, on Linux 6.x):
# mounting and namespaces, chown of the layer's files, the cgroup directories, the init's own
# bounding-set drop, and the network namespace's loopback.
_REQUIRED_CAPS = {0: "CAP_CHOWN", 1: "CAP_DAC_OVERRIDE", 8: "CAP_SETPCAP", 12: "CAP_NET_ADMIN", 21: "CAP_SYS_ADMIN"}


def missing_capabilities() -> builtins.list[str]:
    """The capabilities the local sandbox needs that this process's effective set lacks."""
    try:
        with open("/proc/self/status") as f:
            effective = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError):
        return []  # cannot tell: let the operation itself say what failed
    return [name for bit, name in _REQUIRED_CAPS.items() if not effective >> bit & 1]


def _valid_name(name: str) -> bool:
    try:
        validate_name(name)
    except InvalidInput:
        return False
    return True


def _validate_base(base: str | None) -> str | None:
    if base is None:
        return None
    path = Path(base)
    if not path.is_absolute():
        raise InvalidInput(f"base {base!r} must be an absolute path to a root filesystem "
                           "(a directory with bin/, usr/, etc/)")
    problem = base_problem(base)
    if problem is not None:
        raise InvalidInput(f"base: {problem}")
    return str(path)


def _check_home(home: Path) -> None:
    from hermes_sandboxes.util import ownership

    try:
        ownership.check_dir(home, "the sandbox home")
    except ownership.Untrusted as exc:
        raise InvalidInput(f"{exc}; refusing to use it as a sandbox home") from None


def _validate_masks(masks: Sequence[str], base: str | None, *, rootless: bool) -> tuple[str, ...]:
    if not masks:
        return ()  # (and guest.masks, with hashlib, stays off the exec path: ~9 ms of a CLI exec)
    from hermes_sandboxes.backends.local.guest.masks import resolve_within

    if base is None and rootless:  # a rootless sandbox's root is the user's base, never the host's
        from hermes_sandboxes.backends.local.store import baseimage

        base = str(baseimage.root_of())

    for mask in masks:
        if not isinstance(mask, str) or not mask.startswith("/"):
            raise InvalidInput(f"mask {mask!r} must be an absolute path")
        try:
            resolve_within(base or "/", mask)  # what is masked is where it resolves to: it must resolve
        except OSError as exc:
            raise InvalidInput(f"mask {mask!r} cannot be resolved safely: {exc.strerror or exc}") from None
    return tuple(masks)


def _btrfs_possible() -> bool:
    import shutil

    if shutil.which("mkfs.btrfs") is None:
        return False
    try:
        with open("/proc/filesystems") as f:
            if "btrfs" in f.read():
                return True
    except OSError:
        return False
    return Path(f"/lib/modules/{os.uname().release}").exists()  # loadable as a module


def _dir_identity(path: Path) -> tuple[int, ...] | None:
    """What tells a directory checked before from one put in its place or changed since: device,
    inode, owner and mode of ``path`` itself (not followed); None unless it is a directory."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return None
    return (st.st_dev, st.st_ino, st.st_uid, st.st_gid, st.st_mode)
