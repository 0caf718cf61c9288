"""State sync between a host's ~/.hermes and a persistent remote sandbox, through a real Hermes on
each remote backend's fake: recovery when a sandbox is resumed after a session that never pulled its
files back, what each sync failure does, and the re-sync after a checkpoint restore."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from hermes_sandboxes.hermes.runtime import RUNTIME
from hermes_sandboxes.hermes.sync.recovery import RECOVERED_DIR
from tests.remote import hermes_kit
from tests.remote.conftest import Remote
from tests.remote.hermes_kit import OtherHermes, call_here, cleanup_here, refused_here, run_here, writes


@pytest.fixture
def home(remote: Remote, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    yield from hermes_kit.hermes_home(remote, monkeypatch)


@pytest.fixture
def other(home: Path) -> Iterator[OtherHermes]:
    started = OtherHermes()
    try:
        yield started
    finally:
        started.stop()
    cleanup_here()  # this process's lease too: no lease files are left behind
    leases = RUNTIME.state.root / "leases"
    assert not (list(leases.iterdir()) if leases.exists() else []), "lease files were left behind"


def out(result: dict[str, object]) -> str:
    return str(result.get("output") or "")


def skill(home: Path, name: str, text: str) -> Path:
    path = home / "skills" / name / "SKILL.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_resume_recovers_what_a_crashed_session_never_pulled_back(home: Path, other: OtherHermes) -> None:
    kept = skill(home, "kept", "host v1\n")
    made = other.run('cd "$HOME/.hermes" && mkdir -p skills/new memories && echo agent > skills/new/SKILL.md'
                     ' && echo remember > memories/MEMORY.md && echo "sandbox v2" > skills/kept/SKILL.md')
    assert made["exit_code"] == 0, made
    other.crash()  # no teardown pull: the agent's files exist only in the sandbox
    kept.write_text("host v3\n")  # and the host changed the same skill meanwhile

    seen = out(run_here('cat "$HOME/.hermes/skills/kept/SKILL.md" "$HOME/.hermes/skills/new/SKILL.md"'))

    assert seen.split() == ["host", "v3", "agent"], seen  # the host's copy was pushed after recovery
    assert (home / "skills/new/SKILL.md").read_text() == "agent\n"  # restored in place
    assert (home / "memories/MEMORY.md").read_text() == "remember\n"
    assert kept.read_text() == "host v3\n"
    [aside] = list(home.joinpath(*RECOVERED_DIR).iterdir())
    assert (aside / "skills/kept/SKILL.md").read_text() == "sandbox v2\n"  # neither version lost


def test_unreadable_sandbox_state_blocks_the_push_until_it_can_be_read(remote: Remote, home: Path,
                                                                      other: OtherHermes) -> None:
    kept = skill(home, "kept", "host v1\n")
    assert other.run('echo "sandbox v2" > "$HOME/.hermes/skills/kept/SKILL.md"')["exit_code"] == 0
    other.crash()
    kept.write_text("host v3\n")
    hermes_kit.cut_exec_streams(remote)
    refused = json.dumps(run_here("touch /tmp/ran"))
    hermes_kit.clear_faults(remote)
    assert "recovery on resume failed" in refused, refused
    assert not home.joinpath(*RECOVERED_DIR).exists()
    # nothing was pushed over the sandbox's copy: the next use recovers it, then pushes
    assert out(run_here('cat "$HOME/.hermes/skills/kept/SKILL.md"')).strip() == "host v3"
    [aside] = list(home.joinpath(*RECOVERED_DIR).iterdir())
    assert (aside / "skills/kept/SKILL.md").read_text() == "sandbox v2\n"
    assert run_here("ls /tmp/ran")["exit_code"] != 0  # the refused command never ran


def test_a_failed_initial_push_is_fatal(remote: Remote, home: Path) -> None:
    skill(home, "s", "v1\n")
    hermes_kit.fail_writes(remote)
    refused = json.dumps(run_here("touch /tmp/ran-before-sync"))
    hermes_kit.clear_faults(remote)
    assert "file sync" in refused, refused
    assert out(run_here('cat "$HOME/.hermes/skills/s/SKILL.md"; ls /tmp/ran-before-sync')).split()[0] == "v1"
    assert run_here("ls /tmp/ran-before-sync")["exit_code"] != 0


def test_a_failed_sync_before_a_command_refuses_it_and_marks_the_scope_dirty(remote: Remote, home: Path) -> None:
    path = skill(home, "s", "v1\n")
    assert out(run_here('cat "$HOME/.hermes/skills/s/SKILL.md"')).strip() == "v1"
    path.write_text("v2, longer\n")
    hermes_kit.fail_writes(remote)
    refused = refused_here("touch /tmp/ran-stale")
    assert "file sync" in refused, refused
    dirty = list((RUNTIME.state.root / "leases").glob("*.dirty"))
    hermes_kit.clear_faults(remote)
    assert dirty, "the scope was not marked dirty"
    assert out(run_here('cat "$HOME/.hermes/skills/s/SKILL.md"')).strip() == "v2, longer"
    assert not any(p.exists() for p in dirty)  # a good sync clears the mark
    assert run_here("ls /tmp/ran-stale")["exit_code"] != 0


def test_a_failed_teardown_pull_is_logged_and_the_next_resume_recovers(
        remote: Remote, home: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    import tools.environments.file_sync as file_sync

    monkeypatch.setattr(file_sync, "_sleep", lambda seconds: None)  # Hermes's own hook for its retry pauses
    skill(home, "s", "v1\n")
    assert run_here('echo learned > "$HOME/.hermes/skills/s/notes.md"')["exit_code"] == 0
    hermes_kit.cut_exec_streams(remote)
    with caplog.at_level(logging.WARNING):
        cleanup_here()  # must not raise
    hermes_kit.clear_faults(remote)
    assert any("not pulled back" in r.getMessage() for r in caplog.records), caplog.text
    assert not (home / "skills/s/notes.md").exists()
    assert run_here("true")["exit_code"] == 0  # the next session resumes and recovers first
    assert (home / "skills/s/notes.md").read_text() == "learned\n"


def test_after_a_readers_restore_the_writer_resyncs_only_what_differs(remote: Remote, home: Path,
                                                                     other: OtherHermes) -> None:
    for i in range(8):
        skill(home, f"s{i}", f"v1 {i}\n")
    assert other.run("true")["exit_code"] == 0  # the writer pushed everything
    assert out(run_here('cat "$HOME/.hermes/skills/s3/SKILL.md"')).strip() == "v1 3"  # this one reads
    saved = call_here("sandbox_checkpoint", {"comment": "skills at v1"})["checkpoint"]
    skill(home, "s3", "v2 3\n")
    assert other.run("true")["exit_code"] == 0  # the writer pushes the change
    assert out(run_here('cat "$HOME/.hermes/skills/s3/SKILL.md"')).strip() == "v2 3"

    restored = call_here("sandbox_restore", {"id": saved})  # by the reader: ~/.hermes went back too
    assert restored.get("restored") == saved, restored
    refused = refused_here("true")  # stale state: readers wait for the writer
    assert "marked dirty" in refused and "checkpoint restore" in refused, refused
    hermes_kit.clear_requests(remote)
    resynced = other.run("true")  # the writer re-syncs, sending only what differs
    assert resynced["exit_code"] == 0, resynced
    assert writes(remote) == [f"{'/home/user' if remote.kind == 'e2b' else '/root'}/.hermes/skills/s3/SKILL.md"]
    assert out(run_here('cat "$HOME/.hermes/skills/s3/SKILL.md"')).strip() == "v2 3"


def _cap(home: Path, cap: int) -> None:
    """Hermes's own ``terminal.sync_back_max_bytes`` in the profile's config.yaml."""
    config = yaml.safe_load((home / "config.yaml").read_text())
    config["terminal"]["sync_back_max_bytes"] = cap
    (home / "config.yaml").write_text(yaml.safe_dump(config))


def test_archives_over_hermes_s_sync_back_cap_are_refused_and_nothing_is_written_or_pushed(
        remote: Remote, home: Path, other: OtherHermes, caplog: pytest.LogCaptureFixture) -> None:
    _cap(home, 64 * 1024)
    kept = skill(home, "kept", "host v1\n")
    assert other.run("true")["exit_code"] == 0  # the writer pushed
    assert run_here("true")["exit_code"] == 0  # this process reads
    made = other.run('cd "$HOME/.hermes" && mkdir -p skills/big && head -c 200000 /dev/urandom > skills/big/blob'
                     ' && echo "sandbox v2" > skills/kept/SKILL.md')
    assert made["exit_code"] == 0, made
    other.crash()  # no pull-back: recovery must read the sandbox's tree, over the cap
    kept.write_text("host v3\n")
    hermes_kit.clear_requests(remote)

    refused = refused_here("touch /tmp/ran-over-cap")
    assert "recovery on resume failed" in refused and "more than 65536 bytes" in refused, refused
    assert "terminal.sync_back_max_bytes" in refused, refused
    assert writes(remote) == []  # nothing pushed over the sandbox's copy
    assert not (home / "skills" / "big").exists() and not home.joinpath(*RECOVERED_DIR).exists()
    assert kept.read_text() == "host v3\n"

    _cap(home, 8 << 20)  # raised: the next command recovers, then pushes
    assert out(run_here('cat "$HOME/.hermes/skills/kept/SKILL.md"')).strip() == "host v3"
    assert run_here("ls /tmp/ran-over-cap")["exit_code"] != 0  # the refused command never ran
    assert (home / "skills" / "big" / "blob").stat().st_size == 200000

    _cap(home, 64 * 1024)
    assert run_here('echo learned > "$HOME/.hermes/skills/kept/notes.md"')["exit_code"] == 0
    with caplog.at_level(logging.WARNING):
        cleanup_here()  # the teardown pull: the tree is over the cap, so nothing of it comes back
    refusals = [r.getMessage() for r in caplog.records if "pulling ~/.hermes back" in r.getMessage()]
    assert len(refusals) == 1 and "terminal.sync_back_max_bytes" in refusals[0], caplog.text  # not retried
    assert not (home / "skills" / "kept" / "notes.md").exists()


def test_after_a_restore_made_with_the_cli_a_running_session_resyncs_only_what_differs(
        remote: Remote, home: Path) -> None:
    from tools.terminal_tool_lifecycle import get_active_env

    for i in range(4):
        skill(home, f"s{i}", f"v1 {i}\n")
    assert run_here("true")["exit_code"] == 0  # this session is the writer: it pushed everything
    name = get_active_env(hermes_kit.TASK).sandbox_name
    saved = call_here("sandbox_checkpoint", {"comment": "skills at v1"})["checkpoint"]
    skill(home, "s2", "v2 2\n")
    assert out(run_here('cat "$HOME/.hermes/skills/s2/SKILL.md"')).strip() == "v2 2"

    hermes_kit.cli(remote, "checkpoint", "restore", name, saved, "--yes")  # another process, on the side
    hermes_kit.clear_requests(remote)
    # the same session's next command finds the restore noted and brings ~/.hermes up to date
    assert out(run_here('cat "$HOME/.hermes/skills/s2/SKILL.md"')).strip() == "v2 2"
    assert writes(remote) == [f"{'/home/user' if remote.kind == 'e2b' else '/root'}/.hermes/skills/s2/SKILL.md"]
