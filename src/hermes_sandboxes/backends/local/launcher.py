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
_BOOTSTRAP = ("import marshal, sys; c = marshal.load(sys.stdin.buffer); sys.path.insert(0, c['package']); "
              "from hermes_sandboxes.backends.local.init import main; main(c)")
_ARGV = ("hermes-sandboxes-init", "-I", "-S", "-c", _BOOTSTRAP)


def start_init(name: str, config: dict[str, Any], store_home: Path) -> int:
    """Start the init of sandbox ``name``; returns its host pid once it serves requests."""
    full = {**config, "package": _PACKAGE_PARENT, "seccomp": syscall_filter.compiled(),
            "hide": masks.hidden_from_sandboxes(store_home) if config["lower"] == "/" else []}
    proc = subprocess.run(
        list(_ARGV), executable=sys.executable, input=marshal.dumps(full), capture_output=True,
        env=_INIT_ENV, start_new_session=True, timeout=60,
    )
    if proc.returncode != 0:
        detail = proc.stderr.decode(errors="replace").strip() or "no detail"
        raise SandboxError(f"sandbox {name} failed to start: {detail} (see {config['log']})")
    return int(proc.stdout.strip())
