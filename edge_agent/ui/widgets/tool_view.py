"""A tool call and its result inside a turn's reasoning block.

Zoom: the crop next to the original with the box drawn on it. Searches: the results with a badge
saying where they came from (live, cached, stale, offline). Failures: the observation in red.
"""

from __future__ import annotations

import json

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Static

from edge_agent.agent import events as ev
from edge_agent.ui.widgets.preview import ImagePreview
from edge_agent.ui.widgets.put import put

BADGE_STYLES = {
    "live": "black on green",
    "cached": "black on cyan",
    "stale": "black on yellow",
    "offline": "white on grey37",
    "unreachable": "white on grey37",  # no network: the tool is withdrawn for the rest of the question
    "unconfigured": "white on grey37",
    "local": "black on blue",
    "error": "white on red",
}


def badge(status: str) -> Text:
    return Text(f" {status} ", style=BADGE_STYLES.get(status, "reverse"))


def call_text(e: ev.ToolCalled) -> Text:
    t = Text()
    t.append("call ", style="dim")
    t.append(e.name, style="bold cyan")
    t.append(" " + json.dumps(e.arguments, ensure_ascii=False), style="cyan")
    return t


def results_text(e: ev.ToolFinished) -> Text:
    t = Text()
    for i, r in enumerate(e.results, 1):
        if i > 1:
            t.append("\n")
        t.append(f"{i}. ", style="dim")
        t.append(str(r.get("title", "")), style="bold")
        if r.get("url"):
            t.append(f"  {r['url']}", style="dim underline")
        if r.get("snippet"):
            t.append(f"\n   {r['snippet']}")
    return t


class ToolView(Vertical):
    """One Static for the call, badge and results (few widgets: long chats stay fast to lay out),
    plus the two previews for a zoom."""

    DEFAULT_CSS = """
    ToolView { height: auto; }
    ToolView .tool-body { height: auto; }
    ToolView .tool-images { height: auto; }
    ToolView .tool-images ImagePreview { margin: 0 2 0 0; }
    """

    def __init__(self, called: ev.ToolCalled | None, images: dict[int, str]) -> None:
        super().__init__(classes="tool")
        self.called = called
        self.images = images
        self.finished: ev.ToolFinished | None = None
        self.body = Static(call_text(called) if called is not None else "", classes="tool-body")

    def compose(self) -> ComposeResult:
        yield self.body

    async def finish(self, e: ev.ToolFinished) -> None:
        self.finished = e
        t = call_text(self.called) if self.called is not None else Text()
        if self.called is not None:
            t.append("\n")
        t.append_text(badge(e.status if e.ok or e.status in ("unreachable", "unconfigured",
                                                             "offline") else "error"))
        t.append(f" {e.name} ", style="bold")
        t.append("ok" if e.ok else "failed", style="green" if e.ok else "red")
        n = len(e.results)
        if n:
            t.append(f", {n} result{'s' if n != 1 else ''}", style="dim")
        if not e.ok:
            t.append("\n" + e.observation, style="red")
        elif e.results:
            t.append("\n")
            t.append_text(results_text(e))
        elif e.observation and not e.image_path:
            t.append("\n" + e.observation[:500], style="dim")
        self.body.update(t)
        if e.ok and e.image_path:
            if e.image_index is not None:
                self.images[e.image_index] = e.image_path
            args = self.called.arguments if self.called is not None else {}
            src = self.images.get(int(args.get("img_idx", 0) or 0)) if isinstance(args, dict) else None
            previews = []
            if src:
                previews.append(ImagePreview(src, width=24, height=8, box=args.get("bbox_2d"),
                                             classes="zoom-original"))
            previews.append(ImagePreview(e.image_path, width=24, height=8, classes="zoom-crop"))
            await put(self, Horizontal(*previews, classes="tool-images"))
