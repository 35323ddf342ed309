"""The distribution installs one top-level name, ``edge_agent``: the tools/ folder ships as
``edge_agent.tools``."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_installed_distribution_provides_no_top_level_tools(tmp_path):
    """Outside the checkout (isolated mode: no cwd, no PYTHONPATH), `tools` is not importable,
    `edge_agent.tools` is."""
    code = (
        "import importlib.util, edge_agent.tools.search as s; "
        "print(importlib.util.find_spec('tools'), s.__file__)"
    )
    out = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    spec, path = out.stdout.split()
    assert spec == "None"
    assert Path(path).resolve() == ROOT / "tools" / "search.py"


def test_every_package_is_listed_in_pyproject():
    """pyproject lists packages by hand (find cannot rename tools/): a new subpackage must be added there."""
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    mapped = conf["package-dir"]  # folders outside edge_agent/ that ship inside it
    assert mapped["edge_agent.tools"] == "tools"
    assert all((ROOT / folder).is_dir() for folder in mapped.values())
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "edge_agent").rglob("__init__.py")}
    for name, folder in mapped.items():  # and the subpackages of a folder shipped under another name
        on_disk |= {".".join([name, *p.parent.relative_to(ROOT / folder).parts])
                    for p in (ROOT / folder).rglob("__init__.py")}
    assert set(conf["packages"]) == on_disk


def test_no_code_imports_top_level_tools():
    """In the checkout `import tools` still works (the root is on sys.path), so catch it in the source."""
    bad = re.compile(r"^\s*(from\s+tools(\.|\s+import)|import\s+tools\b)", re.MULTILINE)
    offenders = [
        str(p.relative_to(ROOT))
        for folder in ("edge_agent", "tools", "tests", "scripts")
        for p in (ROOT / folder).rglob("*.py")
        if bad.search(p.read_text(encoding="utf-8"))
    ]
    assert offenders == []
