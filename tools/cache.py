"""The on-disk search cache: one SQLite file, safe to share between processes.

Knows: how to key a search (tool + backend + normalised query, or the SHA-256 of the exact image
bytes, + the parameters that change results; **never** an API key), how to store a response (the
parsed results, the raw body with secrets removed, the backend and the time fetched), how to read
it back, and how to export and import entries as JSON that is validated field by field (never
pickle, never eval).

Does not know: HTTP, backends' JSON shapes, or whether we are online; :mod:`edge_agent.tools.search`
decides when to read and write. Opening the cache touches only the file (never the network).

Concurrency: WAL journal + a busy timeout (:mod:`edge_agent.core.sqlitedb`, shared with the chat
history), one short-lived connection per operation, so the TUI, a ``cache prefetch`` in another
terminal and an eval can all use one file. A file that is not a readable SQLite database of our
schema (``PRAGMA user_version`` 1) raises :class:`CacheError` saying to run ``edge-agent cache clear``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import sqlite3
import tempfile
import time
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_agent.core import sqlitedb
from edge_agent.core.errors import CacheError
from edge_agent.core.files import atomic_write
from edge_agent.core.redaction import redact
from edge_agent.tools import specs
from edge_agent.tools.text import normalise_query

SCHEMA_VERSION = 1  # PRAGMA user_version
_SCHEMA = """CREATE TABLE IF NOT EXISTS entries (
    key TEXT PRIMARY KEY,
    tool TEXT NOT NULL,
    backend TEXT NOT NULL,
    query TEXT NOT NULL,
    image_sha256 TEXT NOT NULL,
    params TEXT NOT NULL,
    results TEXT NOT NULL,
    raw TEXT,
    fetched_at REAL NOT NULL
)"""
EXPORT_FORMAT = "edge-agent-search-cache"
EXPORT_VERSION = 1


# Limits that import enforces (a cache file from someone else is untrusted input).
MAX_QUERY_CHARS = 1000
MAX_RESULTS = 50
MAX_FIELD_CHARS = {"title": 300, "url": 2048, "snippet": 2000, "source": 100}
MAX_RAW_CHARS = 2_000_000
MAX_IMPORT_BYTES = 512 * 1024 * 1024

REBUILD_HINT = ("Run `edge-agent cache clear` to delete it and start an empty cache (cached searches are "
                "lost).")


def make_key(tool: str, backend: str, query: str, image_sha256: str, params: dict[str, Any]) -> str:
    """SHA-256 over canonical JSON of what determines the results. Callers must leave keys out of
    ``params``."""
    blob = json.dumps(
        {"tool": tool, "backend": backend, "query": query, "image_sha256": image_sha256, "params": params},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass
class CacheEntry:
    """One stored search. ``results`` are plain dicts (title, url, snippet, source)."""

    tool: str
    backend: str
    query: str  # normalised query; "" for image searches
    image_sha256: str  # "" for text searches
    params: dict[str, Any]
    results: list[dict[str, str]]
    raw: str | None = None  # the response body, secrets removed
    fetched_at: float = field(default_factory=time.time)  # Unix seconds

    @property
    def key(self) -> str:
        return make_key(self.tool, self.backend, self.query, self.image_sha256, self.params)

    def to_json(self, include_raw: bool = True) -> dict[str, Any]:
        d = {
            "key": self.key,
            "tool": self.tool,
            "backend": self.backend,
            "query": self.query,
            "image_sha256": self.image_sha256,
            "params": self.params,
            "results": self.results,
            "fetched_at": self.fetched_at,
        }
        if include_raw:
            d["raw"] = self.raw
        return d


def _unwritable(folder: Path) -> bool:
    """Nothing can be created in ``folder`` (a read-only mount denies it even to root, whatever the mode
    bits)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".edge-agent-probe-", dir=folder)
    except OSError as e:
        return e.errno in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC)
    os.close(fd)
    os.unlink(name)
    return False


def _damaged(message: str) -> CacheError:
    """A CacheError for a file that is not (or no longer) a cache we can read: `clear` may delete it."""
    e = CacheError(message)
    e.damaged = True  # type: ignore[attr-defined]
    return e


class SearchCache:
    """The cache file at ``path``. Cheap to construct (does not open the file until first use)."""

    def __init__(self, path: Path | str, busy_timeout: float = 15.0) -> None:
        self.path = Path(path)
        self.busy_timeout = busy_timeout
        self._ready = False
        # the folder cannot be written (a read-only home): served as it is, nothing stored
        self.read_only = False

    # --- connections ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """A connection (:func:`edge_agent.core.sqlitedb.connect`); writes use an explicit transaction."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            if e.errno != errno.EROFS:
                raise CacheError(f"Cannot create the cache folder {self.path.parent}: {e.strerror}. Check "
                                 f"its "
                                 "permissions.") from None
        try:
            conn = self._read_only() if self.read_only else self._open()
        except sqlite3.Error as e:
            if self.read_only or not _unwritable(self.path.parent):
                raise self._error(e) from None
            self.read_only = True  # searches still read what was cached; new results are not stored
            conn = self._read_only()
        try:
            yield conn
        except sqlite3.Error as e:
            self._ready = False  # the file may have been replaced under us: check the schema again next time
            raise self._error(e) from None
        finally:
            conn.close()

    def _open(self) -> sqlite3.Connection:
        """A connection; on the first use in this process the file is also checked, and a damaged one is
        set aside (kept) and what is readable of it salvaged into a new file (said once:
        ``edge_agent.core.recovery``)."""
        from edge_agent.core import recovery

        try:
            conn = sqlitedb.connect(self.path, busy_timeout=self.busy_timeout)
            if not self._ready:
                try:
                    recovery.check(conn)
                    self._init(conn)
                except BaseException:
                    conn.close()
                    raise
        except sqlite3.DatabaseError as e:
            if self._ready or not recovery.is_damage(e):
                raise
            return self._recover(recovery.Damaged(str(e)).reason)
        return conn

    def _read_only(self) -> sqlite3.Connection:
        """The file read as it is, without locks (nothing can write to a read-only folder); an empty cache in
        memory when there is no file."""
        if not self.path.exists():
            conn = sqlite3.connect(":memory:")
            conn.executescript(_SCHEMA)
            return conn
        return sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)

    def _recover(self, reason: str) -> sqlite3.Connection:
        from edge_agent.core import recovery

        try:
            aside: Path | None = recovery.set_aside(self.path)
        except FileNotFoundError:  # another process set it aside first
            aside = None
        conn = sqlitedb.connect(self.path, busy_timeout=self.busy_timeout)
        try:
            self._init(conn)
            if aside is not None:
                n = recovery.salvage(aside, conn, ["entries"])["entries"]
                recovery.notice(f"The search cache {self.path} was damaged ({reason}). {n} cached searches "
                                f"were recovered into a new file; the damaged file is kept as {aside}.")
        except BaseException:
            conn.close()
            raise
        return conn

    def _init(self, conn: sqlite3.Connection) -> None:
        try:
            # "meta": the table where caches written before the user_version convention kept their version (1)
            version = sqlitedb.ensure_schema(conn, SCHEMA_VERSION, [_SCHEMA], tables=("entries", "meta"))
        except sqlitedb.ForeignDatabase:
            raise _damaged(f"{self.path} is an SQLite file but not an edge-agent search cache. "
                           f"{REBUILD_HINT}") from None
        if version not in (0, SCHEMA_VERSION):
            raise _damaged(
                f"The search cache {self.path} has schema version {version}, this edge-agent reads version "
                f"{SCHEMA_VERSION}. Export it with the version that wrote it, or: {REBUILD_HINT}"
            )
        self._ready = True

    def _error(self, e: sqlite3.Error) -> CacheError:
        text = str(e)
        if isinstance(e, sqlite3.OperationalError):
            if "locked" in text or "busy" in text:
                return CacheError(f"The search cache {self.path} is locked by another process ({text}). Try "
                                  f"again.")
            if "unable to open" in text:
                return CacheError(f"Cannot open the search cache {self.path} ({text}). Check the folder's "
                                  f"permissions.")
            if "readonly" in text or "read-only" in text:
                return CacheError(f"The search cache {self.path} is read-only ({text}). Check its "
                                  f"permissions.")
            if "disk" in text and "full" in text:
                return CacheError(f"No space left to write the search cache {self.path}. Free some disk "
                                  f"space.")
        return _damaged(f"The search cache {self.path} is damaged ({text}). {REBUILD_HINT}")

    # --- reading and writing --------------------------------------------------------------------
    def get(self, key: str) -> CacheEntry | None:
        with self._connect() as conn:
            row = conn.execute(
                "SELECT tool, backend, query, image_sha256, params, results, raw, fetched_at FROM entries "
                "WHERE key=?",
                (key,),
            ).fetchone()
        if row is None:
            return None
        try:
            entry = CacheEntry(row[0], row[1], row[2], row[3], json.loads(row[4]), json.loads(row[5]), row[6],
                               row[7])
        except (ValueError, TypeError) as e:
            raise _damaged(f"The search cache {self.path} holds an unreadable entry ({e}). "
                           f"{REBUILD_HINT}") from None
        return entry

    def put(self, entry: CacheEntry) -> str:
        """Insert or replace the entry under its key; returns the key."""
        self.put_many([entry])
        return entry.key

    def put_many(self, entries: Iterable[CacheEntry], keep_newer: bool = False) -> int:
        """Write entries in one transaction. ``keep_newer``: an existing entry fetched later wins."""
        rows = [
            (
                e.key,
                e.tool,
                e.backend,
                e.query,
                e.image_sha256,
                json.dumps(e.params, sort_keys=True, ensure_ascii=False),
                json.dumps(e.results, ensure_ascii=False),
                e.raw,
                float(e.fetched_at),
            )
            for e in entries
        ]
        sql = "INSERT INTO entries VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT(key) DO UPDATE SET " + ", ".join(
            f"{c}=excluded.{c}" for c in ("tool", "backend", "query", "image_sha256", "params", "results",
                                          "raw", "fetched_at")
        )
        if keep_newer:
            sql += " WHERE excluded.fetched_at > entries.fetched_at"
        written = 0
        if self.read_only:  # a read-only home: the result is used, not stored
            return 0
        with self._connect() as conn, sqlitedb.transaction(conn):
            for r in rows:
                written += conn.execute(sql, r).rowcount
        return written

    def entries(self) -> Iterator[CacheEntry]:
        """All entries, oldest first (reads them in one go; caches hold thousands, not millions)."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT tool, backend, query, image_sha256, params, results, raw, fetched_at FROM entries "
                "ORDER BY fetched_at, key"
            ).fetchall()
        for row in rows:
            try:
                yield CacheEntry(row[0], row[1], row[2], row[3], json.loads(row[4]), json.loads(row[5]),
                                 row[6], row[7])
            except (ValueError, TypeError) as e:
                raise _damaged(f"The search cache {self.path} holds an unreadable entry ({e}). "
                               f"{REBUILD_HINT}") from None

    def stats(self) -> dict[str, Any]:
        """Counts per tool and backend, time range and file size. Does not create a missing file."""
        out: dict[str, Any] = {"path": str(self.path), "exists": self.path.exists(), "entries": 0,
                               "by_backend": {}}
        if not self.path.exists():
            out.update(bytes=0, oldest=None, newest=None)
            return out
        with self._connect() as conn:
            for tool, backend, n in conn.execute("SELECT tool, backend, COUNT(*) FROM entries GROUP BY tool, "
                                                 "backend"):
                out["by_backend"][f"{tool}/{backend}"] = n
                out["entries"] += n
            oldest, newest = conn.execute("SELECT MIN(fetched_at), MAX(fetched_at) FROM entries").fetchone()
        out["oldest"], out["newest"] = oldest, newest
        out["bytes"] = sum(p.stat().st_size for p in self._files() if p.exists())
        return out

    def clear(self) -> int:
        """Delete every entry. A damaged file is deleted outright (with its WAL); returns entries removed."""
        if not self.path.exists():
            return 0
        try:
            with self._connect() as conn:
                n = conn.execute("DELETE FROM entries").rowcount
                conn.execute("VACUUM")
            return n
        except CacheError as e:
            if not getattr(e, "damaged", False):  # locked or unreadable: deleting would hurt another process
                raise
            for p in self._files():
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
            self._ready = False
            return 0

    def _files(self) -> list[Path]:
        return [self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm")]

    # --- export and import ----------------------------------------------------------------------
    def export(self, dest: Path | str, include_raw: bool = True, secrets: Iterable[str] = ()) -> int:
        """Write every entry as one JSON document (atomically). Returns the number of entries.

        ``secrets`` are removed once more from every stored text (they never should be there).
        """
        dest = Path(dest)
        secrets = tuple(secrets)
        entries = [_redact_entry(e, secrets).to_json(include_raw) for e in self.entries()]
        doc = {"format": EXPORT_FORMAT, "version": EXPORT_VERSION, "exported_at": time.time(),
               "entries": entries}
        try:
            atomic_write(dest, json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
        except OSError as e:
            raise CacheError(f"Cannot write {dest}: {e.strerror}.") from None
        return len(entries)

    def import_file(self, src: Path | str, replace: bool = False, secrets: Iterable[str] = ()) -> tuple[int,
                                                                                                        int]:
        """Validate and import an export. Returns (entries in the file, entries written).

        Existing entries are kept when they are newer, unless ``replace``. Any invalid entry
        rejects the whole file (nothing is written) with a message naming the entry and field.
        """
        src = Path(src)
        try:
            size = src.stat().st_size
        except OSError as e:
            raise CacheError(f"Cannot read {src}: {e.strerror}.") from None
        if size > MAX_IMPORT_BYTES:
            raise CacheError(f"{src} is {size} bytes; an export above {MAX_IMPORT_BYTES} bytes is refused.")
        try:
            text = src.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise CacheError(f"Cannot read {src} as UTF-8 text ({e}).") from None
        secrets = tuple(secrets)
        entries = [_redact_entry(e, secrets) for e in parse_export(text, str(src))]
        written = self.put_many(entries, keep_newer=not replace)
        return len(entries), written


def _redact_entry(e: CacheEntry, secrets: tuple[str, ...]) -> CacheEntry:
    if not secrets:
        return e
    results = [{k: redact(v, secrets) for k, v in r.items()} for r in e.results]
    raw = redact(e.raw, secrets) if e.raw else e.raw
    return CacheEntry(e.tool, e.backend, e.query, e.image_sha256, e.params, results, raw, e.fetched_at)


# ------------------------------------------------------------------------------------------------
# Validation of exports (untrusted input)


def parse_export(text: str, name: str = "export") -> list[CacheEntry]:
    """Parse and validate an export: a JSON document, or JSON lines of entries. Raises CacheError."""
    stripped = text.lstrip()
    docs: list[Any]
    try:
        if stripped.startswith("{") and not _looks_like_jsonl(stripped):
            doc = json.loads(text)
            if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT:
                raise CacheError(f"{name} is not an edge-agent cache export (missing \"format\": "
                                 f"\"{EXPORT_FORMAT}\").")
            if doc.get("version") != EXPORT_VERSION:
                raise CacheError(f"{name} has export version {doc.get('version')!r}; this edge-agent reads "
                                 f"{EXPORT_VERSION}.")
            extra = set(doc) - {"format", "version", "exported_at", "entries"}
            if extra:
                raise CacheError(f"{name}: unknown top-level field(s) {', '.join(sorted(extra))}.")
            docs = doc.get("entries")
            if not isinstance(docs, list):
                raise CacheError(f"{name}: \"entries\" must be a list.")
        else:
            docs = [json.loads(line) for line in text.splitlines() if line.strip()]
    except (ValueError, RecursionError) as e:
        raise CacheError(f"{name} is not valid JSON ({e}).") from None
    return [_validate_entry(d, f"{name} entry {i + 1}") for i, d in enumerate(docs)]


def _looks_like_jsonl(text: str) -> bool:
    first = text.split("\n", 1)[0].strip()
    if not first.endswith("}"):
        return False
    try:
        return isinstance(json.loads(first), dict) and "tool" in json.loads(first)
    except ValueError:
        return False


_ENTRY_FIELDS = {"key", "tool", "backend", "query", "image_sha256", "params", "results", "raw", "fetched_at"}
_REQUIRED = {"tool", "backend", "query", "image_sha256", "params", "results", "fetched_at"}


def _validate_entry(d: Any, where: str) -> CacheEntry:
    def bad(msg: str) -> CacheError:
        return CacheError(f"{where}: {msg}. The file was not imported.")

    if not isinstance(d, dict):
        raise bad("must be a JSON object")
    extra = set(d) - _ENTRY_FIELDS
    if extra:
        raise bad(f"unknown field(s) {', '.join(sorted(extra))}")
    missing = _REQUIRED - set(d)
    if missing:
        raise bad(f"missing field(s) {', '.join(sorted(missing))}")
    tool, backend, query, sha = d["tool"], d["backend"], d["query"], d["image_sha256"]
    kinds = {s.cache_kind: s for s in specs.searches()}
    if tool not in kinds:
        raise bad(f"tool must be one of {', '.join(kinds)}")
    if not isinstance(backend, str) or not backend.isidentifier() or len(backend) > 40:
        raise bad("backend must be a short name")
    if not isinstance(query, str) or len(query) > MAX_QUERY_CHARS:
        raise bad(f"query must be a string of at most {MAX_QUERY_CHARS} characters")
    if not isinstance(sha,
                      str) or (sha and (len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha))):
        raise bad("image_sha256 must be empty or 64 lowercase hex digits")
    if not kinds[tool].per_image and (sha or not query):
        raise bad(f"a {tool} entry has a query and no image_sha256")
    if kinds[tool].per_image and (query or not sha):
        raise bad(f"an {tool} entry has an image_sha256 and an empty query")
    if query != normalise_query(query):
        raise bad("query is not in normalised form")
    params = d["params"]
    if not isinstance(params, dict) or len(params) > 20:
        raise bad("params must be an object of at most 20 fields")
    for k, v in params.items():
        if not isinstance(k, str) or len(k) > 40:
            raise bad("params keys must be short strings")
        if "key" in k.lower() or "token" in k.lower() or "secret" in k.lower():
            raise bad(f"params must not hold credentials ({k!r})")
        if not (v is None or isinstance(v, bool | int | str) or (isinstance(v, float) and math.isfinite(v))):
            raise bad(f"params[{k!r}] must be a string, number, boolean or null")
        if isinstance(v, str) and len(v) > 2048:
            raise bad(f"params[{k!r}] is too long")
    results = d["results"]
    if not isinstance(results, list) or len(results) > MAX_RESULTS:
        raise bad(f"results must be a list of at most {MAX_RESULTS}")
    for j, r in enumerate(results):
        if not isinstance(r, dict) or set(r) != set(MAX_FIELD_CHARS):
            raise bad(f"results[{j}] must have exactly the fields {', '.join(MAX_FIELD_CHARS)}")
        for f, limit in MAX_FIELD_CHARS.items():
            if not isinstance(r[f], str) or len(r[f]) > limit:
                raise bad(f"results[{j}].{f} must be a string of at most {limit} characters")
            if any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co") for c in r[f]):
                raise bad(f"results[{j}].{f} holds control characters")
        if r["url"] and not r["url"].startswith(("http://", "https://")):
            raise bad(f"results[{j}].url must be an http(s) URL or empty")
    raw = d.get("raw")
    if raw is not None and (not isinstance(raw, str) or len(raw) > MAX_RAW_CHARS):
        raise bad(f"raw must be null or a string of at most {MAX_RAW_CHARS} characters")
    fetched = d["fetched_at"]
    if isinstance(fetched, bool) or not isinstance(fetched,
                                                   int | float) or not math.isfinite(fetched) or fetched < 0:
        raise bad("fetched_at must be a non-negative number of seconds since 1970")
    if fetched > time.time() + 86400:
        raise bad("fetched_at is in the future")
    entry = CacheEntry(tool, backend, query, sha, dict(params), [dict(r) for r in results], raw,
                       float(fetched))
    if "key" in d and d["key"] != entry.key:
        raise bad("key does not match the entry's fields (edited by hand?)")
    return entry
