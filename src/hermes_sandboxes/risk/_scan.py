"""Walking a command line: every simple command, every substitution, and the code that shells, ``eval``,
``su -c``, interpreters and ``find -exec`` run, each call judged by the rules for its program.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from hermes_sandboxes.risk._context import Context
from hermes_sandboxes.risk._rules import (
    ALWAYS,
    DISK,
    RULES,
    UNREADABLE_NAMES,
    check_cd,
    check_dd,
    check_git,
    check_kill,
    check_mv_cp_ln,
    check_rm,
    check_rule,
    check_sed,
    check_tar,
    check_tee,
)
from hermes_sandboxes.risk._shell import (
    Call,
    Lexer,
    ParseError,
    Parser,
    Simple,
    Word,
    option_values,
    program_of,
    skip_options,
    unwrap,
)
from hermes_sandboxes.risk._sql import SQL_OPTIONS, check_database, sql_reasons

_MAX_DEPTH = 12  # nested bash -c / eval / $( ) levels we read before giving up (and calling it risky)


def scan_command(text: str, ctx: Context, depth: int) -> None:
    if depth > _MAX_DEPTH:
        ctx.add("commands nested too deeply to read")
        return
    try:
        script = Parser(Lexer(text).run())
    except ParseError:
        _scan_unreadable(text, ctx, depth)
        return
    for name in sorted(script.recursive):
        ctx.add(f"fork bomb (function {name} calls itself)")
    for cmd in script.commands:
        for word in [*cmd.words, *(target for _, target in cmd.redirects)]:
            for sub in word.subs:
                scan_command(sub, ctx, depth + 1)
        for op, target in cmd.redirects:
            _check_redirect(op, target.text, ctx)
        if (call := unwrap(cmd.words, cmd)) is not None:
            _check_call(call, ctx, depth)


def _scan_unreadable(text: str, ctx: Context, depth: int) -> None:
    """Not valid shell: flag dangerous names and SQL anywhere, then read it again without quotes."""
    for name in map(program_of, re.split(r"[\s;&|()<>`'\"{}$]+", text)):
        if name in UNREADABLE_NAMES or name.startswith("mkfs"):
            ctx.add(f"unreadable command mentions {name}")
    for reason in sql_reasons(text):
        ctx.add(reason)
    if (cleaned := re.sub(r"[\"'`\\()]", " ", text)) != text:
        scan_command(cleaned, ctx, depth + 1)


_BLOCK_DEVICE = re.compile(r"/dev/(sd|hd|vd|xvd|nvme|mmcblk|disk|md|dm-|mapper/|loop)")


def _check_redirect(op: str, path: str, ctx: Context) -> None:
    if op not in (">", ">|", "&>", ">&") or (op == ">&" and (path.isdigit() or path == "-")):
        return  # appends and reads leave existing content alone; 2>&1 duplicates a descriptor
    if _BLOCK_DEVICE.match(path):
        ctx.add(f"> onto block device {path}")
    elif hit := ctx.overwrites(path):
        ctx.add(f"> onto protected path {hit}")


def _check_call(call: Call, ctx: Context, depth: int) -> None:
    if call.name.startswith("mkfs"):
        ctx.add(f"{call.name} (formats a filesystem)")
    listing = ALWAYS.get(call.name) == DISK and {"-l", "--list"} & {w.text for w in call.args}
    if call.name in ALWAYS and not listing:
        ctx.add(f"{call.name} ({ALWAYS[call.name]})")
    if call.name in RULES:
        check_rule(call, RULES[call.name], ctx)
    if call.name in _CHECKERS:
        _CHECKERS[call.name](call, ctx, depth)



def _check_find(call: Call, ctx: Context, depth: int) -> None:
    texts = [w.text for w in call.args]
    if "-delete" in texts:
        ctx.add("find -delete")
    for i, text in enumerate(texts):
        if text in ("-exec", "-execdir", "-ok", "-okdir"):
            end = next((j for j in range(i + 1, len(texts)) if texts[j] in (";", "+")), len(texts))
            inner = [Word(w.text, w.glob, w.dynamic or "{}" in w.text, w.subs) for w in call.args[i + 1 : end]]
            if (found := unwrap(inner, Simple(inner))) is not None:
                _check_call(found, ctx, depth + 1)



_DOWNLOADERS = frozenset({"curl", "wget", "fetch", "http", "https", "aria2c"})
_DOWNLOAD_SUBSTITUTION = re.compile(r"(\$\(|`|<\()\s*(?:sudo\s+)?(curl|wget|fetch|http)\b")
_CODE_DELETES = re.compile(r"rmtree|removedirs|os\.remove\b|unlink|rmSync|rmdirSync|rm_rf|rm_r\b|File\.delete")


def _run_code(code: str, ctx: Context, depth: int, runner: str) -> None:
    if match := _DOWNLOAD_SUBSTITUTION.search(code):
        ctx.add(f"runs downloaded code ({match.group(2)} into {runner})")
    scan_command(code, ctx, depth + 1)


def _run_stdin(call: Call, ctx: Context, depth: int, *, shell: bool) -> None:
    """The program reads its code on stdin: from a heredoc, echo or cat we can read, or a download."""
    codes = [doc.body for doc in call.cmd.stdin]
    upstream = call.cmd.upstream
    source = unwrap(upstream.words, upstream) if upstream is not None else None
    if source is not None and source.name == "cat":  # cat <<EOF | sh
        codes += [doc.body for doc in source.cmd.stdin]
    elif source is not None and source.name in ("echo", "printf"):  # echo 'rm -rf x' | sh
        text = _join(source.args[skip_options(source.args, 0, frozenset())[0] :])
        codes.append(text.replace("\\n", "\n"))  # printf and echo -e turn \n into a newline
    for code in codes:
        if shell:
            scan_command(code, ctx, depth + 1)
        elif _CODE_DELETES.search(code):
            ctx.add(f"{call.name} code that deletes files")
    while upstream is not None:
        if (source := unwrap(upstream.words, upstream)) is not None and source.name in _DOWNLOADERS:
            ctx.add(f"runs downloaded code ({source.name} | {call.name})")
        upstream = upstream.upstream


def _join(words: list[Word]) -> str:
    return " ".join(w.text for w in words)


def _check_shell(call: Call, ctx: Context, depth: int) -> None:
    args, i, letters = call.args, 0, ""
    while i < len(args) and len(args[i].text) > 1 and args[i].text[0] in "-+" and args[i].text != "--":
        letters += "" if args[i].text.startswith("--") else args[i].text[1:]
        i += 2 if args[i].text in ("-o", "+o", "-O", "+O", "--rcfile", "--init-file") else 1
    operands = args[i + 1 :] if i < len(args) and args[i].text == "--" else args[i:]
    if "c" in letters:
        for code in operands[:1]:
            _run_code(code.text, ctx, depth, call.name)
    elif not operands or "s" in letters or operands[0].text == "-":
        _run_stdin(call, ctx, depth, shell=True)
    elif match := _DOWNLOAD_SUBSTITUTION.search(operands[0].text):  # bash <(curl ...)
        ctx.add(f"runs downloaded code ({match.group(2)} into {call.name})")


def _check_interpreter(call: Call, ctx: Context, depth: int) -> None:
    texts = [w.text for w in call.args]
    module = texts.index("-m") + 1 if "-m" in texts else len(texts)
    if texts[module : module + 1] in (["pip"], ["pip3"]):  # python -m pip uninstall
        check_rule(Call("pip", call.args[module + 1 :], call.cmd), RULES["pip"], ctx)
        return
    codes = option_values(call.args, frozenset({"-c", "-e", "-E", "--eval", "-p", "--print"}))
    if any(_CODE_DELETES.search(code) for code in codes):
        ctx.add(f"{call.name} code that deletes files")
    if not codes and "-m" not in texts and all(t.startswith("-") for t in texts):
        _run_stdin(call, ctx, depth, shell=False)


def _check_code_runner(call: Call, ctx: Context, depth: int) -> None:
    """eval and watch run their words as shell code, su -c its value; source is judged by its origin."""
    if call.name in ("su", "runuser"):
        for code in option_values(call.args, frozenset({"-c", "--command", "--session-command"})):
            _run_code(code, ctx, depth, call.name)
    elif call.name in ("source", "."):
        if call.args and (match := _DOWNLOAD_SUBSTITUTION.search(call.args[0].text)):
            ctx.add(f"runs downloaded code ({match.group(2)} into {call.name})")
    else:
        start, _seen = skip_options(call.args, 0, frozenset({"-n", "--interval"}))
        _run_code(_join(call.args[start:]), ctx, depth, call.name)


_Checker = Callable[[Call, Context, int], None]
_CHECKERS: dict[str, _Checker] = {
    **dict.fromkeys(("sh", "bash", "zsh", "dash", "ksh", "mksh", "ash", "fish"), _check_shell),
    **dict.fromkeys(("python", "pypy", "perl", "ruby", "node"), _check_interpreter),
    **dict.fromkeys((*SQL_OPTIONS, "mongo", "mongosh"), check_database),
    **dict.fromkeys(("eval", "watch", "su", "runuser", "source", "."), _check_code_runner),
    **dict.fromkeys(("mv", "cp", "ln"), check_mv_cp_ln),
    **dict.fromkeys(("rm", "unlink"), check_rm),
    **dict.fromkeys(("cd", "pushd"), check_cd),
    "find": _check_find,
    "dd": check_dd,
    "tee": check_tee,
    "sed": check_sed,
    "tar": check_tar,
    "git": check_git,
    "kill": check_kill,
}
