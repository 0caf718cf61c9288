"""The faces as a normal user (#19 point 7): Hermes's agent loop (``hermes chat -q`` with the
scripted model), the CLI's demo, and the CLI's commands, all rootless."""

from __future__ import annotations

import json

from tests.rootless import kit


def test_hermes_chat_breaks_and_restores_a_sandbox_as_a_normal_user(rootless_user: kit.TestUser) -> None:
    out = rootless_user.run([str(rootless_user.python), "-m", "tests.rootless.scenarios", "hermes"],
                            cwd=str(kit.REPO))
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    made, broke, restored, after = seen["results"][:4]
    assert made["exit_code"] == 0 and made["output"].startswith("0\n") and "git version" in made["output"]
    assert broke["exit_code"] == 0
    assert "rm -rf /root/app /etc/apt" in restored["discarded_commands"]
    assert after["exit_code"] == 0 and "v1" in after["output"], seen["output"]


def test_the_demo_passes_as_a_normal_user(rootless_user: kit.TestUser) -> None:
    out = rootless_user.run([str(rootless_user.home / "venv" / "bin" / "hermes-sandboxes"), "demo"])
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert "Demo passed" in out.stdout


def test_doctor_as_a_normal_user_says_rootless_and_what_is_enforced(rootless_user: kit.TestUser) -> None:
    out = rootless_user.run([str(rootless_user.home / "venv" / "bin" / "hermes-sandboxes"), "doctor"])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "rootless (uid" in out.stdout and "limits (no delegated cgroup)" in out.stdout
    assert "subordinate ids" in out.stdout and "FAIL" not in out.stdout
