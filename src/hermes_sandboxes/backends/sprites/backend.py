"""The Sprites backend: Fly.io Sprites (persistent cloud VMs with checkpoints) behind the contract.

Creating a Sprite from an image the service has not pulled may take minutes. A create waits up to
``SpritesSettings.create_wait_s`` (4 minutes by default, inside Hermes's 420 s tool deadline),
then fails with a "still being created; retry" error; the next ``open`` of that name picks the
Sprite up once it exists. Two processes creating one name end with one Sprite: the loser's create
is refused (400 "name already exists" in the API reference; 409 is taken the same way) and, once a
lookup finds the name, it adopts the winner's. A create whose answer was lost (5xx, a dropped
connection) is checked with a lookup before it is tried again, so it never makes two. A 429 (too
many creates, or too many Sprites at once) waits what the service asks (``retry_after_seconds``,
else ``Retry-After``) while the create's time allows. The body holds only published fields:
``name``, ``labels``, ``config`` (the SDKs' sizes) and ``wait_for_capacity``; Sprites have one base
image, so no image is sent (the setting is refused, see settings.py). The request goes through the
SDK's authenticated HTTP client rather than ``create_sprite``, which hides a 429's Retry-After.
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import logging
import math
import threading
import time
from typing import TYPE_CHECKING, Any

import httpx

from hermes_sandboxes.backends.sprites.api import API
from hermes_sandboxes.backends.sprites.network import policy_rules
from hermes_sandboxes.backends.sprites.sandbox import EPHEMERAL_LABEL, PROXY_LABEL, Remote, SpritesSandbox
from hermes_sandboxes.backends.sprites.settings import IDLE_REFUSAL, SpritesSettings, find_token
from hermes_sandboxes.errors import (
    BackendUnavailable,
    InvalidInput,
    RateLimited,
    SandboxError,
    SandboxExists,
    SandboxNotFound,
    SandboxUnreachable,
    Unsupported,
)
from hermes_sandboxes.names import unique_name, validate_name
from hermes_sandboxes.sandbox import (
    Backend,
    Capability,
    DoctorCheck,
    Limits,
    SandboxInfo,
    SandboxSpec,
    difference,
    refuse_differences,
)

if TYPE_CHECKING:
    from hermes_sandboxes.backends import BuildContext

log = logging.getLogger(__name__)
_CREATING = ("creating", "provisioning", "pending", "starting")
MIB = 1 << 20
GIB = 1 << 30
# a create body's size fields: the Limits field each comes from, and its unit there
_SIZES = {"cpus": ("cpus", 1.0), "ram_mb": ("memory_bytes", MIB), "storage_gb": ("disk_bytes", GIB)}


def sprite_config(limits: Limits) -> dict[str, int]:
    """The create body's ``config`` for ``limits`` (only the sizes they set), in whole units."""
    config = {
        "cpus": int(limits.cpus) if limits.cpus else None,
        "ram_mb": math.ceil(limits.memory_bytes / MIB) if limits.memory_bytes else None,
        "storage_gb": math.ceil(limits.disk_bytes / GIB) if limits.disk_bytes else None,
    }
    return {key: value for key, value in config.items() if value is not None}


class SpritesBackend(Backend):
    name = "sprites"
    # EGRESS_ALLOWLIST as the Sprite's network policy (names, not ports or addresses: network.py);
    # DIFF for the newest five checkpoints (the ones the service mounts in the Sprite; an older one
    # is refused saying why); not DELETE_CHECKPOINTS (the service has none), not TREE_KILL (the
    # kill endpoint stops the exec session; what becomes of processes that left it is not documented)
    capabilities = frozenset({Capability.CHECKPOINTS, Capability.DIFF, Capability.LIMITS, Capability.TERMINAL,
                              Capability.KILL_TAGGED, Capability.EGRESS_ALLOWLIST})

    def __init__(self, settings: SpritesSettings | None = None, *, token: str | None = None) -> None:
        self.settings = settings or SpritesSettings()
        self._token = token if token is not None else find_token()
        self._api: API | None = None
        self._lock = threading.Lock()

    @property
    def key(self) -> str:
        url = self.settings.resolved_api_url()
        return f"sprites-{hashlib.sha256(url.encode()).hexdigest()[:12]}"

    def unavailable_reason(self) -> str | None:
        if not self._token:
            return "no Sprites token: set SPRITES_TOKEN (or SPRITE_TOKEN) to a token of your Sprites organization"
        return None

    @property
    def api(self) -> API:
        with self._lock:
            if self._api is None:
                reason = self.unavailable_reason()
                if reason or not self._token:
                    raise BackendUnavailable(reason or "no Sprites token")
                self._api = API(self._token, self.settings.resolved_api_url())
            return self._api

    def close(self) -> None:
        with self._lock:
            if self._api is not None:
                self._api.close()
                self._api = None

    # specs ---------------------------------------------------------------------------------------
    def __enter__(self) -> SpritesBackend:
        return self

    def check_spec(self, spec: SandboxSpec) -> None:
        """Refuse what a Sprite cannot honour, before anything is sent."""
        super().check_spec(spec)
        if spec.network not in ("host", "proxy"):
            raise Unsupported(f"a Sprite reaches the internet, or (network 'proxy') the names of an allow-list "
                              f"through its network policy; network {spec.network!r} cannot be honoured")
        if spec.network == "proxy":
            policy_rules(spec.allow)  # InvalidInput for an entry that does not parse
        if spec.limits.pids is not None:
            raise Unsupported("Sprites cannot limit the number of processes")
        if spec.limits.cpus is not None and spec.limits.cpus != int(spec.limits.cpus):
            raise InvalidInput(f"Sprites take a whole number of CPUs, got {spec.limits.cpus:g}")
        if spec.idle_timeout is not None:
            raise Unsupported(f"idle_timeout: {IDLE_REFUSAL}")
        if spec.image is not None:
            raise Unsupported(f"Sprites have one base image (the service's, upgraded by it); image {spec.image!r} "
                              "cannot be chosen: install what you need in the Sprite and checkpoint it")

    def _create_body(self, name: str, spec: SandboxSpec, ephemeral: bool) -> dict[str, Any]:
        config = sprite_config(spec.limits)
        labels = [f"{k}={v}" for k, v in sorted(spec.labels.items())]
        if ephemeral:
            labels.append(EPHEMERAL_LABEL)
        if spec.network == "proxy":
            labels.append(PROXY_LABEL)
        # wait_for_capacity: a create the service cannot place at once waits (inside create_wait_s)
        body: dict[str, Any] = {"name": name, "labels": labels, "wait_for_capacity": True}
        if config:
            body["config"] = config
        return body

    # sandboxes -----------------------------------------------------------------------------------
    def _lookup(self, name: str) -> Remote:
        # the REST answer itself: sprites-py's get_sprite drops the size (config) that open() compares
        answer = self.api.request("GET", f"/v1/sprites/{name}", "lookup", sprite=name)
        try:
            return Remote.from_json(answer.json())
        except ValueError as exc:
            raise SandboxUnreachable(f"Sprite {name}: the lookup's answer is not JSON ({exc}); try again") from None

    def get(self, name: str) -> SpritesSandbox:
        validate_name(name)
        return SpritesSandbox(self, self._lookup(name))

    def open(self, name: str, spec: SandboxSpec | None = None) -> SpritesSandbox:
        validate_name(name)
        deadline = time.monotonic() + self.settings.create_wait_s
        try:
            remote = self._lookup(name)
        except SandboxNotFound:
            try:
                return self.create(name, spec)
            except SandboxExists:  # another process created it first: adopt theirs
                remote = self._lookup(name)
        if remote.ephemeral:
            raise SandboxExists(f"Sprite {name} is ephemeral and belongs to another run; it is never adopted")
        remote = self._await_ready(remote, deadline, ephemeral=False)
        sandbox = SpritesSandbox(self, remote)
        if spec is not None:
            self.check_spec(spec)
            refuse_differences(name, self._differences(sandbox, remote, spec))
            if spec.network == "proxy" and not sandbox.fenced:
                self._fence(sandbox, remote, spec.allow)
        return sandbox

    def _differences(self, sandbox: SpritesSandbox, remote: Remote, spec: SandboxSpec) -> builtins.list[str]:
        """How the existing Sprite differs from ``spec``, in what the service reports: its network
        (the proxy label), its allow-list (as ``info()`` reads it), the sizes the spec asks for and
        its labels. A Sprite without an allow-list asked for one is no difference: it is fenced."""
        out = []
        if sandbox.fenced and spec.network != "proxy":
            out.append(difference("network", "proxy", spec.network))
        elif sandbox.fenced and (allow := sandbox.allow_in_force()) != tuple(spec.allow):
            out.append(difference("allow", allow, spec.allow))
        out += self._size_differences(remote, spec.limits)
        labels = remote.user_labels
        if any(labels.get(key) != value for key, value in spec.labels.items()):
            out.append(difference("labels", {key: labels.get(key) for key in spec.labels}, dict(spec.labels)))
        return out

    def _size_differences(self, remote: Remote, limits: Limits) -> builtins.list[str]:
        """The sizes asked for (in the create body's units) against the ones the service reports;
        a size not asked for is the service's choice, and no difference."""
        asked = sprite_config(limits)
        if not asked:
            return []
        if remote.config is None:
            log.warning("sprites: the service does not report the size of Sprite %s, so the limits asked for "
                        "(%s) cannot be compared with it; it is resumed as it is", remote.name,
                        ", ".join(f"{k} {v}" for k, v in asked.items()))
            return []
        out = []
        for key, (label, unit) in _SIZES.items():
            if key in asked and remote.config.get(key) != asked[key]:
                have = remote.config.get(key)
                out.append(difference(label, have * unit if isinstance(have, int | float) else have,
                                      getattr(limits, label)))
        return out

    def _fence(self, sandbox: SpritesSandbox, remote: Remote, allow: tuple[str, ...]) -> None:
        """An existing Sprite opened with an allow-list it does not have (one made before the list
        was set): the Sprite's name is its identity, so it is fenced in place rather than left open."""
        log.warning("sprites: Sprite %s had no egress allow-list; it now gets the one asked for", sandbox.name)
        self.api.request("PUT", f"/v1/sprites/{sandbox.name}", "label update", sprite=sandbox.name,
                         json_body={"labels": [*remote.labels, PROXY_LABEL]})
        sandbox.fenced = True
        sandbox.set_allow(allow)

    def create(self, name: str, spec: SandboxSpec | None = None, *, ephemeral: bool = False) -> SpritesSandbox:
        validate_name(name)
        spec = spec or self.settings.spec()
        self.check_spec(spec)
        remote = self._create(name, self._create_body(name, spec, ephemeral), ephemeral)
        sandbox = SpritesSandbox(self, remote, created=True)
        if spec.network == "proxy":
            try:  # fenced before anything runs in it
                sandbox.set_allow(spec.allow)
            except BaseException:
                sandbox.destroy()
                raise
        return sandbox

    def create_ephemeral(self, spec: SandboxSpec | None = None, prefix: str = "tmp") -> SpritesSandbox:
        return self.create(unique_name(prefix), spec, ephemeral=True)

    def _create(self, name: str, body: dict[str, Any], ephemeral: bool) -> Remote:
        deadline = time.monotonic() + self.settings.create_wait_s
        for attempt in range(1, 4):
            try:
                return self._await_ready(self._post_create(name, body, deadline, ephemeral), deadline, ephemeral)
            except (SandboxExists, InvalidInput) as refused:
                # the API reference answers a taken name with 400 (and a bad body the same way):
                # a lookup tells which; 409 is read the same way should it come
                if not self._exists(name):
                    raise
                raise SandboxExists(f"a Sprite named {name} already exists; open it, or delete it first") from refused
            except RateLimited as exc:
                pause = exc.retry_after or 1.0
                if attempt == 3 or time.monotonic() + pause > deadline:
                    raise
                time.sleep(pause)
            except SandboxUnreachable:  # a 5xx or a lost answer: was it made all the same?
                try:
                    return self._await_ready(self._lookup(name), deadline, ephemeral)
                except SandboxNotFound:
                    if attempt == 3:
                        raise
        raise AssertionError("unreachable")

    def _exists(self, name: str) -> bool:
        try:
            self._lookup(name)
        except SandboxNotFound:
            return False
        return True

    def _post_create(self, name: str, body: dict[str, Any], deadline: float, ephemeral: bool) -> Remote:
        """POST /v1/sprites on a thread, waited for until ``deadline``."""
        api = self.api
        outcome: dict[str, Remote | SandboxError] = {}

        def post() -> None:
            try:
                response = api.client.http_client.post(f"{api.base_url}/v1/sprites", json=body,
                                                       timeout=self.settings.create_wait_s + 30)
                if response.status_code in (200, 201):
                    outcome["remote"] = Remote.from_json(response.json())
                else:
                    outcome["error"] = api.from_status(response.status_code, response.text, "create", name,
                                                       headers=response.headers)
            except (httpx.HTTPError, ValueError) as exc:
                outcome["error"] = api.translate(exc, "create", name)

        worker = threading.Thread(target=post, daemon=True, name=f"sprites-create-{name}")
        worker.start()
        worker.join(max(0.0, deadline - time.monotonic()))
        if worker.is_alive():
            raise self._still_creating(name, ephemeral)
        result = outcome.get("error") or outcome["remote"]
        if isinstance(result, SandboxError):
            raise result
        return result

    def _await_ready(self, remote: Remote, deadline: float, ephemeral: bool) -> Remote:
        pause = 0.2
        while remote.status in _CREATING:
            if time.monotonic() + pause > deadline:
                raise self._still_creating(remote.name, ephemeral)
            time.sleep(pause)
            pause = min(pause * 2, 2.0)
            remote = self._lookup(remote.name)
        return remote

    def _still_creating(self, name: str, ephemeral: bool) -> SandboxUnreachable:
        wait = self.settings.create_wait_s
        if ephemeral:
            log.warning("sprites: ephemeral Sprite %s was still being created after %.0fs; it may be left "
                        "behind: delete it by hand if it shows up", name, wait)
        return SandboxUnreachable(f"Sprite {name} is still being created; retry in a minute (waited {wait:g}s; "
                                  "the next command picks it up once it exists)")

    def list(self) -> builtins.list[SandboxInfo]:
        from sprites.types import ListOptions

        infos: builtins.list[SandboxInfo] = []
        token: str | None = None
        while True:
            options = ListOptions(max_results=100, continuation_token=token)
            page = self.api.call("list", functools.partial(self.api.client.list_sprites, options))
            infos += [Remote.from_sdk(info).info(self._checkpoint_count(info.name)) for info in page.sprites]
            if not page.has_more or not page.next_continuation_token:
                return infos
            token = page.next_continuation_token

    def _checkpoint_count(self, name: str) -> int:
        """One request per Sprite (the list answer does not carry it); 0 while it is being made."""
        sprite = self.api.client.sprite(name)
        try:
            return len(self.api.call("checkpoint list", sprite.list_checkpoints, sprite=name))
        except (SandboxNotFound, SandboxUnreachable):
            return 0

    def doctor(self) -> builtins.list[DoctorCheck]:
        reason = self.unavailable_reason()
        checks = [DoctorCheck(reason is None, "Sprites token", reason or "SPRITES_TOKEN (or SPRITE_TOKEN) is set")]
        if reason is None:
            from sprites.types import ListOptions

            try:
                self.api.call("token check", lambda: self.api.client.list_sprites(ListOptions(max_results=1)),
                              retry=False)
                checks.append(DoctorCheck(True, "Sprites API", f"{self.api.base_url} accepts the token"))
            except Exception as exc:
                checks.append(DoctorCheck(False, "Sprites API", self.api.redact(str(exc))))
        return checks


def build_backend(settings: Any, context: BuildContext | None = None) -> SpritesBackend:
    """The registry's factory: SpritesSettings -> SpritesBackend, the token read through the
    context's secret lookup when it has one ("" when that finds none: no falling back to this
    process's environment), else from the environment."""
    if not isinstance(settings, SpritesSettings):
        raise InvalidInput(f"the Sprites backend takes SpritesSettings, not {type(settings).__name__}")
    lookup = context.secret_lookup if context else None
    return SpritesBackend(settings, token=(find_token(lookup) or "") if lookup is not None else None)
