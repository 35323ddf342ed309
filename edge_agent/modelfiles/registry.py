"""The registry of installed models: ``settings.models_dir / "registry.json"``.

Knows: the models that are installed (pulled from the hub) or added (local files registered by path, never
copied), in install order, written atomically. Does not know: downloads, GGUF contents, the catalog's entries
beyond a name.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from edge_agent.core.errors import ModelFileError
from edge_agent.core.files import atomic_write
from edge_agent.modelfiles.catalog import REGISTRY_NAME, suggest


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
            raise ModelFileError(f"No installed model named "
                                 f"{name!r}.{suggest(name, [x.name for x in self.models])}")
        self.models.remove(m)
        self.save()
        return m

    def files_in_use(self) -> set[str]:
        return {os.path.abspath(p) for m in self.models for p in (m.path, m.mmproj) if p}
