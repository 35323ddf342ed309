"""Code health, checked mechanically: no function in edge_agent/ or tools/ over 80 lines unless the
comment line right above its ``def`` (or above its first decorator) says why, starting ``# long:``;
no module there over 600 lines; no line of a tracked Python file over 110 characters."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("edge_agent", "tools")
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600
MAX_LINE = 110  # pyproject's line-length; scripts/wrap_long_lines.py shortens what is over it
LINE_FOLDERS = ("edge_agent", "tools", "models", "scripts", "tests")
_WHY = re.compile(r"^\s*#\s*long:\s*\S.{8,}")  # "# long: <why, in a few words at least>"

def long_functions(source: str, max_lines: int = MAX_FUNCTION_LINES) -> list[tuple[str, int, int]]:
    """(qualified name, first line, lines) of every function over ``max_lines`` lines (from ``def``
    to its last line) without a ``# long: why`` comment on the line above it or its decorators."""
    lines = source.splitlines()
    out: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + child.name
                n = (child.end_lineno or child.lineno) - child.lineno + 1
                top = min([child.lineno] + [d.lineno for d in child.decorator_list])
                above = lines[top - 2] if top >= 2 else ""
                if n > max_lines and not _WHY.match(above):
                    out.append((name, child.lineno, n))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return out


def _sources() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def _body(n: int) -> str:
    return "".join(f"    x{i} = {i}\n" for i in range(n - 1))


def test_the_function_check_counts_lines_and_reads_the_reason():
    """80 lines pass, 81 fail; a `# long:` comment with a reason above the def (or its decorator)
    excuses one, a bare or unrelated comment does not; methods and nested functions are found."""
    assert long_functions("def f():\n" + _body(80)) == []
    assert long_functions("def f():\n" + _body(81)) == [("f", 1, 81)]
    assert long_functions("# long: one table, read top to bottom\ndef f():\n" + _body(81)) == []
    assert long_functions("# long:\ndef f():\n" + _body(81)) == [("f", 2, 81)]
    assert long_functions("# the loop\ndef f():\n" + _body(81)) == [("f", 2, 81)]
    src = ("class C:\n    # long: the whole protocol in one place\n    @property\n    def "
           "p(self):\n") + _body(81)
    assert long_functions(src.replace("\n    x", "\n        x")) == []
    nested = "class C:\n    def m(self):\n        async def inner():\n" + _body(
        81).replace("    x", "            x")
    assert [name for name, _, _ in long_functions(nested)] == ["C.m", "C.m.inner"]


def test_no_function_over_80_lines_without_a_reason():
    found = [f"{_rel(p)}:{line} {name} ({n} lines)" for p in _sources()
             for name, line, n in long_functions(p.read_text(encoding="utf-8"))]
    assert found == [], "shorten these, or say why on the line above the def: # long: <why>"


def test_no_module_over_600_lines():
    found = [f"{_rel(p)} ({n} lines)" for p in _sources()
             if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES]
    assert found == []



def test_the_architecture_notes_have_a_paragraph_for_every_package():
    """docs/ARCHITECTURE.md (linked from the README) gives each package of edge_agent/ and tools/ a
    paragraph that starts with its folder in bold: a new package without one fails here."""
    notes = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    packages = {p.parent.name for p in (ROOT / "edge_agent").glob("*/__init__.py")} | {"tools"}
    missing = sorted(name for name in packages
                     if not re.search(rf"^\*\*(?:[a-z_/ .]+ and )?{name}/", notes, re.M))
    assert missing == []
    assert "(docs/ARCHITECTURE.md)" in (ROOT / "README.md").read_text(encoding="utf-8")


def long_lines(source: str, max_chars: int = MAX_LINE) -> list[tuple[int, int]]:
    """(line number, characters) of every line of ``source`` over ``max_chars`` characters."""
    return [(n, len(line)) for n, line in enumerate(source.splitlines(), 1) if len(line) > max_chars]


def _tracked_python() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--", *(f"{d}/*.py" for d in LINE_FOLDERS)], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / p for p in out if (ROOT / p).is_file()]


def test_the_line_check_counts_characters():
    """110 characters pass, 111 fail, wherever the line is (code, comment, docstring, last line)."""
    assert long_lines("x = 1\n" + "#" * 110 + "\n") == []
    assert long_lines("x = 1\n" + "#" * 111 + "\ny = 2") == [(2, 111)]
    assert long_lines('"""' + "d" * 120 + '"""') == [(1, 126)]
    assert long_lines("a\n" * 3 + "b" * 200) == [(4, 200)]


def test_no_line_over_110_characters():
    files = _tracked_python()
    assert len(files) > 100  # git answered: the check reads the tree, not nothing
    found = [f"{_rel(p)}:{n} ({chars} characters)" for p in files
             for n, chars in long_lines(p.read_text(encoding="utf-8"))]
    assert found == [], "run: python scripts/wrap_long_lines.py (then shorten by hand what it reports)"
