#!/usr/bin/env python3
"""Wrap the lines of the project's Python files that are over 110 characters, and only those.

Usage:  python scripts/wrap_long_lines.py [--check] [PATH ...]

Without paths it reads every tracked ``*.py`` file under edge_agent/, tools/, models/, scripts/ and tests/
(``git ls-files``). It rewrites a file only where a line is too long, so the diff stays small and
merges well; run it again after a merge (it is idempotent: a file with no long line is not touched).
``--check`` writes nothing and exits 1 if a line is too long (``tests/test_code_health.py`` checks the
same thing in the test command).

How a long line is shortened, in this order of preference:
  - a comment on its own line is split between words into several comment lines;
  - a comment after code moves to its own line(s) above that line (``noqa``, ``type:`` and other
    pragmas stay where they are);
  - a docstring's line is split between words (the docstring's words stay the same, only where its
    lines break moves);
  - code is broken after a comma, or before ``for``/``if``/``else``/``and``/``or``, inside brackets, the
    next line aligned under the bracket's first item;
  - a string is split between words into adjacent literals (``"ab " "cd"``; parentheses added if it is
    not already inside brackets), which Python joins back into the same string;
  - code is broken right after an opening bracket, the rest indented by four.
Each rewritten file must parse to the same syntax tree as before (``ast.dump``, docstrings compared with
their whitespace collapsed); a file that would not is left as it was and reported. A line this script
cannot shorten (a long URL, a long word in a string, another multi-line string's text) is reported with
its file and line number: shorten that one by hand.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import subprocess
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

LIMIT = 110
ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("edge_agent", "tools", "models", "scripts", "tests")
_PRAGMA = re.compile(r"#\s*(noqa|type:|pragma|fmt:|long:|mypy:|pyright:|ruff:)")
_OPEN, _CLOSE = "([{", ")]}"
_BREAK_BEFORE = {"for", "if", "else", "and", "or"}
MAX_ALIGN = 72  # deeper than this, a continuation aligned under its bracket has too little room


@dataclass
class Tok:
    """One token, with the brackets open around it: (line, column, hanging indent or None) each."""

    type: int
    string: str
    start: tuple[int, int]
    end: tuple[int, int]
    stack: tuple[tuple[int, int, int | None], ...]


def too_long(text: str, limit: int = LIMIT) -> list[int]:
    """The 1-based numbers of the lines of ``text`` over ``limit`` characters."""
    return [i for i, line in enumerate(text.splitlines(), 1) if len(line) > limit]


def _tokens(src: str) -> list[Tok]:
    raw = list(tokenize.generate_tokens(io.StringIO(src).readline))
    raw = _join_fstrings(raw)
    out: list[Tok] = []
    stack: list[tuple[int, int, int | None]] = []
    significant = [t for t in raw if t.type not in (tokenize.NL, tokenize.COMMENT, tokenize.NEWLINE)]
    nxt = {id(a): b for a, b in zip(significant, significant[1:], strict=False)}
    for t in raw:
        if t.type == tokenize.OP and t.string in _CLOSE and stack:
            stack.pop()
        out.append(Tok(t.type, t.string, t.start, t.end, tuple(stack)))
        if t.type == tokenize.OP and t.string in _OPEN:
            after = nxt.get(id(t))
            hanging = after.start[1] if after is not None and after.start[0] > t.start[0] else None
            stack.append((t.start[0], t.start[1], hanging))
    return out


def _join_fstrings(raw: list[tokenize.TokenInfo]) -> list[tokenize.TokenInfo]:
    """Python 3.12 tokenizes an f-string in parts; join them back into one STRING token as 3.11 does."""
    start_type = getattr(tokenize, "FSTRING_START", None)
    if start_type is None:
        return raw
    out: list[tokenize.TokenInfo] = []
    depth, first = 0, None
    for t in raw:
        if t.type == start_type:
            depth += 1
            first = first or t
        elif t.type == tokenize.FSTRING_END:  # type: ignore[attr-defined]
            depth -= 1
            if depth == 0 and first is not None:
                line = first.line if first.start[0] == t.end[0] else ""
                text = line[first.start[1]:t.end[1]] if line else t.string
                out.append(tokenize.TokenInfo(tokenize.STRING, text, first.start, t.end, first.line))
                first = None
        elif depth == 0:
            out.append(t)
    return out


def _in_target(code: list[Tok], i: int) -> bool:
    """Whether the comma ``code[i]`` separates a ``for`` loop's targets or a ``lambda``'s parameters."""
    for t in reversed(code[:i]):
        if len(t.stack) < len(code[i].stack):
            return False
        if t.stack == code[i].stack and t.type == tokenize.NAME and t.string in ("for", "lambda", "in"):
            return t.string != "in"
        if t.stack == code[i].stack and t.type == tokenize.OP and t.string == ":":
            return False
    return False


def _docstring_lines(tree: ast.AST) -> set[int]:
    """The first lines of every docstring in ``tree``."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                found.add(body[0].lineno)
    return found


def _same_tree(a: str, b: str) -> bool:
    def norm(src: str) -> str:
        tree = ast.parse(src)
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                body = node.body
                if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                        and isinstance(body[0].value.value, str):
                    body[0].value.value = " ".join(body[0].value.value.split())
        return ast.dump(tree)

    return norm(a) == norm(b)


def _split_words(text: str, room: int, floor: int) -> int | None:
    """The index of the last space in ``text`` at or before ``room`` and after ``floor`` (None: none)."""
    i = text.rfind(" ", floor + 1, room + 1)
    while i > floor and text[i - 1] == " ":
        i -= 1
    return i if i > floor else None


def _wrap_comment(line: str) -> list[str] | None:
    m = re.match(r"^(\s*#+\s*)", line)
    if m is None or _PRAGMA.match(line.strip()):
        return None
    prefix, out = m.group(1), []
    rest = line.rstrip("\n")
    while len(rest) > LIMIT:
        cut = _split_words(rest, LIMIT, len(prefix))
        if cut is None:
            return None
        out.append(rest[:cut].rstrip())
        rest = prefix + rest[cut:].lstrip()
    return out + [rest]


_NOT_PROSE = re.compile(r"^([-*+|=>]|\d+[.)] |[A-Za-z_]+:$|\.\.|\"\"\"|\'\'\')")


def _same_paragraph(indent: str, nxt: str) -> bool:
    """Whether ``nxt`` continues the text of a line starting with ``indent`` (no list item, table or
    blank)."""
    body = nxt[len(indent):]
    if not nxt.startswith(indent) or not body.strip() or body[0] == " " or "  " in body.strip():
        return False
    return not _NOT_PROSE.match(body)


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _string_parts(tok: str) -> tuple[str, str, str] | None:
    m = re.match(r"^([A-Za-z]*)('''|\"\"\"|'|\")", tok)
    if m is None or not tok.endswith(m.group(2)):
        return None
    prefix, quote = m.group(1), m.group(2)
    return prefix, quote, tok[len(prefix) + len(quote): len(tok) - len(quote)]


def _string_cut(prefix: str, body: str, room: int) -> int | None:
    """Where to cut ``body`` (after a space, outside an f-string's braces) so the first part fits ``room``."""
    fmt = "f" in prefix.lower()
    raw = "r" in prefix.lower()
    depth, cuts, i = 0, [], 0
    while i < len(body) and i < room:
        c = body[i]
        if c == "\\" and not raw:
            i += 2
            continue
        if fmt and c in "{}":
            if body[i: i + 2] in ("{{", "}}"):
                i += 2
                continue
            depth += 1 if c == "{" else -1
        elif c == " " and depth == 0 and 8 <= i + 1 < len(body) and body[i + 1] != " ":
            cuts.append(i + 1)
        i += 1
    roomy = [c for c in cuts if len(body) - c >= 20]  # no orphaned word on the next line if it can be helped
    return (roomy or cuts or [None])[-1]


def _literal(prefix: str, quote: str, body: str) -> str:
    if "f" in prefix.lower() and "{" not in body and "}" not in body:
        prefix = prefix.replace("f", "").replace("F", "")
    return f"{prefix}{quote}{body}{quote}"


class _Fixer:
    def __init__(self, src: str) -> None:
        self.src = src
        self.lines = src.splitlines(keepends=True)
        self.toks = _tokens(src)
        self.docstrings = _docstring_lines(ast.parse(src))

    def replace(self, row: int, new: list[str]) -> str:
        """``src`` with line ``row`` (1-based) replaced by ``new`` (lines without their newline)."""
        end = "\n" if self.lines[row - 1].endswith("\n") else ""
        lines = self.lines[: row - 1] + [x + "\n" for x in new[:-1]] + [new[-1] + end] + self.lines[row:]
        return "".join(lines)

    def replace_two(self, row: int, new: list[str]) -> str:
        """``src`` with lines ``row`` and ``row + 1`` replaced by the two lines ``new``."""
        end = "\n" if self.lines[row].endswith("\n") else ""
        return "".join(self.lines[: row - 1] + [new[0] + "\n", new[1] + end] + self.lines[row + 1:])

    def fix(self, row: int) -> str | None:
        line = self.lines[row - 1].rstrip("\n")
        on_line = [t for t in self.toks if t.start[0] <= row <= t.end[0]
                   and t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                                      tokenize.ENDMARKER)]
        if not on_line:
            return None
        spanning = [t for t in on_line if t.type == tokenize.STRING and t.start[0] != t.end[0]]
        if spanning:
            return self.fix_in_multiline_string(row, line, spanning[0])
        if on_line[0].type == tokenize.COMMENT:
            wrapped = _wrap_comment(line)
            if wrapped is None:
                return None
            nxt = self.lines[row].rstrip("\n") if row < len(self.lines) else ""
            prefix = re.match(r"^(\s*#+\s*)", line)
            if len(wrapped) == 2 and prefix and nxt.startswith(prefix.group(1)) \
                    and _same_paragraph(prefix.group(1), nxt) and not _PRAGMA.match(nxt.strip()):
                return self.replace_two(row, [wrapped[0], wrapped[1] + " " + nxt[len(prefix.group(1)):]])
            return self.replace(row, wrapped)
        comment = on_line[-1] if on_line[-1].type == tokenize.COMMENT else None
        if comment is not None and not _PRAGMA.match(comment.string):
            return self.move_comment_up(row, line, comment)
        code = [t for t in on_line if t.type != tokenize.COMMENT]
        if comment is not None:
            return None  # a pragma must stay on its line: shorten that one by hand
        return self.break_code(row, line, code)

    def fix_in_multiline_string(self, row: int, line: str, tok: Tok) -> str | None:
        if tok.start[0] not in self.docstrings:
            return None
        base = self.lines[tok.start[0] - 1][: tok.start[1]]
        if row != tok.start[0] and len(_indent(line)) > len(base.expandtabs()) and line.strip():
            return None  # an indented block inside a docstring (an example, a table) is laid out by hand
        floor = len(_indent(line)) + (3 if row == tok.start[0] else 0) + 8
        if row == tok.start[0]:
            floor = tok.start[1] + 3 + 8
        cut = _split_words(line, LIMIT, floor)
        if cut is None:
            return None
        if row == tok.end[0] and cut >= tok.end[1] - 3:
            return None
        indent = _indent(line) if row != tok.start[0] else " " * tok.start[1]
        overflow = line[cut:].lstrip()
        if row < tok.end[0] and _same_paragraph(indent, self.lines[row].rstrip("\n")):
            joined = indent + overflow + " " + self.lines[row].strip()
            return self.replace_two(row, [line[:cut].rstrip(), joined])
        return self.replace(row, [line[:cut].rstrip(), indent + overflow])

    def move_comment_up(self, row: int, line: str, comment: Tok) -> str | None:
        first = [t for t in self.toks if t.start[0] == row and t.type != tokenize.INDENT][0]
        if first.start[1] != len(_indent(line)) or comment.start[0] != row:
            return None
        if row > 1 and self.lines[row - 2].rstrip("\n").endswith("\\"):
            return None
        text = comment.string.lstrip("#").strip()
        above = _indent(line) + "# " + text
        code = line[: comment.start[1]].rstrip()
        new = (_wrap_comment(above) or [above]) if len(above) > LIMIT else [above]
        return self.replace(row, new + [code])

    def break_code(self, row: int, line: str, code: list[Tok]) -> str | None:
        if line.rstrip().endswith("\\"):
            return None
        fits, rest = [], []
        for i, t in enumerate(code):
            if t.start[0] != row or not t.stack:
                continue
            nxt = code[i + 1] if i + 1 < len(code) else None
            if t.type == tokenize.OP and t.string == "," and nxt is not None and nxt.start[0] == row \
                    and not (nxt.type == tokenize.OP and nxt.string in _CLOSE) and not _in_target(code, i):
                col = t.end[1]
            elif t.type == tokenize.NAME and t.string in _BREAK_BEFORE and i > 0 \
                    and code[i - 1].start[0] == row and len(t.stack) == len(code[i - 1].stack) \
                    and not (code[i - 1].type == tokenize.OP and code[i - 1].string in _OPEN):
                col = t.start[1]
            else:
                continue
            indent = self.indent_in(t.stack[-1])
            new_rest = " " * indent + line[col:].lstrip()
            if col > LIMIT or indent >= col or indent > MAX_ALIGN:
                continue
            weak = t.type == tokenize.NAME and t.string in ("and", "or")  # rather at a comma, if or else
            option = (-len(t.stack), not weak, col, new_rest)
            if len(new_rest) <= LIMIT:
                fits.append(option)
            elif len(new_rest) < len(line) - 10:
                rest.append(option)
        if fits and max(fits)[0] < -1:  # only deep inside: rather parenthesise a ternary or and/or first
            wrapped = self.parenthesise(row, line, code)
            if wrapped is not None:
                return wrapped
        for options in (fits, rest):
            if options:
                _, _, col, new_rest = max(options)
                return self.replace(row, [line[:col].rstrip(), new_rest])
        return (self.parenthesise(row, line, code) or self.split_string(row, line, code)
                or self.hang(row, line, code) or self.dedent(row, line, code))

    def parenthesise(self, row: int, line: str, code: list[Tok]) -> str | None:
        """A one-line ``return``/``assert``/assignment whose value breaks only outside brackets (``a and b``,
        ``x if c else y``, ``a, b``): the value goes in parentheses, to be broken inside them next."""
        if not code or code[0].start[1] != len(_indent(line)) or code[-1].end[0] != row:
            return None
        before = [t for t in self.toks if t.end[0] < row
                  or (t.end[0] == row and t.end[1] <= code[0].start[1])]
        before = [t for t in before if t.type not in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT,
                                                       tokenize.DEDENT)]
        if before and before[-1].type != tokenize.NEWLINE:
            return None
        top = [i for i, t in enumerate(code) if not t.stack]
        if code[0].type == tokenize.NAME and code[0].string in ("return", "assert"):
            s = 1
        else:
            eq = [i for i in top if code[i].type == tokenize.OP and code[i].string == "="]
            if not eq:
                return None
            s = eq[-1] + 1
        e = len(code)
        if code[0].string == "assert":
            e = next((i for i in top if i > s and code[i].string == ","), e)
        breaks = [i for i in top if s < i < e and (code[i].string == "," or (code[i].type == tokenize.NAME
                  and code[i].string in _BREAK_BEFORE))]
        if s >= e or not breaks or code[e - 1].string == ",":
            return None
        a, b = code[s].start[1], code[e - 1].end[1]
        return self.replace(row, [line[:a] + "(" + line[a:b] + ")" + line[b:]])

    def dedent(self, row: int, line: str, code: list[Tok]) -> str | None:
        """A continuation line indented so deep that it cannot fit moves left, 8 past its statement's
        indent."""
        if not code or not code[0].stack or code[0].start[1] != len(_indent(line)):
            return None
        outer = self.lines[code[0].stack[0][0] - 1]
        indent = len(_indent(outer)) + 8
        if indent >= code[0].start[1]:
            return None
        return self.replace(row, [" " * indent + line.lstrip()])

    def indent_in(self, bracket: tuple[int, int, int | None]) -> int:
        return bracket[2] if bracket[2] is not None else bracket[1] + 1

    def split_string(self, row: int, line: str, code: list[Tok]) -> str | None:
        for t in code:
            if t.type != tokenize.STRING or t.start[
                0] != row or t.end[1] <= LIMIT - 30 or t.start[1] >= LIMIT - 10:
                continue
            parts = _string_parts(t.string)
            if parts is None:
                continue
            prefix, quote, body = parts
            if t.start[0] in self.docstrings and len(quote) == 3:
                return self.split_docstring(row, line, t, len(prefix) + 3)
            wrap = not t.stack
            room = LIMIT - t.start[1] - len(prefix) - 2 * len(quote) - (1 if wrap else 0)
            cut = _string_cut(prefix, body, room)
            if cut is None:
                continue
            indent = t.start[1] + (1 if wrap else 0)
            first = _literal(prefix, quote, body[:cut])
            second = _literal(prefix, quote, body[cut:])
            head, tail = line[: t.start[1]], line[t.end[1]:]
            if wrap:
                return self.replace(row, [head + "(" + first, " " * indent + second + ")" + tail])
            return self.replace(row, [head + first, " " * indent + second + tail])
        return None

    def split_docstring(self, row: int, line: str, t: Tok, opening: int) -> str | None:
        """A one-line docstring becomes two lines, the second under its opening quotes."""
        cut = _split_words(line, LIMIT, t.start[1] + opening + 8)
        if cut is None or cut >= t.end[1] - 3:
            return None
        return self.replace(row, [line[:cut].rstrip(), " " * t.start[1] + line[cut:].lstrip()])

    def hang(self, row: int, line: str, code: list[Tok]) -> str | None:
        """Break after the outermost opening bracket that closes on this line (lines below keep theirs)."""
        for i, t in enumerate(code):
            nxt = code[i + 1] if i + 1 < len(code) else None
            if not (t.type == tokenize.OP and t.string in _OPEN and t.start[0] == row and nxt is not None
                    and nxt.start[0] == row and t.end[1] < LIMIT):
                continue
            if nxt.type == tokenize.OP and nxt.string in _CLOSE:
                continue
            closer = next((c for c in code[i + 1:] if len(c.stack) == len(t.stack) and c.string in _CLOSE),
                          None)
            if closer is None or closer.start[0] != row:
                continue
            indent = len(_indent(line)) + 4
            if indent >= t.end[1]:
                continue
            return self.replace(row, [line[: t.end[1]], " " * indent + line[t.end[1]:].lstrip()])
        return None

def _parses_the_same(a: str, b: str) -> bool:
    try:
        return _same_tree(a, b)
    except SyntaxError:
        return False


def wrap(src: str) -> tuple[str, list[int]]:
    """``src`` with its long lines shortened, and the lines (numbers in the result) still too long."""
    stuck: set[str] = set()
    original = src
    for _ in range(10_000):
        lines = src.splitlines()
        todo = [n for n in too_long(src) if lines[n - 1] not in stuck]
        if not todo:
            break
        new = _Fixer(src).fix(todo[0])
        if new is None or not _parses_the_same(original, new):
            stuck.add(lines[todo[0] - 1])
        else:
            src = new
    return src, too_long(src)


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--", *(f"{d}/*.py" for d in FOLDERS)], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / p for p in out]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a line is too long")
    parser.add_argument("paths", nargs="*", type=Path)
    args = parser.parse_args(argv)
    failed = False
    for path in args.paths or tracked_files():
        old = path.read_text(encoding="utf-8")
        if not too_long(old):
            continue
        name = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path
        if args.check:
            failed = True
            print("\n".join(f"{name}:{n}: over {LIMIT} characters" for n in too_long(old)))
            continue
        new, left = wrap(old)
        if not _same_tree(old, new):
            failed = True
            print(f"{name}: not rewritten (the syntax tree would change)")
            continue
        if new != old:
            path.write_text(new, encoding="utf-8")
        for n in left:
            failed = True
            print(f"{name}:{n}: still over {LIMIT} characters: shorten it by hand")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
