"""Writing a built library: the loader's format (``agent.rationales.parse_library``) with each
entry's provenance in a side field the loader ignores, written atomically.

Knows: the one file it is asked to write. Does not know how the library was built.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from edge_agent.core.files import atomic_write
from edge_agent.library.build import Build


def write_library(build: Build, path: str | Path, *, sources: Sequence[str] = ()) -> Path:
    """Write the library (the loader's format + provenance) to ``path`` atomically."""
    path = Path(path).expanduser()
    atomic_write(path, json.dumps(build.library_json(sources=sources), indent=2, ensure_ascii=False) + "\n")
    return path
