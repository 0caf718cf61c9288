"""A command that fills the sandbox's memory is killed, not the sandbox's init (issue 24, finding 11).

Memory a command charges without holding it (a file in /dev/shm) does not count in its own size
and outlives it, so the OOM killer of the sandbox's memory group took the biggest process, the
init, and the whole sandbox stopped; the command reported no exit code (125 from the CLI) instead
of its kill. Now /dev/shm holds a quarter of the memory limit, and every command is the killer's
first choice (oom_score_adj 1000; the init keeps 0).
"""

from __future__ import annotations

from hermes_sandboxes.backends.local import LocalBackend
from hermes_sandboxes.sandbox import Limits, SandboxSpec
from tests.local.kit import init_state, new_sandbox, sh

LIMIT = 192 << 20
HOG = "python3 -c 'blocks = []\nwhile True: blocks.append(bytearray(1 << 20))'"


def test_filling_dev_shm_or_memory_ends_the_command_and_the_sandbox_lives_on(local_backend: LocalBackend) -> None:
    with new_sandbox(local_backend, SandboxSpec(limits=Limits(memory_bytes=LIMIT))) as sb:
        sh(sb, "true")
        init = init_state(sb)["pid"]
        filled = sb.exec("dd if=/dev/zero of=/dev/shm/fill bs=1M count=400 2>&1; echo dd=$?", timeout=120)
        assert "No space left on device" in filled.stdout and "dd=1" in filled.stdout, filled.stdout
        shm = sh(sb, "df -B1 --output=size /dev/shm | tail -1").stdout
        assert int(shm) == LIMIT // 4
        assert init_state(sb)["pid"] == init  # the same init serves on, with /dev/shm still full
        kills = sb.oom_kills() or 0
        hog = sb.exec(HOG, timeout=120)
        assert hog.exit_code == 137 and (sb.oom_kills() or 0) > kills, hog  # the memory limit's kill, said
        assert init_state(sb)["pid"] == init
        assert sh(sb, "cat /proc/1/oom_score_adj /proc/self/oom_score_adj").stdout.split() == ["0", "1000"]
        assert sh(sb, "rm -f /dev/shm/fill && echo fine").stdout == "fine\n"
