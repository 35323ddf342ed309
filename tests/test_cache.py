"""The SQLite search cache and `edge-agent cache`: storage, WAL sharing between processes, damage
handling, strict export/import, and prefetch-then-offline against real loopback servers."""

from __future__ import annotations

import io
import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from edge_agent.commands.cli import cli
from edge_agent.core.config import Settings
from edge_agent.core.errors import CacheError
from edge_agent.tools.cache import CacheEntry, SearchCache, make_key, normalise_query, parse_export
from edge_agent.tools.http import HttpPolicy
from edge_agent.tools.search import SearchTools

KEY = "sk-CACHE-TEST-key-5566778899"
FAST = HttpPolicy(timeout=0.5, retries=1, backoff=0.01, max_wait=0.5, max_bytes=200_000)


def entry(q: str = "eiffel tower", n: int = 2, **kw) -> CacheEntry:
    d = dict(
        tool="text_search",
        backend="wikipedia",
        query=normalise_query(q),
        image_sha256="",
        params={"url": "https://en.wikipedia.org/w/api.php", "top_k": 5},
        results=[{"title": f"T{i}", "url": f"https://x.example/{i}", "snippet": f"s{i}",
                  "source": "wikipedia"} for i in range(n)],
        raw='{"ok": true}',
        fetched_at=1_700_000_000.0,
    )
    d.update(kw)
    return CacheEntry(**d)


# --- storage ----------------------------------------------------------------------------------


def test_put_get_roundtrip_in_wal_mode(tmp_path):
    c = SearchCache(tmp_path / "c.sqlite3")
    e = entry()
    key = c.put(e)
    assert key == e.key == make_key("text_search", "wikipedia", "eiffel tower", "", e.params)
    got = c.get(key)
    assert got == e
    assert c.get("0" * 64) is None
    with sqlite3.connect(tmp_path / "c.sqlite3") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_key_ignores_case_and_spacing_but_not_params():
    a = entry("  Eiffel\tTower ")
    assert a.key == entry("eiffel tower").key
    assert a.key != entry("eiffel tower",
                          params={"url": "https://en.wikipedia.org/w/api.php", "top_k": 3}).key
    assert a.key != entry("eiffel tower", backend="searxng").key


def test_put_many_keep_newer(tmp_path):
    c = SearchCache(tmp_path / "c.sqlite3")
    c.put(entry(fetched_at=2000.0, raw="new"))
    assert c.put_many([entry(fetched_at=1000.0, raw="old")], keep_newer=True) == 0
    assert c.get(entry().key).raw == "new"
    assert c.put_many([entry(fetched_at=1000.0, raw="old")]) == 1
    assert c.get(entry().key).raw == "old"


def test_stats_and_clear(tmp_path):
    c = SearchCache(tmp_path / "c.sqlite3")
    # stats does not create the file
    assert c.stats()["exists"] is False and not (tmp_path / "c.sqlite3").exists()
    c.put_many([entry("a"), entry("b", fetched_at=1_800_000_000.0),
                entry(tool="image_search", backend="gcv", query="", image_sha256="ab" * 32)])
    st = c.stats()
    assert st["entries"] == 3 and st["by_backend"] == {"text_search/wikipedia": 2, "image_search/gcv": 1}
    assert st["oldest"] == 1_700_000_000.0 and st["newest"] == 1_800_000_000.0 and st["bytes"] > 0
    assert c.clear() == 3
    assert c.stats()["entries"] == 0


def test_a_corrupt_file_is_set_aside_and_a_new_cache_started(tmp_path):
    """Issue 23: a damaged cache is kept aside (tests/test_cli_saved_state.py salvages a damaged page)."""
    path = tmp_path / "c.sqlite3"
    path.write_bytes(b"this is not sqlite at all" * 100)
    c = SearchCache(path)
    assert c.get("k") is None and len(list(tmp_path.glob("c.sqlite3.damaged-*"))) == 1
    c.put(entry())
    assert c.get(entry().key) is not None


@pytest.mark.parametrize("make, words", [
    (lambda conn: conn.execute("CREATE TABLE notes (x)"), "not an edge-agent search cache"),
    (lambda conn: conn.execute("PRAGMA user_version=99"), "schema version 99"),
])
def test_foreign_sqlite_file_or_newer_schema_is_refused(tmp_path, make, words):
    """Another program's SQLite file, or a cache of a newer schema, is never written into: CacheError says
    why."""
    path = tmp_path / "c.sqlite3"
    with sqlite3.connect(path) as conn:
        make(conn)
    with pytest.raises(CacheError, match=words):
        SearchCache(path).get("k")


def test_cache_written_before_the_user_version_convention_is_read(tmp_path):
    """A cache that kept its version in a `meta` table (user_version 0) is read as it is, and then marked
    1."""
    path = tmp_path / "c.sqlite3"
    e = entry()
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute("INSERT INTO meta VALUES ('schema_version', '1')")
        conn.execute("CREATE TABLE entries (key TEXT PRIMARY KEY, tool TEXT NOT NULL, backend TEXT NOT NULL, "
                     "query TEXT NOT NULL, image_sha256 TEXT NOT NULL, params TEXT NOT NULL, results TEXT "
                     "NOT NULL, "
                     "raw TEXT, fetched_at REAL NOT NULL)")
        conn.execute("INSERT INTO entries VALUES (?,?,?,?,?,?,?,?,?)",
                     (e.key, e.tool, e.backend, e.query, e.image_sha256, json.dumps(e.params),
                      json.dumps(e.results),
                      e.raw, e.fetched_at))
    assert SearchCache(path).get(e.key) == e
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1


def test_a_corrupt_cache_under_the_search_tool_is_replaced(tmp_path):
    """A damaged cache is not a tool failure the model should see: it is set aside and the search goes on."""
    (tmp_path / "search-cache.sqlite3").write_bytes(b"garbage" * 1000)
    t = SearchTools.from_settings(Settings(home=tmp_path, offline=True), policy=FAST)
    assert t.text_search("q").status == "offline"
    assert list(tmp_path.glob("search-cache.sqlite3.damaged-*"))


_WRITER = r"""
import sys, time
from edge_agent.tools.cache import CacheEntry, SearchCache
c = SearchCache(sys.argv[1])
tag = sys.argv[2]
for i in range(150):
    c.put(CacheEntry("text_search", "wikipedia", f"{tag} {i}", "", {"top_k": 5},
                     [{"title": tag, "url": "", "snippet": "", "source": "wikipedia"}], None, time.time()))
    assert c.get(CacheEntry("text_search", "wikipedia", f"{tag} {i}", "", {"top_k": 5}, []).key) is not None
print("done", tag)
"""


def test_two_processes_share_one_cache(tmp_path):
    """Two processes writing and reading the same file at once: no 'database is locked', nothing lost."""
    path = tmp_path / "shared.sqlite3"
    root = Path(__file__).resolve().parents[1]
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(path), tag], cwd=root, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for tag in ("alpha", "beta")
    ]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    assert SearchCache(path).stats()["entries"] == 300


# --- export / import ---------------------------------------------------------------------------------


def test_export_import_roundtrip(tmp_path):
    a = SearchCache(tmp_path / "a.sqlite3")
    src = [entry("one"), entry("two", n=0),
           entry(tool="image_search", backend="gcv", query="", image_sha256="cd" * 32, raw=None)]
    a.put_many(src)
    n = a.export(tmp_path / "x.json")
    assert n == 3
    doc = json.loads((tmp_path / "x.json").read_text())
    assert doc["format"] == "edge-agent-search-cache" and doc["version"] == 1
    b = SearchCache(tmp_path / "b.sqlite3")
    assert b.import_file(tmp_path / "x.json") == (3, 3)
    assert sorted(b.entries(), key=lambda e: e.key) == sorted(src, key=lambda e: e.key)
    # importing again changes nothing (same fetched_at); JSON lines of entries are accepted too
    assert b.import_file(tmp_path / "x.json") == (3, 0)
    lines = "\n".join(json.dumps(e) for e in doc["entries"])
    (tmp_path / "x.jsonl").write_text(lines)
    assert len(parse_export(lines)) == 3


def _export_with(tmp_path: Path, mutate) -> Path:
    e = entry().to_json()
    mutate(e)
    doc = {"format": "edge-agent-search-cache", "version": 1, "entries": [entry("ok").to_json(), e]}
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    return p


@pytest.mark.parametrize(
    ("mutate", "words"),
    [
        (lambda e: e.update(extra=1), "unknown field"),
        (lambda e: e.pop("results"), "missing field"),
        (lambda e: e.update(tool="shell"), "tool must be one of"),
        (lambda e: e.update(query="Not Normalised"), "normalised"),
        (lambda e: e.update(key="0" * 64), "key does not match"),
        (lambda e: e["results"][0].update(snippet="bell\x07"), "control characters"),
        (lambda e: e["results"][0].update(url="file:///etc/passwd"), "http(s) URL"),
        (lambda e: e["results"][0].update(evil="x"), "exactly the fields"),
        (lambda e: e["params"].update(api_key="x"), "credentials"),
        (lambda e: e.update(fetched_at="yesterday"), "fetched_at"),
        (lambda e: e.update(fetched_at=time.time() + 10 * 86400), "future"),
        (lambda e: e.update(image_sha256="../../etc"), "image_sha256"),
        (lambda e: e.update(raw={"__class__": "os.system"}), "raw must be"),
    ],
)
def test_import_rejects_bad_entries_and_writes_nothing(tmp_path, mutate, words):
    p = _export_with(tmp_path, mutate)
    c = SearchCache(tmp_path / "c.sqlite3")
    with pytest.raises(CacheError, match="entry 2") as exc:
        c.import_file(p)
    assert words in str(exc.value)
    assert c.stats()["entries"] == 0  # the valid first entry was not written either


@pytest.mark.parametrize(
    "text",
    ["not json", '{"format": "something-else", "version": 1, "entries": []}',
     '{"format": "edge-agent-search-cache", "version": 7, "entries": []}', "[1, 2]"],
)
def test_import_rejects_bad_files(tmp_path, text):
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(CacheError):
        SearchCache(tmp_path / "c.sqlite3").import_file(p)


def test_import_never_unpickles(tmp_path):
    """A pickle file is just invalid input."""
    import pickle

    p = tmp_path / "evil.json"
    p.write_bytes(pickle.dumps({"format": "edge-agent-search-cache"}))
    with pytest.raises(CacheError):
        SearchCache(tmp_path / "c.sqlite3").import_file(p)


# --- CLI -----------------------------------------------------------------------------------------------


@pytest.fixture
def home(edge_home, monkeypatch):
    monkeypatch.setenv("EDGE_AGENT_SEARCH_TIMEOUT", "2")
    return edge_home


def run(*args: str, input: str | None = None):
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


def write_png(path: Path, color: tuple[int, int, int]) -> Path:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (20, 20), color).save(buf, "PNG")
    path.write_bytes(buf.getvalue())
    return path


def test_cli_prefetch_then_offline_answers_from_the_cache(home, tmp_path, fake, monkeypatch):
    """The issue's 'done when': searches run while online are served offline with the same results."""
    wiki, gcv = fake("wikipedia"), fake("gcv")
    monkeypatch.setenv("EDGE_AGENT_WIKIPEDIA_URL", wiki.url)
    monkeypatch.setenv("EDGE_AGENT_IMAGE_SEARCH", "gcv")
    monkeypatch.setenv("EDGE_AGENT_GCV_URL", gcv.url)
    monkeypatch.setenv("EDGE_AGENT_GCV_API_KEY", KEY)
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    write_png(imgs / "a.png", (1, 2, 3))
    write_png(imgs / "b.png", (4, 5, 6))
    qfile = tmp_path / "trip.jsonl"
    qfile.write_text(
        json.dumps({"text_queries": ["louvre opening hours", "Louvre  opening HOURS", "seine bridges"],
                    "images": ["imgs/a.png"]})
        + "\n\n"
        + json.dumps({"id": "q1", "image": "imgs/b.png", "question": "What is this building?",
                      "answers": ["x"]})
        + "\n"
    )
    r = run("cache", "prefetch", str(qfile))
    assert r.exit_code == 0, r.output
    assert "done: 5 fetched, 0 already cached" in r.output  # the duplicate query was searched once
    assert wiki.count == 3 and gcv.count == 2
    r = run("cache", "prefetch", str(qfile), "--json")
    assert json.loads(r.output.strip().splitlines()[-1])["summary"]["cached"] == 5

    monkeypatch.setenv("EDGE_AGENT_OFFLINE", "1")
    monkeypatch.delenv("EDGE_AGENT_GCV_API_KEY")
    t = SearchTools.from_settings(Settings.load(), policy=FAST)
    assert t.text_search("seine bridges").status == "cached"
    assert t.text_search("what is this building?").status == "cached"
    assert t.image_search_file(imgs / "a.png").status == "cached"
    assert t.image_search_file(imgs / "b.png").status == "cached"
    assert t.text_search("eiffel").status == "offline"
    assert wiki.count == 3 and gcv.count == 2

    r = CliRunner().invoke(cli, ["cache", "prefetch", str(qfile)])
    assert r.exit_code == 2 and "offline" in r.output


def test_cli_prefetch_reports_bad_lines(home, tmp_path):
    qfile = tmp_path / "q.jsonl"
    qfile.write_text('{"text_queries": ["a"]}\n{"images": ["missing.png"]}\n')
    r = CliRunner().invoke(cli, ["cache", "prefetch", str(qfile)])
    assert r.exit_code == 2 and "line 2" in r.output and "image not found" in r.output
    qfile.write_text('{"foo": 1}\n')
    r = CliRunner().invoke(cli, ["cache", "prefetch", str(qfile)])
    assert r.exit_code == 2 and "line 1" in r.output


def test_cli_prefetch_failures_exit_nonzero(home, tmp_path, fake, monkeypatch):
    wiki = fake("wikipedia")
    monkeypatch.setenv("EDGE_AGENT_WIKIPEDIA_URL", wiki.url)
    wiki.fail_next("bad_json")
    qfile = tmp_path / "q.jsonl"
    qfile.write_text('{"text_queries": ["a", "b"]}\n')
    r = CliRunner().invoke(cli, ["cache", "prefetch", str(qfile)])
    assert r.exit_code == 1
    assert "1 fetched" in r.output and "1 failed (0 with an older copy kept)" in r.output
    assert 'error   text  "a" -> response is not valid JSON' in r.output


def test_cli_stats_export_import_clear(home, tmp_path, monkeypatch):
    SearchCache(Settings.load().cache_path).put_many([entry("a"), entry("b")])
    r = run("cache", "stats")
    assert "entries: 2" in r.output and "text_search/wikipedia" in r.output
    assert json.loads(run("cache", "stats", "--json").output)["entries"] == 2
    out = tmp_path / "e.json"
    assert "exported 2 entries" in run("cache", "export", str(out)).output
    r = run("cache", "clear", input="n\n")
    assert r.exit_code == 1 and json.loads(run("cache", "stats", "--json").output)["entries"] == 2
    assert "2 entries removed" in run("cache", "clear", "--yes").output
    assert "imported 2 of 2" in run("cache", "import", str(out)).output
    out.write_text('{"format": "edge-agent-search-cache", "version": 1, "entries": [{"tool": "x"}]}')
    r = CliRunner().invoke(cli, ["cache", "import", str(out)])
    assert r.exit_code == 2 and r.output.startswith("Error: Cache problem:")


def test_cli_on_a_corrupt_cache(home):
    (home / "search-cache.sqlite3").write_bytes(b"\x00garbage" * 500)
    r = CliRunner().invoke(cli, ["cache", "stats"])
    assert r.exit_code == 0 and "was damaged" in r.output and "Traceback" not in r.output
    assert run("cache", "clear", "--yes").exit_code == 0
    assert json.loads(run("cache", "stats", "--json").output)["entries"] == 0


def test_export_after_a_keyed_search_has_no_key(home, tmp_path, fake, monkeypatch):
    lens = fake("serpapi")
    lens.fail_next("echo")
    monkeypatch.setenv("EDGE_AGENT_IMAGE_SEARCH", "serpapi")
    monkeypatch.setenv("EDGE_AGENT_SERPAPI_URL", lens.url)
    monkeypatch.setenv("EDGE_AGENT_SERPAPI_API_KEY", KEY)
    monkeypatch.setenv("EDGE_AGENT_PUBLIC_IMAGE_URL_PREFIX", "https://pub.example/")
    qfile = tmp_path / "q.jsonl"
    qfile.write_text(json.dumps({"images": [str(write_png(tmp_path / "i.png", (1, 1, 1)))]}) + "\n")
    assert run("cache", "prefetch", str(qfile)).exit_code == 0
    assert KEY in lens.requests[0].path
    out = tmp_path / "e.json"
    run("cache", "export", str(out))
    text = out.read_text()
    assert KEY not in text and "api_key=***" in text


def test_clear_never_deletes_a_healthy_file_that_is_merely_locked(tmp_path):
    path = tmp_path / "c.sqlite3"
    SearchCache(path).put(entry())
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process is writing
    try:
        with pytest.raises(CacheError, match="locked"):
            SearchCache(path, busy_timeout=0.2).clear()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert SearchCache(path).get(entry().key) is not None


def test_export_and_import_scrub_secrets_that_slipped_in(tmp_path):
    """Belt and braces: a key stored by some older version is removed on export and on import."""
    c = SearchCache(tmp_path / "c.sqlite3")
    leaky = entry(raw=f'{{"u": "https://x/?api_key={KEY}"}}')
    leaky.results[0]["snippet"] = f"token {KEY} here"
    c.put(leaky)
    out = tmp_path / "e.json"
    c.export(out, secrets=[KEY])
    assert KEY not in out.read_text() and "token *** here" in out.read_text()
    raw_doc = {"format": "edge-agent-search-cache", "version": 1, "entries": [leaky.to_json()]}
    src = tmp_path / "leaky.json"
    src.write_text(json.dumps(raw_doc))
    d = SearchCache(tmp_path / "d.sqlite3")
    d.import_file(src, secrets=[KEY])
    assert KEY.encode() not in b"".join(p.read_bytes() for p in tmp_path.glob("d.sqlite3*"))


def test_cli_stats_show_and_clear_removes_saved_context_states(home):
    """Saved context states count in `cache stats` against their budget and go with `cache clear`
    (unless --searches-only)."""
    import numpy as np

    from edge_agent.runtime.state import SessionState, StateStore, sequence_key

    s = Settings.load()
    store = StateStore(s.states_dir, s.state_cache_mb * 2**20)
    for i in range(2):
        st = SessionState(identity={"m": 1}, key=sequence_key({"m": 1}, [i], []), history=[i], images=[],
                          n_pos=1,
                          n_cells=1, logits=np.zeros(8, np.float32), kv=np.zeros(2**20, np.uint8))
        store.put(st, wait=True)
    r = run("cache", "stats")
    assert "context states: 2 in" in r.output and "of 2048 MiB" in r.output
    states = json.loads(run("cache", "stats", "--json").output)["states"]
    assert states["files"] == 2 and states["bytes"] > 2 * 2**20 and states["budget"] == 2048 * 2**20
    assert "0 saved context states" not in run("cache", "clear", "--yes", "--searches-only").output
    assert store.stats()["files"] == 2
    assert "2 saved context states removed" in run("cache", "clear", "--yes").output
    assert store.stats()["files"] == 0
