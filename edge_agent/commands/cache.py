"""`edge-agent cache`: inspect, export, import, clear and prefetch the search cache; saved context states.

The cache is ``HOME/search-cache.sqlite3`` (see :mod:`edge_agent.tools.cache`). Only ``prefetch`` touches the
network; everything else works offline. Exports are JSON; imports are validated field by field. The
saved context states (``HOME/states``, see :mod:`edge_agent.runtime.state`) show in ``stats`` and are
cleared with the cache (``clear --searches-only`` keeps them).
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from edge_agent.core.config import Settings
from edge_agent.core.errors import EdgeAgentError


def _cache(settings: Settings):
    from edge_agent.tools.cache import SearchCache

    return SearchCache(settings.cache_path)


def _states(settings: Settings):
    from edge_agent.runtime.state import StateStore

    return StateStore(settings.states_dir, settings.state_cache_mb * 2**20)


def _when(ts: float | None) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC") if ts else "-"


@click.group("cache")
def command() -> None:
    """Inspect, export, import, clear or prefetch the search cache.

    \b
    Examples:
      edge-agent cache stats
      edge-agent cache prefetch trip.jsonl      run the searches a trip will need, while online
      edge-agent cache export cache.json        share or back up (API keys are never in it)
      edge-agent cache import cache.json
      edge-agent cache clear --yes
    """


@command.command("stats")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def stats(as_json: bool) -> None:
    """Entries per tool and backend, dates and size on disk; saved context states and their budget."""
    s = Settings.load()
    st = _cache(s).stats()
    states = _states(s).stats()
    if as_json:
        click.echo(json.dumps({**st, "states": {**states, "path": str(s.states_dir)}}, indent=2))
        return
    click.echo(f"cache:   {st['path']}{'' if st['exists'] else ' (not created yet)'}")
    click.echo(f"entries: {st['entries']}")
    for name, n in sorted(st["by_backend"].items()):
        click.echo(f"  {name:<24} {n}")
    click.echo(f"oldest:  {_when(st['oldest'])}")
    click.echo(f"newest:  {_when(st['newest'])}")
    click.echo(f"size:    {st['bytes'] / 1024:.1f} KiB")
    click.echo(f"context states: {states['files']} in {s.states_dir}, {states['bytes'] / 2**20:.1f} MiB "
               f"of {states['budget'] / 2**20:.0f} MiB (state_cache_mb; least recently used out)")


@command.command("export")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--no-raw", is_flag=True, help="Leave out the raw responses (smaller; results are kept).")
def export(file: Path, no_raw: bool) -> None:
    """Write every cached search to FILE (JSON)."""
    s = Settings.load()
    n = _cache(s).export(file, include_raw=not no_raw, secrets=s.secrets())
    click.echo(f"exported {n} entries to {file}")


@command.command("import")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--replace", is_flag=True, help="Overwrite cached entries even when the cached copy is newer.")
def import_(file: Path, replace: bool) -> None:
    """Add the searches in FILE (made by `cache export`) to the cache. Validated; nothing is executed."""
    s = Settings.load()
    total, written = _cache(s).import_file(file, replace=replace, secrets=s.secrets())
    click.echo(f"imported {written} of {total} entries from {file}" + ("" if written == total else " (newer "
                                                                                                   "copies "
                                                                                                   "kept)"))


@command.command("clear")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--searches-only", is_flag=True, help="Keep the saved context states.")
def clear(yes: bool, searches_only: bool) -> None:
    """Delete every cached search and saved context state (also repairs a damaged cache file by deleting it).

    Saved context states only save time: without them a chat's image and history are read again."""
    s = Settings.load()
    cache = _cache(s)
    if not yes:
        what = "every cached search" + ("" if searches_only else " and saved context state")
        click.confirm(f"Delete {what} in {s.home}?", abort=True)
    n = cache.clear()
    click.echo(f"cleared {cache.path} ({n} entries removed)")
    if not searches_only:
        k = _states(s).clear()
        click.echo(f"cleared {s.states_dir} ({k} saved context states removed)")


@command.command("prefetch")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--refresh", is_flag=True, help="Search again even when a fresh copy is cached.")
@click.option("--no-images", is_flag=True, help="Skip image searches.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per search, then a summary.")
def prefetch(file: Path, refresh: bool, no_images: bool, as_json: bool) -> None:
    """Run the searches in FILE now, while online, so they work offline later.

    \b
    FILE is JSON lines; each line is either
      {"text_queries": ["eiffel tower height", ...], "images": ["photos/a.jpg", ...]}
    or an eval question {"id": ..., "image": "a.jpg", "question": "...", "answers": [...]}
    (the question text is searched, and the image is reverse-searched).
    Image paths are relative to FILE. Exits with 1 if any search failed.
    """
    from edge_agent.tools.search import SearchTools, load_image_for_search

    s = Settings.load()
    if s.offline:
        raise EdgeAgentError("prefetch needs the network, but offline is on. Run it with "
                             "EDGE_AGENT_OFFLINE=0.", "Offline")
    queries, images = read_prefetch_file(file)
    tools = SearchTools.from_settings(s)
    problem = tools.text_backend.missing()
    if problem and queries:
        raise EdgeAgentError(problem[0].upper() + problem[1:], "Search not configured")
    if images and not no_images and tools.image_backend.missing():
        click.echo(f"note: {tools.image_backend.missing()} Skipping {len(images)} image(s).", err=True)
        no_images = True
    counts: Counter[str] = Counter()

    def report(kind: str, label: str, out: Any) -> None:
        counts[out.status] += 1
        if as_json:
            click.echo(json.dumps({"tool": kind, "input": label, "status": out.status,
                                   "results": len(out.results),
                                   "seconds": round(out.seconds, 3), "error": out.error}))  # fmt: skip
        else:
            what = out.error if out.status in ("error", "unconfigured") else f"{len(out.results)} results"
            if out.status == "stale":
                what += f"; kept the older copy ({out.error})"
            click.echo(f"{out.status:<7} {kind:<5} {label} -> {what}")

    try:
        for q in queries:
            report("text", json.dumps(q, ensure_ascii=False), tools.text_search(q, refresh=refresh))
        for path in [] if no_images else images:
            try:
                data, mime = load_image_for_search(path)
            except EdgeAgentError as e:
                counts["error"] += 1
                click.echo(f"error   image {path}: {e.message}", err=True)
                continue
            report("image", str(path), tools.image_search(data, mime, refresh=refresh))
    finally:
        tools.close()
    summary = {k: counts.get(k, 0) for k in ("live", "cached", "stale", "error", "unconfigured", "offline")}
    if as_json:
        click.echo(json.dumps({"summary": summary, "cache": str(s.cache_path)}))
    else:
        failed = summary["error"] + summary["stale"]
        click.echo(
            f"done: {summary['live']} fetched, {summary['cached']} already cached, {failed} failed "
            f"({summary['stale']} with an older copy kept); cache {s.cache_path}"
        )
    if summary["error"] or summary["stale"]:
        click.get_current_context().exit(1)


def read_prefetch_file(file: Path) -> tuple[list[str], list[Path]]:
    """The distinct text queries and image paths in a prefetch file, in order. Raises EdgeAgentError."""
    from edge_agent.tools.text import query_key  # what the cache keys by: one search per key

    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise EdgeAgentError(f"Cannot read {file} as UTF-8 text ({e}).", "Bad prefetch file") from None
    queries: list[str] = []
    images: list[Path] = []
    seen_q: set[str] = set()
    seen_i: set[Path] = set()

    def bad(n: int, msg: str) -> EdgeAgentError:
        return EdgeAgentError(
            f"{file} line {n}: {msg}. Each line must be a JSON object with \"text_queries\" and/or "
            f"\"images\" lists, "
            'or an eval question {"id", "image", "question", "answers"}.',
            "Bad prefetch file",
        )

    def add_query(n: int, q: Any) -> None:
        if not isinstance(q, str):
            raise bad(n, "queries must be strings")
        if q.strip() and query_key(q) not in seen_q:
            seen_q.add(query_key(q))
            queries.append(q.strip())

    def add_image(n: int, p: Any) -> None:
        if not isinstance(p, str) or not p.strip():
            raise bad(n, "image paths must be non-empty strings")
        path = Path(p).expanduser()
        if not path.is_absolute():
            path = file.parent / path
        if not path.is_file():
            raise bad(n, f"image not found: {path}")
        if path not in seen_i:
            seen_i.add(path)
            images.append(path)

    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as e:
            raise bad(n, f"not valid JSON ({e})") from None
        if not isinstance(obj, dict):
            raise bad(n, "not a JSON object")
        known = False
        for key, add in (("text_queries", add_query), ("images", add_image)):
            if key in obj:
                known = True
                if not isinstance(obj[key], list):
                    raise bad(n, f'"{key}" must be a list')
                for item in obj[key]:
                    add(n, item)
        if "question" in obj:
            known = True
            add_query(n, obj["question"])
        if obj.get("image") is not None:
            known = True
            add_image(n, obj["image"])
        if not known:
            raise bad(n, "no text_queries, images, question or image")
    return queries, images

