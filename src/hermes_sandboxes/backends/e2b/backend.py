"""The E2B backend: discovery by identity, create, adopt, list."""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import e2b

from hermes_sandboxes.backends.e2b.faults import map_error, transient
from hermes_sandboxes.backends.e2b.identity import (
    ALLOW_KEY,
    API_KEY_ENV,
    CREATED_KEY,
    EPHEMERAL_FLOOR_S,
    EPHEMERAL_KEY,
    IDENTITY_KEY,
    NAME_KEY,
    NETWORK_KEY,
    OWNER_KEY,
    PLUGIN_KEY,
    PLUGIN_VALUE,
    SCOPE_KEY,
    lease_request,
    lifecycle,
    scope_digest,
)
from hermes_sandboxes.backends.e2b.network import Posture, egress_rules
from hermes_sandboxes.backends.e2b.sandbox import E2BSandbox, info_of, posture_in
from hermes_sandboxes.backends.e2b.settings import E2BSettings
from hermes_sandboxes.errors import (
    BackendUnavailable,
    InvalidInput,
    SandboxError,
    SandboxExists,
    SandboxNotFound,
    Unsupported,
)
from hermes_sandboxes.names import unique_name, validate_name
from hermes_sandboxes.recorder.credentials import Redactor
from hermes_sandboxes.sandbox import (
    Backend,
    Capability,
    SandboxInfo,
    SandboxSpec,
    difference,
    refuse_differences,
)

log = logging.getLogger(__name__)

T = TypeVar("T")


class E2BBackend(Backend):
    """Sandboxes in one E2B account (``E2B_API_KEY``), as seen by one profile."""

    name = "e2b"
    capabilities = frozenset({Capability.CHECKPOINTS, Capability.DELETE_CHECKPOINTS, Capability.FORK,
                              Capability.EGRESS_ALLOWLIST, Capability.KILL_TAGGED})

    def __init__(self, settings: E2BSettings | None = None, *, api_key: str | None = None,
                 profile: str | None = None, api_url: str | None = None, sandbox_url: str | None = None,
                 domain: str | None = None, request_timeout: float | None = None) -> None:
        self.settings = settings or E2BSettings()
        self._api_key = api_key if api_key is not None else os.environ.get(API_KEY_ENV) or None
        # the Hermes profile whose sandboxes these are: by default the one Hermes itself would use
        # (HERMES_HOME, else ~/.hermes), resolved as the plugin resolves it, so the CLI and the plugin
        # see the same sandboxes and share their journals and leases
        self.profile = profile or os.path.realpath(os.path.expanduser(os.environ.get("HERMES_HOME", "").strip()
                                                                      or "~/.hermes"))
        self._opts: dict[str, Any] = {k: v for k, v in (("api_url", api_url), ("sandbox_url", sandbox_url),
                                                       ("domain", domain), ("request_timeout", request_timeout))
                                     if v is not None}
        self.redactor = Redactor({API_KEY_ENV: self._api_key} if self._api_key else {})
        where = api_url or domain or os.environ.get("E2B_API_URL") or os.environ.get("E2B_DOMAIN") or "e2b.app"
        self._key = "e2b-" + hashlib.sha256(f"{where}\0{self.profile}".encode()).hexdigest()[:12]
        self.owner = hashlib.sha256(self.profile.encode()).hexdigest()[:16]

    @property
    def key(self) -> str:
        """Where this backend's sandboxes live: the E2B endpoint and the profile, as a digest."""
        return self._key

    # plumbing ------------------------------------------------------------------------------------
    @property
    def opts(self) -> dict[str, Any]:
        """Connection options for every SDK call (the key is passed, never read from a log)."""
        if not self._api_key:
            raise BackendUnavailable(self.unavailable_reason() or "no E2B API key")
        return {"api_key": self._api_key, **self._opts}

    def unavailable_reason(self) -> str | None:
        if not self._api_key:
            return f"{API_KEY_ENV} is not set; get a key at https://e2b.dev/dashboard and export it"
        return None

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """Run one SDK call; its failure comes out as one of our cause classes, redacted."""
        try:
            return fn()
        except SandboxError:
            raise
        except Exception as exc:
            raise map_error(exc, what, self.redactor) from None

    def close(self) -> None:
        """Nothing to release: the SDK's connection pool is process-wide."""

    def __enter__(self) -> E2BBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # discovery -----------------------------------------------------------------------------------
    def _find(self, metadata: Mapping[str, str], what: str) -> list[e2b.SandboxInfo]:
        """Every running or paused sandbox with ``metadata``, newest first (all pages)."""
        def query() -> list[e2b.SandboxInfo]:
            pages = e2b.Sandbox.list(query=e2b.SandboxQuery(metadata=dict(metadata)), **self.opts)
            found: list[e2b.SandboxInfo] = []
            while pages.has_next:
                found += pages.next_items()
            return found

        found = self.call(what, query)
        return sorted(found, key=lambda s: s.started_at, reverse=True)

    def _adoptable(self, scope: str, name: str, *,
                   also: tuple[tuple[str, str], ...] = ()) -> e2b.SandboxInfo | None:
        """The newest sandbox stamped ``hermes_scope: scope``; failing that, the newest matching one
        of the further (key, digest) pairs of ``also``, tried in order."""
        for key, digest in ((SCOPE_KEY, scope), *also):
            found = self._find({PLUGIN_KEY: PLUGIN_VALUE, key: digest}, f"find sandbox {name}")
            if len(found) > 1:
                log.warning("E2B: %d sandboxes share the identity of %s; adopting the newest (%s). The others "
                            "pause when their leases end; delete them in the E2B dashboard.",
                            len(found), name, found[0].sandbox_id)
            if found:
                return found[0]
        return None

    def _metadata(self, name: str, scope: str, ephemeral: bool,
                  settings: E2BSettings | None = None) -> dict[str, str]:
        chosen = settings or self.settings
        identity = scope_digest(self.profile, name, chosen, persistent=not ephemeral)
        return {**chosen.metadata, PLUGIN_KEY: PLUGIN_VALUE, SCOPE_KEY: scope, IDENTITY_KEY: identity,
                NAME_KEY: name, OWNER_KEY: self.owner, EPHEMERAL_KEY: "true" if ephemeral else "false",
                **_network_metadata(posture_of(chosen)), CREATED_KEY: f"{time.time():.3f}"}

    def lease(self, ephemeral: bool) -> int:
        if ephemeral:  # an idle ephemeral sandbox must outlive the reaper that cleans it up
            return self.settings.lease + EPHEMERAL_FLOOR_S
        return self.settings.lease

    # the contract --------------------------------------------------------------------------------
    def check_spec(self, spec: SandboxSpec) -> None:
        """E2B sizes a sandbox by its template; its network is the internet, nothing, or an
        allow-list in E2B's own egress rules (refused when E2B cannot express an entry); it keeps
        the lease in the settings. Anything else in a spec is refused, never ignored."""
        super().check_spec(spec)
        if spec.network == "proxy":
            egress_rules(spec.allow)
        if spec.idle_timeout is not None and spec.idle_timeout != self.settings.idle_timeout:
            raise Unsupported(f"on E2B the idle timeout is the lease of the backend's settings (now "
                              f"{self.settings.lease} s); set idle_timeout there (e.g. -o idle_timeout=30m), "
                              "not per sandbox")
        for key, value in spec.labels.items():
            if not isinstance(key, str) or not key or not isinstance(value, str):
                raise InvalidInput(f"label {key!r}: E2B metadata takes non-empty text keys and text values")

    def _effective(self, spec: SandboxSpec | None) -> E2BSettings:
        """The settings a sandbox is made with. A spec's network picks the posture: "host" has the
        internet, "none" and "loopback" deny all egress (the sandbox's own loopback stays), "proxy"
        reaches its allow-list; its image names the template; its labels join the metadata (the
        identity keys still win)."""
        if spec is None:
            return self.settings
        self.check_spec(spec)
        return self.settings.model_copy(update={
            "allow_internet_access": spec.network in ("host", "proxy"),
            "allow": tuple(spec.allow) if spec.network == "proxy" else None,
            "template": spec.image or self.settings.template,
            "metadata": {**self.settings.metadata, **spec.labels},
        })

    def open(self, name: str, spec: SandboxSpec | None = None, *, task: str | None = None) -> E2BSandbox:
        """The persistent sandbox ``name``, found again or created. ``task`` (the Hermes plugin's
        task id) makes its ``hermes_scope`` the existing plugin's for that task, so either plugin
        adopts the other's sandbox; without it the name stands in for the task. Either way a
        sandbox made under the other form is found too (by our identity key, or by a scope the
        name gave before task ids were used).

        A found sandbox whose allow-list or labels differ from ``spec`` is refused (SpecMismatch).
        One of this name made with another template or network posture is another identity: by
        name (no ``task``) it is refused too, or resumed as it is without a spec; for a Hermes task
        a new sandbox is made beside it, as the existing plugin does (the old one pauses)."""
        validate_name(name)
        settings = self._effective(spec)
        identity = scope_digest(self.profile, name, settings, persistent=True)
        scope = identity if task is None else scope_digest(self.profile, task, settings, persistent=True)
        also = ((IDENTITY_KEY, identity),) if task is None else ((SCOPE_KEY, identity), (IDENTITY_KEY, identity))
        found = self._adoptable(scope, name, also=tuple(pair for pair in also if pair != (SCOPE_KEY, scope)))
        if found is not None:
            sandbox = self._attach(found.sandbox_id, name, found.metadata.get(SCOPE_KEY) or scope, ephemeral=False,
                                   created=False, posture=posture_of(settings))
            if spec is not None:
                refuse_differences(name, self._differences(sandbox, found, spec))
            return sandbox
        other = self._other_identity(name, settings, spec) if task is None else None
        if other is not None:
            return self._attach(other.sandbox_id, name, other.metadata.get(SCOPE_KEY, ""), ephemeral=False,
                                created=False, posture=posture_in(other.metadata))
        self._refuse_taken(name, only_ephemeral=True)  # an ephemeral one is never adopted, nor shadowed
        return self._create(name, scope, settings, ephemeral=False)

    def _other_identity(self, name: str, settings: E2BSettings, spec: SandboxSpec | None) -> e2b.SandboxInfo | None:
        """By name, the newest persistent sandbox ``name`` made with another template or network
        posture than ``settings``: resumed as it is without a spec, refused with one (naming what
        its identity says differs)."""
        taken = self._find({PLUGIN_KEY: PLUGIN_VALUE, OWNER_KEY: self.owner, NAME_KEY: name}, f"find {name}")
        persistent = [s for s in taken if s.metadata.get(EPHEMERAL_KEY) != "true"]
        if not persistent or len(persistent) < len(taken):
            return None  # none, or an ephemeral one: _refuse_taken says so
        if spec is None:
            return persistent[0]
        refuse_differences(name, self._identity_differences(name, settings, persistent[0]))
        return None

    def _identity_differences(self, name: str, settings: E2BSettings, found: e2b.SandboxInfo) -> builtins.list[str]:
        """What made ``found`` another identity than ``settings`` give: its network posture (in its
        metadata), else its template or the ``secure`` setting, told apart by recomputing its
        identity digest (neither is in its metadata)."""
        have, want = posture_in(found.metadata), posture_of(settings)
        out = [] if have.label == want.label else [difference("network", have.label, want.label)]
        same_posture = settings.model_copy(update={"allow_internet_access": have.internet, "allow": have.allow})
        stored = found.metadata.get(IDENTITY_KEY)
        if scope_digest(self.profile, name, same_posture, persistent=True) != stored:
            other_secure = same_posture.model_copy(update={"secure": not settings.secure})
            if scope_digest(self.profile, name, other_secure, persistent=True) == stored:
                out.append(difference("the secure setting", not settings.secure, settings.secure))
            else:
                out.append(difference("image", found.name or found.template_id, settings.template))
        return out

    def _differences(self, sandbox: E2BSandbox, found: e2b.SandboxInfo, spec: SandboxSpec) -> builtins.list[str]:
        """How a sandbox of the same identity differs from ``spec``: the allow-list E2B enforces
        (``info()``) and the labels in its metadata (other metadata is no difference)."""
        out = []
        if spec.network == "proxy" and (allow := sandbox.info().spec.allow) != tuple(spec.allow):
            out.append(difference("allow", allow, spec.allow))
        labels = found.metadata
        if any(labels.get(key) != value for key, value in spec.labels.items()):
            out.append(difference("labels", {key: labels.get(key) for key in spec.labels}, dict(spec.labels)))
        return out

    def _refuse_taken(self, name: str, *, only_ephemeral: bool = False) -> None:
        """SandboxExists when this profile already has a sandbox called ``name``."""
        taken = self._find({PLUGIN_KEY: PLUGIN_VALUE, OWNER_KEY: self.owner, NAME_KEY: name}, f"find {name}")
        ephemeral = [s for s in taken if s.metadata.get(EPHEMERAL_KEY) == "true"]
        if ephemeral:
            raise SandboxExists(f"an ephemeral sandbox named {name} exists and is never adopted; "
                                "use another name")
        if taken and not only_ephemeral:
            raise SandboxExists(f"a sandbox named {name} exists (made with another template or network "
                                "posture); remove it or use another name")

    def create(self, name: str, spec: SandboxSpec | None = None, *, ephemeral: bool = False,
               task: str | None = None) -> E2BSandbox:
        """A new sandbox ``name``. With ``task`` (the Hermes plugin's ephemeral runs) it is stamped
        with the existing plugin's scope for that task, which several run-unique sandboxes may
        share: it is never adopted, so only the name must be free."""
        validate_name(name)
        settings = self._effective(spec)
        scope = scope_digest(self.profile, name if task is None else task, settings, persistent=not ephemeral)
        if task is None and self._adoptable(scope, name) is not None:
            raise SandboxExists(f"an E2B sandbox named {name} already exists; use it, or remove it first")
        self._refuse_taken(name)
        return self._create(name, scope, settings, ephemeral=ephemeral)

    def fork(self, source: E2BSandbox, new_name: str, snapshot_id: str) -> E2BSandbox:
        """A new persistent sandbox ``new_name`` started from ``snapshot_id`` (see E2BSandbox.fork)."""
        validate_name(new_name)
        settings = self.settings.model_copy(update={"allow_internet_access": source.posture.internet,
                                                    "allow": source.posture.allow})
        scope = scope_digest(self.profile, new_name, settings, persistent=True)
        if self._adoptable(scope, new_name) is not None:
            raise SandboxExists(f"an E2B sandbox named {new_name} already exists; pick another name")
        return self._create(new_name, scope, settings, ephemeral=False, template=snapshot_id)

    def create_ephemeral(self, spec: SandboxSpec | None = None, prefix: str = "tmp") -> E2BSandbox:
        return self.create(unique_name(prefix), spec, ephemeral=True)

    def get(self, name: str) -> E2BSandbox:
        validate_name(name)
        found = self._find({PLUGIN_KEY: PLUGIN_VALUE, OWNER_KEY: self.owner, NAME_KEY: name}, f"find {name}")
        if not found:
            raise SandboxNotFound(f"no E2B sandbox named {name}; see `hermes-sandboxes ls`")
        info = found[0]
        ephemeral = info.metadata.get(EPHEMERAL_KEY) == "true"
        return self._attach(info.sandbox_id, name, info.metadata.get(SCOPE_KEY, ""), ephemeral=ephemeral,
                            created=False, posture=posture_in(info.metadata))

    def list(self) -> builtins.list[SandboxInfo]:
        found = self._find({PLUGIN_KEY: PLUGIN_VALUE, OWNER_KEY: self.owner}, "list sandboxes")
        return [info_of(s) for s in found if s.metadata.get(NAME_KEY)]

    def _create(self, name: str, scope: str, settings: E2BSettings, *, ephemeral: bool,
                template: str | None = None) -> E2BSandbox:
        """Create the sandbox from ``template`` (a snapshot id, for a fork) or the settings' template."""
        lease = lease_request(self.lease(ephemeral))
        lease_until = time.monotonic() + lease
        try:
            sdk = e2b.Sandbox.create(
                template=template or settings.template, timeout=lease,
                metadata=self._metadata(name, scope, ephemeral, settings),
                **posture_of(settings).create_options(), lifecycle=lifecycle(not ephemeral), **self.opts)
        except Exception as exc:
            error = map_error(exc, f"create sandbox {name}", self.redactor)
            if transient(exc):
                # the reply may be what was lost: the sandbox may exist and be billed; find it by its
                # scope and name (a scope alone may be shared by several ephemeral runs of one task)
                with contextlib.suppress(SandboxError):
                    found = next(iter(self._find({PLUGIN_KEY: PLUGIN_VALUE, SCOPE_KEY: scope, NAME_KEY: name},
                                                 f"find sandbox {name}")), None)
                    if found is not None:
                        log.warning("E2B: the reply to creating %s was lost; found it as %s", name,
                                    found.sandbox_id)
                        return self._attach(found.sandbox_id, name, scope, ephemeral=ephemeral, created=True,
                                            posture=posture_of(settings))
            if getattr(exc, "status_code", None) == 404:  # what create answers for an unknown template
                raise InvalidInput(f"{error}; check the template (setting template, or the spec's image)") from None
            raise error from None
        return E2BSandbox(self, sdk, name, scope, ephemeral=ephemeral, created=True,
                          posture=posture_of(settings), lease_until=lease_until)

    def _attach(self, sandbox_id: str, name: str, scope: str, *, ephemeral: bool, created: bool,
                posture: Posture | None = None) -> E2BSandbox:
        lease = lease_request(self.lease(ephemeral))
        lease_until = time.monotonic() + lease
        sdk = self.call(f"connect to sandbox {name}",
                        lambda: e2b.Sandbox.connect(sandbox_id, timeout=lease, **self.opts))
        return E2BSandbox(self, sdk, name, scope, ephemeral=ephemeral, created=created,
                          posture=posture or posture_of(self.settings),
                          lease_until=lease_until)


def posture_of(settings: E2BSettings) -> Posture:
    return Posture(internet=settings.allow_internet_access, allow=settings.allow)


def _network_metadata(posture: Posture) -> dict[str, str]:
    """What ``ls`` and ``get`` read back: the mode, and a "proxy" sandbox's allow-list as made."""
    if posture.allow is None:
        return {NETWORK_KEY: posture.label}
    return {NETWORK_KEY: posture.label, ALLOW_KEY: " ".join(posture.allow)}
