"""What `models list`, the settings screen and the first-run screen show of the models: one row each.

Knows: the catalog, the registry, the demo and the wheel models (``edge_agent.modelfiles.catalog``), and the
memory estimate of each (``edge_agent.modelfiles.footprint``). Does not know: downloads, llama.cpp.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_agent.core.config import Settings
from edge_agent.core.errors import ModelFileError
from edge_agent.modelfiles import catalog as _catalog
from edge_agent.modelfiles.catalog import CatalogEntry, load_catalog, repo_dirname, wheel_install_hint
from edge_agent.modelfiles.registry import Registry
from edge_agent.modelfiles.resolution import resolve
from edge_agent.modelfiles.wheels import installed


@dataclass(frozen=True)
class ModelStatus:
    """One row of the model overview. status: installed | added | available | demo | demo-missing | partial |
    broken."""

    name: str
    status: str
    size: int | None
    quant: str
    architecture: str
    mmproj: str  # file name, or 'text only'
    roles: tuple[str, ...]
    description: str = ""
    is_default: bool = False
    path: str | None = None
    # expected peak resident bytes answering a photo question at the current settings
    # (edge_agent.modelfiles.footprint)
    memory: int | None = None
    memory_with_prophet: int | None = None


def partial_downloads(models_dir: Path) -> list[Path]:
    """``*.part`` files left by interrupted pulls (resumable; never loadable)."""
    if not models_dir.is_dir():
        return []
    return sorted(models_dir.glob("*/*.part"))


def overview(settings: Settings) -> list[ModelStatus]:
    """Installed and added models first (install order; then the wheel models installed), then the demo,
    then catalog models not installed."""
    catalog = load_catalog()
    registry = Registry(settings.models_dir)
    try:
        default_name = resolve(dataclasses.replace(settings, prophet="")).name
    except ModelFileError:
        default_name = None
    rows: list[ModelStatus] = []
    for m in registry.models:
        entry = catalog.get(m.catalog) if m.catalog else None
        status = "broken" if m.missing_files() else ("installed" if m.source == "pull" else "added")
        size = None if status == "broken" else sum(p.stat().st_size for p in (m.model_path,
                                                                              m.mmproj_path) if p)
        fp = None if status == "broken" else _footprint(settings, m.model_path, m.mmproj_path)
        rows.append(ModelStatus(
            m.name, status, size, m.quant or (entry.quant if entry else "?"),
            m.architecture or (entry.architecture if entry else "?"),
            Path(m.mmproj).name if m.mmproj else "text only", tuple(m.roles),
            entry.description if entry else "", m.name == default_name, m.path,
            memory=fp.alone if fp else None, memory_with_prophet=fp.with_prophet if fp else None))
    wheel_rows = [_wheel_row(settings, e, default_name) for e in catalog.entries if e.wheels is not None]
    rows += [r for r in wheel_rows if r.status == "installed"]
    demo = catalog.demo
    demo_path = _catalog.find_demo_gguf(demo)  # looked up at call time (tests replace it)
    rows.append(ModelStatus(
        demo.name, "demo" if demo_path else "demo-missing", demo_path.stat().st_size if demo_path else None,
        demo.quant, demo.architecture, "text only", demo.roles,
        demo.description if demo_path else f"{demo.description}; install: {demo.install}",
        demo.name == default_name, str(demo_path) if demo_path else None,
        memory=fp.alone if (fp := _footprint(settings, demo_path, None) if demo_path else None) else None,
        memory_with_prophet=fp.with_prophet if fp else None))
    partial_dirs = {p.parent.name for p in partial_downloads(settings.models_dir)}
    pulled = {m.catalog for m in registry.models if m.catalog}
    for e in catalog.entries:
        if e.name in pulled:
            continue
        if e.wheels is not None:
            continue
        partial = e.repo is not None and repo_dirname(e.repo) in partial_dirs and any(
            (settings.models_dir / repo_dirname(e.repo) / f"{f.name}.part").exists()
            for f in (e.file, e.mmproj) if f)
        rows.append(ModelStatus(
            e.name, "partial" if partial else "available", e.download_size, e.quant, e.architecture,
            e.mmproj.name if e.mmproj else "text only", e.roles, e.description,
            memory=fp.alone if (fp := _entry_footprint(settings, e)) else None,
            memory_with_prophet=fp.with_prophet if fp else None))
    return rows + [r for r in wheel_rows if r.status != "installed"]


def better_than_demo() -> str | None:
    """The largest real model installed from PyPI wheels that can be the agent (a Qwen: it answers text
    questions far better than the 135M demo, README's quality table), or None. One stat per wheel model."""
    best = max(((e.wheels.bytes, e.name) for e in load_catalog().all()
                if e.wheels is not None and "agent" in e.roles and installed(e.wheels)), default=None)
    return best[1] if best else None


def _wheel_row(settings: Settings, e: CatalogEntry, default_name: str | None) -> ModelStatus:
    assert e.wheels is not None
    path = installed(e.wheels)
    fp = _footprint(settings, path, None) if path else _entry_footprint(settings, e)
    return ModelStatus(e.name, "installed" if path else "available", e.wheels.bytes, e.quant, e.architecture,
                       "text only", e.roles, e.description if path else f"{e.description}; install: "
                       f"{wheel_install_hint(e)}", e.name == default_name, str(path) if path else None,
                       memory=fp.alone if fp else None, memory_with_prophet=fp.with_prophet if fp else None)


def _entry_footprint(settings: Settings, e: CatalogEntry) -> Any:
    """edge_agent.modelfiles.footprint's estimate for a catalog model not on disk (sizes and shape from the
    catalog)."""
    from edge_agent.modelfiles import footprint

    size = e.wheels.bytes if e.wheels is not None else e.file.size if e.file is not None else None
    if not size:
        return None
    return footprint.estimate(settings, weights=size, mmproj=(e.mmproj.size or 0) if e.mmproj else 0,
                              kv=footprint.kv_shape_of_entry(e.family, e.params))


def _footprint(settings: Settings, model: Path, mmproj: Path | None) -> Any:
    """edge_agent.modelfiles.footprint's estimate for files on disk (their headers give the KV shape)."""
    from edge_agent.modelfiles import footprint

    try:
        weights = model.stat().st_size
        mm = mmproj.stat().st_size if mmproj else 0
    except OSError:
        return None
    return footprint.estimate(settings, weights=weights, mmproj=mm, kv=footprint.kv_shape_of_file(model))
