"""RecordedSandbox against the real local backend: the journal, automatic checkpoints, retention,
restore previews and the audit log."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from hermes_sandboxes.errors import CheckpointNotFound, InvalidInput
from hermes_sandboxes.names import unique_name
from hermes_sandboxes.recorder.journal import (
    AllowRecord,
    CheckpointDeleteRecord,
    CheckpointRecord,
    DestroyRecord,
    ExecRecord,
    Journal,
    RestoreRecord,
)
from hermes_sandboxes.recorder.options import Checkpointing, Health, Retention
from hermes_sandboxes.recorder.sandbox import RecordedSandbox
from hermes_sandboxes.recorder.state import HostState
from hermes_sandboxes.sandbox import ChangeKind, Sandbox, SandboxSpec

Factory = Callable[..., RecordedSandbox]


@pytest.fixture
def record(sandbox: Sandbox, tmp_path: Path) -> Factory:
    def make(**options: Any) -> RecordedSandbox:
        return HostState(tmp_path, durable=False).recorded(sandbox, **options)

    return make


def audit_of(tmp_path: Path) -> Journal:
    (path,) = tmp_path.glob("*/audit.jsonl")  # one backend's audit log under the host state dir
    return Journal(path)


def commands(records: Sequence[ExecRecord]) -> list[str]:
    return [c.command for c in records]


def make_app(recorded: RecordedSandbox) -> None:
    script = "mkdir -p /root/app/src && echo 'print(1)' > /root/app/src/main.py && echo v1 >/root/app/VERSION"
    assert recorded.exec(script).result.ok


def test_every_command_goes_to_the_journal_and_the_audit_log(record: Factory, tmp_path: Path) -> None:
    recorded = record(origin={"session": "s-1"})
    recorded.exec("echo hello")
    recorded.exec(["sh", "-c", "exit 3"], origin={"task": "t-7"})
    for log in (recorded.journal, audit_of(tmp_path)):
        execs = log.records_of(ExecRecord, sandbox=recorded.name)
        assert [(e.command, e.exit_code) for e in execs] == [("echo hello", 0), ("sh -c 'exit 3'", 3)]
        assert execs[1].origin == {"session": "s-1", "task": "t-7"}
        assert all(e.duration_s >= 0 and not e.timed_out for e in execs)


def test_a_command_that_cannot_start_is_recorded_with_its_error(record: Factory) -> None:
    recorded = record()
    with pytest.raises(InvalidInput):
        recorded.exec("ls", cwd="not/absolute")
    (failed,) = recorded.journal.records_of(ExecRecord)
    assert failed.exit_code is None and failed.error is not None and "absolute" in failed.error


def test_an_automatic_checkpoint_before_rm_rf_lets_restore_bring_the_app_back(record: Factory) -> None:
    recorded = record(checkpointing=Checkpointing("risky"))
    make_app(recorded)

    outcome = recorded.exec("rm -rf /root/app")
    assert outcome.verdict.risky and outcome.result.ok
    auto = outcome.auto_checkpoint
    assert auto is not None
    assert auto.trigger == "auto" and auto.trigger_command == "rm -rf /root/app"
    assert "rm -rf /root/app" in auto.comment
    assert not recorded.exec("test -e /root/app").result.ok

    preview = recorded.restore_preview(auto.id)
    assert preview.commands is not None
    assert [c.command for c in preview.commands] == ["rm -rf /root/app", "test -e /root/app"]
    assert preview.changes is not None and preview.summary is not None
    deleted = {c.path for c in preview.changes if c.kind is ChangeKind.DELETED}
    assert {"/root/app/src/main.py", "/root/app/VERSION"} <= deleted
    assert preview.summary.total.deleted >= 2

    thrown_away = recorded.restore(auto.id)
    assert thrown_away is not None and len(thrown_away) == 2
    assert recorded.exec("cat /root/app/VERSION").result.stdout == "v1\n"
    (restored,) = recorded.journal.records_of(RestoreRecord)
    assert restored.id == auto.id and restored.discarded == 2


def test_a_harmless_command_takes_no_checkpoint_under_the_risky_policy(record: Factory) -> None:
    recorded = record(checkpointing=Checkpointing("risky"))
    outcome = recorded.exec("ls /")
    assert outcome.auto_checkpoint is None and not outcome.verdict.risky
    assert recorded.checkpoints() == []


def test_the_policy_can_be_chosen_per_command(record: Factory) -> None:
    recorded = record()  # off by default
    assert recorded.exec("rm -rf /root/nothing").auto_checkpoint is None
    taken = recorded.exec("echo hi", checkpoint="always").auto_checkpoint
    assert taken is not None and [c.id for c in recorded.checkpoints()] == [taken.id]
    with pytest.raises(InvalidInput):
        recorded.exec("echo hi", checkpoint="sometimes")  # type: ignore[arg-type]


def test_retention_keeps_the_last_ten_automatic_checkpoints_and_every_manual_one(record: Factory) -> None:
    recorded = record(checkpointing=Checkpointing("always"), retention=Retention(min_age=0))
    manual = [recorded.checkpoint("first manual")]
    agent = recorded.checkpoint("the agent's own", trigger="agent")
    recorded.exec("touch /root/changed", checkpoint="off")  # else the first auto reuses the agent's
    autos = []
    for i in range(13):
        outcome = recorded.exec(f"echo {i} >> /root/log")
        assert outcome.auto_checkpoint is not None
        autos.append(outcome.auto_checkpoint.id)
        if i == 5:
            manual.append(recorded.checkpoint("second manual"))
            recorded.exec("touch /root/changed-again", checkpoint="off")

    listed = recorded.checkpoints()
    by_trigger: dict[str, list[str]] = {}
    for checkpoint in listed:
        by_trigger.setdefault(checkpoint.trigger, []).append(checkpoint.id)
    assert by_trigger["auto"] == autos[-10:]
    assert by_trigger["manual"] == [c.id for c in manual]
    assert by_trigger["agent"] == [agent.id]
    pruned = recorded.journal.records_of(CheckpointDeleteRecord)
    assert [(d.id, d.reason) for d in pruned] == [(a, "retention") for a in autos[:3]]


def test_retention_must_keep_at_least_one(record: Factory) -> None:
    with pytest.raises(InvalidInput, match="retention"):
        record(retention=Retention(0))


def test_each_checkpoint_lists_the_commands_since_the_previous_one(record: Factory) -> None:
    recorded = record()
    recorded.exec("echo one")
    first = recorded.checkpoint("base")
    recorded.exec("echo two")
    recorded.exec("false")
    second = recorded.checkpoint("after two commands")

    listed = {c.id: c for c in recorded.checkpoints()}
    assert commands(listed[first.id].commands) == ["echo one"]
    assert listed[second.id].previous == first.id
    assert [(c.command, c.exit_code) for c in listed[second.id].commands] == [
        ("echo two", 0), ("false", 1)]
    assert listed[second.id].trigger == "manual"
    assert listed[second.id].comment == "after two commands"
    assert isinstance(listed[second.id].layer_bytes, int)


def test_a_deleted_checkpoint_hands_its_commands_to_the_next_one(record: Factory) -> None:
    recorded = record()
    first = recorded.checkpoint("first")
    recorded.exec("echo a")
    middle = recorded.checkpoint("middle")
    recorded.exec("echo b")
    last = recorded.checkpoint("last")
    recorded.delete_checkpoint(middle.id)

    listed = {c.id: c for c in recorded.checkpoints()}
    assert set(listed) == {first.id, last.id}
    assert listed[last.id].previous == first.id
    assert commands(listed[last.id].commands) == ["echo a", "echo b"]
    (deleted,) = recorded.journal.records_of(CheckpointDeleteRecord)
    assert (deleted.id, deleted.reason) == (middle.id, "manual")


def test_restore_preview_lists_the_commands_since_and_forgets_the_ones_a_restore_discarded(
    record: Factory,
) -> None:
    recorded = record()
    make_app(recorded)
    base = recorded.checkpoint("app installed")
    recorded.exec("echo v2 >/root/app/VERSION")
    recorded.exec("touch /root/app/new-file")

    preview = recorded.restore_preview(base.id)
    assert preview.commands is not None
    assert [c.command for c in preview.commands] == ["echo v2 >/root/app/VERSION", "touch /root/app/new-file"]
    assert preview.changes is not None
    kinds = {c.path: c.kind for c in preview.changes}
    assert kinds["/root/app/VERSION"] is ChangeKind.MODIFIED
    assert kinds["/root/app/new-file"] is ChangeKind.ADDED
    assert preview.to_dict()["summary"]["total"]["files"] == len(preview.changes)

    recorded.restore(base.id)
    recorded.exec("echo after-restore")
    again = recorded.restore_preview(base.id, diff=False)
    assert again.commands is not None and [c.command for c in again.commands] == ["echo after-restore"]
    assert again.changes is None and again.diff_unavailable


def test_a_checkpoint_taken_outside_the_journal_still_lists_with_trigger_unknown(
    record: Factory, sandbox: Sandbox
) -> None:
    recorded = record()
    recorded.exec("echo before")
    direct = sandbox.checkpoint("taken by hand")
    recorded.exec("echo after")
    (listed,) = recorded.checkpoints()
    assert listed.id == direct.id and listed.trigger == "unknown" and not listed.journaled
    assert listed.comment == "taken by hand"
    preview = recorded.restore_preview(direct.id, diff=False)
    assert preview.commands is not None and [c.command for c in preview.commands] == ["echo after"]


def test_the_health_command_runs_before_a_checkpoint_and_its_result_is_kept(record: Factory) -> None:
    recorded = record(health=Health("test -f /root/app/VERSION && echo healthy"))
    sick = recorded.checkpoint("nothing installed yet")
    make_app(recorded)
    well = recorded.checkpoint("installed")
    recorded.exec("touch /root/app/changed", checkpoint="off")  # else the auto checkpoint reuses "installed"
    auto = recorded.exec("echo x", checkpoint="always").auto_checkpoint

    assert sick.health is not None and sick.health.passed is False and sick.health.exit_code == 1
    assert well.health is not None and well.health.passed is True and "healthy" in well.health.output_tail
    assert auto is not None and auto.health is None  # not before every risky command
    # The health command is the checkpoint's evidence, not one of the agent's commands.
    assert "test -f" not in " ".join(e.command for e in recorded.journal.records_of(ExecRecord))
    stored = {r.id: r for r in recorded.journal.records_of(CheckpointRecord)}
    health = stored[well.id].health
    assert health is not None and health.exit_code == 0


def test_checkpoint_show_and_missing_checkpoints(record: Factory) -> None:
    recorded = record()
    taken = recorded.checkpoint("kept", trigger="agent")
    assert recorded.get_checkpoint(taken.id).trigger == "agent"
    with pytest.raises(CheckpointNotFound, match="has no checkpoint 'ck-nope'"):
        recorded.restore_preview("ck-nope")
    with pytest.raises(InvalidInput):
        recorded.checkpoint("bad", trigger="whim")  # type: ignore[arg-type]


def test_destroy_is_recorded_and_ends_the_story(local_backend: Any, tmp_path: Path) -> None:
    from hermes_sandboxes.names import unique_name

    sandbox = local_backend.create(unique_name("rec"))
    recorded = HostState(tmp_path, durable=False).recorded(sandbox)
    recorded.record_create()
    recorded.checkpoint("doomed")
    recorded.destroy()
    assert recorded.journal.records_of(DestroyRecord)
    assert recorded.journal.story(sandbox.name).checkpoints == {}
    assert [d["type"] for d in audit_of(tmp_path).raw()] == ["create", "checkpoint_start", "checkpoint", "destroy"]


def test_secrets_never_reach_the_logs(record: Factory, tmp_path: Path) -> None:
    recorded = HostState(tmp_path, durable=False).recorded(
        record().inner, redact=lambda s: s.replace("s3cr3t-token", "[REDACTED]"))
    recorded.exec("echo s3cr3t-token > /dev/null", env={"API_TOKEN": "s3cr3t-token"})
    for path in (recorded.journal.path, audit_of(tmp_path).path):
        text = path.read_text()
        assert "s3cr3t-token" not in text and "API_TOKEN" not in text


def test_overwriting_an_existing_protected_file_is_risky_and_creating_one_is_not(record: Factory) -> None:
    recorded = record(checkpointing=Checkpointing("risky", ("/root/app",)))
    make_app(recorded)  # its redirects create files, which the sandbox confirms did not exist
    assert [c.trigger for c in recorded.checkpoints()] == []
    assert recorded.exec("echo new > NOTES", cwd="/root/app").auto_checkpoint is None
    outcome = recorded.exec("echo v2 > VERSION", cwd="/root/app")
    assert outcome.auto_checkpoint is not None
    assert outcome.verdict.reasons == ("> onto protected path /root/app/VERSION",)


def test_an_allow_list_change_is_recorded_with_what_it_replaced_and_left_out_of_stories(
        local_backend: Any, tmp_path: Path) -> None:
    sandbox = local_backend.create(unique_name("rec"), SandboxSpec(network="proxy", allow=("@pypi",)))
    try:
        recorded = HostState(tmp_path, durable=False).recorded(sandbox)
        taken = recorded.checkpoint("before")
        assert recorded.set_allow(["@pypi", " 127.0.0.1:8080 "], previous=["@pypi"]) == ("@pypi", "127.0.0.1:8080")
        assert sandbox.info().spec.allow == ("@pypi", "127.0.0.1:8080")
        for log in (recorded.journal, audit_of(tmp_path)):
            (change,) = log.records_of(AllowRecord, sandbox=sandbox.name)
            assert change.allow == ("@pypi", "127.0.0.1:8080") and change.previous == ("@pypi",)
        with pytest.raises(InvalidInput):  # refused before the sandbox is touched: nothing recorded
            recorded.set_allow(["no such host!"])
        assert len(recorded.journal.records_of(AllowRecord)) == 1
        assert recorded.get_checkpoint(taken.id).commands == ()  # not a command of the agent's
    finally:
        sandbox.destroy()
