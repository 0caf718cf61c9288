"""The fake service's state: Sprites, each backed by a real local sandbox, and their checkpoints.

Only the local backend's public contract is used (create, get, exec, start, read_file, write_file,
checkpoint, checkpoints, restore, destroy), so commands and files inside a fake Sprite are real.
Blocking calls: the server runs them on worker threads.

Like the service, a fake Sprite has its newest five checkpoints at ``/.sprite/checkpoints/<id>/``.
The fake emulates those mounts inside the Sprite's own tree: each checkpoint keeps a tar of the
Sprite's directories (``MOUNTED_ROOTS``: the local sandbox's lower layer is this host's root, far
too big to copy, and the Sprite's own files live there) taken as the checkpoint is made, unpacked
under the mount point; after a restore (which rolls that directory back too) the five are unpacked
again. They are not read-only here (making them so would change the permissions a diff compares).

The network policy is enforced where the fake can: through name resolution, as the service does
it through DNS. Each fake Sprite shares this host's network (a Sprite reaches the internet), and the
names a test registers in ``hosts`` (each a loopback address) resolve inside it, through the
Sprite's ``/etc/hosts``, only while its policy allows them (the most specific rule wins: the exact
name, then the longest ``*.domain``, then ``*``; no rules, no restriction). A refused name does not
resolve, so a ``curl`` to it fails as it would on a DNS REFUSED. Raw addresses are not blocked here.
The policy is readable inside at ``/.sprite/policy/network.json``, as on the service.
"""

from __future__ import annotations

import itertools
import json
import secrets
import shlex
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox
from hermes_sandboxes.errors import SandboxFileNotFound
from hermes_sandboxes.sandbox import Limits, SandboxSpec


def sized(config: dict[str, Any]) -> Limits:
    """The limits of a Sprite created with ``config`` (``cpus``, ``ram_mb``; ``storage_gb`` is the
    service's business: the fake's store keeps no quota per Sprite)."""
    cpus, ram_mb = config.get("cpus"), config.get("ram_mb")
    return Limits(cpus=float(cpus) if cpus else None, memory_bytes=int(ram_mb) << 20 if ram_mb else None)

MOUNTS = "/.sprite/checkpoints"
MOUNTED = 5
HOSTS_MARK = "#fake-sprites-policy"
DEFAULT_DOMAINS = {"github.com", "registry.npmjs.org", "pypi.org", "files.pythonhosted.org"}  # include: defaults
MOUNTED_ROOTS = ("root", "home")  # the host's other directories show through and change under a test


class Conflict(Exception):
    """A Sprite with that name exists already (or is being created)."""


class Missing(Exception):
    """No such Sprite, checkpoint, session or file."""


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class FakeSprite:
    name: str
    local_name: str
    config: dict[str, Any]
    labels: list[str]
    image: str | None
    created: float = field(default_factory=time.time)
    status: str = "creating"  # then "warm"; "running" while a command runs
    id: str = field(default_factory=lambda: f"sprite-{secrets.token_hex(8)}")
    sandbox: LocalSandbox | None = None
    checkpoint_ids: dict[str, str] = field(default_factory=dict)  # Sprites id (v1, v2...) -> local id
    auto_ids: set[str] = field(default_factory=set)  # the service's own (auto-N), hidden by default
    sources: dict[str, str] = field(default_factory=dict)  # checkpoint id -> the one before it
    trees: dict[str, bytes] = field(default_factory=dict)  # checkpoint id -> a tar of its MOUNTED_ROOTS
    running: int = 0
    restarting: bool = False  # a restore is under way: exec is refused
    rules: list[dict[str, str]] = field(default_factory=list)  # the network policy
    # sprites-go reads a config in the answer, the API reference's Sprite schema lists none: a test
    # turns it off to be the service that omits it
    reports_config: bool = True

    def to_json(self) -> dict[str, Any]:
        status = "running" if self.running and self.status == "warm" else self.status
        return {
            "id": self.id, "name": self.name, "organization": "fake-org", "status": status,
            "created_at": iso(self.created), "updated_at": iso(self.created),
            "url": f"https://{self.name}-fake.sprites.app", "url_settings": {"auth": "sprite"},
            "labels": list(self.labels), **({"config": dict(self.config)} if self.reports_config else {}),
            **({"image": self.image} if self.image else {}),
        }


class World:
    """Every Sprite of one fake server, in one local backend under names this world owns."""

    def __init__(self, backend: LocalBackend, local_prefix: str) -> None:
        self.backend = backend
        self.hosts: dict[str, str] = {}  # name -> loopback address, resolvable where a policy allows it
        self._prefix = local_prefix
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()
        self.sprites: dict[str, FakeSprite] = {}

    # sprites -----------------------------------------------------------------------------------
    def reserve(self, name: str, config: dict[str, Any], labels: list[str], image: str | None) -> FakeSprite:
        """Claim ``name`` atomically: of two concurrent creates exactly one gets it."""
        with self._lock:
            if name in self.sprites:
                raise Conflict(name)
            sprite = FakeSprite(name, f"{self._prefix}-{next(self._numbers)}", config, labels, image)
            self.sprites[name] = sprite
            return sprite

    def build(self, sprite: FakeSprite) -> None:
        """Create the Sprite's sandbox (the slow part of a create), with the size the create asked
        for as its limits (CPUs and memory; the store's disk limit where it can enforce one), as
        the service sizes a Sprite by its ``config``."""
        sandbox = self.backend.create(sprite.local_name, SandboxSpec(network="host", limits=sized(sprite.config)))
        sandbox.exec(["mkdir", "-p", "/root", "/home/sprite"])
        sprite.sandbox = sandbox
        self.resolve(sprite, sandbox)
        sprite.status = "warm"

    # the network policy ------------------------------------------------------------------------
    def set_policy(self, name: str, rules: list[dict[str, str]]) -> None:
        sprite, sandbox = self.ready(name)
        sprite.rules = [dict(r) for r in rules]
        self.resolve(sprite, sandbox)

    def resolve(self, sprite: FakeSprite, sandbox: LocalSandbox) -> None:
        """Write the Sprite's /etc/hosts: the registered names its policy allows, and its policy."""
        marked = "".join(f"{address} {host} {HOSTS_MARK}\n" for host, address in sorted(self.hosts.items())
                         if allowed(host, sprite.rules))
        script = ('mkdir -p /.sprite/policy && printf %s "$1" > /.sprite/policy/network.json && '
                  f'sed -i "/{HOSTS_MARK}/d" /etc/hosts && printf %s "$2" >> /etc/hosts')
        result = sandbox.exec(["sh", "-c", script, "sh", json.dumps({"rules": sprite.rules}), marked])
        if result.exit_code != 0:
            raise OSError(f"could not apply the network policy of {sprite.name}: {result.stderr}")

    def get(self, name: str) -> FakeSprite:
        sprite = self.sprites.get(name)
        if sprite is None:
            raise Missing(f"sprite {name} not found")
        return sprite

    def ready(self, name: str) -> tuple[FakeSprite, LocalSandbox]:
        sprite = self.get(name)
        if sprite.sandbox is None:
            raise Missing(f"sprite {name} is still being created")
        return sprite, sprite.sandbox

    def delete(self, name: str) -> None:
        with self._lock:
            sprite = self.sprites.pop(name, None)
        if sprite is None:
            raise Missing(f"sprite {name} not found")
        if sprite.sandbox is not None:
            sprite.sandbox.destroy()

    def destroy_all(self) -> list[str]:
        errors = []
        for name in list(self.sprites):
            try:
                self.delete(name)
            except Exception as exc:  # keep cleaning up; report at the end
                errors.append(f"{name}: {exc}")
        for name in self.backend.names():  # a build that finished after its Sprite was deleted
            if name.startswith(self._prefix + "-"):
                self.backend.get(name).destroy()
        return errors

    def page(self, prefix: str, max_results: int, after: str) -> tuple[list[FakeSprite], bool]:
        names = sorted(n for n in self.sprites if n.startswith(prefix) and n > after)
        chosen = names[:max_results]
        return [self.sprites[n] for n in chosen], len(names) > len(chosen)

    # checkpoints -------------------------------------------------------------------------------
    def checkpoint(self, name: str, comment: str, *, auto: bool = False) -> str:
        sprite, sandbox = self.ready(name)
        local = sandbox.checkpoint(comment)
        if auto:
            public = f"auto-{len(sprite.auto_ids) + 1}"
            sprite.auto_ids.add(public)
        else:
            public = f"v{len(sprite.checkpoint_ids) - len(sprite.auto_ids) + 1}"
        previous = next(reversed(sprite.checkpoint_ids), None)
        sprite.checkpoint_ids[public] = local.id
        sprite.sources[public] = previous or ""
        sprite.trees[public] = _tar(sandbox)
        self.mount(sprite, sandbox)
        return public

    def mount(self, sprite: FakeSprite, sandbox: LocalSandbox) -> None:
        """Make ``/.sprite/checkpoints`` hold exactly the newest MOUNTED checkpoints' trees."""
        newest = list(sprite.checkpoint_ids)[-MOUNTED:]
        present = sandbox.exec(f"mkdir -p {MOUNTS} && ls -1 {MOUNTS}").stdout.split()
        for stale in set(present) - set(newest):
            sandbox.exec(["rm", "-rf", "--", f"{MOUNTS}/{stale}"])
        for public in newest:
            if public in present:
                continue
            target = f"{MOUNTS}/{public}"
            proc = sandbox.start(["sh", "-c", 'mkdir -p "$1" && tar -x -C "$1"', "sh", target],
                                 stdin=sprite.trees[public])
            if proc.wait(timeout=120) != 0:
                raise OSError(f"could not mount checkpoint {public} of {sprite.name}")

    def checkpoints(self, name: str, *, include_auto: bool = True) -> list[dict[str, Any]]:
        sprite, sandbox = self.ready(name)
        by_local = {c.id: c for c in sandbox.checkpoints()}
        out = []
        for public, local_id in sprite.checkpoint_ids.items():
            cp = by_local.get(local_id)
            if cp is not None and (include_auto or public not in sprite.auto_ids):
                out.append({"id": public, "create_time": iso(cp.created_at), "comment": cp.comment,
                            "health": "", "source_id": sprite.sources.get(public, ""),
                            **({"is_auto": True} if public in sprite.auto_ids else {})})
        return out

    def begin_restart(self, name: str) -> None:
        self.get(name).restarting = True

    def end_restart(self, name: str) -> None:
        sprite = self.sprites.get(name)
        if sprite is not None:
            sprite.restarting = False

    def find_checkpoint(self, name: str, public: str) -> dict[str, Any]:
        for cp in self.checkpoints(name):
            if cp["id"] == public:
                return cp
        raise Missing(f"checkpoint {public} not found")

    def restore(self, name: str, public: str) -> None:
        sprite, sandbox = self.ready(name)
        self.find_checkpoint(name, public)
        sandbox.restore(sprite.checkpoint_ids[public])
        sandbox.exec(["rm", "-rf", "--", MOUNTS])  # rolled back with the rest: mounted afresh
        self.mount(sprite, sandbox)
        self.resolve(sprite, sandbox)  # the policy is the Sprite's, not its files': it stays

    # files -------------------------------------------------------------------------------------
    def write(self, name: str, path: str, data: bytes, mode: int, parents: bool) -> None:
        _, sandbox = self.ready(name)
        parent = path.rsplit("/", 1)[0] or "/"
        check = ["mkdir", "-p", "--", parent] if parents else ["test", "-d", parent]
        if sandbox.exec(check).exit_code != 0:
            raise Missing(f"{parent}: no such directory")
        sandbox.write_file(path, data, mode)

    def read(self, name: str, path: str) -> bytes:
        _, sandbox = self.ready(name)
        try:
            return sandbox.read_file(path)
        except SandboxFileNotFound as exc:
            raise Missing(path) from exc

    def listing(self, name: str, path: str) -> list[dict[str, Any]]:
        _, sandbox = self.ready(name)
        result = sandbox.exec(["python3", "-c", _LIST_SCRIPT, path])
        if result.exit_code != 0:
            raise Missing(path)
        entries: list[dict[str, Any]] = json.loads(result.stdout)
        return entries

    def remove(self, name: str, path: str, recursive: bool) -> None:
        _, sandbox = self.ready(name)
        if sandbox.exec(["test", "-e", path]).exit_code != 0:
            raise Missing(path)
        flag = "-rf" if recursive else "-f"
        result = sandbox.exec(f"rm {flag} -- {shlex.quote(path)} 2>&1 || rmdir -- {shlex.quote(path)}")
        if result.exit_code != 0:
            raise OSError(result.stdout.strip())


def allowed(host: str, rules: list[dict[str, str]]) -> bool:
    """Whether ``rules`` let ``host`` resolve: the most specific rule wins (the exact name, then the
    longest ``*.domain``, then ``*``); no rules, no restriction; no rule matching, refused."""
    if not rules:
        return True
    best: tuple[int, int, str] | None = None
    for rule in rules:
        domain, action = rule.get("domain", ""), rule.get("action", "")
        if rule.get("include") == "defaults":
            domain, action = (host, "allow") if host in DEFAULT_DOMAINS else ("", "")
        if domain == host:
            rank = (3, len(domain), action)
        elif domain.startswith("*.") and host.endswith(domain[1:]):
            rank = (2, len(domain), action)
        elif domain == "*":
            rank = (1, 0, action)
        else:
            continue
        if best is None or rank[:2] > best[:2]:
            best = rank
    return best is not None and best[2] == "allow"


def _tar(sandbox: LocalSandbox) -> bytes:
    out = bytearray()
    roots = " ".join(MOUNTED_ROOTS)
    proc = sandbox.start(["sh", "-c", f"cd / && tar -c $(for d in {roots}; do [ -e $d ] && echo $d; done)"],
                         on_stdout=out.extend)
    if proc.wait(timeout=120) != 0:
        raise OSError("could not snapshot the Sprite's tree for its checkpoint mount")
    return bytes(out)


# What fs/list answers: the entries of a directory, or the file itself.
_LIST_SCRIPT = r"""
import json, os, stat, sys, datetime
p = sys.argv[1]
def entry(path):
    st = os.lstat(path)
    return {"name": os.path.basename(path) or "/", "path": path, "size": st.st_size,
            "mode": oct(stat.S_IMODE(st.st_mode))[2:].rjust(4, "0"), "isDir": stat.S_ISDIR(st.st_mode),
            "modTime": datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc).isoformat()}
if os.path.isdir(p) and not os.path.islink(p):
    print(json.dumps([entry(os.path.join(p, n)) for n in sorted(os.listdir(p))]))
else:
    print(json.dumps([entry(p)]))
"""
