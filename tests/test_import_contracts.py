"""Import contracts, checked on the source: every ``import`` in edge_agent/ and tools/ (module level,
inside functions, under TYPE_CHECKING alike) read with ``ast``, so a contract cannot be broken by an
import that only runs on some path.

Contracts:
- layers: a folder per layer. The folders are read from the tree (every package of edge_agent/, and
  tools/, which installs as edge_agent.tools); their order, top to bottom, from the ```layers block of
  docs/ARCHITECTURE.md. A folder missing from the block, or named there and missing from the tree, fails;
  the root of edge_agent/ holds no module, so nothing is in a layer by omission. A module imports only
  modules of its own folder or of lower ones (so no two folders import each other in a circle).
- ``runtime`` is the only importer of llama_cpp; ``ui`` the only importer of textual.
- outside ``runtime``, nobody imports a private runtime module (``runtime._lib``).
- inside ``runtime``, no import circle.

Why not import-linter: it finds a package's modules by walking its folder, and ``edge_agent.tools``
lives in ``tools/`` (pyproject's package-dir), so its imports would be invisible to it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTES = ROOT / "docs" / "ARCHITECTURE.md"


def layer_block(notes: Path = NOTES) -> list[str]:
    """The folders of docs/ARCHITECTURE.md's ```layers block, top (the highest layer) to bottom."""
    m = re.search(r"^```layers\n(.*?)^```", notes.read_text(encoding="utf-8"), re.M | re.S)
    assert m is not None, f"{notes} has no ```layers block"
    return [line.split()[0].rstrip("/") for line in m.group(1).splitlines() if line.strip()]


def folders(root: Path = ROOT) -> set[str]:
    """The packages of edge_agent/ (and tools/, installed as edge_agent.tools), as the tree has them."""
    return {p.parent.name for p in (root / "edge_agent").glob("*/__init__.py")} | {"tools"}


BLOCK = layer_block()
LAYERS: dict[str, int] = {name: len(BLOCK) - 1 - i for i, name in enumerate(BLOCK)}  # core 0 ... commands
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


def layer(module: str, layers: dict[str, int] = LAYERS) -> int:
    """A module's layer: its folder's (-1 for a module at the root of edge_agent/, which no folder holds)."""
    return layers.get(part(module) or "", -1)


def violations(srcs: dict[str, Path], layers: dict[str, int] = LAYERS) -> list[str]:
    """Every broken contract, one line each."""
    bad: list[str] = []
    for name, path in srcs.items():
        here = part(name) or ""
        if here not in layers and path.name != "__init__.py":
            bad.append(f"{path.parent.name}/{path.name} is in no folder of the layers")
        where = f"{path.parent.name}/{path.name}"
        for line, target in imports_of(name, path):
            top = target.split(".")[0]
            owner = ONLY_IMPORTER.get(top)
            if owner is not None and here != owner:
                bad.append(f"{where}:{line} imports {top}: only {owner}/ may")
            if top != "edge_agent" or target == "edge_agent.__future__":
                continue
            there = part(target) or ""
            if there != here and layer(target, layers) > layer(name, layers):
                bad.append(f"{where}:{line} ({here or 'edge_agent'}/) imports {target} "
                           f"({there or 'edge_agent'}/): a lower layer imports a higher one")
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
    """Relative, nested and TYPE_CHECKING imports are all found; a broken contract of each kind is
    reported."""
    pkg = tmp_path / "edge_agent"
    for folder in ("agent", "runtime", "engine"):
        (pkg / folder).mkdir(parents=True)
    (tmp_path / "tools").mkdir()
    files = {
        pkg / "agent" / "loop.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..engine "
                                   "import engine\n",
        pkg / "agent" / "seprod.py": "def f():\n    import llama_cpp\n    from edge_agent.runtime import "
                                     "_lib\n",
        pkg / "runtime" / "a.py": "from edge_agent.runtime import b\n",
        pkg / "runtime" / "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from "
                                  "edge_agent.runtime.a import X\n",
        pkg / "engine" / "engine.py": "from edge_agent.agent.loop import run_agent\n",
        pkg / "helpers.py": "import os\n",
        tmp_path / "tools" / "zoom.py": "from edge_agent.ui import app\n",
    }
    for p, text in files.items():
        p.write_text(text)
    srcs = sources(tmp_path)
    assert "edge_agent.tools.zoom" in srcs
    layers = {"ui": 4, "engine": 3, "agent": 2, "runtime": 1, "tools": 0}
    bad = "\n".join(violations(srcs, layers))
    assert ("loop.py:3 (agent/) imports edge_agent.engine.engine (engine/): a lower layer imports a higher "
            "one") in bad
    assert "seprod.py:2 imports llama_cpp: only runtime/ may" in bad
    assert "seprod.py:3 imports the private edge_agent.runtime._lib" in bad
    assert "zoom.py:1 (tools/) imports edge_agent.ui.app (ui/)" in bad
    assert "edge_agent/helpers.py is in no folder of the layers" in bad
    assert "engine.py" not in bad  # a higher layer importing a lower one is the rule, not a break
    assert runtime_cycles(srcs) == [["a", "b", "a"]]


def test_the_layers_are_the_folders_of_the_tree():
    """docs/ARCHITECTURE.md's ```layers block names each folder of the tree once, and nothing else; the root
    of edge_agent/ holds no module (a new folder, or a module left at the root, fails here)."""
    assert sorted(BLOCK) == sorted(set(BLOCK)), "a folder named twice in the layers block"
    assert set(BLOCK) == folders()
    assert sorted(p.name for p in (ROOT / "edge_agent").glob("*.py")) == ["__init__.py"]


def test_layers_and_only_importers_hold():
    """Each folder imports only its own modules and the folders below it (docs/ARCHITECTURE.md's order);
    llama_cpp only in runtime/, textual only in ui/; runtime's privates stay inside it."""
    assert violations(sources()) == []


def test_no_import_circle_inside_the_runtime():
    assert runtime_cycles(sources()) == []
