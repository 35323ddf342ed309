"""The moves the model can make, one module each: ``zoom``, ``text_search``, ``image_search``, ``answer``.

Each module of this package (but ``base``) defines ``SPEC``, a :class:`~edge_agent.tools.specs.base.ToolSpec`;
the registry finds them by listing the package, so a new tool is one new module here. Everything that
names a tool reads it: the system prompt and its schemas, the grammars and the parser (agent.prompts,
agent.actions), the loop, the toolbox's availability rules, the rationale libraries, the plan patterns
(agent.intent), the search cache's kinds, the trace's search count and the app's network indicator.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

from edge_agent.tools.specs.base import ActionError, ToolSpec

__all__ = ["ActionError", "ToolSpec", "all_specs", "by_action", "by_name", "is_search", "refresh", "searches",
           "tools"]


@functools.cache
def all_specs() -> tuple[ToolSpec, ...]:
    """Every move, in the order the system prompt lists the tools (the answer last)."""
    found = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name == "base" or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        spec = getattr(module, "SPEC", None)
        if not isinstance(spec, ToolSpec):
            raise TypeError(f"{module.__name__} defines no SPEC (a ToolSpec)")
        found.append(spec)
    specs = tuple(sorted(found, key=lambda s: (s.prompt_rank, s.action)))
    for attr in ("action", "name"):
        values = [getattr(s, attr) for s in specs if getattr(s, attr)]
        if len(set(values)) != len(values):
            raise ValueError(f"two tools share a {attr}: {sorted(values)}")
    return specs


def refresh() -> None:
    """Forget the registry (a test that adds a module to the package's path)."""
    all_specs.cache_clear()
    _by_action.cache_clear()


@functools.cache
def _by_action() -> dict[str, ToolSpec]:
    return {s.action: s for s in all_specs()}


def by_action(action: str) -> ToolSpec:
    """The move named ``action`` ("zoom"); KeyError for an unknown one."""
    return _by_action()[action]


def by_name(name: str) -> ToolSpec | None:
    """The tool the model calls ``name`` ("image_zoom_in_tool"); None for an unknown name."""
    return next((s for s in all_specs() if s.is_tool and s.name == name), None)


def tools() -> tuple[ToolSpec, ...]:
    """The functions the model may call (every move but the answer), in the prompt's order."""
    return tuple(s for s in all_specs() if s.is_tool)


def searches() -> tuple[ToolSpec, ...]:
    """The tools a search backend runs (their results kept in the search cache)."""
    return tuple(s for s in all_specs() if s.is_search)


def is_search(name: str) -> bool:
    """Whether the tool called ``name`` is a search (a name the trace or an event carries)."""
    spec = by_name(name)
    return spec is not None and spec.is_search
