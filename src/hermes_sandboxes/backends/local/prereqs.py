"""What a normal user's machine must allow for rootless sandboxes, each with its fix.

Read-only: sysctls under /proc/sys, /etc/subuid and /etc/subgid, the uidmap tools. ``blockers`` are
the ones without which no rootless sandbox starts (each one line naming its fix); ``checks`` are
everything ``doctor`` reports. The inputs are parameters so the logic is testable on kernels that
lack the knob (this one has no AppArmor).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from hermes_sandboxes.backends.local import userns

SYSCTL = Path("/proc/sys")
APPARMOR_PROFILE = Path("/etc/apparmor.d/hermes-sandboxes")
SETUP_APPARMOR = "sudo hermes-sandboxes setup-apparmor"


@dataclass(frozen=True)
class Check:
    ok: bool
    label: str
    detail: str
    blocking: bool = False  # without it no rootless sandbox starts


def _sysctl(name: str, root: Path) -> str | None:
    try:
        return (root / name.replace(".", "/")).read_text().strip()
    except OSError:
        return None


def userns_checks(root: Path = SYSCTL, profile: Path = APPARMOR_PROFILE) -> list[Check]:
    """The three switches distributions use to keep users out of user namespaces."""
    checks = []
    clone = _sysctl("kernel.unprivileged_userns_clone", root)
    if clone is not None:
        checks.append(Check(clone != "0", "unprivileged user namespaces (kernel.unprivileged_userns_clone)",
                            "allowed" if clone != "0" else
                            "disabled: run once `sudo sysctl -w kernel.unprivileged_userns_clone=1` and add "
                            "`kernel.unprivileged_userns_clone=1` to /etc/sysctl.d/99-hermes-sandboxes.conf",
                            blocking=clone == "0"))
    most = _sysctl("user.max_user_namespaces", root)
    if most is not None:
        checks.append(Check(most != "0", "user namespaces allowed (user.max_user_namespaces)",
                            f"{most}" if most != "0" else
                            "0: run once `sudo sysctl -w user.max_user_namespaces=15000` and add "
                            "`user.max_user_namespaces=15000` to /etc/sysctl.d/99-hermes-sandboxes.conf",
                            blocking=most == "0"))
    restricted = _sysctl("kernel.apparmor_restrict_unprivileged_userns", root)
    if restricted is not None:
        allowed = restricted == "0" or profile.exists()
        checks.append(Check(allowed, "AppArmor lets this interpreter make user namespaces "
                                     "(kernel.apparmor_restrict_unprivileged_userns)",
                            "not restricted" if restricted == "0" else
                            f"profile {profile} installed" if profile.exists() else
                            f"restricted (Ubuntu 23.10+): install a profile once with `{SETUP_APPARMOR}`",
                            blocking=not allowed))
    return checks


def mapping_check(uid: int | None = None) -> Check:
    idmap = userns.rootless_map(uid)
    if idmap.full:
        outer = idmap.uids[1]
        return Check(True, "subordinate ids (/etc/subuid, /etc/subgid)",
                     f"inner 0 is you, inner 1-{outer[2]} are host ids {outer[1]}-{outer[1] + outer[2] - 1}")
    tools = userns.newidmap_tools()
    fix = ("apt-get install uidmap" if tools is None else
           "add a block with `sudo usermod --add-subuids 100000-165535 --add-subgids 100000-165535 $USER`")
    return Check(False, "subordinate ids (/etc/subuid, /etc/subgid)",
                 f"none: inside, only root (you) exists, so apt (its _apt user), chown to other users and "
                 f"tools that switch users fail; fix: {fix}")


def blockers(root: Path = SYSCTL, profile: Path = APPARMOR_PROFILE) -> list[str]:
    """One line per missing prerequisite that stops every rootless sandbox."""
    found = [f"{c.label}: {c.detail}" for c in userns_checks(root, profile) if c.blocking]
    if not Path("/proc/self/ns/user").exists():
        found.append("this kernel has no user namespaces (CONFIG_USER_NS)")
    return found


def apparmor_profile(interpreter: str | None = None) -> str:
    """The profile that lets ``interpreter`` (this Python, resolved) create user namespaces."""
    path = os.path.realpath(interpreter or sys.executable)
    return ("abi <abi/4.0>,\ninclude <tunables/global>\n\n"
            f"profile hermes-sandboxes {path} flags=(unconfined) {{\n  userns,\n\n"
            "  include if exists <local/hermes-sandboxes>\n}\n")
