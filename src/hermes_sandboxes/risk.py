"""Which shell commands deserve an automatic checkpoint before they run.

``classify`` reads a command line as a shell would (quotes, ``; && || | &``, newlines, ``( )``,
``{ }``, ``$( )``, backticks, heredocs), looks past prefixes (``sudo``, ``env``, ``VAR=x``,
``timeout 10``, ``xargs`` ...), reads the code given to ``bash -c``, ``eval``, ``su -c`` or piped
into a shell, then judges each simple command by its program and arguments. Text that is only an
argument (``echo "rm -rf /"``, ``grep -r "DROP TABLE" .``) is never taken for a command.

Choices, fail-closed because a needless checkpoint is cheap and a lost file is not:
- a recursive rm is risky wherever it points (``/tmp`` too); a plain or forced rm only with a
  wildcard, an operand known only at run time (``$VAR``, ``$( )``, ``xargs``, ``find -exec {}``) or
  a target under a protected path, so ``rm -f /tmp/x.log`` is harmless;
- ``make clean``/``distclean`` is risky: the recipe is unseen and exists to delete things;
- ``ssh host 'cmd'``, ``docker exec``/``run`` and ``kubectl exec`` act elsewhere: not risky here;
- input that is not valid shell (an unbalanced quote) is scanned for dangerous program names and
  SQL anywhere, then read again without its quotes, so ``echo 'rm -rf /`` counts as risky.

Blind spots: stdin we cannot see (``psql < dump.sql``, ``cat f | sh``); scripts, Makefile recipes,
aliases and functions defined earlier; the values of variables; other languages beyond a few
deletion calls in ``python -c``/``node -e``/``perl -e``; ``~``, and relative paths when no ``cwd``
is given (a ``cd`` inside the command is followed).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from hermes_sandboxes.errors import InvalidInput

__all__ = ["CHECKPOINT_POLICIES", "CheckpointPolicy", "RiskVerdict", "classify", "wants_checkpoint"]

CheckpointPolicy = Literal["off", "risky", "always"]
CHECKPOINT_POLICIES: tuple[CheckpointPolicy, ...] = ("off", "risky", "always")

_MAX_DEPTH = 12  # nested bash -c / eval / $( ) levels we read before giving up (and calling it risky)


@dataclass(frozen=True)
class RiskVerdict:
    risky: bool
    reasons: tuple[str, ...] = ()  # short and human-readable: "recursive rm of /root/app"


def classify(
    command: str,
    *,
    protected_paths: Sequence[str] = (),
    exists: Callable[[str], bool] | None = None,
    cwd: str | None = None,
) -> RiskVerdict:
    """Whether the shell string ``command`` may destroy something a checkpoint could bring back.

    ``protected_paths``: absolute paths whose files must not be removed, moved or overwritten.
    ``exists`` tells whether a path exists; without it any ``>`` onto a protected path counts.
    ``cwd`` is where the command starts, to match relative paths against protected ones.
    """
    if not isinstance(command, str):
        raise InvalidInput(f"classify takes a shell string, not {type(command).__name__}: use shlex.join")
    for path in [*protected_paths, *([cwd] if cwd is not None else [])]:
        if not path.startswith("/"):
            raise InvalidInput(f"path {path!r} is relative: give protected paths and cwd as absolute paths")
    ctx = _Context(tuple(_normalise(p) for p in protected_paths), exists, cwd and _normalise(cwd))
    _scan(command, ctx, 0)
    return RiskVerdict(bool(ctx.reasons), tuple(ctx.reasons))


def wants_checkpoint(
    policy: CheckpointPolicy,
    command: str,
    *,
    protected_paths: Sequence[str] = (),
    exists: Callable[[str], bool] | None = None,
    cwd: str | None = None,
) -> RiskVerdict:
    """Whether to checkpoint before ``command``: never (off), always, or when it is risky."""
    if policy == "off":
        return RiskVerdict(False)
    if policy == "always":
        return RiskVerdict(True, ("policy always",))
    if policy == "risky":
        return classify(command, protected_paths=protected_paths, exists=exists, cwd=cwd)
    raise InvalidInput(f"unknown checkpoint policy {policy!r}: use one of {', '.join(CHECKPOINT_POLICIES)}")


# --- Reading the command line: a small shell lexer and parser, enough to find every simple command.


class _ParseError(Exception):
    """Not valid shell (an unbalanced quote or parenthesis, a redirection without a target)."""


@dataclass
class _Word:
    text: str  # after quote removal; substitutions keep their source text
    glob: bool = False  # an unquoted * or ?: the shell expands it to files we cannot see
    dynamic: bool = False  # holds $VAR, $( ), backticks or <( ): its value is known only at run time
    subs: list[str] = field(default_factory=list)  # the command text inside $( ), backticks and <( )


@dataclass
class _Heredoc:
    body: str = ""  # filled in when the lexer reaches the line after the operator


_Token = _Word | _Heredoc | str  # a str is an operator or a redirection
_OPERATORS = ("&&", "||", ";;", "|&", ";", "&", "|", "(", ")", "\n")
_REDIRECTIONS = ("&>>", "<<<", "<<-", ">>", "&>", ">|", ">&", "<&", "<>", "<<", ">", "<")
_WORD_END = frozenset(" \t\r\n;&|()<>")
_BACKTICK_REST = re.compile(r"(?:[^`\\]|\\.)*`", re.S)
_ANSI_C_REST = re.compile(r"(?:[^'\\]|\\.)*'", re.S)


class _Lexer:
    """Words (quotes removed), operators and heredocs; a nested lexer finds where ``$( )`` ends."""

    def __init__(self, text: str, start: int = 0) -> None:
        self.s, self.i = text, start
        self.tokens: list[_Token] = []
        self.pending: list[tuple[_Heredoc, str, bool]] = []  # heredocs whose body starts next line

    def run(self, *, nested: bool = False) -> list[_Token]:
        s, depth = self.s, 0
        while self.i < len(s):
            c = s[self.i]
            if c in " \t\r":
                self.i += 1
            elif s.startswith("\\\n", self.i):
                self.i += 2  # a line continuation
            elif c == "#":
                self.i = self._line_end(self.i)  # a comment
            elif c not in _WORD_END or s.startswith(("<(", ">("), self.i):
                self._word()
            elif nested and c == ")" and depth == 0:
                self.i += 1
                return self.tokens  # the ) that closes the substitution
            else:
                depth += {"(": 1, ")": -1}.get(c, 0)
                self._operator()
        if nested:
            raise _ParseError("unbalanced parenthesis")
        return self.tokens

    def _operator(self) -> None:
        op = next(o for o in (*_REDIRECTIONS, *_OPERATORS) if self.s.startswith(o, self.i))
        self.i += len(op)
        if op in ("<<", "<<-"):
            while self.s[self.i : self.i + 1] in (" ", "\t"):
                self.i += 1
            start = len(self.tokens)
            self._word()
            delimiter = self.tokens.pop() if len(self.tokens) > start else None
            if not isinstance(delimiter, _Word):
                raise _ParseError("heredoc without a delimiter")
            self.tokens.append(doc := _Heredoc())
            self.pending.append((doc, delimiter.text, op == "<<-"))
            return
        self.tokens.append(op)
        if op == "\n":
            self._heredoc_bodies()

    def _heredoc_bodies(self) -> None:
        for doc, delimiter, strip_tabs in self.pending:
            lines: list[str] = []
            while self.i < len(self.s):
                end = self._line_end(self.i)
                line, self.i = self.s[self.i : end], end + 1
                if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                    break
                lines.append(line)
            doc.body = "\n".join(lines)
        self.pending.clear()

    def _line_end(self, j: int) -> int:
        end = self.s.find("\n", j)
        return len(self.s) if end < 0 else end

    def _word(self) -> None:
        s, start, word, out, quoted = self.s, self.i, _Word(""), list[str](), False
        while self.i < len(s):
            c = s[self.i]
            if c in _WORD_END and not (self.i == start and s.startswith(("<(", ">("), self.i)):
                break
            if c == "'":
                end = s.find("'", self.i + 1)
                if end < 0:
                    raise _ParseError("unbalanced single quote")
                out.append(s[self.i + 1 : end])
                self.i, quoted = end + 1, True
            elif c == '"':
                self.i, quoted = self.i + 1, True
                out.append(self._double_quoted(word))
            elif c == "\\":
                out.append(s[self.i + 1 : self.i + 2].replace("\n", ""))
                self.i, quoted = self.i + 2, True
            elif s.startswith("$'", self.i):
                end = self._rest(_ANSI_C_REST, self.i + 2)
                out.append(s[self.i + 2 : end - 1].replace("\\'", "'"))
                self.i, quoted = end, True
            elif c in "$`<>":
                out.append(self._expansion(word))
            else:
                word.glob = word.glob or c in "*?"
                out.append(c)
                self.i += 1
        word.text = "".join(out)
        if quoted or not word.text.isdigit() or s[self.i : self.i + 1] not in ("<", ">"):
            self.tokens.append(word)  # else it was the descriptor number of 2>err.log

    def _double_quoted(self, word: _Word) -> str:
        s, out = self.s, list[str]()
        while self.i < len(s) and s[self.i] != '"':
            if s[self.i] == "\\" and s[self.i + 1 : self.i + 2] in ("$", "`", '"', "\\", "\n"):
                out.append(s[self.i + 1].replace("\n", ""))
                self.i += 2
            elif s[self.i] in "$`":
                out.append(self._expansion(word))
            else:
                out.append(s[self.i])
                self.i += 1
        if self.i >= len(s):
            raise _ParseError("unbalanced double quote")
        self.i += 1
        return "".join(out)

    def _expansion(self, word: _Word) -> str:
        """``$( )``, ``$(( ))``, ``<( )``, backticks, ``${ }`` or ``$NAME`` at self.i: its source text."""
        s, i = self.s, self.i
        after = s[i + 1 : i + 2]
        if after == "(":
            (inner := _Lexer(s, i + 2)).run(nested=True)
            end = inner.i
            if not s.startswith("$((", i):  # arithmetic holds no command
                word.subs.append(s[i + 2 : end - 1])
        elif s[i] == "`":
            end = self._rest(_BACKTICK_REST, i + 1)
            word.subs.append(s[i + 1 : end - 1].replace("\\`", "`"))
        elif after == "{":
            end = s.find("}", i) + 1
            if end == 0:
                raise _ParseError("unbalanced ${")
        elif after.isalpha() or after == "_":
            end = i + 1  # $NAME: the name's letters are read next as plain text
        elif after and (after in "@*#?$!-" or after.isdigit()):
            end = i + 2
        else:
            self.i += 1
            return s[i]  # a lone $, < or >
        word.dynamic = True
        self.i = end
        return s[i:end]

    def _rest(self, pattern: re.Pattern[str], start: int) -> int:
        match = pattern.match(self.s, start)
        if match is None:
            raise _ParseError("unbalanced quote")
        return match.end()


_RESERVED = frozenset({"!", "if", "then", "else", "elif", "fi", "do", "done", "while", "until", "esac"})


@dataclass
class _Simple:
    words: list[_Word] = field(default_factory=list)
    redirects: list[tuple[str, _Word]] = field(default_factory=list)
    stdin: list[_Heredoc] = field(default_factory=list)  # heredocs and here-strings
    upstream: _Simple | None = None  # the command piping into this one


class _Parser:
    """Groups tokens into simple commands and notices functions that call themselves (fork bombs)."""

    def __init__(self, tokens: list[_Token]) -> None:
        self.commands: list[_Simple] = []
        self.recursive: set[str] = set()
        self.cur = _Simple()
        self.braces = 0
        self.bodies: list[tuple[str, int]] = []  # function bodies we are inside: (name, brace depth)
        self.defining: str | None = None  # a function whose body comes next
        self.in_parens = False  # between `name (` and `)`
        self.keyword = False  # just read `function`: the name comes next
        redirect: str | None = None  # an operator waiting for its target word
        for tok in tokens:
            if redirect is not None:
                if not isinstance(tok, _Word):
                    raise _ParseError("redirection without a target")
                self.cur.redirects.append((redirect, tok))
                if redirect == "<<<":
                    self.cur.stdin.append(_Heredoc(tok.text))
                redirect = None
            elif isinstance(tok, _Word):
                self._word(tok)
            elif isinstance(tok, _Heredoc):
                self.cur.stdin.append(tok)
            elif tok in _REDIRECTIONS:
                redirect = tok
            else:
                self._operator(tok)
        if redirect is not None:
            raise _ParseError("redirection without a target")
        self._operator(";")

    def _word(self, word: _Word) -> None:
        text = word.text
        if self.cur.words:
            self.cur.words.append(word)
        elif self.keyword:
            self.keyword, self.defining = False, text
        elif text == "function":
            self.keyword = True
        elif text == "{":
            self.braces += 1
            if self.defining is not None:
                self.bodies.append((self.defining, self.braces))
                self.defining = None
        elif text == "}":
            if self.bodies and self.bodies[-1][1] == self.braces:
                self.bodies.pop()
            self.braces -= 1
        elif text not in _RESERVED:
            if any(name == text for name, _ in self.bodies):
                self.recursive.add(text)
            self.cur.words.append(word)

    def _operator(self, op: str) -> None:
        cur = self.cur
        if op == "(" and len(cur.words) == 1 and not cur.redirects:
            self.defining, self.in_parens, self.cur = cur.words[0].text, True, _Simple()
        elif op == ")" and self.in_parens:
            self.in_parens = False
        else:
            if cur.words or cur.redirects:
                self.commands.append(cur)
            self.cur = _Simple(upstream=cur if op in ("|", "|&") and cur.words else None)


# --- Judging what the commands do.


@dataclass
class _Context:
    protected: tuple[str, ...]
    exists: Callable[[str], bool] | None
    cwd: str | None
    reasons: list[str] = field(default_factory=list)

    def add(self, reason: str) -> None:
        if reason not in self.reasons:
            self.reasons.append(reason)

    def resolve(self, path: str) -> str | None:
        """``path`` made absolute, or None when that depends on something we cannot see."""
        if not path or path.startswith(("~", "$")) or (path[0] != "/" and self.cwd is None):
            return None
        return _normalise(posixpath.join(self.cwd or "/", path))

    def protected_hit(self, path: str, *, ancestors: bool = False) -> str | None:
        """The resolved ``path`` if it lies under a protected path (or, with ancestors, holds one)."""
        resolved = self.resolve(path)
        if resolved is None:
            return None
        for root in self.protected:
            if _inside(resolved, root) or (ancestors and _inside(root, resolved)):
                return resolved
        return None

    def overwrites(self, path: str) -> str | None:
        """The resolved ``path`` if writing it clobbers a protected file (one that exists, if we can tell)."""
        hit = self.protected_hit(path)
        try:
            return None if hit is None or (self.exists is not None and not self.exists(hit)) else hit
        except OSError:
            return hit  # cannot tell: assume the file is there


def _normalise(path: str) -> str:
    path = posixpath.normpath(path)
    return "/" + path.lstrip("/") if path.startswith("/") else path


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _clip(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _scan(text: str, ctx: _Context, depth: int) -> None:
    if depth > _MAX_DEPTH:
        ctx.add("commands nested too deeply to read")
        return
    try:
        script = _Parser(_Lexer(text).run())
    except _ParseError:
        _scan_unreadable(text, ctx, depth)
        return
    for name in sorted(script.recursive):
        ctx.add(f"fork bomb (function {name} calls itself)")
    for cmd in script.commands:
        for word in [*cmd.words, *(target for _, target in cmd.redirects)]:
            for sub in word.subs:
                _scan(sub, ctx, depth + 1)
        for op, target in cmd.redirects:
            _check_redirect(op, target.text, ctx)
        if (call := _unwrap(cmd.words, cmd)) is not None:
            _check_call(call, ctx, depth)


def _scan_unreadable(text: str, ctx: _Context, depth: int) -> None:
    """Not valid shell: flag dangerous names and SQL anywhere, then read it again without quotes."""
    for name in map(_program, re.split(r"[\s;&|()<>`'\"{}$]+", text)):
        if name in _UNREADABLE_NAMES or name.startswith("mkfs"):
            ctx.add(f"unreadable command mentions {name}")
    for reason in _sql_reasons(text):
        ctx.add(reason)
    if (cleaned := re.sub(r"[\"'`\\()]", " ", text)) != text:
        _scan(cleaned, ctx, depth + 1)


_BLOCK_DEVICE = re.compile(r"/dev/(sd|hd|vd|xvd|nvme|mmcblk|disk|md|dm-|mapper/|loop)")


def _check_redirect(op: str, path: str, ctx: _Context) -> None:
    if op not in (">", ">|", "&>", ">&") or (op == ">&" and (path.isdigit() or path == "-")):
        return  # appends and reads leave existing content alone; 2>&1 duplicates a descriptor
    if _BLOCK_DEVICE.match(path):
        ctx.add(f"> onto block device {path}")
    elif hit := ctx.overwrites(path):
        ctx.add(f"> onto protected path {hit}")


@dataclass
class _Call:
    """A program and its arguments, once prefixes such as sudo and env are out of the way."""

    name: str
    args: list[_Word]
    cmd: _Simple  # where it came from: redirections, heredocs, the command piping into it
    computed: bool = False  # xargs adds operands we cannot see


_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=")
_VERSIONED = re.compile(r"^(python|pip|pypy|perl|ruby|node)[0-9.]+$")


def _program(word: str) -> str:
    """``/usr/bin/python3.11`` -> ``python``: the name the tables below know."""
    return _VERSIONED.sub(r"\1", word.rsplit("/", 1)[-1])


def _unwrap(words: list[_Word], cmd: _Simple) -> _Call | None:
    i, computed = 0, False
    while True:
        while i < len(words) and _ASSIGNMENT.match(words[i].text):
            i += 1
        if i >= len(words):
            return None
        name = _program(words[i].text)
        if name not in _WRAPPERS:
            return _Call(name, words[i + 1 :], cmd, computed)
        values, operands = _WRAPPERS[name]
        i, seen = _skip_options(words, i + 1, values)
        if name == "command" and seen & {"-v", "-V"}:
            return None  # `command -v rm` only looks the name up
        i, computed = i + operands, computed or name == "xargs"


def _option_width(option: str, values: frozenset[str]) -> int:
    """How many words ``option`` spans: 2 when its value is the next word (``-u root``, ``-Eu root``)."""
    if option in values:
        return 2
    for k, letter in enumerate("" if option.startswith("--") or "=" in option else option[1:], 1):
        if "-" + letter in values:
            return 2 if k == len(option) - 1 else 1
    return 1


def _skip_options(words: list[_Word], i: int, values: frozenset[str]) -> tuple[int, set[str]]:
    seen: set[str] = set()
    while i < len(words) and len(words[i].text) > 1 and words[i].text[0] == "-":
        if words[i].text == "--":
            return i + 1, seen
        seen.add(words[i].text)
        i += _option_width(words[i].text, values)
    return i, seen


def _positionals(args: list[_Word], values: frozenset[str] = frozenset()) -> list[_Word]:
    out, i = list[_Word](), 0
    while i < len(args):
        if args[i].text == "--":
            return out + args[i + 1 :]
        if len(args[i].text) > 1 and args[i].text[0] == "-":
            i += _option_width(args[i].text, values)
        else:
            out.append(args[i])
            i += 1
    return out


def _flags(args: list[_Word]) -> list[str]:
    texts = [w.text for w in args]
    if "--" in texts:
        texts = texts[: texts.index("--")]  # what follows -- is operands
    return [t for t in texts if len(t) > 1 and t[0] == "-"]


def _letters(flags: list[str]) -> str:
    """Every short option letter given: ``-fdx -n`` -> ``fdxn``."""
    return "".join(flag[1:] for flag in flags if not flag.startswith("--"))


def _option_values(args: list[_Word], names: frozenset[str]) -> list[str]:
    """The values of options ``names``, given as ``-c CODE``, ``-cCODE`` or ``--command=CODE``."""
    values: list[str] = []
    for i, text in enumerate(w.text for w in args):
        if text == "--":
            break
        if text in names:
            values.extend(w.text for w in args[i + 1 : i + 2])
        elif text.startswith("--") and text.split("=", 1)[0] in names and "=" in text:
            values.append(text.split("=", 1)[1])
        elif not text.startswith("--") and len(text) > 2 and text[:2] in names:
            values.append(text[2:])
    return values


def _check_call(call: _Call, ctx: _Context, depth: int) -> None:
    if call.name.startswith("mkfs"):
        ctx.add(f"{call.name} (formats a filesystem)")
    listing = _ALWAYS.get(call.name) == _DISK and {"-l", "--list"} & {w.text for w in call.args}
    if call.name in _ALWAYS and not listing:
        ctx.add(f"{call.name} ({_ALWAYS[call.name]})")
    if call.name in _RULES:
        _check_rule(call, _RULES[call.name], ctx)
    if call.name in _CHECKERS:
        _CHECKERS[call.name](call, ctx, depth)


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


def _check_rule(call: _Call, rule: _Rule, ctx: _Context) -> None:
    for flag in _flags(call.args):
        named = any(flag == o or flag.startswith((o + "-", o + "=")) for o in rule.options)
        if named or (not flag.startswith("--") and any(c in flag[1:] for c in rule.letters)):
            ctx.add(f"{call.name} {flag}")
    operands = [w.text for w in _positionals(call.args, rule.values)]
    for phrase in operands if rule.anywhere else [" ".join(operands[:1]), " ".join(operands[:2])]:
        if phrase in rule.subcommands:
            ctx.add(f"{call.name} {phrase}")


def _check_rm(call: _Call, ctx: _Context, _depth: int) -> None:
    flags, operands = _flags(call.args), _positionals(call.args)
    if ("--recursive" in flags or {"r", "R"} & set(_letters(flags))) and (operands or call.computed):
        ctx.add(_clip(f"recursive rm of {' '.join(w.text for w in operands) or 'paths from stdin'}"))
    if call.computed or any(w.dynamic for w in operands):
        ctx.add(f"{call.name} of paths known only at run time")
    for word in operands:
        if word.glob:
            ctx.add(f"{call.name} with a wildcard ({word.text})")
        if hit := ctx.protected_hit(word.text):
            ctx.add(f"{call.name} of protected path {hit}")


def _check_find(call: _Call, ctx: _Context, depth: int) -> None:
    texts = [w.text for w in call.args]
    if "-delete" in texts:
        ctx.add("find -delete")
    for i, text in enumerate(texts):
        if text in ("-exec", "-execdir", "-ok", "-okdir"):
            end = next((j for j in range(i + 1, len(texts)) if texts[j] in (";", "+")), len(texts))
            inner = [_Word(w.text, w.glob, w.dynamic or "{}" in w.text, w.subs) for w in call.args[i + 1 : end]]
            if (found := _unwrap(inner, _Simple(inner))) is not None:
                _check_call(found, ctx, depth + 1)


def _check_dd(call: _Call, ctx: _Context, _depth: int) -> None:
    for word in call.args:
        if word.text.startswith("of=") and word.text != "of=/dev/null":
            ctx.add(f"dd writing to {word.text[3:]}")


def _sources_and_destination(call: _Call) -> tuple[list[str], str | None]:
    """Operands of cp, mv or ln, honouring ``-t DIR``."""
    operands = [w.text for w in _positionals(call.args, frozenset({"-t", "--target-directory", "-S"}))]
    if target := _option_values(call.args, frozenset({"-t", "--target-directory"})):
        return operands, target[0]
    return (operands[:-1], operands[-1]) if len(operands) > 1 else (operands, None)


def _is_top_level(path: str) -> bool:
    return path.startswith("/") and _normalise(path).count("/") == 1


def _check_mv_cp_ln(call: _Call, ctx: _Context, _depth: int) -> None:
    """mv takes its sources away; cp, ln -f and mv write over their destination."""
    sources, destination = _sources_and_destination(call)
    for path in sources if call.name == "mv" else ():
        if hit := ctx.protected_hit(path, ancestors=True):
            ctx.add(f"mv of protected path {hit}")
        elif _is_top_level(path):
            ctx.add(f"mv of top-level directory {_normalise(path)}")
    flags = _flags(call.args)
    forced = call.name != "ln" or "f" in _letters(flags) or "--force" in flags
    if forced and destination is not None and (hit := ctx.overwrites(destination)):
        ctx.add(f"{call.name}{' -f' if call.name == 'ln' else ''} onto protected path {hit}")


def _check_tee(call: _Call, ctx: _Context, _depth: int) -> None:
    flags = _flags(call.args)
    if "a" in _letters(flags) or "--append" in flags:
        return
    for word in _positionals(call.args):
        if hit := ctx.overwrites(word.text):
            ctx.add(f"tee onto protected path {hit}")


_SED_SCRIPT = frozenset({"-e", "-f", "--expression", "--file"})


def _check_sed(call: _Call, ctx: _Context, _depth: int) -> None:
    flags = _flags(call.args)
    if not any(re.match(r"-[nrEsuz]*i|--in-place", flag) for flag in flags):
        return
    files = _positionals(call.args, _SED_SCRIPT | {"-l", "--line-length"})
    if not (_option_values(call.args, _SED_SCRIPT) or any(f.startswith(("-e", "-f")) for f in flags)):
        files = files[1:]  # the first operand is the script
    for word in files:
        if hit := ctx.protected_hit(word.text):
            ctx.add(f"sed -i on protected path {hit}")


def _check_tar(call: _Call, ctx: _Context, _depth: int) -> None:
    texts = [w.text for w in call.args]
    old_style = bool(texts) and not texts[0].startswith("-") and "x" in texts[0]  # tar xzf a.tgz
    if not (old_style or "x" in _letters(_flags(call.args)) or {"--extract", "--get"} & set(texts)):
        return
    for directory in _option_values(call.args, frozenset({"-C", "--directory"})):
        where = ctx.resolve(directory)
        if where is not None and (where == "/" or (_is_top_level(where) and where != "/tmp")):
            ctx.add(f"tar extraction into {where}")
        elif hit := ctx.protected_hit(directory, ancestors=True):
            ctx.add(f"tar extraction into protected path {hit}")


def _git_is_risky(sub: str, rest: list[str]) -> bool:
    flags = [t for t in rest if t.startswith("-")]
    short, operands = _letters(flags), [t for t in rest if not t.startswith("-")]
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


def _check_git(call: _Call, ctx: _Context, _depth: int) -> None:
    values = frozenset({"-C", "-c", "--git-dir", "--work-tree", "--namespace", "--config-env"})
    i, _seen = _skip_options(call.args, 0, values)
    if i >= len(call.args):
        return
    sub, rest = call.args[i].text, [w.text for w in call.args[i + 1 :]]
    if _git_is_risky(sub, rest):
        ctx.add(_clip(f"git {sub} {' '.join(rest)}"))


def _check_kill(call: _Call, ctx: _Context, _depth: int) -> None:
    texts = [w.text for w in call.args]
    if texts[:1] in (["-s"], ["-n"]):
        texts = texts[2:]  # -s KILL
    elif texts and texts[0].startswith("-") and texts[0] != "--":
        texts = texts[1:]  # -9, -KILL
    if texts[:1] == ["--"]:
        texts = texts[1:]
    if "-1" in texts:
        ctx.add("kill of every process (kill -1)")


def _check_cd(call: _Call, ctx: _Context, _depth: int) -> None:
    operands = _positionals(call.args)
    ctx.cwd = ctx.resolve(operands[0].text) if operands and not operands[0].dynamic else None


_DOWNLOADERS = frozenset({"curl", "wget", "fetch", "http", "https", "aria2c"})
_DOWNLOAD_SUBSTITUTION = re.compile(r"(\$\(|`|<\()\s*(?:sudo\s+)?(curl|wget|fetch|http)\b")
_CODE_DELETES = re.compile(r"rmtree|removedirs|os\.remove\b|unlink|rmSync|rmdirSync|rm_rf|rm_r\b|File\.delete")


def _run_code(code: str, ctx: _Context, depth: int, runner: str) -> None:
    if match := _DOWNLOAD_SUBSTITUTION.search(code):
        ctx.add(f"runs downloaded code ({match.group(2)} into {runner})")
    _scan(code, ctx, depth + 1)


def _run_stdin(call: _Call, ctx: _Context, depth: int, *, shell: bool) -> None:
    """The program reads its code on stdin: from a heredoc, echo or cat we can read, or a download."""
    codes = [doc.body for doc in call.cmd.stdin]
    upstream = call.cmd.upstream
    source = _unwrap(upstream.words, upstream) if upstream is not None else None
    if source is not None and source.name == "cat":  # cat <<EOF | sh
        codes += [doc.body for doc in source.cmd.stdin]
    elif source is not None and source.name in ("echo", "printf"):  # echo 'rm -rf x' | sh
        text = _join(source.args[_skip_options(source.args, 0, frozenset())[0] :])
        codes.append(text.replace("\\n", "\n"))  # printf and echo -e turn \n into a newline
    for code in codes:
        if shell:
            _scan(code, ctx, depth + 1)
        elif _CODE_DELETES.search(code):
            ctx.add(f"{call.name} code that deletes files")
    while upstream is not None:
        if (source := _unwrap(upstream.words, upstream)) is not None and source.name in _DOWNLOADERS:
            ctx.add(f"runs downloaded code ({source.name} | {call.name})")
        upstream = upstream.upstream


def _join(words: list[_Word]) -> str:
    return " ".join(w.text for w in words)


def _check_shell(call: _Call, ctx: _Context, depth: int) -> None:
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


def _check_interpreter(call: _Call, ctx: _Context, depth: int) -> None:
    texts = [w.text for w in call.args]
    module = texts.index("-m") + 1 if "-m" in texts else len(texts)
    if texts[module : module + 1] in (["pip"], ["pip3"]):  # python -m pip uninstall
        _check_rule(_Call("pip", call.args[module + 1 :], call.cmd), _RULES["pip"], ctx)
        return
    codes = _option_values(call.args, frozenset({"-c", "-e", "-E", "--eval", "-p", "--print"}))
    if any(_CODE_DELETES.search(code) for code in codes):
        ctx.add(f"{call.name} code that deletes files")
    if not codes and "-m" not in texts and all(t.startswith("-") for t in texts):
        _run_stdin(call, ctx, depth, shell=False)


def _check_code_runner(call: _Call, ctx: _Context, depth: int) -> None:
    """eval and watch run their words as shell code, su -c its value; source is judged by its origin."""
    if call.name in ("su", "runuser"):
        for code in _option_values(call.args, frozenset({"-c", "--command", "--session-command"})):
            _run_code(code, ctx, depth, call.name)
    elif call.name in ("source", "."):
        if call.args and (match := _DOWNLOAD_SUBSTITUTION.search(call.args[0].text)):
            ctx.add(f"runs downloaded code ({match.group(2)} into {call.name})")
    else:
        start, _seen = _skip_options(call.args, 0, frozenset({"-n", "--interval"}))
        _run_code(_join(call.args[start:]), ctx, depth, call.name)


_SQL_DROP = re.compile(
    r"\bDROP\s+(MATERIALIZED\s+VIEW|TABLE|DATABASE|SCHEMA|INDEX|VIEW|USER|ROLE|COLUMN|TRIGGER"
    r"|FUNCTION|PROCEDURE|SEQUENCE|TYPE|EXTENSION|OWNED|COLLECTION|KEYSPACE)\b"
)
_SQL_UPDATE = re.compile(r"\bUPDATE\s+\S+\s+SET\b")


def _sql_reasons(sql: str) -> list[str]:
    """What is destructive in ``sql``: DROP, TRUNCATE, and DELETE or UPDATE without WHERE."""
    reasons = []
    text = re.sub(r"'(?:[^']|'')*'", "''", sql)  # string literals first: '--' in a string is no comment
    text = re.sub(r"--[^\n]*|/\*.*?\*/", " ", text, flags=re.S)
    for statement in (" ".join(s.split()) + " " for s in text.upper().split(";")):
        if match := _SQL_DROP.search(statement):
            reasons.append(f"SQL DROP {' '.join(match.group(1).split())}")
        if statement.startswith("TRUNCATE"):
            reasons.append("SQL TRUNCATE")
        if (delete := statement.find("DELETE FROM")) >= 0 and " WHERE " not in statement[delete:]:
            reasons.append("SQL DELETE without WHERE")
        if (update := _SQL_UPDATE.search(statement)) and " WHERE " not in statement[update.start() :]:
            reasons.append("SQL UPDATE without WHERE")
    return reasons


_SQL_OPTIONS = {  # where each client takes its SQL on the command line
    **dict.fromkeys(("mysql", "mariadb"), frozenset({"-e", "--execute"})),
    "psql": frozenset({"-c", "--command"}),
    "sqlcmd": frozenset({"-Q", "-q"}),
    "clickhouse-client": frozenset({"-q", "--query"}),
    "sqlite3": frozenset({"-cmd"}),
    "duckdb": frozenset({"-c", "-cmd"}),
}
_MONGO_DANGER = re.compile(r"\.\s*(dropDatabase|drop|dropIndexes)\s*\(|\.\s*(deleteMany|remove)\s*\(\s*\{\s*\}\s*\)")


def _check_database(call: _Call, ctx: _Context, _depth: int) -> None:
    heredocs = [doc.body for doc in call.cmd.stdin]
    if call.name in ("mongo", "mongosh"):
        for code in [*_option_values(call.args, frozenset({"--eval"})), *heredocs]:
            if match := _MONGO_DANGER.search(code):
                ctx.add(f"MongoDB {match.group(1) or match.group(2)}")
        return
    statements = _option_values(call.args, _SQL_OPTIONS[call.name]) + heredocs
    if call.name in ("sqlite3", "duckdb"):  # sqlite3 app.db 'DELETE FROM users'
        values = frozenset({"-cmd", "-separator", "-nullvalue", "-newline", "-init"})
        statements += [w.text for w in _positionals(call.args, values)[1:]]
    for reason in (r for sql in statements for r in _sql_reasons(sql)):
        ctx.add(reason)


# --- Tables.

# Prefixes that run the rest of their words as a command: the options that take a value, and how
# many operands come before the command (the duration of `timeout 10`, the new root of `chroot /mnt`).
_WRAPPERS: dict[str, tuple[frozenset[str], int]] = {
    "sudo": (frozenset({"-u", "-g", "-h", "-p", "-C", "-r", "-t", "-U", "-T", "-D", "-R", "--user", "--group",
                        "--host", "--prompt", "--role", "--type", "--chdir"}), 0),
    "xargs": (frozenset({"-n", "-L", "-l", "-I", "-i", "-P", "-d", "-E", "-e", "-s", "-a", "--max-args",
                         "--max-lines", "--replace", "--max-procs", "--delimiter", "--arg-file"}), 0),
    "env": (frozenset({"-u", "-C", "-S", "--unset", "--chdir", "--split-string"}), 0),
    "time": (frozenset({"-o", "-f", "--output", "--format"}), 0),
    "ionice": (frozenset({"-c", "-n", "-p", "--class", "--classdata"}), 0),
    "stdbuf": (frozenset({"-i", "-o", "-e", "--input", "--output", "--error"}), 0),
    "timeout": (frozenset({"-s", "-k", "--signal", "--kill-after"}), 1),
    "chroot": (frozenset({"--userspec", "--groups"}), 1),
    "nice": (frozenset({"-n", "--adjustment"}), 0),
    "doas": (frozenset({"-u", "-C"}), 0),
    "exec": (frozenset({"-a"}), 0),
    "taskset": (frozenset(), 1),
    **dict.fromkeys(("nohup", "command", "builtin", "setsid", "busybox"), (frozenset[str](), 0)),
}

_DISK = "rewrites disks or partitions"
_ALWAYS: dict[str, str] = {
    **dict.fromkeys(("wipefs", "fdisk", "sfdisk", "cfdisk", "parted", "gdisk", "sgdisk", "mkswap"), _DISK),
    "blkdiscard": _DISK,
    **dict.fromkeys(("shred", "truncate"), "destroys file contents"),
    **dict.fromkeys(("killall", "killall5", "pkill"), "kills processes by name"),
    **dict.fromkeys(("shutdown", "reboot", "halt", "poweroff"), "stops the machine"),
    **dict.fromkeys(("userdel", "deluser", "groupdel"), "deletes accounts"),
}
_UNREADABLE_NAMES = frozenset({"rm", "dd", "find", *_ALWAYS})

_DOCKER = "rm|rmi|system prune|container prune|container rm|image prune|image rm|volume rm|volume prune|network prune"
_RULES: dict[str, _Rule] = {
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

_Checker = Callable[[_Call, _Context, int], None]
_CHECKERS: dict[str, _Checker] = {
    **dict.fromkeys(("sh", "bash", "zsh", "dash", "ksh", "mksh", "ash", "fish"), _check_shell),
    **dict.fromkeys(("python", "pypy", "perl", "ruby", "node"), _check_interpreter),
    **dict.fromkeys((*_SQL_OPTIONS, "mongo", "mongosh"), _check_database),
    **dict.fromkeys(("eval", "watch", "su", "runuser", "source", "."), _check_code_runner),
    **dict.fromkeys(("mv", "cp", "ln"), _check_mv_cp_ln),
    **dict.fromkeys(("rm", "unlink"), _check_rm),
    **dict.fromkeys(("cd", "pushd"), _check_cd),
    "find": _check_find,
    "dd": _check_dd,
    "tee": _check_tee,
    "sed": _check_sed,
    "tar": _check_tar,
    "git": _check_git,
    "kill": _check_kill,
}
