"""`edge-agent chats`: the saved chats, newest first, with the ids `ask --chat ID` takes; `chats show ID`
prints one; `chats export ID` writes it as Markdown or JSON (what the app's export writes); `chats rename` and
`chats delete` do what the app's chat list does (Ctrl+O, r and d), never while the chat is being answered.

Reads the one chat store the app and `ask` write (edge_agent.chat.store). Knows nothing of models.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import click

from edge_agent.agent import events as ev
from edge_agent.core.config import Settings
from edge_agent.tools import observations


@contextmanager
def _store(settings: Settings) -> Iterator[Any]:
    from edge_agent.chat.store import ChatStore

    store = ChatStore(settings.chats_path, secrets=settings.secrets())
    try:
        yield store
    finally:
        store.close()


_LIMIT = click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True,
                      help="Most chats to list.")
_JSON = click.option("--json", "as_json", is_flag=True, help="One JSON object per chat per line.")


@click.group("chats", invoke_without_command=True)
@_LIMIT
@_JSON
@click.pass_context
def command(ctx: click.Context, limit: int, as_json: bool) -> None:
    """List saved chats: id, last activity, messages, title.

    \b
    Examples:
      edge-agent chats                       (or: edge-agent chats list)
      edge-agent chats show 12
      edge-agent chats export 12 -o chat.md
      edge-agent chats export 12 --format json > chat.json
      edge-agent chats rename 12 "Bike shop"
      edge-agent chats delete 12 13 --yes
      edge-agent ask --chat 12 "And the door?"
    """
    if ctx.invoked_subcommand is None:
        _list(limit, as_json)


@command.command("list")
@_LIMIT
@_JSON
def list_(limit: int, as_json: bool) -> None:
    """List saved chats (as `edge-agent chats` alone does)."""
    _list(limit, as_json)


def _list(limit: int, as_json: bool) -> None:
    settings = Settings.load()
    if not settings.chats_path.exists():
        if not as_json:
            click.echo("No chats yet. Ask a question: edge-agent ask photo.jpg \"What is this?\"")
        return
    with _store(settings) as store:
        chats = store.list_chats()[:limit]
    for c in chats:
        if as_json:
            click.echo(json.dumps({"id": c.id, "title": c.title, "updated": c.updated,
                                   "messages": c.n_messages},
                                  ensure_ascii=False))
        else:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(c.updated))
            click.echo(f"{c.id:>5}  {when}  {c.n_messages:>3} msgs  {c.title}")
    if not chats and not as_json:
        click.echo("No chats yet.")


@command.command("show")
@click.argument("chat_id", type=int, metavar="ID")
def show(chat_id: int) -> None:
    """Print chat ID: its questions, images and answers (an answer that did not finish says how it ended)."""
    with _store(Settings.load()) as store:
        chat = store.load(chat_id)
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(chat.updated))
    click.echo(f"chat {chat.id}: {chat.title}  ({len(chat.messages)} messages, {when})")
    if chat.models.get("model"):
        click.echo("models: " + ", ".join(f"{k} {Path(chat.models[k]).name}"
                                          for k in ("model", "mmproj", "prophet",
                                                    "prophet_mmproj") if chat.models.get(k)))
    for m in chat.messages:
        if m.role == "user":
            click.echo(f"\nYou: {m.text}" + "".join(f"\n  image: {p}" for p in m.images))
        else:
            ended = "" if m.status in ("answered", "done") else f" ({m.status})"
            click.echo(f"edge-agent{ended}: {m.text or '(no answer)'}")
            if m.text and (without := ev.searches_without(m.events)):
                click.echo(f"  note: {observations.answered_without(without)}")
    click.echo(f"\nContinue it: edge-agent ask --chat {chat.id} \"question\"", err=True)


@command.command("export")
@click.argument("chat_id", type=int, metavar="ID")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="File to write (Markdown: its images are copied into FILE_files/ beside it). Default: "
                   "stdout.")
@click.option("--format", "fmt", type=click.Choice(["md", "json"]), default=None,
              help="md (default) or json; with -o, taken from the file's suffix when not given.")
def export(chat_id: int, output: Path | None, fmt: str | None) -> None:
    """Write chat ID as Markdown (tool calls, crops, rationale scores) or JSON (every event)."""
    from edge_agent.chat import export as chat_export

    if fmt is None:
        fmt = "json" if output is not None and output.suffix.lower() == ".json" else "md"
    with _store(Settings.load()) as store:
        if output is None:
            text = chat_export.export_markdown(store, chat_id) if fmt == "md" else json.dumps(
                chat_export.export_json(store, chat_id), indent=2, ensure_ascii=False)
            click.echo(text.rstrip("\n"))
            return
        chat_export.export_to(store, chat_id, **({"md": output} if fmt == "md" else {"json_path": output}))
    click.echo(f"chat {chat_id} written to {output}", err=True)


def _unused(settings: Settings, chat_id: int) -> AbstractContextManager[Any]:
    """Chat ``chat_id``'s lock held for the block, or ChatBusy naming who answers in it
    (edge_agent.chat.lock)."""
    from edge_agent.chat.lock import ChatLock

    return ChatLock(settings.home, chat_id, "edge-agent chats").holding(timeout=0)


@command.command("rename")
@click.argument("chat_id", type=int, metavar="ID")
@click.argument("title", nargs=-1, required=True)
def rename(chat_id: int, title: tuple[str, ...]) -> None:
    """Give chat ID the title TITLE (the words after ID; quotes not needed)."""
    settings = Settings.load()
    with _store(settings) as store, _unused(settings, chat_id):
        old = store.load(chat_id).title  # no such chat: says so
        store.rename(chat_id, " ".join(title))
        click.echo(f'chat {chat_id}: "{old}" renamed "{store.load_title(chat_id)}"')


@command.command("delete")
@click.argument("chat_ids", type=int, nargs=-1, required=True, metavar="ID...")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def delete(chat_ids: tuple[int, ...], yes: bool) -> None:
    """Delete chats for good: their questions, answers and traces (`chats export ID` keeps a copy).

    Every ID is checked before any is deleted: an unknown one deletes none."""
    settings = Settings.load()
    with _store(settings) as store:
        chats = {i: store.load(i) for i in dict.fromkeys(chat_ids)}  # no such chat: says so, deletes none
        if not yes:
            listed = "; ".join(f'chat {c.id} "{c.title}" ({len(c.messages)} messages)'
                               for c in chats.values())
            click.confirm(f"Delete {listed} for good?", abort=True)
        for c in chats.values():
            with _unused(settings, c.id):
                store.delete(c.id)
            click.echo(f'deleted chat {c.id} "{c.title}" ({len(c.messages)} messages)')
