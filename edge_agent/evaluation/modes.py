"""The evaluated configurations: a reasoning mode and whether SeProD drafts.

Knows: the mode names the ``eval`` command takes (and their aliases). Does not know: the engine,
models, question sets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from edge_agent.errors import ConfigError


@dataclass(frozen=True)
class ModeSpec:
    """One evaluated configuration: the agent's reasoning mode and whether SeProD drafts."""

    name: str  # canonical: freeform | ssr | ssr+seprod
    engine_mode: str  # what the engine's ``mode`` takes: freeform | ssr
    seprod: bool


MODES: dict[str, ModeSpec] = {
    "freeform": ModeSpec("freeform", "freeform", False),
    "ssr": ModeSpec("ssr", "ssr", False),
    "ssr+seprod": ModeSpec("ssr+seprod", "ssr", True),
}
_MODE_ALIASES = {"free-form": "freeform", "free_form": "freeform", "react": "freeform", "seprod": "ssr+seprod"}


def parse_modes(text: str | Sequence[str]) -> list[ModeSpec]:
    """``"freeform,ssr,ssr+seprod"`` (any case, ``free-form`` accepted) -> specs, in order, deduplicated."""
    parts = text.split(",") if isinstance(text, str) else list(text)
    out: list[ModeSpec] = []
    for raw in parts:
        key = raw.strip().lower().replace(" ", "")
        if not key:
            continue
        key = _MODE_ALIASES.get(key, key)
        if key not in MODES:
            raise ConfigError(f"Unknown eval mode {raw.strip()!r}. Choose from: {', '.join(MODES)} (comma-separated).")
        if MODES[key] not in out:
            out.append(MODES[key])
    if not out:
        raise ConfigError(f"No eval mode given. Pass --modes with any of: {', '.join(MODES)}.")
    return out

