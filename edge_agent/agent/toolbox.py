"""The tool executor the loop calls: zoom (local, pillow) and the two searches (injected).

Knows: how a parsed :class:`ToolCall` maps to a tool, and how every outcome (a crop, search results,
a refused box, an unconfigured backend, an offline cache miss) becomes a :class:`ToolOutcome` whose
``observation`` the model reads. A mistake is a value, never an exception; bugs still propagate.

Which moves need an image, which are searches (and which of those are keyed by image), and the words
of "what is still possible" are the tools' specs (``edge_agent.tools.specs``); a tool whose spec has its
own ``run`` runs by it. The tool-availability policy of one question lives here (the loop asks
:meth:`Toolbox.available_actions` at the start of every turn, so the prompt's schemas, the SSR candidates and
the free-form grammar follow it): a search whose backend is unconfigured is never offered; a search found
unreachable (connection refused, DNS failure, timeout) is withdrawn for the rest of the question; offline with
nothing cached for a search, it is not offered; image search is withdrawn once every image has been
searched. A move that cannot bring anything new (:meth:`Toolbox.nothing_new`: a search whose normalised
query, or image, this question already ran; offline, a query that is not cached) is not run: the loop
takes it back before it reaches the context and chooses another move. The observation of a failed call
says what failed and what is still possible.
Does not know: the network (the search object is handed in: :class:`SearchLike`, which
``edge_agent.tools.search.SearchTools`` implements and the tests' fakes too), models, the loop.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from edge_agent.agent.actions import ToolCall
from edge_agent.core.errors import EdgeAgentError
from edge_agent.tools import specs
from edge_agent.tools.images import jpeg_bytes
from edge_agent.tools.text import query_key
from edge_agent.tools.zoom import ImageStore, ZoomError

if TYPE_CHECKING:  # tools.search imports requests: the agent package holds no network code
    from edge_agent.tools.search import SearchOutcome


@dataclass
class ToolOutcome:
    ok: bool
    observation: str  # untrusted text the model reads inside <tool_response>
    seconds: float
    status: str  # zoom: local; search: live | cached | stale | offline | unconfigured | unreachable | error
    # | refused (not run: it could bring nothing new)
    image: bytes | None = None  # zoom: PNG of the crop, appended to the context as a new image
    image_index: int | None = None
    image_path: str | None = None
    results: tuple[dict[str, Any], ...] = ()
    label: str = ""  # zoom: what the crop should show (the grounding draft's target)


class ToolExecutor(Protocol):
    """What the loop needs from its tools."""

    def offered_actions(self) -> frozenset[str]:
        """Action types this session can ever offer (the system prompt lists their tools): the same
        whether or not an image is attached now or a search is reachable now."""

    def available_actions(self) -> frozenset[str]:
        """Action types that make sense now (no zoom / image search without an image)."""

    def n_images(self) -> int: ...

    def image_png(self, idx: int) -> bytes:
        """The model's PNG of image ``idx`` (0 = original)."""

    def nothing_new(self, call: ToolCall) -> str | None:
        """Why running ``call`` could bring nothing new to this question (None: it may), e.g. the same
        normalised query again. The loop takes such a move back instead of running it."""

    def not_offered_why(self, action: str) -> str | None:
        """Why ``action`` is not offered in this question now ("it is offline and nothing is cached ...");
        None when it is, or when no reason is known."""

    def cannot_run(self, call: ToolCall) -> str | None:
        """Why ``call`` cannot run now at all (offline, and it is not cached), as :meth:`nothing_new` says
        it; None when it could (a repeat of a search this question ran is not this: its results are in)."""

    def run(self, call: ToolCall, *, cancel: threading.Event | None = None) -> ToolOutcome: ...


class SearchLike(Protocol):
    """What the toolbox (and the engine) use of the search tools: ``edge_agent.tools.search.SearchTools``."""

    def text_search(self, query: str) -> SearchOutcome: ...

    def image_search(self, image_bytes: bytes, mime: str = "image/jpeg") -> SearchOutcome: ...

    def unconfigured(self, tool: str) -> str | None:
        """Why ``tool`` (text_search | image_search) cannot work at all (a missing setting); None: it may."""
        ...

    def offline_miss(self, tool: str, query: str | None = None, image: bytes | None = None) -> str | None:
        """Offline: why this search (``query`` / ``image``; neither: any search of ``tool``) can only miss
        the cache. None when online, or when the cache holds it."""
        ...

    def set_offline(self, offline: bool) -> None:
        """Serve searches from the cache only (or not) from the next search on (the ``offline`` setting)."""

    def close(self) -> None: ...


class Toolbox:
    """Tools for one question: the image store (original + crops) and the search tools."""

    def __init__(self, images: ImageStore | None, search: SearchLike | None = None, *,
                 vision: bool | None = None) -> None:
        self.images = images
        self.search = search
        self.vision = images is not None if vision is None else vision  # the model reads images
        # (tool, normalised query or image index) -> what it gave
        self._searched: dict[tuple[str, str], str] = {}
        # text results this question read: (title, url, snippet) -> the query that found them; and the
        # outcome of a query that nothing_new ran to see whether its results are new (run() uses it)
        self._read: dict[tuple[str, str, str], str] = {}
        self._looked_ahead: dict[str, SearchOutcome] = {}
        self.withdrawn: dict[str, str] = {}  # action -> why it is no longer offered in this question
        # the tools that need this question's images or search tools (any other runs by its spec's ``run``)
        self._runners = {"zoom": self._zoom, "text_search": self._search, "image_search": self._image_search}

    def offered_actions(self) -> frozenset[str]:
        """What the system prompt offers: zoom and image search when the model reads images (attached
        now or not), the searches whose backend is configured, and the answer. Per question
        (:meth:`available_actions`) a tool is withdrawn from the candidates and the grammar instead, so
        attaching, detaching or a search going down never changes the system prompt (the chat's KV
        cache stays valid)."""
        return frozenset(s.action for s in specs.all_specs() if (self.vision or not s.needs_image)
                         and not (s.is_search and self._unconfigured(s.action)))

    def available_actions(self) -> frozenset[str]:
        """Action types that make sense now: no zoom / image search without an image, and none of the
        tools withdrawn (unconfigured, unreachable, looping, nothing left to search)."""
        acts = {s.action for s in specs.all_specs() if self.images is not None or not s.needs_image}
        for action in (s.action for s in specs.searches()):
            if action in acts and action not in self.withdrawn and (why := self._unconfigured(action)):
                self.withdrawn[action] = why
            if action in acts and action not in self.withdrawn and self.search is not None and (
                    why := self.search.offline_miss(action)):
                self.withdrawn[action] = why
        for spec in specs.searches():
            if spec.per_image and spec.action in acts and self.images is not None and all(
                    (spec.action, str(i)) in self._searched for i in range(len(self.images))):
                self.withdrawn.setdefault(spec.action, "every image has been searched")
        return frozenset(acts - set(self.withdrawn))

    def _unconfigured(self, action: str) -> str | None:
        """Why ``action``'s backend cannot work at all in this session (None: it may)."""
        if self.search is None:
            return f"{action} is not available in this session"
        return self.search.unconfigured(action)

    def still_possible(self) -> str:
        """One sentence for the model: what it can still do in this question."""
        can = [s.can_do for s in specs.tools() if s.action in self.available_actions()]
        return f"You can still {', '.join(can)} or answer." if can else "Give your final answer now."

    def n_images(self) -> int:
        return 0 if self.images is None else len(self.images)

    def image_png(self, idx: int) -> bytes:
        if self.images is None:
            raise IndexError("no images")
        return self.images.model_png(idx)

    def not_offered_why(self, action: str) -> str | None:
        return None if action in self.available_actions() else self.withdrawn.get(action)

    def nothing_new(self, call: ToolCall) -> str | None:
        """Why ``call`` could bring nothing new to this question: the same search again (normalised query,
        or image), offline a query or image that is not cached, or a text search whose results are all
        ones this question has read (the query runs to see: "capital of Lebanon in 2023" after "capital
        of Lebanon"; :meth:`run` then uses that outcome). None: it may (zoom always may)."""
        if call.name == "text_search":
            query = str(call.arguments.get("query", ""))
            key = query_key(query)
            if ("text_search", key) in self._searched:
                return f'this question already searched for "{key}" ({self._searched[("text_search", key)]})'
            if miss := self.cannot_run(call):
                return miss
            return self._read_before(query, key)
        if call.name == "image_search" and self.images is not None:
            idx = self._image_index(call)
            if idx is None:
                return None  # a bad index is the model's mistake: run() says so
            if ("image_search", str(idx)) in self._searched:
                return f"this question already searched with image {idx}"
            return self.cannot_run(call)
        return None

    def cannot_run(self, call: ToolCall) -> str | None:
        if self.search is None:
            return None
        if call.name == "text_search":
            return self.search.offline_miss("text_search", query=str(call.arguments.get("query", "")))
        idx = self._image_index(call) if call.name == "image_search" and self.images is not None else None
        if idx is not None and self.images is not None:
            return self.search.offline_miss("image_search", image=jpeg_bytes(self.images[idx].image))
        return None

    def _image_index(self, call: ToolCall) -> int | None:
        """The image an image search names, None when it names none of this question's."""
        assert self.images is not None
        try:
            return self.images.check_index(call.arguments.get("img_idx", 0))
        except ZoomError:
            return None

    def run(self, call: ToolCall, *, cancel: threading.Event | None = None) -> ToolOutcome:
        t0 = time.perf_counter()
        # the loop takes such moves back; a caller that does not
        if (why := self.nothing_new(call)) is not None:
            return ToolOutcome(False, f"{call.name} was not run: {why}. {self.still_possible()}",
                               time.perf_counter() - t0, "refused")
        try:
            spec = specs.by_name(call.name)
            if spec is not None and (runner := self._runners.get(spec.action)) is not None:
                return runner(call, t0)
            if spec is not None and spec.run is not None:
                if (out := self._refused(spec.action, t0)) is not None:
                    return out
                return ToolOutcome(True, spec.run(call.arguments), time.perf_counter() - t0, "local")
        except ZoomError as e:  # a refused box or image index: the message is written for the model
            return ToolOutcome(False, f"{call.name} failed: {e} {self.still_possible()}",
                               time.perf_counter() - t0,
                               "error")
        except EdgeAgentError as e:  # e.g. a corrupt cache: the model hears it, the run goes on
            return ToolOutcome(False, f"{call.name} failed: {e.message} {self.still_possible()}",
                               time.perf_counter() - t0, "error")
        return ToolOutcome(False, f"Unknown tool {call.name!r}. {self.still_possible()}",
                           time.perf_counter() - t0,
                           "error")

    def _zoom(self, call: ToolCall, t0: float) -> ToolOutcome:
        if self.images is None:
            return ToolOutcome(False, "There is no image to zoom into; answer or search instead.",
                               time.perf_counter() - t0, "error")
        a = call.arguments
        r = self.images.zoom(a.get("bbox_2d"), a.get("img_idx", 0), a.get("label", ""))
        img = r.image
        return ToolOutcome(True, r.observation, time.perf_counter() - t0, "local",
                           image=self.images.model_png(img.index),
                           image_index=img.index, image_path=str(img.path) if img.path else None,
                           label=img.label)

    def _read_before(self, query: str, key: str) -> str | None:
        """Why a text search after others of this question brings nothing new: every result it gives is one
        this question read (None: some are new, it found nothing, or it failed: the model should hear)."""
        if not self._read or self.search is None or "text_search" not in self.available_actions():
            return None
        o = self._looked_ahead.get(key)
        if o is None:
            o = self._looked_ahead[key] = self.search.text_search(query)
        seen = [self._read.get((r.title, r.url, r.snippet)) for r in o.results]
        if not o.ok or not seen or None in seen:
            return None
        return f'its results are ones this question read already (the search for "{seen[0]}" found them)'

    def _search(self, call: ToolCall, t0: float) -> ToolOutcome:
        if (out := self._refused("text_search", t0)) is not None:
            return out
        query = call.arguments["query"]
        key = query_key(query)  # the search cache's notion of "the same query"
        assert self.search is not None  # without one the tool is withdrawn: _refused answered above
        o = self._looked_ahead.pop(key, None) or self.search.text_search(query)
        if o.ok:
            for r in o.results:
                self._read.setdefault((r.title, r.url, r.snippet), key)
        return self._from_search("text_search", key, o, t0)

    def _refused(self, action: str, t0: float) -> ToolOutcome | None:
        """A call of a withdrawn tool (a policy or a model that ignores the grammar): not run."""
        if action in self.available_actions():
            return None
        why = self.withdrawn.get(action, "it is not available")
        status = "unconfigured" if self._unconfigured(action) else "error"
        return ToolOutcome(False, f"{action} was not run: {why}. {self.still_possible()}",
                           time.perf_counter() - t0,
                           status)

    def _image_search(self, call: ToolCall, t0: float) -> ToolOutcome:
        if self.images is None:
            return ToolOutcome(False, "There is no image to search with; use text_search or answer.",
                               time.perf_counter() - t0, "error")
        idx = self.images.check_index(call.arguments.get("img_idx", 0))
        if (out := self._refused("image_search", t0)) is not None:
            return out
        assert self.search is not None  # without one the tool is withdrawn: _refused answered above
        o = self.search.image_search(jpeg_bytes(self.images[idx].image), "image/jpeg")
        return self._from_search("image_search", str(idx), o, t0)

    def _from_search(self, tool: str, key: str, o: SearchOutcome, t0: float) -> ToolOutcome:
        results = o.results_json()
        ok = o.ok
        status, observation = o.status, o.observation
        if ok:
            self._searched[(tool, key)] = "its results are above" if results else "it found nothing"
        elif o.unreachable:  # the network, not the service: DNS, refused, timeout
            status = "unreachable"
            self.withdrawn[tool] = "the search service cannot be reached (no network?)"
            self._searched[(tool, key)] = "that search failed"
            observation = (f"{observation}\n{tool} is withdrawn for the rest of this question. "
                           f"{self.still_possible()}")
        else:
            self._searched[(tool, key)] = ("that search failed" if o.status != "offline"
                                           else "it is not in the cache")
            if o.status == "unconfigured":
                self.withdrawn[tool] = "it is not configured"
                observation = (f"{observation}\n{tool} is withdrawn for the rest of this question. "
                               f"{self.still_possible()}")
            else:
                observation = f"{observation}\n{self.still_possible()}"
        return ToolOutcome(ok, observation, time.perf_counter() - t0, status, results=results)
