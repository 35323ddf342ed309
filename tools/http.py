"""One careful HTTP GET/POST that returns parsed JSON or a typed, secret-free failure.

Knows: timeouts (connect and a total deadline per attempt, so a server that drips bytes cannot
hold us), retries with exponential backoff on 429 and 5xx honouring ``Retry-After`` (seconds or an
HTTP date) up to a cap (:func:`with_retries`: the app's one retry loop, the hub downloads use it
too), a hard limit on the body size, empty and invalid JSON bodies, and how to keep API keys out of
every message it produces (:func:`edge_agent.core.redaction.redact`) and out of urllib3's debug log
(:func:`protect_logs`).

Does not know: search backends, the cache, settings. It never raises for a network or server
problem: those come back as :class:`FetchError` (an exception the caller catches and turns into
an observation); anything else that escapes is a bug.
"""

from __future__ import annotations

import email.utils
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import requests
import urllib3

from edge_agent.core.redaction import redact, redact_tree, usable

log = logging.getLogger(__name__)

T = TypeVar("T")

# Status codes worth another try: rate limited, or the server (or a proxy) failed.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class HttpPolicy:
    """How hard one request tries. Defaults suit a laptop on flaky Wi-Fi; tests shrink the waits."""

    timeout: float = 10.0  # seconds: connect timeout, and the whole of one attempt (headers + body)
    retries: int = 2  # extra attempts after the first (fetch_json: only for 429 / 5xx)
    backoff: float = 0.5  # first wait between attempts; doubles each time
    max_wait: float = 5.0  # longest single wait; a Retry-After above it ends the retries at once
    max_bytes: int = 2_000_000  # body size limit (decoded bytes); search JSON is ~5-100 kB


class FetchError(Exception):
    """The request did not produce usable JSON. ``kind`` is one of:

    unreachable (DNS, refused, no route), timeout, http (a status >= 400 after retries),
    rate_limited (429 with a wait longer than we accept), too_large, empty, bad_json.
    ``message`` is one line, already free of secrets.
    """

    def __init__(self, kind: str, message: str, status: int | None = None, attempts: int = 1) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.attempts = attempts

    @property
    def network_down(self) -> bool:
        """True when the network (not the service) is the problem."""
        return self.kind in ("unreachable", "timeout")


@dataclass(frozen=True)
class FetchResult:
    data: Any  # parsed JSON
    text: str  # the body as text (for the cache's raw copy; redact before storing)
    status: int
    attempts: int
    seconds: float


# ------------------------------------------------------------------------------------------------
# Secrets


def safe_url(url: str) -> str:
    """``url`` without its query string and credentials: what may appear in a log line."""
    try:
        p = urlsplit(url)
    except ValueError:
        return "<bad url>"
    host = p.hostname or ""
    if p.port:
        host = f"{host}:{p.port}"
    return urlunsplit((p.scheme, host, p.path, "", ""))


class _RedactFilter(logging.Filter):
    """Rewrites log records that carry a secret (urllib3 logs full request lines at DEBUG)."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()
        self.lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # a malformed record is logging's problem, not ours; leave it alone
            return True
        with self.lock:
            secrets = tuple(self.secrets)
        clean = redact(msg, secrets)
        if clean != msg:
            record.msg, record.args = clean, None
        return True


_FILTER = _RedactFilter()
_FILTERED_LOGGERS = ("urllib3.connectionpool", "urllib3.util.retry", "requests", __name__)
_installed = False


def protect_logs(secrets: Iterable[str]) -> None:
    """Make sure ``secrets`` never reach a log handler through urllib3, requests or this module."""
    global _installed
    with _FILTER.lock:
        _FILTER.secrets.update(usable(secrets))
        if not _installed:
            for name in _FILTERED_LOGGERS:
                logging.getLogger(name).addFilter(_FILTER)
            _installed = True


# ------------------------------------------------------------------------------------------------
# The request


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """Parse a Retry-After header: delta-seconds or an HTTP date. None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class TryAgain(Exception):
    """Raised by one attempt inside :func:`with_retries` to ask for another.

    ``error`` is raised instead when no attempt is left. ``wait``: seconds the server asked for
    (Retry-After), instead of the backoff. ``progressed``: this attempt got somewhere (a download
    received bytes), so the count of failures in a row starts again.
    """

    def __init__(self, error: Exception, *, wait: float | None = None, progressed: bool = False) -> None:
        super().__init__(str(error))
        self.error = error
        self.wait = wait
        self.progressed = progressed


def with_retries(attempt: Callable[[int], T], policy: HttpPolicy, *, sleep: Callable[[float],
                                                                                     None] = time.sleep) -> T:
    """``attempt(n)`` (n = 1, 2, ...) until it returns or raises anything but :class:`TryAgain`.

    After a TryAgain: wait its ``wait`` or ``policy.backoff`` doubled per failure in a row (at most
    ``policy.max_wait``), then try again, unless ``policy.retries`` failures in a row have been retried
    already: then its ``error`` is raised. The one retry loop of the app (search requests, hub downloads).
    """
    failures = 0
    n = 0
    while True:
        n += 1
        try:
            return attempt(n)
        except TryAgain as again:
            failures = 1 if again.progressed else failures + 1
            if failures > policy.retries:
                raise again.error from again.__cause__
            wait = again.wait if again.wait is not None else policy.backoff * 2 ** (failures - 1)
            wait = min(wait, policy.max_wait)
            log.info("%s; retrying in %.2f s", again.error, wait)
            sleep(wait)


def fetch_json(
    session: requests.Session,
    method: str,
    url: str,
    *,
    policy: HttpPolicy,
    params: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    json_body: Any = None,
    secrets: Iterable[str] = (),
    sleep: Callable[[float], None] = time.sleep,
) -> FetchResult:
    """Send one request (with retries) and parse the JSON body. Raises :class:`FetchError` only."""
    secrets = tuple(secrets)
    t0 = time.monotonic()
    where = safe_url(url)
    # requests strips only `Authorization` when a redirect changes host; a key in a custom header or
    # in the query string would follow the redirect to wherever it points. So: no redirects with a key.
    sent = [str(v) for v in (headers or {}).values()] + [str(v) for v in (params or {}).values()]
    follow = not any(sec and sec in v for sec in secrets for v in sent)

    def attempt(n: int) -> tuple[int, int, dict, bytes]:
        log.debug("%s %s (attempt %d)", method, where, n)
        try:
            status, resp_headers, body = _attempt(session, method, url, params, headers, json_body, policy,
                                                  follow)
        except FetchError as e:
            e.attempts = n
            e.message = redact(e.message, secrets)
            log.info("%s %s failed: %s", method, where, e.message)
            raise
        if status in RETRY_STATUSES:
            wait = retry_after_seconds(resp_headers.get("Retry-After"))
            what = "rate limited (429)" if status == 429 else f"server error {status}"
            kind = "rate_limited" if status == 429 else "http"
            if wait is not None and wait > policy.max_wait:
                raise FetchError(
                    kind,
                    f"{what}; the server asks to wait {wait:.0f} s, longer than the {policy.max_wait:.0f} s "
                    f"we wait",
                    status, n,
                )  # fmt: skip
            raise TryAgain(FetchError(kind, f"{what} after {n} attempts", status, n), wait=wait)
        return n, status, resp_headers, body

    attempts, status, resp_headers, body = with_retries(attempt, policy, sleep=sleep)
    if 300 <= status < 400:
        target = safe_url(redact(resp_headers.get("Location", ""), secrets)) or "elsewhere"
        raise FetchError(
            "http", f"the endpoint redirects (HTTP {status}) to {target}; put that address in the settings",
            status, attempts
        )
    if status >= 400:
        raise FetchError("http", f"HTTP {status}{_error_hint(body, secrets)}", status, attempts)
    if not body.strip():
        raise FetchError("empty", f"empty response (HTTP {status})", status, attempts)
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise FetchError("bad_json", f"response is not valid JSON ({type(e).__name__})", status,
                         attempts) from None
    # Backends may reflect the request (URL with its key) in the body: scrub before anyone reads it.
    text = redact(body.decode("utf-8", errors="replace"), secrets)
    if secrets:
        data = redact_tree(data, secrets)
    return FetchResult(data, text, status, attempts, time.monotonic() - t0)


def _attempt(session, method, url, params, headers, json_body, policy, follow) -> tuple[int, dict, bytes]:
    """One request: (status, headers, body bytes), the body read under the size limit and deadline."""
    deadline = time.monotonic() + policy.timeout
    try:
        resp = session.request(
            method,
            url,
            params=params,
            headers=headers,
            json=json_body,
            timeout=(policy.timeout, policy.timeout),
            stream=True,
            allow_redirects=follow,
        )
    except requests.exceptions.Timeout:
        raise FetchError("timeout", f"no answer within {policy.timeout:g} s") from None
    except requests.exceptions.ConnectionError as e:
        raise FetchError("unreachable", f"cannot connect ({_short_reason(e)})") from None
    except requests.exceptions.RequestException as e:  # invalid URL, too many redirects, ...
        raise FetchError("unreachable", f"request failed ({type(e).__name__}: {_short_reason(e)})") from None
    try:
        length = resp.headers.get("Content-Length")
        if length and length.isdigit() and int(length) > policy.max_bytes:
            raise FetchError("too_large", f"response too large ({int(length)} bytes > {policy.max_bytes})",
                             resp.status_code)
        chunks: list[bytes] = []
        size = 0
        try:
            for chunk in _body_chunks(resp):
                size += len(chunk)
                if size > policy.max_bytes:
                    raise FetchError("too_large", f"response too large (over {policy.max_bytes} bytes)",
                                     resp.status_code)
                if time.monotonic() > deadline:
                    raise FetchError("timeout", f"response not complete within {policy.timeout:g} s",
                                     resp.status_code)
                chunks.append(chunk)
        except requests.exceptions.Timeout:
            raise FetchError("timeout", f"response stalled for {policy.timeout:g} s",
                             resp.status_code) from None
        except urllib3.exceptions.ReadTimeoutError:
            raise FetchError("timeout", f"response stalled for {policy.timeout:g} s",
                             resp.status_code) from None
        except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError, OSError) as e:
            raise FetchError("unreachable", f"connection broke while reading ({_short_reason(e)})") from None
        return resp.status_code, dict(resp.headers), b"".join(chunks)
    finally:
        resp.close()


def _body_chunks(resp: requests.Response) -> Iterator[bytes]:
    """The decoded body in pieces as they arrive, so the deadline is checked even on a server that
    drips bytes. ``iter_content`` blocks until a whole chunk is in; urllib3 2's ``read1`` does not."""
    read1 = getattr(resp.raw, "read1", None)
    if read1 is None:  # urllib3 1.x
        yield from resp.iter_content(16384)
        return
    while True:
        chunk = read1(65536, decode_content=True)
        if not chunk:
            return
        yield chunk


def _short_reason(e: BaseException) -> str:
    """The innermost, most specific words of a requests/urllib3 error, one line, at most 200 chars."""
    text = str(e)
    # urllib3 wraps the cause as "...: Failed to establish a new connection: [Errno 111] Connection
    # refused'))"
    m = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text)
    if m:
        text = m.group(1)
    return " ".join(text.split())[:200]


def _error_hint(body: bytes, secrets: tuple[str, ...]) -> str:
    """A few words from an error body (JSON "error"/"message" fields), for the observation."""
    try:
        data = json.loads(body[:20000])
    except (ValueError, RecursionError):
        return ""
    msg = None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):
            msg = err.get("message") or err.get("info") or err.get("detail")
        elif isinstance(err, str):
            msg = err
        msg = msg or data.get("message") or data.get("detail")
    if not isinstance(msg, str) or not msg.strip():
        return ""
    return ": " + redact(" ".join(msg.split())[:200], secrets)
