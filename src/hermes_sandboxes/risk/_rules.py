"""The per-program risk rules: programs that are always risky, risky subcommands and options, and
checkers for programs whose risk depends on their operands (rm, mv, cp, dd, sed, tar, git ...).

Programs that run other code (shells, ``eval``, interpreters, ``find -exec``) are judged in ``scan``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hermes_sandboxes.risk._context import Context, clip, normalise
from hermes_sandboxes.risk._shell import Call, flags_of, letters_of, option_values, positionals, skip_options


@dataclass(frozen=True)
class _Rule:
    """Risky uses of a program: subcommands ("remove", "system prune"), options, option letters."""

    subcommands: frozenset[str]
    options: tuple[str, ...]  # "--delete" also matches "--delete-after" and "--delete=..."
    letters: str  # short option letters: "R" matches -R and -Rv
    values: frozenset[str]  # options that take a value, so the subcommand can be found
    anywhere: bool  # the subcommand may be any operand (make targets), not only the first


def _rule(subs: str = "", *, options: str = "", letters: str = "", values: str = "", anywhere: bool = False) -> _Rule:
    subcommands = frozenset(subs.split("|")) - {""}
    return _Rule(subcommands, tuple(options.split()), letters, frozenset(values.split()), anywhere)


def check_rule(call: Call, rule: _Rule, ctx: Context) -> None:
    for flag in flags_of(call.args):
        named = any(flag == o or flag.startswith((o + "-", o + "=")) for o in rule.options)
        if named or (not flag.startswith("--") and any(c in flag[1:] for c in rule.letters)):
            ctx.add(f"{call.name} {flag}")
    operands = [w.text for w in positionals(call.args, rule.values)]
    for phrase in operands if rule.anywhere else [" ".join(operands[:1]), " ".join(operands[:2])]:
        if phrase in rule.subcommands:
            ctx.add(f"{call.name} {phrase}")


def check_rm(call: Call, ctx: Context, _depth: int) -> None:
    flags, operands = flags_of(call.args), positionals(call.args)
    if ("--recursive" in flags or {"r", "R"} & set(letters_of(flags))) and (operands or call.computed):
        ctx.add(clip(f"recursive rm of {' '.join(w.text for w in operands) or 'paths from stdin'}"))
    if call.computed or any(w.dynamic for w in operands):
        ctx.add(f"{call.name} of paths known only at run time")
    for word in operands:
        if word.glob:
            ctx.add(f"{call.name} with a wildcard ({word.text})")
        if hit := ctx.protected_hit(word.text):
            ctx.add(f"{call.name} of protected path {hit}")


def check_dd(call: Call, ctx: Context, _depth: int) -> None:
    for word in call.args:
        if word.text.startswith("of=") and word.text != "of=/dev/null":
            ctx.add(f"dd writing to {word.text[3:]}")


def _sources_and_destination(call: Call) -> tuple[list[str], str | None]:
    """Operands of cp, mv or ln, honouring ``-t DIR``."""
    operands = [w.text for w in positionals(call.args, frozenset({"-t", "--target-directory", "-S"}))]
    if target := option_values(call.args, frozenset({"-t", "--target-directory"})):
        return operands, target[0]
    return (operands[:-1], operands[-1]) if len(operands) > 1 else (operands, None)


def _is_top_level(path: str) -> bool:
    return path.startswith("/") and normalise(path).count("/") == 1


def check_mv_cp_ln(call: Call, ctx: Context, _depth: int) -> None:
    """mv takes its sources away; cp, ln -f and mv write over their destination."""
    sources, destination = _sources_and_destination(call)
    for path in sources if call.name == "mv" else ():
        if hit := ctx.protected_hit(path, ancestors=True):
            ctx.add(f"mv of protected path {hit}")
        elif _is_top_level(path):
            ctx.add(f"mv of top-level directory {normalise(path)}")
    flags = flags_of(call.args)
    forced = call.name != "ln" or "f" in letters_of(flags) or "--force" in flags
    if forced and destination is not None and (hit := ctx.overwrites(destination)):
        ctx.add(f"{call.name}{' -f' if call.name == 'ln' else ''} onto protected path {hit}")


def check_tee(call: Call, ctx: Context, _depth: int) -> None:
    flags = flags_of(call.args)
    if "a" in letters_of(flags) or "--append" in flags:
        return
    for word in positionals(call.args):
        if hit := ctx.overwrites(word.text):
            ctx.add(f"tee onto protected path {hit}")


_SED_SCRIPT = frozenset({"-e", "-f", "--expression", "--file"})


def check_sed(call: Call, ctx: Context, _depth: int) -> None:
    flags = flags_of(call.args)
    if not any(re.match(r"-[nrEsuz]*i|--in-place", flag) for flag in flags):
        return
    files = positionals(call.args, _SED_SCRIPT | {"-l", "--line-length"})
    if not (option_values(call.args, _SED_SCRIPT) or any(f.startswith(("-e", "-f")) for f in flags)):
        files = files[1:]  # the first operand is the script
    for word in files:
        if hit := ctx.protected_hit(word.text):
            ctx.add(f"sed -i on protected path {hit}")


def check_tar(call: Call, ctx: Context, _depth: int) -> None:
    texts = [w.text for w in call.args]
    old_style = bool(texts) and not texts[0].startswith("-") and "x" in texts[0]  # tar xzf a.tgz
    if not (old_style or "x" in letters_of(flags_of(call.args)) or {"--extract", "--get"} & set(texts)):
        return
    for directory in option_values(call.args, frozenset({"-C", "--directory"})):
        where = ctx.resolve(directory)
        if where is not None and (where == "/" or (_is_top_level(where) and where != "/tmp")):
            ctx.add(f"tar extraction into {where}")
        elif hit := ctx.protected_hit(directory, ancestors=True):
            ctx.add(f"tar extraction into protected path {hit}")


def _git_is_risky(sub: str, rest: list[str]) -> bool:
    flags = [t for t in rest if t.startswith("-")]
    short, operands = letters_of(flags), [t for t in rest if not t.startswith("-")]
    forced = "f" in short or "--force" in flags
    if sub in ("rebase", "filter-branch", "filter-repo"):
        return True
    if sub == "reset":
        return "--hard" in rest
    if sub in ("clean", "rm", "switch"):
        return forced or "--discard-changes" in flags
    if sub == "checkout":
        return forced or "." in operands or "--" in rest[:-1]
    if sub == "restore":
        return "W" in short or "--worktree" in flags or not ("S" in short or "--staged" in flags)
    if sub == "push":
        rewrites = any(f.startswith(("--force", "--delete", "--mirror", "--prune")) for f in flags)
        return rewrites or forced or "d" in short or any(t.startswith(("+", ":")) for t in operands)
    if sub == "branch":
        return "D" in short or (forced and ("d" in short or "--delete" in flags))
    return sub in ("stash", "reflog") and operands[:1] in (["drop"], ["clear"], ["expire"], ["delete"])


def check_git(call: Call, ctx: Context, _depth: int) -> None:
    values = frozenset({"-C", "-c", "--git-dir", "--work-tree", "--namespace", "--config-env"})
    i, _seen = skip_options(call.args, 0, values)
    if i >= len(call.args):
        return
    sub, rest = call.args[i].text, [w.text for w in call.args[i + 1 :]]
    if _git_is_risky(sub, rest):
        ctx.add(clip(f"git {sub} {' '.join(rest)}"))


def check_kill(call: Call, ctx: Context, _depth: int) -> None:
    texts = [w.text for w in call.args]
    if texts[:1] in (["-s"], ["-n"]):
        texts = texts[2:]  # -s KILL
    elif texts and texts[0].startswith("-") and texts[0] != "--":
        texts = texts[1:]  # -9, -KILL
    if texts[:1] == ["--"]:
        texts = texts[1:]
    if "-1" in texts:
        ctx.add("kill of every process (kill -1)")


def check_cd(call: Call, ctx: Context, _depth: int) -> None:
    operands = positionals(call.args)
    ctx.cwd = ctx.resolve(operands[0].text) if operands and not operands[0].dynamic else None


DISK = "rewrites disks or partitions"
ALWAYS: dict[str, str] = {
    **dict.fromkeys(("wipefs", "fdisk", "sfdisk", "cfdisk", "parted", "gdisk", "sgdisk", "mkswap"), DISK),
    "blkdiscard": DISK,
    **dict.fromkeys(("shred", "truncate"), "destroys file contents"),
    **dict.fromkeys(("killall", "killall5", "pkill"), "kills processes by name"),
    **dict.fromkeys(("shutdown", "reboot", "halt", "poweroff"), "stops the machine"),
    **dict.fromkeys(("userdel", "deluser", "groupdel"), "deletes accounts"),
}
UNREADABLE_NAMES = frozenset({"rm", "dd", "find", *ALWAYS})

_DOCKER = "rm|rmi|system prune|container prune|container rm|image prune|image rm|volume rm|volume prune|network prune"
RULES: dict[str, _Rule] = {
    **dict.fromkeys(("apt", "apt-get", "aptitude"), _rule("remove|purge|autoremove|autopurge", values="-o -c -t")),
    **dict.fromkeys(("yum", "dnf", "microdnf"), _rule("remove|erase|autoremove")),
    **dict.fromkeys(("conda", "mamba", "micromamba"), _rule("remove|uninstall|env remove", values="-n -p")),
    **dict.fromkeys(("docker", "podman"), _rule(_DOCKER + "|builder prune|compose rm", values="-H -c --context")),
    **dict.fromkeys(("terraform", "tofu"), _rule("destroy", options="-destroy")),
    **dict.fromkeys(("chmod", "chown", "chgrp"), _rule(options="--recursive", letters="R")),
    **dict.fromkeys(("zypper", "brew"), _rule("remove|rm|uninstall")),
    **dict.fromkeys(("poetry", "pdm", "yarn"), _rule("remove")),
    **dict.fromkeys(("pip", "gem", "cargo"), _rule("uninstall")),
    "apk": _rule("del"),
    "snap": _rule("remove"),
    "flatpak": _rule("uninstall"),
    "dpkg": _rule(options="--remove --purge", letters="rP"),
    "pacman": _rule(options="--remove", letters="R"),
    "pipx": _rule("uninstall|uninstall-all"),
    "uv": _rule("remove|pip uninstall"),
    "npm": _rule("uninstall|un|unlink|remove|rm|r|prune"),
    "pnpm": _rule("remove|rm|uninstall|un|prune"),
    "kubectl": _rule("delete", values="-n --namespace --context --cluster --kubeconfig -s --server --user"),
    "helm": _rule("uninstall|delete", values="-n --namespace --kube-context"),
    "pulumi": _rule("destroy"),
    "systemctl": _rule("stop|disable|mask|kill|isolate|poweroff|reboot|halt", values="-H -M -t -p -s --type"),
    "service": _rule("stop", anywhere=True),
    "make": _rule("clean|distclean|clobber|mrproper|realclean", values="-C -f -I -o -W --file", anywhere=True),
    "rsync": _rule(options="--delete --del --remove-source-files"),
    "crontab": _rule(letters="r"),
    "redis-cli": _rule("flushall|FLUSHALL|flushdb|FLUSHDB", values="-h -p -a -n --user --pass", anywhere=True),
}
