"""The tool executor the loop calls: zoom (local, pillow) and the two searches (injected).

Knows: how a parsed :class:`ToolCall` maps to a tool, and how every outcome (a crop, search results,
a refused box, an unconfigured backend, an offline cache miss) becomes a :class:`ToolOutcome` whose
``observation`` the model reads. A mistake is a value, never an exception; bugs still propagate.
Does not know: the network (the search object is handed in; ``tools.search.SearchTools`` in the app,
anything with ``text_search(query)`` / ``image_search(bytes, mime)`` in tests), models, the loop.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

from edge_agent.agent.actions import ToolCall
from edge_agent.agent.prompts import ZOOM_TOOL
from edge_agent.errors import EdgeAgentError
from tools.images import jpeg_bytes
from tools.zoom import ImageStore, ZoomError


@dataclass
class ToolOutcome:
    ok: bool
    observation: str  # untrusted text the model reads inside <tool_response>
    seconds: float
    status: str  # zoom: local; search: live | cached | stale | offline | unconfigured | error
    image: bytes | None = None  # zoom: PNG of the crop, appended to the context as a new image
    image_index: int | None = None
    image_path: str | None = None
    results: tuple[dict[str, Any], ...] = ()
    label: str = ""  # zoom: what the crop should show (the grounding draft's target)


class ToolExecutor(Protocol):
    """What the loop needs from its tools."""

    def available_actions(self) -> frozenset[str]:
        """Action types that make sense now (no zoom / image search without an image)."""

    def n_images(self) -> int: ...

    def image_png(self, idx: int) -> bytes:
        """The model's PNG of image ``idx`` (0 = original)."""

    def run(self, call: ToolCall, *, cancel: threading.Event | None = None) -> ToolOutcome: ...


class SearchLike(Protocol):
    def text_search(self, query: str) -> Any: ...

    def image_search(self, image_bytes: bytes, mime: str = "image/jpeg") -> Any: ...


class Toolbox:
    """Tools for one question: the image store (original + crops) and the search tools."""

    def __init__(self, images: ImageStore | None, search: SearchLike | None = None) -> None:
        self.images = images
        self.search = search
        self._searched: set[tuple[str, str]] = set()  # (tool, normalised query or image index) this question

    def available_actions(self) -> frozenset[str]:
        if self.images is None:
            return frozenset({"text_search", "answer"})
        return frozenset({"zoom", "text_search", "image_search", "answer"})

    def n_images(self) -> int:
        return 0 if self.images is None else len(self.images)

    def image_png(self, idx: int) -> bytes:
        if self.images is None:
            raise IndexError("no images")
        return self.images[idx].model_png(self.images.max_pixels)

    def run(self, call: ToolCall, *, cancel: threading.Event | None = None) -> ToolOutcome:
        t0 = time.perf_counter()
        try:
            if call.name == ZOOM_TOOL:
                return self._zoom(call, t0)
            if call.name == "text_search":
                return self._search(call, t0)
            if call.name == "image_search":
                return self._image_search(call, t0)
        except ZoomError as e:  # a refused box or image index: the message is written for the model
            return ToolOutcome(False, f"{call.name} failed: {e}", time.perf_counter() - t0, "error")
        except EdgeAgentError as e:  # e.g. a corrupt cache: the model hears it, the run goes on
            return ToolOutcome(False, f"{call.name} failed: {e.message}", time.perf_counter() - t0, "error")
        return ToolOutcome(False, f"Unknown tool {call.name!r}.", time.perf_counter() - t0, "error")

    def _zoom(self, call: ToolCall, t0: float) -> ToolOutcome:
        if self.images is None:
            return ToolOutcome(False, "There is no image to zoom into; answer or search instead.",
                               time.perf_counter() - t0, "error")
        a = call.arguments
        r = self.images.zoom(a.get("bbox_2d"), a.get("img_idx", 0), a.get("label", ""))
        img = r.image
        return ToolOutcome(True, r.observation, time.perf_counter() - t0, "local", image=img.model_png(self.images.max_pixels),
                           image_index=img.index, image_path=str(img.path) if img.path else None, label=img.label)

    def _search(self, call: ToolCall, t0: float) -> ToolOutcome:
        if self.search is None:
            return ToolOutcome(False, "text_search is not available in this session; answer from what you know.",
                               time.perf_counter() - t0, "unconfigured")
        query = call.arguments["query"]
        if (repeat := self._repeat("text_search", " ".join(query.casefold().split()), t0)) is not None:
            return repeat
        o = self.search.text_search(query)
        return self._from_search(o, t0)

    def _repeat(self, tool: str, key: str, t0: float) -> ToolOutcome | None:
        """The same search twice in one question gives the same results: say so instead of re-running it.

        Small models otherwise loop on one query until the turn limit (seen with SmolLM2 offline).
        """
        if (tool, key) not in self._searched:
            self._searched.add((tool, key))
            return None
        what = f'"{key}"' if tool == "text_search" else f"image {key}"
        return ToolOutcome(False, f"You already searched for {what}; its results are above. "
                                  "Search for something different, or answer.", time.perf_counter() - t0, "error")

    def _image_search(self, call: ToolCall, t0: float) -> ToolOutcome:
        if self.images is None:
            return ToolOutcome(False, "There is no image to search with; use text_search or answer.",
                               time.perf_counter() - t0, "error")
        idx = self.images.check_index(call.arguments.get("img_idx", 0))
        if self.search is None:
            return ToolOutcome(False, "image_search is not available in this session; answer or zoom instead.",
                               time.perf_counter() - t0, "unconfigured")
        if (repeat := self._repeat("image_search", str(idx), t0)) is not None:
            return repeat
        o = self.search.image_search(jpeg_bytes(self.images[idx].image), "image/jpeg")
        return self._from_search(o, t0)

    @staticmethod
    def _from_search(o: Any, t0: float) -> ToolOutcome:
        results = tuple(r.to_json() if hasattr(r, "to_json") else dict(r) for r in getattr(o, "results", ()))
        ok = bool(getattr(o, "ok", o.status in ("live", "cached", "stale")))
        return ToolOutcome(ok, o.observation, time.perf_counter() - t0, o.status, results=results)
