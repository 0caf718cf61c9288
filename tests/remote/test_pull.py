"""The teardown pull's archive (hermes_sandboxes.hermes.sync.filesync) on each remote backend: capped while it
streams, and reduced to regular files that pass the tar data filter before Hermes extracts it."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from hermes_sandboxes.hermes.sync.filesync import Pulled, SandboxFileSync
from hermes_sandboxes.sandbox import Sandbox


@pytest.fixture
def sync_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import tools.environments.file_sync as file_sync

    home = tmp_path / "hermes"
    (home / "skills" / "s").mkdir(parents=True)
    (home / "skills" / "s" / "SKILL.md").write_text("pushed\n")
    (home / "config.yaml").write_text("{}\n")
    monkeypatch.setenv("HERMES_HOME", str(home))
    monkeypatch.setattr(file_sync, "_sleep", lambda seconds: None)  # Hermes's hook for its retry pauses
    return home


def _sync(sb: Sandbox, limit: int) -> SandboxFileSync:
    sync = SandboxFileSync(lambda: sb, f"{sb.home}/.hermes", threading.Lock(), archive_limit=limit)
    sync.push(force=True)
    return sync


def test_an_oversized_pull_is_cut_off_while_it_streams(remote_sandbox: Sandbox, sync_home: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    sb = remote_sandbox
    sync = _sync(sb, 1 << 20)
    written = sb.exec(["sh", "-c", f'head -c 3000000 /dev/urandom > "{sb.home}/.hermes/skills/s/big"; '
                                   f'echo more > "{sb.home}/.hermes/skills/s/notes.md"'])
    assert written.exit_code == 0, written
    with caplog.at_level(logging.WARNING):
        assert sync.pull() is Pulled.FAILED
    assert "more than 1048576 bytes" in caplog.text and "cut off" in caplog.text
    assert sorted(p.name for p in (sync_home / "skills" / "s").iterdir()) == ["SKILL.md"]


def test_a_pull_takes_regular_files_only(remote_sandbox: Sandbox, sync_home: Path, tmp_path: Path,
                                         caplog: pytest.LogCaptureFixture) -> None:
    sb = remote_sandbox
    sync = _sync(sb, 1 << 30)
    base = f"{sb.home}/.hermes/skills/s"
    made = sb.exec(["sh", "-c", f'cd "{base}" && ln -s /etc/passwd passwd && ln -s ../../../../.. up'
                                f' && mkfifo pipe && echo learned > notes.md'])
    assert made.exit_code == 0, made
    with caplog.at_level(logging.WARNING):
        assert sync.pull() is Pulled.DONE
    found = sorted(p.name for p in (sync_home / "skills" / "s").iterdir())
    assert found == ["SKILL.md", "notes.md"], found
    assert (sync_home / "skills" / "s" / "notes.md").read_text() == "learned\n"
    assert not any(p.is_symlink() for p in sync_home.rglob("*"))


def test_a_pull_never_writes_through_a_host_symlink(remote_sandbox: Sandbox, sync_home: Path, tmp_path: Path) -> None:
    sb = remote_sandbox
    sync = _sync(sb, 1 << 30)
    outside = tmp_path / "outside"
    outside.mkdir()
    (sync_home / "skills" / "s" / "linked").symlink_to(outside)  # made on the host after the push
    made = sb.exec(["sh", "-c", f'mkdir -p "{sb.home}/.hermes/skills/s/linked" && '
                                f'echo planted > "{sb.home}/.hermes/skills/s/linked/x.md" && '
                                f'echo learned > "{sb.home}/.hermes/skills/s/notes.md"'])
    assert made.exit_code == 0, made
    assert sync.pull() is Pulled.DONE
    assert list(outside.iterdir()) == []
    assert (sync_home / "skills" / "s" / "notes.md").read_text() == "learned\n"
