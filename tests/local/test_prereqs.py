"""The distribution switches that keep users out of user namespaces, each named with its fix
(backends/local/prereqs.py), read from a /proc/sys tree given to it: this kernel has none of them
set (and no AppArmor), so each is shown against its inputs, as the distributions set them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hermes_sandboxes.backends.local import prereqs

SRC = str(Path(__file__).resolve().parents[2] / "src")
SITE = str(next((Path(__file__).resolve().parents[2] / ".venv" / "lib").glob("python3*/site-packages")))


def _sysctls(root: Path, **values: str) -> Path:
    for name, value in values.items():
        path = root / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")
    return root


def test_ubuntus_apparmor_restriction_is_named_with_its_one_time_fix(tmp_path: Path) -> None:
    root = _sysctls(tmp_path / "sys", kernel__apparmor_restrict_unprivileged_userns="1")
    profile = tmp_path / "apparmor.d" / "hermes-sandboxes"
    found = prereqs.blockers(root, profile)
    assert len(found) == 1 and "sudo hermes-sandboxes setup-apparmor" in found[0] and "\n" not in found[0]
    profile.parent.mkdir()
    profile.write_text(prereqs.apparmor_profile("/usr/bin/python3"))
    assert prereqs.blockers(root, profile) == []  # installed: nothing stops a sandbox
    check = next(c for c in prereqs.userns_checks(root, profile) if "AppArmor" in c.label)
    assert check.ok and str(profile) in check.detail


def test_the_older_debian_switch_and_a_zero_namespace_limit_are_named_with_their_sysctl(tmp_path: Path) -> None:
    root = _sysctls(tmp_path / "sys", kernel__unprivileged_userns_clone="0", user__max_user_namespaces="0")
    found = prereqs.blockers(root, tmp_path / "none")
    assert len(found) == 2
    assert any("sysctl -w kernel.unprivileged_userns_clone=1" in line for line in found)
    assert any("sysctl -w user.max_user_namespaces=" in line for line in found)


def test_a_machine_that_allows_them_has_no_blocker(tmp_path: Path) -> None:
    root = _sysctls(tmp_path / "sys", kernel__unprivileged_userns_clone="1", user__max_user_namespaces="96000",
                    kernel__apparmor_restrict_unprivileged_userns="0")
    assert prereqs.blockers(root, tmp_path / "none") == []
    assert all(c.ok for c in prereqs.userns_checks(root, tmp_path / "none"))
    assert prereqs.blockers() == []  # and this machine, as it is


def test_the_apparmor_profile_names_the_resolved_interpreter_and_allows_userns() -> None:
    text = prereqs.apparmor_profile("/usr/bin/python3")
    assert "/usr/bin/python3.11 " in text and "userns," in text and "flags=(unconfined)" in text


def test_setup_apparmor_prints_its_profile_and_refuses_to_install_without_root() -> None:
    cli = [sys.executable, "-m", "hermes_sandboxes.cli", "setup-apparmor"]
    shown = subprocess.run([*cli, "--print", "--python", "/usr/bin/python3"], capture_output=True, text=True,
                           timeout=60, check=False)
    assert shown.returncode == 0 and "profile hermes-sandboxes /usr/bin/python3.11" in shown.stdout
    assert "apparmor_parser -r /etc/apparmor.d/hermes-sandboxes" in shown.stdout
    as_user = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
                              "-c", "import sys; from hermes_sandboxes.cli.app import main; main(sys.argv[1:])",
                              "setup-apparmor"],
                             capture_output=True, text=True, timeout=60, check=False, cwd="/",
                             env={"PYTHONPATH": f"{SRC}:{SITE}", "PATH": "/usr/bin:/bin"})
    assert as_user.returncode == 1, as_user.stderr
    assert as_user.stderr.count("\n") == 1 and "sudo hermes-sandboxes setup-apparmor" in as_user.stderr
