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
:class:`edge_agent.errors.CacheError` (fix: ``edge-agent cache clear``).

Untrusted text: titles, URLs and snippets come from the web. They are size-limited, HTML-stripped
and cleaned of control and format characters here, but may still contain strings such as
``<|im_end|>`` or ``</tool_response>``. The agent MUST tokenize observations with special tokens
NOT parsed (the runtime's ``append_text(..., special=False)``), so such text stays plain text.

Keys: API keys are sent in headers where the API allows (Brave, Google Cloud Vision) and in the
query string only for SerpApi; they never enter cache keys, stored responses, exports,
observations or log records (see :func:`edge_agent.tools.http.redact` and :func:`edge_agent.tools.http.protect_logs`).

Does not know: the model, prompts, chat format, images beyond bytes + MIME type (except the small
:func:`load_image_for_search` helper). Startup never touches the network.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import logging
import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

import requests

from edge_agent.files import atomic_write
from edge_agent.redaction import redact
from edge_agent.tools.cache import CacheEntry, SearchCache, make_key
from edge_agent.tools.http import FetchError, HttpPolicy, fetch_json, protect_logs
from edge_agent.tools.text import (
    MAX_QUERY_CHARS,
    SNIPPET_CHARS,
    SOURCE_CHARS,
    TITLE_CHARS,
    clean_text,
    clean_url,
    query_key,
)

if TYPE_CHECKING:
    from edge_agent.config import Settings

log = logging.getLogger(__name__)

USER_AGENT = "edge-agent/0.1 (on-device VLM agent)"

OBS_SNIPPET_CHARS = 300  # the observation shortens stored snippets further
MAX_OBSERVATION_CHARS = 3000
MAX_IMAGE_BYTES = 7_000_000  # larger images are refused (Cloud Vision takes <= 10 MB of base64 JSON)

STATUSES = ("live", "cached", "stale", "offline", "unconfigured", "error")

# ------------------------------------------------------------------------------------------------
# Values


@dataclass(frozen=True)
class SearchResult:
    """One result, already cleaned: single-line strings within the limits above."""

    title: str
    url: str
    snippet: str
    source: str  # backend, or backend/kind for image search ("gcv/entity", "serpapi/visual_match")

    def to_json(self) -> dict[str, str]:
        return {"title": self.title, "url": self.url, "snippet": self.snippet, "source": self.source}


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


def make_result(title: Any, url: Any, snippet: Any, source: str, *, html_text: bool = False) -> SearchResult | None:
    r = SearchResult(
        clean_text(title, TITLE_CHARS, html_text=html_text),
        clean_url(url),
        clean_text(snippet, SNIPPET_CHARS, html_text=html_text),
        clean_text(source, SOURCE_CHARS),
    )
    return r if (r.title or r.url) else None


def _bad_shape(backend: str, what: str) -> FetchError:
    return FetchError("bad_response", f"unexpected {backend} response: {what}")


# ------------------------------------------------------------------------------------------------
# Backends: one small class each (build a request, parse a response)


@dataclass(frozen=True)
class Request:
    method: str
    url: str
    params: dict[str, Any] | None = None
    headers: dict[str, str] | None = None
    json_body: Any = None


class Backend:
    name = "none"
    tool = "text_search"

    def __init__(self, url: str, top_k: int, api_key: str = "") -> None:
        self.url = url.strip()
        self.top_k = top_k
        self.api_key = api_key

    def missing(self) -> str | None:
        """None when usable; else the observation that says what to configure."""
        return None

    def cache_params(self) -> dict[str, Any]:
        """Parameters that change results (no key!). The URL is redacted in case a user put a key in it."""
        return {"url": redact(self.url.rstrip("/"), [self.api_key]), "top_k": self.top_k}

    def parse(self, data: Any) -> list[SearchResult]:
        raise NotImplementedError


class WikipediaBackend(Backend):
    """MediaWiki Action API: full-text search with each page's intro as the snippet (one request)."""

    name = "wikipedia"

    def missing(self) -> str | None:
        if not self.url:
            return "text search is not configured: wikipedia_url is empty (default https://en.wikipedia.org/w/api.php)."
        return None

    def request(self, query: str) -> Request:
        k = min(self.top_k, 20)  # exlimit is at most 20 for intro extracts
        return Request(
            "GET",
            self.url,
            params={
                "action": "query",
                "format": "json",
                "formatversion": "2",
                "generator": "search",
                "gsrsearch": query,
                "gsrlimit": k,
                "gsrnamespace": 0,
                "prop": "extracts|info",
                "exintro": 1,
                "explaintext": 1,
                "exsentences": 3,
                "exlimit": k,
                "inprop": "url",
                "redirects": 1,
            },
        )

    def parse(self, data: Any) -> list[SearchResult]:
        if not isinstance(data, dict):
            raise _bad_shape(self.name, "not a JSON object")
        err = data.get("error")
        if isinstance(err, dict):
            raise FetchError("api", f"Wikipedia error: {clean_text(err.get('info') or err.get('code'), 200)}")
        q = data.get("query")
        if q is None:
            return []  # MediaWiki omits "query" when the search matched nothing
        if not isinstance(q, dict):
            raise _bad_shape(self.name, '"query" is not an object')
        base = _wiki_base(self.url)
        out: list[SearchResult] = []
        if "pages" in q:  # generator=search + extracts (what we ask for)
            pages = q["pages"]
            if isinstance(pages, dict):  # formatversion=1 shape
                pages = list(pages.values())
            if not isinstance(pages, list):
                raise _bad_shape(self.name, '"pages" is not a list')
            pages = [p for p in pages if isinstance(p, dict) and not p.get("missing") and p.get("title")]
            pages.sort(key=lambda p: p.get("index") if isinstance(p.get("index"), int) else 1 << 30)
            for p in pages:
                url = p.get("fullurl") or base + quote(str(p["title"]).replace(" ", "_"))
                r = make_result(p["title"], url, p.get("extract", ""), self.name)
                if r:
                    out.append(r)
        elif "search" in q:  # list=search shape (snippets are HTML)
            hits = q["search"]
            if not isinstance(hits, list):
                raise _bad_shape(self.name, '"search" is not a list')
            for h in hits:
                if isinstance(h, dict) and h.get("title"):
                    url = base + quote(str(h["title"]).replace(" ", "_"))
                    r = make_result(h["title"], url, h.get("snippet", ""), self.name, html_text=True)
                    if r:
                        out.append(r)
        return out[: self.top_k]


def _wiki_base(api_url: str) -> str:
    """https://en.wikipedia.org/w/api.php -> https://en.wikipedia.org/wiki/"""
    p = urlsplit(api_url)
    return f"{p.scheme}://{p.netloc}/wiki/"


class SearxngBackend(Backend):
    name = "searxng"

    def missing(self) -> str | None:
        if not self.url:
            return (
                "text search is not configured: text_search=searxng needs searxng_url, the address of your SearXNG "
                "instance with JSON output enabled (e.g. `edge-agent config set searxng_url http://localhost:8888`)."
            )
        return None

    def request(self, query: str) -> Request:
        url = self.url.rstrip("/")
        if not url.endswith("/search"):
            url += "/search"
        return Request("GET", url, params={"q": query, "format": "json"})

    def parse(self, data: Any) -> list[SearchResult]:
        if not isinstance(data, dict) or not isinstance(data.get("results", []), list):
            raise _bad_shape(self.name, 'no "results" list')
        out: list[SearchResult] = []
        for box in data.get("infoboxes") or []:
            if isinstance(box, dict):
                urls = box.get("urls") if isinstance(box.get("urls"), list) else []
                url = box.get("id") or next((u.get("url") for u in urls if isinstance(u, dict)), "")
                r = make_result(box.get("infobox"), url, box.get("content"), f"{self.name}/infobox", html_text=True)
                if r:
                    out.append(r)
        for h in data.get("results", []):
            if isinstance(h, dict):
                r = make_result(h.get("title"), h.get("url"), h.get("content"), self.name, html_text=True)
                if r:
                    out.append(r)
        return out[: self.top_k]


class BraveBackend(Backend):
    name = "brave"

    def missing(self) -> str | None:
        if not self.api_key:
            return (
                "text search is not configured: text_search=brave needs brave_api_key "
                "(set EDGE_AGENT_BRAVE_API_KEY or `edge-agent config set brave_api_key ...`), "
                "or use text_search=wikipedia, which needs no key."
            )
        return None

    def request(self, query: str) -> Request:
        return Request(
            "GET",
            self.url,
            params={"q": query, "count": min(self.top_k, 20)},
            headers={"Accept": "application/json", "X-Subscription-Token": self.api_key},
        )

    def parse(self, data: Any) -> list[SearchResult]:
        if not isinstance(data, dict):
            raise _bad_shape(self.name, "not a JSON object")
        web = data.get("web")
        if web is None:
            return []  # Brave leaves out "web" when nothing matched
        if not isinstance(web, dict) or not isinstance(web.get("results", []), list):
            raise _bad_shape(self.name, '"web.results" is not a list')
        out = []
        for h in web.get("results", []):
            if isinstance(h, dict):
                r = make_result(h.get("title"), h.get("url"), h.get("description"), self.name, html_text=True)
                if r:
                    out.append(r)
        return out[: self.top_k]


class ImageBackend(Backend):
    tool = "image_search"

    def request_image(self, image: bytes, mime: str, sha256: str, public_url: str) -> Request:
        raise NotImplementedError


class NoImageBackend(ImageBackend):
    name = "none"

    def missing(self) -> str | None:
        return (
            "image search is not configured: set image_search=gcv and gcv_api_key (Google Cloud Vision), "
            "or image_search=serpapi with serpapi_api_key and public_image_url_prefix (`edge-agent config`). "
            "Use text_search or look at the image instead."
        )


class GcvBackend(ImageBackend):
    """Google Cloud Vision WEB_DETECTION: sends the image bytes (base64); the key goes in a header."""

    name = "gcv"

    def missing(self) -> str | None:
        if not self.api_key:
            return (
                "image search is not configured: image_search=gcv needs gcv_api_key "
                "(set EDGE_AGENT_GCV_API_KEY or `edge-agent config set gcv_api_key ...`)."
            )
        return None

    def request_image(self, image: bytes, mime: str, sha256: str, public_url: str) -> Request:
        body = {
            "requests": [
                {
                    "image": {"content": base64.b64encode(image).decode("ascii")},
                    "features": [{"type": "WEB_DETECTION", "maxResults": max(10, self.top_k)}],
                }
            ]
        }
        return Request("POST", self.url, headers={"X-Goog-Api-Key": self.api_key}, json_body=body)

    def parse(self, data: Any) -> list[SearchResult]:
        if not isinstance(data, dict) or not isinstance(data.get("responses"), list) or not data["responses"]:
            raise _bad_shape(self.name, 'no "responses" list')
        resp = data["responses"][0]
        if not isinstance(resp, dict):
            raise _bad_shape(self.name, "responses[0] is not an object")
        err = resp.get("error")
        if isinstance(err, dict) and err.get("message"):
            raise FetchError("api", f"Cloud Vision error: {clean_text(err.get('message'), 200)}")
        web = resp.get("webDetection") or {}
        if not isinstance(web, dict):
            raise _bad_shape(self.name, '"webDetection" is not an object')

        def items(name: str) -> list[dict]:
            v = web.get(name)
            return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []

        labels = [
            r
            for x in items("bestGuessLabels")[:2]
            if (r := make_result(f"Best guess: {x.get('label', '')}" if x.get("label") else "", "", "", "gcv/label"))
        ]
        entities = []
        for x in items("webEntities"):
            score = x.get("score")
            note = f"web entity, score {score:.2f}" if isinstance(score, int | float) and math.isfinite(score) else "web entity"
            if r := make_result(x.get("description"), "", note, "gcv/entity"):
                entities.append(r)
        pages = []
        for x in items("pagesWithMatchingImages"):
            kind = "full" if x.get("fullMatchingImages") else "partial" if x.get("partialMatchingImages") else "similar"
            if r := make_result(x.get("pageTitle") or x.get("url"), x.get("url"), f"page with a {kind} matching image", "gcv/page", html_text=True):
                pages.append(r)
        # Share the k slots: labels, then about half entities, then pages, then any entities left.
        k = self.top_k
        n_ent = max(1, (k - len(labels)) // 2)
        out = labels + entities[:n_ent] + pages
        out += entities[n_ent:]
        return out[:k]


class SerpApiLensBackend(ImageBackend):
    """SerpApi's Google Lens engine. Lens fetches the image from a public URL, which the user provides."""

    name = "serpapi"

    def __init__(self, url: str, top_k: int, api_key: str = "", public_prefix: str = "") -> None:
        super().__init__(url, top_k, api_key)
        self.public_prefix = public_prefix.strip()

    def missing(self) -> str | None:
        if not self.api_key:
            return (
                "image search is not configured: image_search=serpapi needs serpapi_api_key "
                "(set EDGE_AGENT_SERPAPI_API_KEY or `edge-agent config set serpapi_api_key ...`)."
            )
        if not self.public_prefix.lower().startswith(("http://", "https://")):
            return (
                "image search is not configured: SerpApi Google Lens needs a public URL for the image; set "
                "public_image_url_prefix to a web address where you publish the folder home/public/ "
                "(edge-agent uploads nothing itself)."
            )
        return None

    def request_image(self, image: bytes, mime: str, sha256: str, public_url: str) -> Request:
        params = {"engine": "google_lens", "url": public_url, "api_key": self.api_key, "hl": "en"}
        return Request("GET", self.url, params=params)

    def parse(self, data: Any) -> list[SearchResult]:
        if not isinstance(data, dict):
            raise _bad_shape(self.name, "not a JSON object")
        err = data.get("error")
        if isinstance(err, str) and err:
            if "returned any results" in err:  # SerpApi's way of saying "zero results" (HTTP 200)
                return []
            raise FetchError("api", f"SerpApi error: {clean_text(err, 200)}")
        out: list[SearchResult] = []
        kg = data.get("knowledge_graph")
        for x in kg if isinstance(kg, list) else []:
            if isinstance(x, dict) and (r := make_result(x.get("title"), x.get("link"), x.get("subtitle"), "serpapi/knowledge_graph")):
                out.append(r)
        vm = data.get("visual_matches")
        for x in vm if isinstance(vm, list) else []:
            if isinstance(x, dict):
                snippet = f"from {x['source']}" if isinstance(x.get("source"), str) and x.get("source") else ""
                if r := make_result(x.get("title"), x.get("link"), snippet, "serpapi/visual_match"):
                    out.append(r)
        return out[: self.top_k]


_EXT = {"image/jpeg": ".jpg", "image/png": ".png", "image/webp": ".webp", "image/gif": ".gif", "image/bmp": ".bmp"}


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

    # --- the two tools --------------------------------------------------------------------------
    def text_search(self, query: str, *, refresh: bool = False) -> SearchOutcome:
        """Search the web (the configured text backend) for ``query``. ``refresh``: skip a fresh cache hit."""
        t0 = time.monotonic()
        b = self.text_backend
        q = clean_text(query, MAX_QUERY_CHARS)
        if not q:
            return SearchOutcome(
                "text_search", "", (), "error",
                "text_search needs a non-empty query: call it again with a few keywords.",
                b.name, time.monotonic() - t0, error="empty query",
            )  # fmt: skip
        return self._run(b, q, query_key(q), "", refresh, t0, lambda: b.request(q))

    def image_search(self, image_bytes: bytes, mime: str = "image/jpeg", *, refresh: bool = False) -> SearchOutcome:
        """Reverse image search of exactly ``image_bytes`` (the cache key is their SHA-256)."""
        t0 = time.monotonic()
        b = self.image_backend
        if not isinstance(image_bytes, bytes | bytearray | memoryview):
            raise TypeError("image_search needs the image's bytes")
        image = bytes(image_bytes)
        if b.name == "none":  # nothing to look up, even in the cache
            return SearchOutcome("image_search", "", (), "unconfigured", _cap(b.missing() or ""), b.name, time.monotonic() - t0)
        mime = sniff_mime(image) or (mime or "").lower().replace("image/jpg", "image/jpeg")  # the bytes decide
        problem = None
        if not image:
            problem = "image_search got an empty image."
        elif len(image) > MAX_IMAGE_BYTES:
            problem = f"the image is too large to search ({len(image)} bytes; at most {MAX_IMAGE_BYTES}). Zoom into a part and search that."
        elif mime not in _EXT:
            problem = f"image search accepts JPEG, PNG, WebP, GIF or BMP images, not {clean_text(mime, 40)!r}."
        if problem:
            return SearchOutcome("image_search", "", (), "error", problem, b.name, time.monotonic() - t0, error=problem)
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
    def _run(self, b: Backend, q: str, norm: str, sha: str, refresh: bool, t0: float, build) -> SearchOutcome:
        tool = b.tool
        params = b.cache_params()
        key = make_key(tool, b.name, norm, sha, params)
        entry = self.cache.get(key)
        subject = f'"{q}"' if q else "the image"  # the hash would cost tokens and tell the model nothing

        def outcome(status: str, results: list | tuple, observation: str, fetched: float | None, error: str | None = None):
            o = SearchOutcome(
                tool, q, tuple(results), status, _cap(redact(observation, self.secrets)), b.name,
                time.monotonic() - t0, fetched, sha, error,
            )  # fmt: skip
            log.info("%s via %s: %s, %d results, %.3f s", tool, b.name, status, len(o.results), o.seconds)
            return o

        def from_entry(status: str, note: str = "", error: str | None = None) -> SearchOutcome:
            results = [_result_from_json(r) for r in entry.results]
            return outcome(status, results, _format(tool, subject, b.name, results, note), entry.fetched_at, error)

        if self.offline:
            if entry is not None:
                return from_entry("cached")
            return outcome(
                "offline", (),
                f"No cached result for {subject} (offline). Answer from what you have seen or know, "
                "or try a query searched before.",
                None,
            )  # fmt: skip
        problem = b.missing()
        if problem:
            if entry is not None:
                return from_entry("cached")
            return outcome("unconfigured", (), problem, None)
        if entry is not None and not refresh and time.time() - entry.fetched_at < self.max_age_s:
            return from_entry("cached")
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
                when = _date(entry.fetched_at)
                stale = from_entry("stale", f"stale copy from {when}; the search failed now: {reason}", reason)
                return dataclasses.replace(stale, unreachable=e.network_down)
            hint = _hint(b, e)
            failed = outcome("error", (), f"{tool} failed ({b.name}): {reason}.{hint}", None, reason)
            return dataclasses.replace(failed, unreachable=e.network_down)
        now = time.time()
        self.cache.put(
            CacheEntry(tool, b.name, norm, sha, params, [r.to_json() for r in results], redact(res.text, self.secrets), now)
        )
        return outcome("live", results, _format(tool, subject, b.name, results), now)

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


def _result_from_json(r: Any) -> SearchResult:
    """A stored result back as a value; a hand-edited cache row gets cleaned like fresh web text."""
    if not isinstance(r, dict):
        r = {}
    return SearchResult(
        clean_text(r.get("title"), TITLE_CHARS), clean_url(r.get("url")),
        clean_text(r.get("snippet"), SNIPPET_CHARS), clean_text(r.get("source"), SOURCE_CHARS),
    )  # fmt: skip


def _hint(b: Backend, e: FetchError) -> str:
    if e.network_down:
        return " The network may be down: answer from what you have, or search again later."
    if e.status in (401, 403):
        if b.name == "searxng":
            return " The SearXNG instance refused JSON output: enable `json` under search.formats in its settings.yml."
        return f" Check the {b.name} API key."
    if isinstance(b, SerpApiLensBackend) and e.kind in ("api", "http"):
        return f" SerpApi must be able to download the image from public_image_url_prefix ({b.public_prefix})."
    return ""


def _date(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _format(tool: str, subject: str, backend: str, results: list[SearchResult], note: str = "") -> str:
    """The compact, numbered observation. Every token here costs prompt time: keep it short."""
    what = "Search results for" if tool == "text_search" else "Reverse image search results for"
    head = f"{what} {subject} ({backend}{'; ' + note if note else ''}):"
    if not results:
        return f"{head}\nNo results."
    lines = [head]
    for i, r in enumerate(results, 1):
        lines.append(f"{i}. {r.title}" + (f" | {r.url}" if r.url else ""))
        if r.snippet:
            lines.append("   " + clean_text(r.snippet, OBS_SNIPPET_CHARS))
    return "\n".join(lines)


def _cap(text: str) -> str:
    if len(text) <= MAX_OBSERVATION_CHARS:
        return text
    return text[: MAX_OBSERVATION_CHARS - 12].rstrip() + "\n[truncated]"


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
