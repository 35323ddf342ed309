"""`edge-agent chats`: the saved chats, newest first, with the ids `ask --chat ID` takes.

Reads the one chat store the app and `ask` write (edge_agent.chats). Knows nothing of models.
"""

from __future__ import annotations

import json
import time

import click

from edge_agent.config import Settings


@click.command("chats")
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True, help="Most chats to list.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per chat per line.")
def command(limit: int, as_json: bool) -> None:
    """List saved chats: id, last activity, messages, title.

    \b
    Examples:
      edge-agent chats
      edge-agent ask --chat 12 "And the door?"
    """
    from edge_agent.chats import ChatStore

    settings = Settings.load()
    if not settings.chats_path.exists():
        if not as_json:
            click.echo("No chats yet. Ask a question: edge-agent ask photo.jpg \"What is this?\"")
        return
    store = ChatStore(settings.chats_path, secrets=settings.secrets())
    try:
        chats = store.list_chats()[:limit]
    finally:
        store.close()
    for c in chats:
        if as_json:
            click.echo(json.dumps({"id": c.id, "title": c.title, "updated": c.updated, "messages": c.n_messages},
                                  ensure_ascii=False))
        else:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(c.updated))
            click.echo(f"{c.id:>5}  {when}  {c.n_messages:>3} msgs  {c.title}")
    if not chats and not as_json:
        click.echo("No chats yet.")
