"""Reading the command line: a small shell lexer and parser, enough to find every simple command.

Then the program each simple command runs, once prefixes such as ``sudo``, ``env`` or ``VAR=x`` are
out of the way, and helpers that read its options and operands.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


class ParseError(Exception):
    """Not valid shell (an unbalanced quote or parenthesis, a redirection without a target)."""


@dataclass
class Word:
    text: str  # after quote removal; substitutions keep their source text
    glob: bool = False  # an unquoted * or ?: the shell expands it to files we cannot see
    dynamic: bool = False  # holds $VAR, $( ), backticks or <( ): its value is known only at run time
    subs: list[str] = field(default_factory=list)  # the command text inside $( ), backticks and <( )


@dataclass
class _Heredoc:
    body: str = ""  # filled in when the lexer reaches the line after the operator


_Token = Word | _Heredoc | str  # a str is an operator or a redirection
_OPERATORS = ("&&", "||", ";;", "|&", ";", "&", "|", "(", ")", "\n")
_REDIRECTIONS = ("&>>", "<<<", "<<-", ">>", "&>", ">|", ">&", "<&", "<>", "<<", ">", "<")
_WORD_END = frozenset(" \t\r\n;&|()<>")
_BACKTICK_REST = re.compile(r"(?:[^`\\]|\\.)*`", re.S)
_ANSI_C_REST = re.compile(r"(?:[^'\\]|\\.)*'", re.S)


class Lexer:
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
            raise ParseError("unbalanced parenthesis")
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
            if not isinstance(delimiter, Word):
                raise ParseError("heredoc without a delimiter")
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
        s, start, word, out, quoted = self.s, self.i, Word(""), list[str](), False
        while self.i < len(s):
            c = s[self.i]
            if c in _WORD_END and not (self.i == start and s.startswith(("<(", ">("), self.i)):
                break
            if c == "'":
                end = s.find("'", self.i + 1)
                if end < 0:
                    raise ParseError("unbalanced single quote")
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

    def _double_quoted(self, word: Word) -> str:
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
            raise ParseError("unbalanced double quote")
        self.i += 1
        return "".join(out)

    def _expansion(self, word: Word) -> str:
        """``$( )``, ``$(( ))``, ``<( )``, backticks, ``${ }`` or ``$NAME`` at self.i: its source text."""
        s, i = self.s, self.i
        after = s[i + 1 : i + 2]
        if after == "(":
            (inner := Lexer(s, i + 2)).run(nested=True)
            end = inner.i
            if not s.startswith("$((", i):  # arithmetic holds no command
                word.subs.append(s[i + 2 : end - 1])
        elif s[i] == "`":
            end = self._rest(_BACKTICK_REST, i + 1)
            word.subs.append(s[i + 1 : end - 1].replace("\\`", "`"))
        elif after == "{":
            end = s.find("}", i) + 1
            if end == 0:
                raise ParseError("unbalanced ${")
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
            raise ParseError("unbalanced quote")
        return match.end()


_RESERVED = frozenset({"!", "if", "then", "else", "elif", "fi", "do", "done", "while", "until", "esac"})


@dataclass
class Simple:
    words: list[Word] = field(default_factory=list)
    redirects: list[tuple[str, Word]] = field(default_factory=list)
    stdin: list[_Heredoc] = field(default_factory=list)  # heredocs and here-strings
    upstream: Simple | None = None  # the command piping into this one


class Parser:
    """Groups tokens into simple commands and notices functions that call themselves (fork bombs)."""

    def __init__(self, tokens: list[_Token]) -> None:
        self.commands: list[Simple] = []
        self.recursive: set[str] = set()
        self.cur = Simple()
        self.braces = 0
        self.bodies: list[tuple[str, int]] = []  # function bodies we are inside: (name, brace depth)
        self.defining: str | None = None  # a function whose body comes next
        self.in_parens = False  # between `name (` and `)`
        self.keyword = False  # just read `function`: the name comes next
        redirect: str | None = None  # an operator waiting for its target word
        for tok in tokens:
            if redirect is not None:
                if not isinstance(tok, Word):
                    raise ParseError("redirection without a target")
                self.cur.redirects.append((redirect, tok))
                if redirect == "<<<":
                    self.cur.stdin.append(_Heredoc(tok.text))
                redirect = None
            elif isinstance(tok, Word):
                self._word(tok)
            elif isinstance(tok, _Heredoc):
                self.cur.stdin.append(tok)
            elif tok in _REDIRECTIONS:
                redirect = tok
            else:
                self._operator(tok)
        if redirect is not None:
            raise ParseError("redirection without a target")
        self._operator(";")

    def _word(self, word: Word) -> None:
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
            self.defining, self.in_parens, self.cur = cur.words[0].text, True, Simple()
        elif op == ")" and self.in_parens:
            self.in_parens = False
        else:
            if cur.words or cur.redirects:
                self.commands.append(cur)
            self.cur = Simple(upstream=cur if op in ("|", "|&") and cur.words else None)


# --- The program a simple command runs, and its options.


@dataclass
class Call:
    """A program and its arguments, once prefixes such as sudo and env are out of the way."""

    name: str
    args: list[Word]
    cmd: Simple  # where it came from: redirections, heredocs, the command piping into it
    computed: bool = False  # xargs adds operands we cannot see



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

_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=")
_VERSIONED = re.compile(r"^(python|pip|pypy|perl|ruby|node)[0-9.]+$")


def program_of(word: str) -> str:
    """``/usr/bin/python3.11`` -> ``python``: the name the tables (here, in ``rules`` and ``scan``) know."""
    return _VERSIONED.sub(r"\1", word.rsplit("/", 1)[-1])


def unwrap(words: list[Word], cmd: Simple) -> Call | None:
    i, computed = 0, False
    while True:
        while i < len(words) and _ASSIGNMENT.match(words[i].text):
            i += 1
        if i >= len(words):
            return None
        name = program_of(words[i].text)
        if name not in _WRAPPERS:
            return Call(name, words[i + 1 :], cmd, computed)
        values, operands = _WRAPPERS[name]
        i, seen = skip_options(words, i + 1, values)
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


def skip_options(words: list[Word], i: int, values: frozenset[str]) -> tuple[int, set[str]]:
    seen: set[str] = set()
    while i < len(words) and len(words[i].text) > 1 and words[i].text[0] == "-":
        if words[i].text == "--":
            return i + 1, seen
        seen.add(words[i].text)
        i += _option_width(words[i].text, values)
    return i, seen


def positionals(args: list[Word], values: frozenset[str] = frozenset()) -> list[Word]:
    out, i = list[Word](), 0
    while i < len(args):
        if args[i].text == "--":
            return out + args[i + 1 :]
        if len(args[i].text) > 1 and args[i].text[0] == "-":
            i += _option_width(args[i].text, values)
        else:
            out.append(args[i])
            i += 1
    return out


def flags_of(args: list[Word]) -> list[str]:
    texts = [w.text for w in args]
    if "--" in texts:
        texts = texts[: texts.index("--")]  # what follows -- is operands
    return [t for t in texts if len(t) > 1 and t[0] == "-"]


def letters_of(flags: list[str]) -> str:
    """Every short option letter given: ``-fdx -n`` -> ``fdxn``."""
    return "".join(flag[1:] for flag in flags if not flag.startswith("--"))


def option_values(args: list[Word], names: frozenset[str]) -> list[str]:
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
