"""The evaluated configurations: a reasoning mode, whether SeProD drafts, and which rationale library.

Knows: the mode names the ``eval`` command takes (and their aliases), and how ``--rationales`` turns
each SSR mode into one column per library (``ssr[builtin]``, ``ssr[mine]``). Does not know: the
engine, models, question sets, what is inside a library.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from edge_agent.core.errors import ConfigError


@dataclass(frozen=True)
class ModeSpec:
    """One evaluated configuration: the agent's reasoning mode and whether SeProD drafts, and for the
    paper's ablations the SSR variant (index-only scoring, a smaller library)."""

    name: str  # canonical: freeform | ssr | ssr+seprod | direct | an ablation (+ "[library]" when compared)
    engine_mode: str  # what the engine's ``mode`` takes: freeform | ssr | direct
    seprod: bool
    library: str = ""  # the library's column name (see with_libraries); "": the one the settings name
    index_only: bool = False  # score "[k]" instead of the rationale's text (the paper's "[1]" ablation)
    # a library-size ablation: "k1" (one rationale that implies no action) or built-in ids to keep
    ablation_library: str = ""
    keep_ids: tuple[str, ...] = ()

    @property
    def is_ablation(self) -> bool:
        return self.index_only or bool(self.ablation_library or self.keep_ids)


MODES: dict[str, ModeSpec] = {
    "freeform": ModeSpec("freeform", "freeform", False),
    "ssr": ModeSpec("ssr", "ssr", False),
    "ssr+seprod": ModeSpec("ssr+seprod", "ssr", True),
    # the model alone in a plain chat (its own chat template, no tools, no agent): what a user of
    # LM Studio or llama.cpp gets from the same file
    "direct": ModeSpec("direct", "direct", False),
    # the paper's ablations: index-only scoring; 1 and 2 rationales (6: the built-in library, "ssr")
    "ssr-index": ModeSpec("ssr-index", "ssr", False, index_only=True),
    "ssr-k1": ModeSpec("ssr-k1", "ssr", False, ablation_library="k1"),
    "ssr-k2": ModeSpec("ssr-k2", "ssr", False, keep_ids=("text_search", "answer_knowledge")),
}
_MODE_ALIASES = {"free-form": "freeform", "free_form": "freeform", "react": "freeform",
                 "seprod": "ssr+seprod",
                 "plain": "direct", "ssr-index-only": "ssr-index", "ssr-k6": "ssr"}


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
            raise ConfigError(f"Unknown eval mode {raw.strip()!r}. Choose from: {', '.join(MODES)} "
                              f"(comma-separated).")
        if MODES[key] not in out:
            out.append(MODES[key])
    if not out:
        raise ConfigError(f"No eval mode given. Pass --modes with any of: {', '.join(MODES)}.")
    return out


def with_libraries(specs: Sequence[ModeSpec], libraries: Sequence[str]) -> list[ModeSpec]:
    """Each SSR mode once per library (``ssr`` -> ``ssr[builtin]``, ``ssr[mine]``), in order;
    free-form (which scores no library) stays one column. ``libraries`` are column names."""
    if not libraries:
        return list(specs)
    out: list[ModeSpec] = []
    for s in specs:
        if s.engine_mode != "ssr" or s.is_ablation:
            out.append(s)
            continue
        out += [ModeSpec(f"{s.name}[{lib}]", s.engine_mode, s.seprod, lib) for lib in libraries]
    return out

