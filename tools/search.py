"""The agent's search tools: ``text_search {query}`` and ``image_search {img_idx}``, cached on disk.

Interface (what the agent calls)::

    tools = SearchTools.from_settings(settings)        # no network, no file opened yet
    out = tools.text_search("eiffel tower height")     # -> SearchOutcome
    out = tools.image_search(image_bytes, "image/jpeg")  # reverse image search of those exact bytes
                                  # (the type is sniffed from the bytes; the cache key is their SHA-256)
    out = tools.image_search_file(path)  # = image_search(*load_image_for_search(path)): the bytes the
                                  # agent's toolbox sends for img_idx 0, so `cache prefetch` entries hit
    out.observation   # str: what the model sees (numbered results, or a clear message), <= 3000 chars
    out.status        # live | cached | stale | offline | unconfigured | error
    out.ok            # status in (live, cached, stale)
    out.results       # tuple[SearchResult(title, url, snippet, source), ...]; results_json() -> dicts
    out.backend, out.seconds, out.fetched_at, out.error, out.query, out.image_sha256
    tools.offline = True          # the TUI may flip it at any time
    tools.text_search(q, refresh=True)   # ignore a fresh cache entry (prefetch --refresh)
    tools.close()                 # the HTTP session, if one was opened

Statuses: ``live`` fetched now; ``cached`` served from the cache (offline, or online and younger
than ``search_cache_days``); ``stale`` the backend failed (network down, 5xx, bad JSON...) so an
older cached copy was served, and the observation says so; ``offline`` offline and not in the
cache; ``unconfigured`` the chosen backend lacks a key/URL (or image search is ``none``);
``error`` the search failed and nothing was cached. Tool failures are **returned** as outcomes
(the agent feeds the observation back to the model); only bugs raise. A damaged cache file raises
:class:`edge_agent.core.errors.CacheError` (fix: ``edge-agent cache clear``).

Untrusted text: titles, URLs and snippets come from the web. They are size-limited, HTML-stripped
and cleaned of control and format characters here, but may still contain strings such as
``<|im_end|>`` or ``</tool_response>``. The agent MUST tokenize observations with special tokens
NOT parsed (the runtime's ``append_text(..., special=False)``), so such text stays plain text.

Keys: API keys are sent in headers where the API allows (Brave, Google Cloud Vision) and in the
query string only for SerpApi; they never enter cache keys, stored responses, exports,
observations or log records (see :func:`edge_agent.core.redaction.redact` and
:func:`edge_agent.tools.http.protect_logs`).

What this module knows is the cache policy (when to serve a cached entry, when to ask the backend,
what to serve when the backend fails) and which outcome each case is. The services' requests and
responses are in :mod:`edge_agent.tools.backends`; the words of each observation are in
:mod:`edge_agent.tools.observations`.

Does not know: the model, prompts, chat format, images beyond bytes + MIME type (except the small
:func:`load_image_for_search` helper). Startup never touches the network.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import requests

from edge_agent.core.files import atomic_write
from edge_agent.core.redaction import redact
from edge_agent.tools import observations as words
from edge_agent.tools.backends import (
    Backend,
    BraveBackend,
    GcvBackend,
    ImageBackend,
    NoImageBackend,
    Request,
    SearchResult,
    SearxngBackend,
    SerpApiLensBackend,
    WikipediaBackend,
)
from edge_agent.tools.cache import CacheEntry, SearchCache, make_key
from edge_agent.tools.http import FetchError, HttpPolicy, fetch_json, protect_logs
from edge_agent.tools.text import MAX_QUERY_CHARS, clean_text, query_key

if TYPE_CHECKING:
    from edge_agent.core.config import Settings

log = logging.getLogger(__name__)

USER_AGENT = "edge-agent/0.1 (on-device VLM agent)"

MAX_IMAGE_BYTES = 7_000_000  # larger images are refused (Cloud Vision takes <= 10 MB of base64 JSON)

STATUSES = ("live", "cached", "stale", "offline", "unconfigured", "error")

# ------------------------------------------------------------------------------------------------
# Values


@dataclass(frozen=True)
class SearchOutcome:
    """What one tool call produced. ``observation`` is the only part the model sees."""

    tool: str  # text_search | image_search
    query: str  # the cleaned query, or "" for image search
    results: tuple[SearchResult, ...]
    status: str  # one of STATUSES
    observation: str
    backend: str  # wikipedia | searxng | brave | gcv | serpapi | none
    seconds: float
    fetched_at: float | None = None  # Unix time the results were fetched (None: no results)
    image_sha256: str = ""
    error: str | None = None  # why the backend failed (error / stale), secret-free
    unreachable: bool = False  # the network, not the service, failed (DNS, refused, timeout): error / stale

    @property
    def ok(self) -> bool:
        """True when the observation holds search results (possibly none, possibly stale)."""
        return self.status in ("live", "cached", "stale")

    def results_json(self) -> tuple[dict[str, str], ...]:
        return tuple(r.to_json() for r in self.results)


_EXT = {"image/jpeg": ".jpg", "image/png": ".png", "image/webp": ".webp", "image/gif": ".gif",
        "image/bmp": ".bmp"}


# ------------------------------------------------------------------------------------------------
# The tools


class SearchTools:
    """Both search tools over one cache. Cheap to build; opens the cache file on first use."""

    def __init__(
        self,
        *,
        text_backend: Backend,
        image_backend: ImageBackend,
        cache: SearchCache,
        offline: bool = False,
        max_age_s: float = 30 * 86400,
        policy: HttpPolicy | None = None,
        session: requests.Session | None = None,
        public_dir: Path | None = None,
        secrets: tuple[str, ...] = (),
    ) -> None:
        self.text_backend = text_backend
        self.image_backend = image_backend
        self.cache = cache
        self.offline = offline
        self.max_age_s = max_age_s
        self.policy = policy or HttpPolicy()
        self.public_dir = public_dir
        self.secrets = tuple(s for s in secrets if s)
        self._session = session
        protect_logs(self.secrets)

    @classmethod
    def from_settings(
        cls, settings: Settings, *, policy: HttpPolicy | None = None, session: requests.Session | None = None
    ) -> SearchTools:
        """Build from settings. ``policy`` overrides the HTTP behaviour (tests shrink the waits)."""
        k = settings.search_top_k
        text: Backend = {
            "wikipedia": lambda: WikipediaBackend(settings.wikipedia_url, k),
            "searxng": lambda: SearxngBackend(settings.searxng_url, k),
            "brave": lambda: BraveBackend(settings.brave_url, k, settings.brave_api_key),
        }[settings.text_search]()
        image: ImageBackend = {
            "none": lambda: NoImageBackend("", k),
            "gcv": lambda: GcvBackend(settings.gcv_url, k, settings.gcv_api_key),
            "serpapi": lambda: SerpApiLensBackend(
                settings.serpapi_url, k, settings.serpapi_api_key, settings.public_image_url_prefix
            ),
        }[settings.image_search]()
        policy = policy or HttpPolicy(timeout=settings.search_timeout)
        return cls(
            text_backend=text,
            image_backend=image,
            cache=SearchCache(settings.cache_path),
            offline=settings.offline,
            max_age_s=settings.search_cache_days * 86400,
            policy=policy,
            session=session,
            public_dir=settings.home / "public",
            secrets=tuple(settings.secrets()),
        )

    @property
    def session(self) -> requests.Session:
        if self._session is None:  # created lazily: building the tools must not even prepare a connection
            self._session = requests.Session()
            self._session.headers["User-Agent"] = USER_AGENT
        return self._session

    def close(self) -> None:
        if self._session is not None:
            self._session.close()

    def set_offline(self, offline: bool) -> None:
        self.offline = offline

    def unconfigured(self, tool: str) -> str | None:
        """Why ``tool`` (text_search | image_search) cannot work at all in this session: the setting its
        backend misses, written for a person; None when it may work."""
        return (self.text_backend if tool == "text_search" else self.image_backend).missing()

    def offline_miss(self, tool: str, query: str | None = None, image: bytes | None = None) -> str | None:
        """Offline: why this search can only miss the cache (``query`` for text_search, ``image``'s bytes for
        image_search; neither: the cache holds nothing at all for the tool's backend). None when online
        or cached. Reads the cache, never the network."""
        if not self.offline:
            return None
        b = self.text_backend if tool == "text_search" else self.image_backend
        if query is None and image is None:
            held = self.cache.stats().get("by_backend", {}).get(f"{tool}/{b.name}", 0)
            return None if held else f"it is offline and nothing is cached for {tool}"
        if image is not None:
            norm, sha, what = "", hashlib.sha256(bytes(image)).hexdigest(), "this image"
        else:
            q = clean_text(query, MAX_QUERY_CHARS)
            norm, sha, what = query_key(q), "", words.subject(q)
        if self.cache.get(make_key(tool, b.name, norm, sha, b.cache_params())) is not None:
            return None
        return f"it is offline and {what} is not in the cache"

    # --- the two tools --------------------------------------------------------------------------
    def text_search(self, query: str, *, refresh: bool = False) -> SearchOutcome:
        """Search the web (the configured text backend) for ``query``. ``refresh``: skip a fresh cache hit."""
        t0 = time.monotonic()
        b = self.text_backend
        q = clean_text(query, MAX_QUERY_CHARS)
        if not q:
            return SearchOutcome("text_search", "", (), "error", words.EMPTY_QUERY, b.name,
                                 time.monotonic() - t0,
                                 error="empty query")
        return self._run(b, q, query_key(q), "", refresh, t0, lambda: b.request(q))

    def image_search(self, image_bytes: bytes, mime: str = "image/jpeg", *,
                     refresh: bool = False) -> SearchOutcome:
        """Reverse image search of exactly ``image_bytes`` (the cache key is their SHA-256)."""
        t0 = time.monotonic()
        b = self.image_backend
        if not isinstance(image_bytes, bytes | bytearray | memoryview):
            raise TypeError("image_search needs the image's bytes")
        image = bytes(image_bytes)
        if b.name == "none":  # nothing to look up, even in the cache
            return SearchOutcome("image_search", "", (), "unconfigured", words.cap(b.missing() or ""), b.name,
                                 time.monotonic() - t0)
        mime = sniff_mime(image) or (mime or "").lower().replace("image/jpg",
                                                                 "image/jpeg")  # the bytes decide
        problem = None
        if not image:
            problem = words.EMPTY_IMAGE
        elif len(image) > MAX_IMAGE_BYTES:
            problem = words.image_too_large(len(image), MAX_IMAGE_BYTES)
        elif mime not in _EXT:
            problem = words.image_type_refused(mime)
        if problem:
            return SearchOutcome("image_search", "", (), "error", problem, b.name, time.monotonic() - t0,
                                 error=problem)
        sha = hashlib.sha256(image).hexdigest()

        def build() -> Request:
            public_url = ""
            if isinstance(b, SerpApiLensBackend):
                public_url = self._publish(image, mime, sha, b.public_prefix)
            return b.request_image(image, mime, sha, public_url)

        return self._run(b, "", "", sha, refresh, t0, build)

    def image_search_file(self, path: Path | str, *, refresh: bool = False) -> SearchOutcome:
        """Reverse image search of an image file, sent as :func:`load_image_for_search` prepares it."""
        data, mime = load_image_for_search(path)
        return self.image_search(data, mime, refresh=refresh)

    # --- the common path ------------------------------------------------------------------------
    def _run(self, b: Backend, q: str, norm: str, sha: str, refresh: bool, t0: float,
             build: Callable[[], Request]) -> SearchOutcome:
        """The cache policy: offline -> the cache or a miss; unconfigured -> the cache or the problem;
        a fresh entry -> it; else the backend, whose failure serves a stale entry if there is one."""
        tool = b.tool
        params = b.cache_params()
        key = make_key(tool, b.name, norm, sha, params)
        entry = self.cache.get(key)
        what = words.subject(q)

        def outcome(status: str, results: Sequence[SearchResult], observation: str, fetched: float | None,
                    error: str | None = None, unreachable: bool = False) -> SearchOutcome:
            o = SearchOutcome(
                tool, q, tuple(results), status, words.cap(redact(observation, self.secrets)), b.name,
                time.monotonic() - t0, fetched, sha, error, unreachable,
            )  # fmt: skip
            log.info("%s via %s: %s, %d results, %.3f s", tool, b.name, status, len(o.results), o.seconds)
            return o

        def from_entry(entry: CacheEntry, status: str, note: str = "", error: str | None = None,
                       unreachable: bool = False) -> SearchOutcome:
            results = [SearchResult.from_json(r) for r in entry.results]
            return outcome(status, results, words.results(tool, what, b.name, results, note),
                           entry.fetched_at, error,
                           unreachable)

        if self.offline:
            if entry is not None:
                return from_entry(entry, "cached")
            return outcome("offline", (), words.offline_miss(what), None)
        problem = b.missing()
        if problem:
            if entry is not None:
                return from_entry(entry, "cached")
            return outcome("unconfigured", (), problem, None)
        if entry is not None and not refresh and time.time() - entry.fetched_at < self.max_age_s:
            return from_entry(entry, "cached")
        try:
            req = build()
            res = fetch_json(
                self.session, req.method, req.url, policy=self.policy, params=req.params, headers=req.headers,
                json_body=req.json_body, secrets=self.secrets,
            )  # fmt: skip
            results = b.parse(res.data)
        except FetchError as e:
            reason = redact(e.message, self.secrets)
            if entry is not None:
                return from_entry(entry, "stale", words.stale_note(entry.fetched_at, reason), reason,
                                  e.network_down)
            observation = words.failed(tool, b.name, reason, network_down=e.network_down, hint=b.hint(e))
            return outcome("error", (), observation, None, reason, e.network_down)
        now = time.time()
        self.cache.put(
            CacheEntry(tool, b.name, norm, sha, params, [r.to_json() for r in results], redact(res.text,
                                                                                               self.secrets),
                                                                                               now)
        )
        return outcome("live", results, words.results(tool, what, b.name, results), now)

    def _publish(self, image: bytes, mime: str, sha: str, prefix: str) -> str:
        """Write the image under home/public/ (content-addressed) and return its public URL."""
        name = sha[:32] + _EXT[mime]
        if self.public_dir is None:
            raise FetchError("config", "no public folder configured for SerpApi images")
        path = self.public_dir / name
        try:
            if not path.exists():
                atomic_write(path, image)
        except OSError as e:
            raise FetchError("config", f"cannot write {path} for SerpApi ({e.strerror})") from None
        return prefix.rstrip("/") + "/" + name


# ------------------------------------------------------------------------------------------------
# Images


def sniff_mime(data: bytes) -> str | None:
    """The MIME type of an image from its first bytes, for the formats search backends take."""
    if data[:3] == b"\xff\xd8\xff":
        return "image/jpeg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "image/png"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data[:2] == b"BM":
        return "image/bmp"
    return None


def load_image_for_search(path: Path | str) -> tuple[bytes, str]:
    """The bytes the agent sends when it reverse-searches the original image (``img_idx`` 0), and
    their MIME type, so ``cache prefetch`` stores the search under the very key the agent will ask for.

    That is JPEG (quality 90) of the image as :func:`edge_agent.tools.images.load_image` normalises it (EXIF
    rotation, RGB, full resolution): exactly what ``edge_agent.agent.toolbox`` sends
    (``jpeg_bytes(store[0].image)``); ``tests/test_search.py`` pins the two together.
    Raises ImageError if the file cannot be read.
    """
    from edge_agent.tools.images import jpeg_bytes, load_image

    return jpeg_bytes(load_image(path).image), "image/jpeg"
