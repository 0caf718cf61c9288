"""One story of the MCP tools over any backend (the local one, and the real Sprites and E2B SDKs
against their fakes): what every backend must do the same, and what a backend without a
capability must say instead of failing silently. Called by tests/mcp, tests/sprites and tests/e2b."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from mcp import Client

from hermes_sandboxes.mcp.scope import Rules
from hermes_sandboxes.sandbox import Backend, Capability
from tests.mcp.kit import InProcess, call_error, call_ok, data, drive, running_for, text


def run_story(backend: Backend, state_root: Path, prefix: str, **settings: Any) -> dict[str, Any]:
    """Create, run, write, break, restore (where it can), fork (where it can), remove; returns what
    the model was told at each step that differs between backends."""
    caps = backend.capabilities
    server = running_for(backend, state_root, Rules(prefix=prefix), **settings)
    told: dict[str, Any] = {}

    async def scenario(client: Client) -> None:
        name = (await call_ok(client, "sandbox_create", name="conf"))["sandbox"]
        info = await call_ok(client, "sandbox_info", sandbox=name)
        assert info["backend"] == backend.name
        assert set(info["missing_capabilities"]) == {str(c) for c in Capability} - {str(c) for c in caps}
        home = info["home"]
        ran = await call_ok(client, "exec", sandbox=name, command="echo out; echo err >&2; exit 3")
        assert (ran["exit_code"], ran["stdout"], ran["stderr"]) == (3, "out\n", "err\n")
        slow = await call_ok(client, "exec", sandbox=name, command="sleep 60", timeout=1)
        assert slow["exit_code"] == 124 and slow["timed_out"] is True
        blob = bytes(range(256))
        await call_ok(client, "file_write", sandbox=name, path=f"{home}/w/blob",
                      content_base64=base64.b64encode(blob).decode())
        await call_ok(client, "file_write", sandbox=name, path=f"{home}/w/a.txt", content="keep me\n")
        got = await call_ok(client, "file_read", sandbox=name, path=f"{home}/w/blob")
        assert base64.b64decode(got["content"]) == blob
        listed = await call_ok(client, "file_list", sandbox=name, path=f"{home}/w")
        assert [e["name"] for e in listed["entries"]] == ["a.txt", "blob"]
        wiped = await client.call_tool("exec", {"sandbox": name, "command": f"rm -rf {home}/w"})
        assert not wiped.is_error, text(wiped)
        if Capability.CHECKPOINTS not in caps:
            assert data(wiped)["checkpoint"] is None
            told["no_checkpoints"] = await call_error(client, "checkpoint_create", sandbox=name, comment="x")
            return
        undo = data(wiped)["checkpoint"]["undo"]["arguments"]
        assert undo["checkpoint"] in text(wiped)
        preview = await call_ok(client, "checkpoint_restore", sandbox=name, checkpoint=undo["checkpoint"])
        assert preview["applied"] is False and [c["command"] for c in preview["commands"]] == [f"rm -rf {home}/w"]
        told["preview_diff_unavailable"] = preview["diff_unavailable"]
        diff = await client.call_tool("checkpoint_diff", {"sandbox": name, "checkpoint": undo["checkpoint"]})
        if Capability.DIFF in caps:
            assert not diff.is_error and any("a.txt" in c["path"] for c in data(diff)["changes"]), text(diff)
        else:
            assert diff.is_error and "cannot diff" in text(diff)
            told["diff"] = text(diff)
        since = await call_ok(client, "checkpoint_log", sandbox=name, since=undo["checkpoint"])
        assert [c["command"] for c in since["commands"]] == [f"rm -rf {home}/w"]  # what the restore undoes
        await call_ok(client, "checkpoint_restore", **undo)
        back = await call_ok(client, "file_read", sandbox=name, path=f"{home}/w/a.txt")
        assert back["content"] == "keep me\n"
        saved = await call_ok(client, "checkpoint_create", sandbox=name, comment="restored state")
        listed_cps = await call_ok(client, "checkpoint_list", sandbox=name)
        assert [c["trigger"] for c in listed_cps["checkpoints"]][-2:] == ["auto", "agent"]
        assert listed_cps["checkpoints"][-1]["id"] == saved["checkpoint"]["id"]
        log = await call_ok(client, "checkpoint_log", sandbox=name)
        assert f"rm -rf {home}/w" in [c["command"] for c in log["commands"]]
        fork = await client.call_tool("sandbox_fork", {"sandbox": name, "name": "conf2"})
        if Capability.FORK in caps:
            assert not fork.is_error, text(fork)
            copy = await call_ok(client, "file_read", sandbox=f"{prefix}-conf2", path=f"{home}/w/a.txt")
            assert copy["content"] == "keep me\n"
            await call_ok(client, "sandbox_remove", sandbox=f"{prefix}-conf2", confirm=True)
        else:
            assert fork.is_error and "cannot fork" in text(fork)
            told["fork"] = text(fork)
        kept = await call_ok(client, "sandbox_remove", sandbox=name)
        assert kept["removed"] is False
        await call_ok(client, "sandbox_remove", sandbox=name, confirm=True)
        assert name not in {s["name"] for s in (await call_ok(client, "sandbox_list"))["sandboxes"]}

    try:
        drive(InProcess(server), scenario)
    finally:
        server.close()
        for info in backend.list():
            if info.name.startswith(f"{prefix}-"):
                backend.get(info.name).destroy()
    return told
