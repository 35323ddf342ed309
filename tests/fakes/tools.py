"""A fake of the search tools for pure agent logic: :class:`FakeSearch` implements
``agent.toolbox.SearchLike`` fully (checked by mypy: pyproject's [tool.mypy] files) and answers with real
``SearchOutcome`` values. The search tools themselves are tested against real HTTP servers
(``tests/fakes/search_servers.py``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from edge_agent.agent.toolbox import SearchLike
from edge_agent.tools.backends import SearchResult
from edge_agent.tools.search import SearchOutcome


def outcome(tool: str = "text_search", status: str = "live", observation: str = "", *,
            results: Sequence[SearchResult] = (), query: str = "",
            unreachable: bool = False) -> SearchOutcome:
    """A SearchOutcome as ``SearchTools`` makes one (backend "fake")."""
    return SearchOutcome(tool, query, tuple(results), status, observation, "fake", 0.0,
                         unreachable=unreachable)


def result(title: str = "Result", url: str = "http://x", snippet: str = "s") -> SearchResult:
    return SearchResult(title, url, snippet, "fake")


class FakeSearch:
    """Text and image search answered by ``text(query)`` / ``image(bytes, mime)`` (None: the call is a test
    failure); ``unconfigured_tools``: {tool: why} for backends that cannot work; ``cached``: {tool: the
    queries its cache holds}, whose misses ``offline_miss`` names once ``set_offline(True)`` (the real
    cache's rule, as ``SearchTools`` words it). Records every call."""

    def __init__(self, text: Callable[[str], SearchOutcome] | None = None,
                 image: Callable[[bytes, str], SearchOutcome] | None = None,
                 unconfigured_tools: dict[str, str] | None = None,
                 cached: dict[str, set[str]] | None = None) -> None:
        self.text, self.image = text, image
        self.unconfigured_tools = dict(unconfigured_tools or {})
        self.cached = {k: set(v) for k, v in (cached or {}).items()}
        self.queries: list[str] = []
        self.images: list[tuple[bytes, str]] = []  # (bytes, mime) of each image search
        self.closed = False
        self.offline = False

    def text_search(self, query: str) -> SearchOutcome:
        self.queries.append(query)
        if self.text is None:
            raise AssertionError("text_search was not expected here")
        return self.text(query)

    def image_search(self, image_bytes: bytes, mime: str = "image/jpeg") -> SearchOutcome:
        self.images.append((image_bytes, mime))
        if self.image is None:
            raise AssertionError("image_search was not expected here")
        return self.image(image_bytes, mime)

    def unconfigured(self, tool: str) -> str | None:
        return self.unconfigured_tools.get(tool)

    def offline_miss(self, tool: str, query: str | None = None, image: bytes | None = None) -> str | None:
        if not self.offline:
            return None  # the real cache's offline rule: tests/test_tool_policy.py
        held = self.cached.get(tool, set())
        if query is None and image is None:
            return None if held else f"it is offline and nothing is cached for {tool}"
        what = f'"{query}"' if query is not None else "this image"
        return None if (query if query is not None else "image") in held else (
            f"it is offline and {what} is not in the cache")

    def set_offline(self, offline: bool) -> None:
        self.offline = offline

    def close(self) -> None:
        self.closed = True


def _conforms(s: FakeSearch) -> SearchLike:
    """mypy holds the fake to the protocol SearchTools implements (never called)."""
    return s
