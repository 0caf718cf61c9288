"""The classifier's shortcut (plain read-only command lines answered without the parser, to keep
the parser off the hot path of exec) agrees with the parser and never swallows a risky line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hermes_sandboxes.risk import _plainly_harmless, classify
from hermes_sandboxes.risk._context import Context
from hermes_sandboxes.risk._scan import scan_command

PLAIN = ["true", "ls -la /root", "cat /etc/os-release", "echo hello world", "grep -r TODO /root/app",
         "tail -n 20 /var/log/app.log", "sleep 1", "du -sh /root", "wc -l /root/a.txt", "test -e /root/x"]
NOT_PLAIN = ["rm -rf /root/app", "echo x > /root/app/config", "cat a | sh", "echo $(rm -rf /)", "ls; rm -rf /",
             "ls && dd if=/dev/zero of=/dev/sda", "grep -r x /root * ", "echo 'rm -rf /'", "find / -delete",
             "cat\nrm -rf /root", "true\trm -rf /root", "env rm -rf /root", "sleep 1 & rm -rf /root"]


@pytest.mark.parametrize("command", PLAIN)
def test_a_plain_read_only_line_takes_the_shortcut_and_the_parser_agrees(command: str) -> None:
    assert _plainly_harmless(command)
    ctx = Context((), None, None)
    scan_command(command, ctx, 0)
    assert ctx.reasons == []


@pytest.mark.parametrize("command", NOT_PLAIN)
def test_anything_else_goes_to_the_parser(command: str) -> None:
    assert not _plainly_harmless(command)


def test_classifying_a_plain_line_does_not_load_the_parser() -> None:
    code = ("import sys; from hermes_sandboxes.risk import classify; classify('ls -la /root'); "
            "print('hermes_sandboxes.risk._scan' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout == "False\n"
    assert classify("rm -rf /root/app").risky
