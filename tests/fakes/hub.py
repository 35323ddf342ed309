"""A real HTTP server on 127.0.0.1 that answers like the Hugging Face hub, for download tests.

Serves the shapes edge_agent.modelfiles.hub relies on (and that huggingface_hub uses too):
- ``GET /api/models/{owner}/{repo}[/revision/{rev}]?blobs=true`` -> ``{"id", "sha", "siblings": [{"rfilename",
  "size", "blobId", "lfs": {"sha256", "size", "pointerSize"}}]}``
- ``GET|HEAD /{owner}/{repo}/resolve/{rev}/{file}`` -> LFS files: 302 to ``/cdn/{sha256}`` with the hub's
  ``X-Repo-Commit``, ``X-Linked-Etag``, ``X-Linked-Size`` headers; small files: the bytes, ETag = git oid
- ``GET /cdn/{sha256}`` -> the bytes, honouring ``Range: bytes=N-`` with 206 / Content-Range (416 past the
end)
- errors with the hub's ``X-Error-Code`` (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo)

Faults for tests: ``cut_after[name] = n`` sends the full Content-Length but only n bytes, then drops the
connection (once per entry in ``cut_times[name]``, default once); ``corrupt.add(name)`` serves the file
with one byte flipped (the metadata keeps the true sha256); ``ignore_range = True`` answers 200 with the
whole file to a Range request; ``gated.add(repo)`` answers 401 without a token; ``stall_after[name] = n``
sends n bytes and then nothing (the connection stays open) until :meth:`stop`, once. ``requests`` records
(method, path, Range header, Authorization header) for assertions.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class _File:
    data: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def git_oid(self) -> str:
        return hashlib.sha1(b"blob %d\0" % len(self.data) + self.data).hexdigest()


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, dict[str, _File]] = {}
        self.requests: list[tuple[str, str, str | None, str | None]] = []
        self.cut_after: dict[str, int] = {}
        self.cut_times: dict[str, int] = {}
        self.corrupt: set[str] = set()
        self.gated: set[str] = set()
        self.ignore_range = False
        self.stall_after: dict[str, int] = {}
        self.delay: dict[str, float] = {}  # seconds before the bytes of file ``name`` are sent (a slow link)
        self.released = threading.Event()  # set by stop(): stalled handlers end
        self.api_busy = 0  # the next N file-list requests answer 503 with Retry-After: 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.lock = threading.Lock()

    # -- content ---------------------------------------------------------------------------------
    def add_file(self, repo: str, name: str, data: bytes, *, lfs: bool = True) -> None:
        self.repos.setdefault(repo, {})[name] = _File(data, lfs)

    def sha256(self, repo: str, name: str) -> str:
        return self.repos[repo][name].sha256

    def transfers(self, name: str) -> list[str | None]:
        """Range headers of the byte transfers (GET /cdn/ or non-LFS resolve) of file ``name``."""
        out = []
        for method, path, rng, _auth in self.requests:
            if method == "GET" and (path.startswith("/cdn/") and path.endswith("/" + name) or
                                    "/resolve/" in path and path.endswith("/" + name)
                                    and not self._is_lfs(name)):
                out.append(rng)
        return out

    def _is_lfs(self, name: str) -> bool:
        return any(f.lfs for files in self.repos.values() for n, f in files.items() if n == name)

    # -- server ----------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        assert isinstance(host, str)  # an IPv4 loopback address (typeshed allows bytes for AF_UNIX)
        return f"http://{host}:{port}"

    def start(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            fake = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        server = self._server
        self._thread = threading.Thread(target=lambda: server.serve_forever(poll_interval=0.02),
                                        name="fakehub",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.released.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    fake: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    # -- routing ---------------------------------------------------------------------------------
    def _route(self, head: bool) -> None:
        fake = self.fake
        parts = urlsplit(self.path)
        path = unquote(parts.path)
        with fake.lock:
            fake.requests.append((self.command, path, self.headers.get("Range"),
                                  self.headers.get("Authorization")))
        segs = [s for s in path.split("/") if s]
        if segs[:2] == ["api", "models"] and len(segs) >= 4:
            repo = "/".join(segs[2:4])
            rev = segs[5] if len(segs) >= 6 and segs[4] == "revision" else "main"
            return self._api_model(repo, rev)
        if len(segs) >= 5 and segs[2] == "resolve":
            repo, rev, name = "/".join(segs[:2]), segs[3], "/".join(segs[4:])
            return self._resolve(repo, rev, name, head)
        if len(segs) == 3 and segs[0] == "cdn":
            return self._cdn(segs[1], segs[2], head)
        return self._error(404, "RepoNotFound", "not found")

    def _check(self, repo: str, rev: str) -> dict[str, _File] | None:
        files = self.fake.repos.get(repo)
        if files is None:
            self._error(404, "RepoNotFound", f"Repository {repo} not found")
            return None
        if repo in self.fake.gated and not self.headers.get("Authorization"):
            self._error(401, "GatedRepo", "Access to this model is restricted")
            return None
        if rev not in ("main", COMMIT):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return None
        return files

    def _api_model(self, repo: str, rev: str) -> None:
        with self.fake.lock:
            busy, self.fake.api_busy = self.fake.api_busy > 0, max(0, self.fake.api_busy - 1)
        if busy:
            return self._send(503, b"busy", {"Retry-After": "0"})
        files = self._check(repo, rev)
        if files is None:
            return
        siblings = []
        for name, f in files.items():
            s = {"rfilename": name, "size": len(f.data), "blobId": f.git_oid}
            if f.lfs:
                s["lfs"] = {"sha256": f.sha256, "size": len(f.data), "pointerSize": 134}
            siblings.append(s)
        body = json.dumps({"id": repo, "modelId": repo, "sha": COMMIT, "private": False,
                           "siblings": siblings}).encode()
        self._send(200, body, {"Content-Type": "application/json"})

    def _resolve(self, repo: str, rev: str, name: str, head: bool) -> None:
        files = self._check(repo, rev)
        if files is None:
            return
        f = files.get(name)
        if f is None:
            return self._error(404, "EntryNotFound", f"{name} does not exist on {rev}")
        common = {"X-Repo-Commit": COMMIT}
        if f.lfs:
            common.update({"X-Linked-Etag": f'"{f.sha256}"', "X-Linked-Size": str(len(f.data)),
                           "ETag": f'"{f.git_oid}"', "Location": f"/cdn/{f.sha256}/{name}",
                           "Content-Length": "0"})
            self.send_response(302)
            for k, v in common.items():
                self.send_header(k, v)
            self.end_headers()
            return
        self._serve_bytes(name, f, head, {**common, "ETag": f'"{f.git_oid}"'})

    def _cdn(self, sha: str, name: str, head: bool) -> None:
        for files in self.fake.repos.values():
            for n, f in files.items():
                if f.lfs and f.sha256 == sha and n == name:
                    return self._serve_bytes(name, f, head, {})
        self._error(404, "EntryNotFound", "no such blob")

    def _serve_bytes(self, name: str, f: _File, head: bool, headers: dict[str, str]) -> None:
        fake = self.fake
        data = f.data
        if name in fake.corrupt and data:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        start, status = 0, 200
        rng = self.headers.get("Range")
        if rng and not fake.ignore_range:
            start = int(rng.removeprefix("bytes=").split("-")[0])
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
            headers = {**headers, "Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"}
        body = data[start:]
        self.send_response(status)
        for k, v in {**headers, "Content-Length": str(len(body)), "Accept-Ranges": "bytes",
                     "Content-Type": "application/octet-stream"}.items():
            self.send_header(k, v)
        self.end_headers()
        if head:
            return
        with fake.lock:
            cut = fake.cut_after.get(name)
            if cut is not None:
                left = fake.cut_times.get(name, 1) - 1
                if left <= 0:
                    fake.cut_after.pop(name)
                    fake.cut_times.pop(name, None)
                else:
                    fake.cut_times[name] = left
            stall = fake.stall_after.pop(name, None)
        if fake.delay.get(name):
            fake.released.wait(fake.delay[name])
        if stall is not None:
            self.wfile.write(body[:stall])
            self.wfile.flush()
            fake.released.wait(30)
            self.close_connection = True
            return
        if cut is not None and cut < len(body):
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.close_connection = True  # the client sees fewer bytes than Content-Length
            return
        self.wfile.write(body)

    # -- helpers ---------------------------------------------------------------------------------
    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for k, v in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str) -> None:
        self._send(status, json.dumps({"error": message}).encode(),
                   {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message})
