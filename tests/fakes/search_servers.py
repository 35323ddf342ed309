"""Real HTTP servers on 127.0.0.1 that answer like the search backends, for tests.

One :class:`FakeBackend` per JSON shape (wikipedia, searxng, brave, gcv, serpapi). Each runs a
``ThreadingHTTPServer`` in a daemon thread on a free port, records every request, and answers
with results derived from the request (so different queries / images give different results).
Failure modes are queued with :meth:`FakeBackend.fail_next` and used up one request each:

    timeout      hold the request (no answer) for ``hang`` seconds
    500 / 502 / 503 / 401 / 403   that status with a small JSON error body
    429          429 with ``Retry-After: <retry_after>`` (None: no header)
    bad_json     200 with a body that is not JSON
    huge         200 with ``huge_bytes`` of valid JSON and a Content-Length
    huge_stream  the same without Content-Length (the size is only known while reading)
    empty        200 with an empty body
    drip         200, then a few bytes every 0.05 s for ``hang`` seconds (beats a per-read timeout)
    gzip         the normal answer, gzip-compressed (Content-Encoding), as real APIs send it
    chunked_gzip the same with Transfer-Encoding: chunked
    redirect     302 to ``arg`` + the same path and query (use ("redirect", other.base))
    no_results   200 with the backend's "nothing found" shape
    echo         200, normal shape, but every result echoes the full request URL and headers
                 (the worst case for key leaks: a backend that reflects the query string)

Nothing here is a mock of our code: the client under test does real HTTP over loopback.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

PATHS = {
    "wikipedia": "/w/api.php",
    "searxng": "/search",
    "brave": "/res/v1/web/search",
    "gcv": "/v1/images:annotate",
    "serpapi": "/search.json",
}


@dataclass
class Recorded:
    method: str
    path: str  # path + query string, as sent
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.monotonic)  # when it arrived (time.monotonic)


@dataclass
class FakeBackend:
    shape: str
    hang: float = 5.0
    latency: float = 0.0  # seconds every answer takes (a real API's round trip; benchmarks)
    huge_bytes: int = 3_000_000
    requests: list[Recorded] = field(default_factory=list)
    _modes: list[tuple[str, Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> FakeBackend:
        backend = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                backend._handle(self, "GET")

            def do_POST(self) -> None:
                backend._handle(self, "POST")

            def log_message(self, *args: Any) -> None:  # keep pytest output clean
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def url(self) -> str:
        """The endpoint to put in settings (wikipedia_url, searxng_url, brave_url, gcv_url, serpapi_url)."""
        return self.base + ("" if self.shape == "searxng" else PATHS[self.shape])

    def fail_next(self, *modes: str | tuple[str, Any]) -> None:
        """Queue failure modes for the next requests, one request each: "500", ("429", 2), "timeout"..."""
        with self._lock:
            for m in modes:
                self._modes.append(m if isinstance(m, tuple) else (m, None))

    @property
    def count(self) -> int:
        return len(self.requests)

    # --- serving --------------------------------------------------------------------------------
    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        n = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(n) if n else b""
        split = urlsplit(h.path)
        query = {k: v[0] for k, v in parse_qs(split.query).items()}
        rec = Recorded(method, h.path, query, dict(h.headers), body)
        with self._lock:
            self.requests.append(rec)
            mode, arg = self._modes.pop(0) if self._modes else ("ok", None)
        if self.latency > 0:
            self._stop.wait(self.latency)
        if mode == "timeout":
            self._stop.wait(self.hang)
            return self._send(h, 200, b'{"late": true}')
        if mode == "429":
            headers = {} if arg is None else {"Retry-After": str(arg)}
            return self._send(h, 429, b'{"error": "slow down"}', headers)
        if mode.isdigit():
            err = {"error": {"code": int(mode), "message": f"fake failure {mode}"}}
            return self._send(h, int(mode), json.dumps(err).encode())
        if mode == "bad_json":
            return self._send(h, 200, b'{"query": {"pages": [ this is not json')
        if mode == "empty":
            return self._send(h, 200, b"")
        if mode in ("huge", "huge_stream"):
            blob = json.dumps({"padding": "x" * self.huge_bytes}).encode()
            return self._send(h, 200, blob, length=mode == "huge")
        # valid start, then a few bytes every 0.05 s: never idle long enough for a read timeout
        if mode == "drip":
            try:
                h.send_response(200)
                h.send_header("Content-Type", "application/json")
                h.end_headers()
                h.wfile.write(b'{"padding": "')
                t_end = time.monotonic() + self.hang
                while time.monotonic() < t_end and not self._stop.is_set():
                    h.wfile.write(b"x" * 16)
                    h.wfile.flush()
                    time.sleep(0.05)
                h.wfile.write(b'"}')
            except (BrokenPipeError, ConnectionResetError):
                pass
            return None
        if mode == "redirect":  # to another server (``arg``): must not receive our key
            return self._send(h, 302, b"", {"Location": f"{arg}{h.path}"})
        if mode == "no_results":
            return self._send(h, 200, json.dumps(self._empty()).encode())
        if mode in ("gzip", "chunked_gzip"):  # what real servers do: compressed, maybe chunked
            blob = gzip.compress(json.dumps(self._answer(rec, None)).encode())
            if mode == "gzip":
                return self._send(h, 200, blob, {"Content-Encoding": "gzip"})
            try:
                h.send_response(200)
                h.send_header("Content-Type", "application/json")
                h.send_header("Content-Encoding", "gzip")
                h.send_header("Transfer-Encoding", "chunked")
                h.end_headers()
                for i in range(0, len(blob), 100):
                    part = blob[i : i + 100]
                    h.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                h.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass
            return None
        echo = None
        if mode == "echo":
            echo = f"{method} {h.path} {json.dumps(dict(h.headers))}"
        return self._send(h, 200, json.dumps(self._answer(rec, echo)).encode())

    def _send(self, h: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict | None = None,
              length: bool = True) -> None:
        try:
            h.send_response(status)
            h.send_header("Content-Type", "application/json")
            for k, v in (headers or {}).items():
                h.send_header(k, v)
            if length:
                h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up first (timeouts, size limits)
            pass

    # --- the JSON shapes ------------------------------------------------------------------------
    def _empty(self) -> Any:
        return {
            "wikipedia": {"batchcomplete": True},
            "searxng": {"query": "", "number_of_results": 0, "results": [], "answers": [], "infoboxes": []},
            "brave": {"type": "search", "query": {"original": ""}},
            "gcv": {"responses": [{"webDetection": {}}]},
            "serpapi": {"error": "Google Lens hasn't returned any results for this query."},
        }[self.shape]

    def _answer(self, rec: Recorded, echo: str | None) -> Any:
        q = rec.query
        if self.shape == "wikipedia":
            term = q.get("gsrsearch", "")
            k = int(q.get("gsrlimit", 5))
            # MediaWiki returns pages in no particular order; "index" gives the rank.
            pages = [
                {
                    "pageid": 1000 + i,
                    "ns": 0,
                    "title": f"{term} ({i})" if i else term.title(),
                    "index": i + 1,
                    "extract": echo or f"Article {i + 1} about {term}. It has two sentences.",
                    "fullurl": f"https://en.wikipedia.org/wiki/{term.replace(' ', '_')}_{i}",
                }
                for i in range(k)
            ]
            return {"batchcomplete": True, "query": {"pages": list(reversed(pages))}}
        if self.shape == "searxng":
            term = q.get("q", "")
            results = [
                {
                    "url": f"https://example.org/{i}?q={term.replace(' ', '+')}",
                    "title": f"<b>{term}</b> result {i}",
                    "content": echo or f"Snippet {i} for {term} &amp; more",
                    "engine": "duckduckgo",
                    "engines": ["duckduckgo"],
                    "score": 1.0 / (i + 1),
                }
                for i in range(8)
            ]
            return {"query": term, "number_of_results": 8, "results": results, "answers": [], "infoboxes": []}
        if self.shape == "brave":
            term = q.get("q", "")
            k = int(q.get("count", 5))
            results = [
                {"title": f"{term} - Brave {i}", "url": f"https://brave.example/{i}", "description": echo
                 or f"<strong>{term}</strong> described {i}"}
                for i in range(k)
            ]
            return {"type": "search", "query": {"original": term},
                    "web": {"type": "search", "results": results}}
        if self.shape == "gcv":
            req = json.loads(rec.body)["requests"][0]
            digest = hashlib.sha256(base64.b64decode(req["image"]["content"])).hexdigest()[:8]
            return {
                "responses": [
                    {
                        "webDetection": {
                            "webEntities": [
                                {"entityId": "/m/02j81", "score": 0.93, "description": f"Landmark {digest}"},
                                {"entityId": "/m/0abc", "score": 0.61, "description": echo or "Tower"},
                                {"entityId": "/m/0def", "score": 0.40},  # entities may lack a description
                            ],
                            "fullMatchingImages": [{"url": f"https://img.example/{digest}.jpg"}],
                            "pagesWithMatchingImages": [
                                {"url": f"https://pages.example/{digest}",
                                 "pageTitle": f"About <b>{digest}</b>",
                                 "fullMatchingImages": [{"url": f"https://img.example/{digest}.jpg"}]},
                                {"url": "https://pages.example/other", "pageTitle": "Another page",
                                 "partialMatchingImages": [{"url": "https://img.example/p.jpg"}]},
                            ],
                            "visuallySimilarImages": [{"url": "https://img.example/sim.jpg"}],
                            "bestGuessLabels": [{"label": f"landmark {digest}", "languageCode": "en"}],
                        }
                    }
                ]
            }
        if self.shape == "serpapi":
            image_url = q.get("url", "")
            name = image_url.rsplit("/", 1)[-1]
            meta = {"id": "abc", "status": "Success", "json_endpoint": echo
                    or "https://serpapi.com/searches/abc.json"}
            return {
                "search_metadata": meta,
                "search_parameters": {"engine": "google_lens", "url": image_url},
                "knowledge_graph": [{"title": f"Knowledge {name}", "link": "https://kg.example/x",
                                     "subtitle": "Building"}],
                "visual_matches": [
                    {"position": i + 1, "title": echo or f"Match {i} of {name}",
                     "link": f"https://vm.example/{i}", "source": "Example"}
                    for i in range(6)
                ],
            }
        raise AssertionError(self.shape)
