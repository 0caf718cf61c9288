"""What the rootless tests do as their user (``python -m tests.rootless.scenarios NAME``): each
scenario prints one JSON object of what it saw, which the root-side test asserts on."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from hermes_sandboxes.backends.local import LocalBackend
from hermes_sandboxes.sandbox import SandboxSpec


def _backend() -> LocalBackend:
    """A store in the user's home, which goes with the user (its layers hold files of the user's
    subordinate ids, which the user alone cannot remove)."""
    return LocalBackend(tempfile.mkdtemp(prefix="hrl-", dir=Path.home()))


def confinement() -> dict[str, Any]:
    """The user's secrets, files, /tmp and processes, seen and attacked from inside."""
    home = Path.home()
    token = secrets.token_hex(16)
    planted = {home / ".ssh" / "id_ed25519": token, home / ".aws" / "credentials": token,
               home / ".config" / "hermes" / ".env": f"OPENAI_API_KEY={token}"}
    made: list[Path] = []  # what this scenario adds to the home, which the later tests share: removed after
    clobbered = [str(path) for path in planted if path.exists()]
    assert not clobbered, f"another test left {clobbered}, which this one would overwrite"
    for path, text in planted.items():
        for parent in reversed(path.parents):
            if parent.is_relative_to(home) and not parent.exists():
                parent.mkdir()
                made.append(parent)
        path.write_text(text)
        made.append(path)
    owned = home / f"notes-{token}.txt"
    owned.write_text("mine\n")
    made.append(owned)
    host_tmp = Path(tempfile.mkstemp(prefix="hrl-host-", dir="/tmp")[1])
    host_tmp.write_text(token)
    other = subprocess.Popen(["sleep", "600"])
    backend = _backend()
    seen: dict[str, Any] = {}
    try:
        sb = backend.create("confined", SandboxSpec(network="loopback"))
        paths = " ".join(str(p) for p in [*planted, owned, host_tmp])
        seen["listed"] = sb.exec(f"ls -d {paths} {home} /home/* 2>/dev/null; ls -A /tmp").stdout
        seen["grep"] = sb.exec(f"grep -rlsF {token} / --exclude-dir=proc --exclude-dir=sys 2>/dev/null; true",
                               timeout=300).stdout
        attempts = (f"echo pwned > {owned}; echo pwned >> /proc/1/root{owned}; "
                    f"echo pwned > /proc/self/root{owned}; for f in /proc/*/root{owned}; do echo pwned > $f; done")
        seen["write"] = sb.exec(attempts + " 2>/dev/null; true").exit_code
        seen["kill"] = sb.exec(f"kill -9 {other.pid}; echo $?; kill -9 -1; true").stdout
        seen["ps"] = sb.exec("ps -e -o pid=,comm=").stdout
        seen["uid_map"] = sb.exec("cat /proc/self/uid_map").stdout
        sb.destroy()
        masked = LocalBackend(backend.home, masks=("/etc/apt", "/etc/debian_version")).create("masked")
        seen["masked"] = masked.exec("ls -A /etc/apt; cat /etc/debian_version; touch /etc/apt/x; echo $?").stdout
    finally:
        for name in backend.names():
            backend.get(name).destroy()
        seen["owned_after"] = owned.read_text()
        seen["other_alive"] = other.poll() is None
        other.kill()
        other.wait()
        host_tmp.unlink()
        for path in reversed(made):
            if path.is_dir():
                path.rmdir()
            else:
                path.unlink()
    seen.update(token=token, home=str(home), pid=other.pid)
    return seen


def hermes() -> dict[str, Any]:
    """``hermes chat -q`` as this user, with the scripted model and the sandbox backend: break the
    toolchain, restore the automatic checkpoint, use it again."""
    from tests.fakes.model_server import ModelServer, call, say
    from tests.hermes.loop_kit import AgentLoop, checkpoint_named

    backend = _backend()
    profile = Path(tempfile.mkdtemp(prefix="hrl-hermes-", dir=Path.home()))
    with ModelServer() as server:
        loop = AgentLoop(profile, backend, "rl", server)
        loop.settings["auto_checkpoint"] = "always"
        try:
            run = loop.ask([
                call("terminal", command="mkdir -p /root/app && echo v1 > /root/app/main.py && id -u && git --version"),
                call("terminal", command="rm -rf /root/app /etc/apt"),
                lambda conversation: call("tool_call", calls=[{"name": "sandbox_restore", "arguments": {
                    "id": checkpoint_named(conversation.tool_results()[-1])}}]),
                call("terminal", command="ls /etc/apt/sources.list.d && cat /root/app/main.py"),
                say("restored"),
            ])
        finally:
            for name in loop.sandbox_names():
                backend.get(name).destroy()
    return {"returncode": run.returncode, "results": run.tool_json(), "output": run.output[-3000:]}


def no_cgroup() -> dict[str, Any]:
    """What a sandbox without a delegated cgroup enforces, and how it freezes and kills."""
    from hermes_sandboxes.backends.local import cgroups
    from hermes_sandboxes.errors import Unsupported
    from hermes_sandboxes.sandbox import Limits

    backend = _backend()
    seen: dict[str, Any] = {"capabilities": sorted(c.name for c in backend.capabilities)}
    try:
        backend.create("limited", SandboxSpec(limits=Limits(memory_bytes=256 << 20)))
    except Unsupported as exc:
        seen["memory_refused"] = str(exc)
    sb = backend.create("plain", SandboxSpec(limits=Limits(pids=200)))
    try:
        seen["nproc"] = sb.exec("ulimit -u").stdout.strip()
        # the shell prints the background child's pid ($!) as it forks it; the shell has exited when
        # exec returns, but the child may not have exec'd sleep yet: wait for that (its comm), not a time
        inner = int(sb.exec("sleep 600 >/dev/null 2>&1 & echo $!").stdout)
        groups = cgroups.from_state(sb._runtime()["cgroups"])  # type: ignore[index]
        host_pid = _host_pid(sb, inner)
        _wait(lambda: Path(f"/proc/{host_pid}/comm").read_text() == "sleep\n")
        with groups.frozen():
            seen["frozen_state"] = _state(host_pid)
            seen["marked"] = groups.is_frozen()
        seen["thawed_state"] = _state(host_pid)
        seen["marked_after"] = groups.is_frozen()
        proc = sb.start("sh -c 'sleep 601 & sleep 602'")
        _wait(lambda: len(sb.exec("pgrep -x sleep").stdout.split()) == 3)
        proc.kill()
        proc.wait(30)
        _wait(lambda: len(sb.exec("pgrep -x sleep").stdout.split()) == 1)
        seen["after_kill"] = sb.exec("pgrep -ax sleep").stdout
    finally:
        for name in backend.names():
            backend.get(name).destroy()
    return seen


def _host_pid(sb: Any, inner: int) -> int:
    """The host pid of the process that is ``inner`` in the sandbox's pid namespace."""
    init = int(sb._runtime()["pid"])
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            nspid = fields.get("NSpid", "").split()
            # the background sleep's shell has exited: its parent is the sandbox's init
            if len(nspid) >= 2 and int(nspid[-1]) == inner and int(fields["PPid"]) == init:
                return int(entry.name)
    raise AssertionError(f"no host process is pid {inner} inside")


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _wait(condition: Any, timeout: float = 30) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def escapes() -> dict[str, Any]:
    """The escape suite's probes from root inside a rootless sandbox: every denied system call,
    another store of the same user, the init's /proc entry, the capabilities left."""
    from tests.local.test_escapes import ALL_PROBES, PROBE

    token = secrets.token_hex(16)
    victim, attacker = _backend(), _backend()
    seen: dict[str, Any] = {"token": token}
    try:
        other = victim.create("victim")
        other.write_file("/root/secret.txt", token.encode())
        other.stop()
        sb = attacker.create("attacker")
        sb.write_file("/root/syscall_probe.py", PROBE.read_bytes())
        probe = sb.exec(f"python3 /root/syscall_probe.py '{json.dumps(ALL_PROBES)}'")
        seen["probe"] = json.loads(probe.stdout) if probe.exit_code == 0 else probe.stderr
        seen["grep"] = sb.exec(f"grep -rlsF {token} / --exclude-dir=proc --exclude-dir=sys 2>/dev/null; true",
                               timeout=300).stdout
        seen["victim_home"] = sb.exec(f"ls -d {victim.home} 2>&1; true").stdout
        seen["init"] = sb.exec("cat /proc/1/environ; ls -l /proc/1/root/ 2>&1 | head -1; true").stdout
        seen["capbnd"] = sb.exec("grep CapBnd /proc/self/status").stdout.split()[1]
        seen["nnp"] = sb.exec("grep NoNewPrivs /proc/self/status").stdout.split()[1]
        seen["seccomp"] = sb.exec("grep ^Seccomp: /proc/self/status").stdout.split()[1]
    finally:
        for backend in (victim, attacker):
            for name in backend.names():
                backend.get(name).destroy()
    return seen


SCENARIOS = {"confinement": confinement, "hermes": hermes, "no_cgroup": no_cgroup, "escapes": escapes}

if __name__ == "__main__":
    print(json.dumps(SCENARIOS[sys.argv[1]](*sys.argv[2:])))
