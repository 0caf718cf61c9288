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
import threading
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


# One launcher kept started ahead per host process (see take): a start then skips the interpreter's
# start-up and imports (tens of ms). It waits on a pipe from this process only, holds nothing of
# any sandbox, and exits when this process does (its stdin closes).
_spare: subprocess.Popen[bytes] | None = None
_spare_lock = threading.Lock()


def take() -> subprocess.Popen[bytes]:
    """A launcher started ahead: the spare if there is a live one, else a new one."""
    global _spare
    with _spare_lock:
        spare, _spare = _spare, None
    if spare is not None and spare.poll() is None:
        return spare
    return start_ahead()


def _refill() -> None:
    """Start the next spare on a thread, so that no caller waits for it."""
    def spawn() -> None:
        global _spare
        proc = start_ahead()
        with _spare_lock:
            old, _spare = _spare, proc
        if old is not None:
            old.kill()
            old.communicate()

    threading.Thread(target=spawn, name="hermes-sandboxes-launcher-spare", daemon=True).start()


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
    ahead = ahead or take()
    try:
        out, err = ahead.communicate(marshal.dumps(full), timeout=60)
    finally:
        if ahead.poll() is None:  # timed out or interrupted: no half-started launcher stays
            ahead.kill()
            ahead.communicate()
        _refill()
    code = ahead.returncode
    if code != 0:
        detail = err.decode(errors="replace").strip() or (
            f"its launcher was killed by signal {-code}" if code < 0 else f"its launcher exited with {code}")
        raise SandboxError(f"sandbox {name} failed to start: {detail} (see {config['log']})")
    return int(out.strip())
