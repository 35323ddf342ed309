"""The search backends: one small class each, that builds a request and parses a response.

Knows: each service's request (Wikipedia's MediaWiki API, SearXNG, Brave, Google Cloud Vision web
detection, SerpApi Google Lens), the JSON it answers with, which settings it needs (``missing``: what
to configure, in words the user and the model both read), the parameters that change its results
(the cache key; never a key), and what to advise when it fails (``hint``). Results come back as
:class:`SearchResult` values, cleaned by :mod:`edge_agent.tools.text`.

Does not know: HTTP (``edge_agent.tools.http`` sends the request), the cache, whether we are
online, how results are shown to the model (:mod:`edge_agent.tools.observations`).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from edge_agent.core.redaction import redact
from edge_agent.tools.http import FetchError
from edge_agent.tools.text import SNIPPET_CHARS, SOURCE_CHARS, TITLE_CHARS, clean_text, clean_url


@dataclass(frozen=True)
class SearchResult:
    """One result, already cleaned: single-line strings within the limits of :mod:`edge_agent.tools.text`."""

    title: str
    url: str
    snippet: str
    source: str  # backend, or backend/kind for image search ("gcv/entity", "serpapi/visual_match")

    def to_json(self) -> dict[str, str]:
        return {"title": self.title, "url": self.url, "snippet": self.snippet, "source": self.source}

    @classmethod
    def from_json(cls, r: Any) -> SearchResult:
        """A stored result back as a value; a hand-edited cache row gets cleaned like fresh web text."""
        if not isinstance(r, dict):
            r = {}
        return cls(
            clean_text(r.get("title"), TITLE_CHARS), clean_url(r.get("url")),
            clean_text(r.get("snippet"), SNIPPET_CHARS), clean_text(r.get("source"), SOURCE_CHARS),
        )  # fmt: skip


def make_result(title: Any, url: Any, snippet: Any, source: str, *,
                html_text: bool = False) -> SearchResult | None:
    r = SearchResult(
        clean_text(title, TITLE_CHARS, html_text=html_text),
        clean_url(url),
        clean_text(snippet, SNIPPET_CHARS, html_text=html_text),
        clean_text(source, SOURCE_CHARS),
    )
    return r if (r.title or r.url) else None


def _dicts(value: Any) -> list[dict]:
    """The objects of a JSON list; nothing when ``value`` is not a list (responses are untrusted shapes)."""
    return [x for x in value if isinstance(x, dict)] if isinstance(value, list) else []


def _collect(items: Iterable[dict], build: Callable[[dict], SearchResult | None]) -> list[SearchResult]:
    """What ``build`` makes of each item, the items it could make nothing of (no title, no URL) left out."""
    return [r for x in items if (r := build(x)) is not None]


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

    # What the backend cannot work without ("url" or "api_key"), and what to say when it is empty.
    needs = ""
    unconfigured = ""

    def missing(self) -> str | None:
        """None when usable; else the observation that says what to configure."""
        return self.unconfigured if self.needs and not getattr(self, self.needs) else None

    def cache_params(self) -> dict[str, Any]:
        """Parameters that change results (no key!). The URL is redacted in case a user put a key in it."""
        return {"url": redact(self.url.rstrip("/"), [self.api_key]), "top_k": self.top_k}

    def parse(self, data: Any) -> list[SearchResult]:
        raise NotImplementedError

    def hint(self, e: FetchError) -> str:
        """What to check when a request failed for a reason this service explains ("" when none)."""
        return f"Check the {self.name} API key." if e.status in (401, 403) else ""


class WikipediaBackend(Backend):
    """MediaWiki Action API: full-text search with each page's intro as the snippet (one request)."""

    name = "wikipedia"
    needs = "url"
    unconfigured = ("text search is not configured: wikipedia_url is empty (default "
                    "https://en.wikipedia.org/w/api.php).")

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
            pages = [p for p in _dicts(pages) if not p.get("missing") and p.get("title")]
            pages.sort(key=lambda p: p.get("index") if isinstance(p.get("index"), int) else 1 << 30)
            out = _collect(pages, lambda p: make_result(
                p["title"], p.get("fullurl") or base + quote(str(p["title"]).replace(" ", "_")),
                p.get("extract", ""),
                self.name))
        elif "search" in q:  # list=search shape (snippets are HTML)
            hits = q["search"]
            if not isinstance(hits, list):
                raise _bad_shape(self.name, '"search" is not a list')
            out = _collect([h for h in _dicts(hits) if h.get("title")], lambda h: make_result(
                h["title"], base + quote(str(h["title"]).replace(" ", "_")), h.get("snippet", ""), self.name,
                html_text=True))
        return out[: self.top_k]


def _wiki_base(api_url: str) -> str:
    """https://en.wikipedia.org/w/api.php -> https://en.wikipedia.org/wiki/"""
    p = urlsplit(api_url)
    return f"{p.scheme}://{p.netloc}/wiki/"


class SearxngBackend(Backend):
    name = "searxng"
    needs = "url"
    unconfigured = (
        "text search is not configured: text_search=searxng needs searxng_url, the address of your SearXNG "
        "instance with JSON output enabled (e.g. `edge-agent config set searxng_url http://localhost:8888`)."
    )

    def request(self, query: str) -> Request:
        url = self.url.rstrip("/")
        if not url.endswith("/search"):
            url += "/search"
        return Request("GET", url, params={"q": query, "format": "json"})

    def hint(self, e: FetchError) -> str:
        if e.status in (401, 403):
            return ("The SearXNG instance refused JSON output: enable `json` under search.formats in its "
                    "settings.yml.")
        return ""

    def parse(self, data: Any) -> list[SearchResult]:
        if not isinstance(data, dict) or not isinstance(data.get("results", []), list):
            raise _bad_shape(self.name, 'no "results" list')

        def infobox(box: dict) -> SearchResult | None:
            url = box.get("id") or next((u.get("url") for u in _dicts(box.get("urls"))), "")
            return make_result(box.get("infobox"), url, box.get("content"), f"{self.name}/infobox",
                               html_text=True)

        out = _collect(_dicts(data.get("infoboxes")), infobox)
        out += _collect(_dicts(data.get("results", [])), lambda h: make_result(
            h.get("title"), h.get("url"), h.get("content"), self.name, html_text=True))
        return out[: self.top_k]


class BraveBackend(Backend):
    name = "brave"
    needs = "api_key"
    unconfigured = (
        "text search is not configured: text_search=brave needs brave_api_key "
        "(set EDGE_AGENT_BRAVE_API_KEY or `edge-agent config set brave_api_key ...`), "
        "or use text_search=wikipedia, which needs no key."
    )

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
        out = _collect(_dicts(web.get("results", [])), lambda h: make_result(
            h.get("title"), h.get("url"), h.get("description"), self.name, html_text=True))
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
    needs = "api_key"
    unconfigured = (
        "image search is not configured: image_search=gcv needs gcv_api_key "
        "(set EDGE_AGENT_GCV_API_KEY or `edge-agent config set gcv_api_key ...`)."
    )

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

        def entity(x: dict) -> SearchResult | None:
            score = x.get("score")
            note = f"web entity, score {score:.2f}" if isinstance(score,
                                                                  int | float) and math.isfinite(
                                                                      score) else "web entity"
            return make_result(x.get("description"), "", note, "gcv/entity")

        def page(x: dict) -> SearchResult | None:
            kind = ("full" if x.get("fullMatchingImages") else "partial" if x.get("partialMatchingImages")
                    else "similar")
            return make_result(x.get("pageTitle") or x.get("url"), x.get("url"),
                               f"page with a {kind} matching image",
                               "gcv/page", html_text=True)

        labels = _collect(_dicts(web.get("bestGuessLabels"))[:2], lambda x: make_result(
            f"Best guess: {x.get('label', '')}" if x.get("label") else "", "", "", "gcv/label"))
        entities = _collect(_dicts(web.get("webEntities")), entity)
        pages = _collect(_dicts(web.get("pagesWithMatchingImages")), page)
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

    def hint(self, e: FetchError) -> str:
        if e.status in (401, 403):
            return super().hint(e)
        if e.kind in ("api", "http"):
            return ("SerpApi must be able to download the image from public_image_url_prefix "
                    f"({self.public_prefix}).")
        return ""

    def parse(self, data: Any) -> list[SearchResult]:
        if not isinstance(data, dict):
            raise _bad_shape(self.name, "not a JSON object")
        err = data.get("error")
        if isinstance(err, str) and err:
            if "returned any results" in err:  # SerpApi's way of saying "zero results" (HTTP 200)
                return []
            raise FetchError("api", f"SerpApi error: {clean_text(err, 200)}")
        def match(x: dict) -> SearchResult | None:
            snippet = f"from {x['source']}" if isinstance(x.get("source"), str) and x.get("source") else ""
            return make_result(x.get("title"), x.get("link"), snippet, "serpapi/visual_match")

        out = _collect(_dicts(data.get("knowledge_graph")), lambda x: make_result(
            x.get("title"), x.get("link"), x.get("subtitle"), "serpapi/knowledge_graph"))
        out += _collect(_dicts(data.get("visual_matches")), match)
        return out[: self.top_k]
