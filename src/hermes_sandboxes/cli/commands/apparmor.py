"""``setup-apparmor``: the one-time fix for distributions whose AppArmor keeps users out of user
namespaces (Ubuntu 23.10+, ``kernel.apparmor_restrict_unprivileged_userns=1``), run once with sudo.

It installs a profile that lets the interpreter running hermes-sandboxes (resolved: the venv's
python is a link to it) create user namespaces, and loads it. ``--print`` shows the profile and
the commands instead, for whoever prefers to install it by hand.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import click


@click.command(name="setup-apparmor",
               short_help="Once, with sudo: let rootless sandboxes make user namespaces under AppArmor.")
@click.option("--print", "show", is_flag=True, help="Print the profile and the commands; install nothing.")
@click.option("--python", "interpreter", default=None, metavar="PATH",
              help="The interpreter the profile is for (default: the one running this command).")
def setup_apparmor(show: bool, interpreter: str | None) -> None:
    """Install /etc/apparmor.d/hermes-sandboxes for this interpreter and load it (apparmor_parser)."""
    from hermes_sandboxes.backends.local import prereqs

    profile = prereqs.APPARMOR_PROFILE
    text = prereqs.apparmor_profile(interpreter or sys.executable)
    if show:
        click.echo(f"# {profile}\n{text}\n# then: sudo apparmor_parser -r {profile}")
        return
    if os.geteuid() != 0:
        raise click.ClickException(f"installing an AppArmor profile needs root: run `{prereqs.SETUP_APPARMOR}` "
                                   "once (or --print to see what it installs)")
    parser = shutil.which("apparmor_parser")
    if parser is None:
        raise click.ClickException("apparmor_parser not found: this system has no AppArmor userspace "
                                   "(apt-get install apparmor), or needs no profile")
    tmp = profile.with_name(f".{profile.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, profile)
    done = subprocess.run([parser, "-r", str(profile)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise click.ClickException(f"apparmor_parser refused {profile}: {(done.stderr or done.stdout).strip()}")
    click.echo(f"installed and loaded {profile}: rootless sandboxes can make user namespaces now")
