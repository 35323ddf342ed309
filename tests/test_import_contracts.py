"""Import contracts, checked on the source: every ``import`` in edge_agent/ and tools/ (module level,
inside functions, under TYPE_CHECKING alike) read with ``ast``, so a contract cannot be broken by an
import that only runs on some path.

Contracts (the README's "Layout"):
- layers: ui, commands, cli -> engine and the other consumers of the agent and tools (chats, crops,
  measured, evaluation, library, hub) -> agent, chat_context -> runtime, tools -> base (everything
  else: errors, config, files, catalog, modelfile, ...). A module imports only modules of its own
  layer or lower ones.
- ``runtime`` is the only importer of llama_cpp; ``ui`` the only importer of textual.
- ``agent`` and ``chat_context`` never import ui, commands or engine (the layers imply it; said
  explicitly because it is the rule people look for).
- outside ``runtime``, nobody imports a private runtime module (``runtime._lib``).
- inside ``runtime``, no import circle.

Why not import-linter: it finds a package's modules by walking its folder, and ``edge_agent.tools``
lives in ``tools/`` (pyproject's package-dir), so its imports would be invisible to it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Layer of each top-level part of edge_agent (the part after "edge_agent."); anything not named is base (0).
LAYERS: dict[str, int] = {
    "ui": 4, "commands": 4,
    # the engine and the other consumers of the agent's values (the chat store and continuity, crops,
    # the evaluation and its Ray workers, the library builder): beside the engine, below the front ends
    "engine": 3, "chat": 3, "evaluation": 3, "library": 3,
    "agent": 2,
    # model files (the catalog, GGUF checks, footprints, downloads: hub uses tools.http's retry policy)
    "runtime": 1, "tools": 1, "modelfiles": 1,
    "core": 0,
}
LAYER_NAMES = {4: "ui/commands", 3: "engine", 2: "agent/chat_context", 1: "runtime/tools", 0: "base"}
# third-party packages only one part may import
ONLY_IMPORTER = {"llama_cpp": "runtime", "textual": "ui", "textual_image": "ui"}


def module_name(path: Path, root: Path = ROOT) -> str:
    """The dotted name a source file is imported as (tools/ installs as edge_agent.tools)."""
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[0] == "tools":
        parts = ["edge_agent", *parts]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def sources(root: Path = ROOT) -> dict[str, Path]:
    files = [*(root / "edge_agent").rglob("*.py"), *(root / "tools").rglob("*.py")]
    return {module_name(p, root): p for p in sorted(files)}


def imports_of(name: str, path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every import statement of the file; ``from x import y`` counts as
    x.y (a submodule or a name in x: both are checked against x's part)."""
    is_pkg = path.name == "__init__.py"
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join([*pkg, base] if base else pkg)
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return out


def part(module: str) -> str | None:
    """The top-level part of edge_agent a module belongs to ("runtime", "engine", ...), None outside."""
    bits = module.split(".")
    if bits[0] != "edge_agent":
        return None
    return bits[1] if len(bits) > 1 else ""


def layer(module: str) -> int:
    return LAYERS.get(part(module) or "", 0)


def violations(srcs: dict[str, Path]) -> list[str]:
    """Every broken contract, one line each."""
    bad: list[str] = []
    for name, path in srcs.items():
        here = part(name) or ""
        where = f"{path.parent.name}/{path.name}"
        for line, target in imports_of(name, path):
            top = target.split(".")[0]
            owner = ONLY_IMPORTER.get(top)
            if owner is not None and here != owner:
                bad.append(f"{where}:{line} imports {top}: only {owner}/ may")
            if top != "edge_agent" or target == "edge_agent.__future__":
                continue
            if layer(target) > layer(name):
                bad.append(f"{where}:{line} ({LAYER_NAMES[layer(name)]}) imports {target} "
                           f"({LAYER_NAMES[layer(target)]}): a lower layer imports a higher one")
            if here in ("agent", "chat_context") and part(target) in ("ui", "commands", "engine"):
                bad.append(f"{where}:{line} imports {target}: the agent never imports ui, commands or engine")
            bits = target.split(".")
            if here != "runtime" and len(bits) > 2 and bits[1] == "runtime" and bits[2].startswith("_"):
                bad.append(f"{where}:{line} imports the private {'.'.join(bits[:3])}")
    return bad


def runtime_cycles(srcs: dict[str, Path]) -> list[list[str]]:
    """Import circles among the modules of edge_agent.runtime (any import, TYPE_CHECKING included)."""
    mods = {n.rsplit(".", 1)[-1]: p for n, p in srcs.items() if n.startswith("edge_agent.runtime.")}
    graph: dict[str, set[str]] = {}
    for m, p in mods.items():
        deps = set()
        for _, target in imports_of(f"edge_agent.runtime.{m}", p):
            bits = target.split(".")
            if bits[:2] == ["edge_agent", "runtime"] and len(bits) > 2 and bits[2] in mods and bits[2] != m:
                deps.add(bits[2])
        graph[m] = deps
    found: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(u: str) -> None:
        state[u] = 1
        stack.append(u)
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                found.append([*stack[stack.index(v):], v])
            elif v not in state:
                visit(v)
        stack.pop()
        state[u] = 2

    for u in sorted(graph):
        if u not in state:
            visit(u)
    return found


def test_the_checker_reads_every_kind_of_import(tmp_path):
    """Relative, nested and TYPE_CHECKING imports are all found; a broken contract of each kind is reported."""
    pkg = tmp_path / "edge_agent"
    (pkg / "agent").mkdir(parents=True)
    (pkg / "runtime").mkdir()
    (tmp_path / "tools").mkdir()
    files = {
        pkg / "agent" / "loop.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..engine import Engine\n",
        pkg / "agent" / "seprod.py": "def f():\n    import llama_cpp\n    from edge_agent.runtime import _lib\n",
        pkg / "runtime" / "a.py": "from edge_agent.runtime import b\n",
        pkg / "runtime" / "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from edge_agent.runtime.a import X\n",
        pkg / "engine.py": "from edge_agent.agent.loop import run_agent\n",
        tmp_path / "tools" / "zoom.py": "from edge_agent.ui import app\n",
    }
    for p, text in files.items():
        p.write_text(text)
    srcs = sources(tmp_path)
    assert "edge_agent.tools.zoom" in srcs
    bad = "\n".join(violations(srcs))
    assert "loop.py:3 (agent/chat_context) imports edge_agent.engine.Engine (engine)" in bad
    assert "the agent never imports ui, commands or engine" in bad
    assert "seprod.py:2 imports llama_cpp: only runtime/ may" in bad
    assert "seprod.py:3 imports the private edge_agent.runtime._lib" in bad
    assert "zoom.py:1 (runtime/tools) imports edge_agent.ui.app (ui/commands)" in bad
    assert "engine.py" not in bad  # a higher layer importing a lower one is the rule, not a break
    assert runtime_cycles(srcs) == [["a", "b", "a"]]


def test_layers_and_only_importers_hold():
    """ui/commands -> engine -> agent/chat_context -> runtime/tools -> base; llama_cpp only in runtime/,
    textual only in ui/; the agent never imports ui/commands/engine; runtime's privates stay inside it."""
    assert violations(sources()) == []


def test_no_import_circle_inside_the_runtime():
    assert runtime_cycles(sources()) == []


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_every_named_part_exists(name):
    """A renamed package must not silently leave the contracts (its modules would count as base)."""
    assert name in {part(m) for m in sources()}
