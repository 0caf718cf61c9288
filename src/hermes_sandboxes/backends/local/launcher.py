"""Host side of starting a sandbox's init: what it is told, and how it is run.

The configuration travels on the launcher's stdin, never on its command line: the init inherits
that command line, and the sandbox reads it as /proc/1/cmdline. So the command line is a fixed,
path-free bootstrap (``argv[0]`` is a name, not the interpreter's host path). To the caller's
configuration this adds the security parts every init gets: the compiled seccomp filter and the
paths of other sandbox stores (and loop images) to hide.
"""

from __future__ import annotations

import marshal
import subprocess
import sys
from pathlib import Path
from typing import Any

from hermes_sandboxes.backends.local import masks, syscall_filter
from hermes_sandboxes.errors import SandboxError

_INIT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[3])
# -I: no PYTHON* variables, no user site and no current directory on sys.path; -S: no site-packages
# processing (.pth files of every installed package): the init needs only this package, whose
# parent directory comes with the configuration.
# Two messages on stdin: the package's parent directory, then the configuration. The init module
# is imported between them, so a launcher started ahead (start_ahead) is ready when told.
_BOOTSTRAP = ("import marshal, sys; sys.path.insert(0, marshal.load(sys.stdin.buffer)); "
              "from hermes_sandboxes.backends.local.init import main; main(marshal.load(sys.stdin.buffer))")
_ARGV = ("hermes-sandboxes-init", "-I", "-S", "-c", _BOOTSTRAP)


def start_ahead() -> subprocess.Popen[bytes]:
    """A launcher that starts its interpreter and imports the init now, and sets up a sandbox only
    once given its configuration (start_init(..., ahead=)); if its caller gives up or dies first,
    it exits having done nothing."""
    proc = subprocess.Popen(list(_ARGV), executable=sys.executable, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_INIT_ENV, start_new_session=True)
    assert proc.stdin is not None
    proc.stdin.write(marshal.dumps(_PACKAGE_PARENT))
    proc.stdin.flush()
    return proc


def start_init(name: str, config: dict[str, Any], store_home: Path,
               ahead: subprocess.Popen[bytes] | None = None) -> int:
    """Start the init of sandbox ``name`` (with a launcher started ahead, if given); returns its
    host pid once it serves requests."""
    full = {**config, "package": _PACKAGE_PARENT, "seccomp": syscall_filter.compiled(),
            "hide": masks.hidden_from_sandboxes(store_home) if config["lower"] == "/" else []}
    if ahead is None:
        proc = subprocess.run(
            list(_ARGV), executable=sys.executable, input=marshal.dumps(_PACKAGE_PARENT) + marshal.dumps(full),
            capture_output=True, env=_INIT_ENV, start_new_session=True, timeout=60,
        )
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    else:
        out, err = ahead.communicate(marshal.dumps(full), timeout=60)
        code = ahead.returncode
    if code != 0:
        detail = err.decode(errors="replace").strip() or "no detail"
        raise SandboxError(f"sandbox {name} failed to start: {detail} (see {config['log']})")
    return int(out.strip())
