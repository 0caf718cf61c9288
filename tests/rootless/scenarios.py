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
    return LocalBackend(tempfile.mkdtemp(prefix="hrl-", dir="/tmp"))


def confinement() -> dict[str, Any]:
    """The user's secrets, files, /tmp and processes, seen and attacked from inside."""
    home = Path.home()
    token = secrets.token_hex(16)
    planted = {home / ".ssh" / "id_ed25519": token, home / ".aws" / "credentials": token,
               home / ".config" / "hermes" / ".env": f"OPENAI_API_KEY={token}"}
    for path, text in planted.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    owned = home / "notes.txt"
    owned.write_text("mine\n")
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
    finally:
        for name in backend.names():
            backend.get(name).destroy()
        seen["owned_after"] = owned.read_text()
        seen["other_alive"] = other.poll() is None
        other.kill()
        other.wait()
        host_tmp.unlink()
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


SCENARIOS = {"confinement": confinement, "hermes": hermes}

if __name__ == "__main__":
    print(json.dumps(SCENARIOS[sys.argv[1]](*sys.argv[2:])))
