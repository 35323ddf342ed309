"""The status bar: models, mode, SeProD, online/offline, tokens per second, engine state.

"offline" is shown when the setting says so, and also when the last search could not reach the
network (``network_down``, set from the agent's events) until a search gets through again. A narrow
terminal drops the least needed parts first (the context, tokens per second, SeProD, the mode, the
prophet), then shortens the model's name: the engine state and the network state always show.
"""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from edge_agent.core.config import Settings

# The reasoning modes as the app names them, in the order Ctrl+R goes through them.
MODE_LABEL = {"ssr": "SSR", "freeform": "free-form", "direct": "direct"}


def next_mode(mode: str) -> str:
    """The mode after ``mode`` (Ctrl+R): SSR -> free-form -> direct (a plain chat) -> SSR."""
    order = list(MODE_LABEL)
    return order[(order.index(mode) + 1) % len(order)] if mode in order else order[0]


def model_label(value: str) -> str:
    """A catalog name stays as it is; a path shows its file name."""
    if not value:
        return ""
    return Path(value).stem if ("/" in value or value.endswith(".gguf")) else value


class StatusBar(Static):
    DEFAULT_CSS = """
    StatusBar { height: 1; background: $panel; color: $text; padding: 0 1; }
    """

    state = reactive("starting")  # starting | loading | ready | busy | no model
    tokens_per_second: reactive[float | None] = reactive(None)
    network_down = reactive(False)  # the last search found the network unreachable
    context = reactive("")  # how the last question's context was opened: live, restored, rebuilt, new

    def __init__(self, settings: Settings, **kw) -> None:
        super().__init__(**kw)
        self.settings = settings
        self.model_name = model_label(settings.model) or "default model"
        self.prophet_name = model_label(settings.prophet)
        self.text_only = False

    def set_settings(self, settings: Settings) -> None:
        self.settings = settings
        self.refresh_bar()

    def set_models(self, model: str, prophet: str | None, text_only: bool = False) -> None:
        self.model_name, self.prophet_name, self.text_only = model, prophet or "", text_only
        self.refresh_bar()

    def refresh_bar(self) -> None:
        self.refresh()  # the reactives above repaint by themselves; settings and models do not

    def parts(self) -> list[tuple[int, Text]]:
        """The bar's parts in order, each with its rank: below 5 (context, speed, the prophet's name) dropped,
        lowest first, when space is short; then the model's name (5) is cut short; the mode, SeProD, the
        network and the state always stay."""
        s = self.settings
        model = Text()
        model.append(self.model_name, style="bold")
        if self.text_only:
            model.append(" (text only)", style="yellow")
        out = [(5, model)]
        if self.prophet_name:
            out.append((2, Text(f" + prophet {self.prophet_name}", style="magenta")))  # glued to the model
        mode = Text()
        mode.append(MODE_LABEL.get(s.mode, s.mode), style="bold cyan")
        if s.mode == "ssr":
            mode.append(f" τ {s.ssr_tau:g}", style="cyan")
        out.append((7, mode))
        seprod = self.prophet_name and s.seprod
        out.append((6, Text(f"SeProD τ {s.seprod_tau:g}", style="magenta") if seprod else Text("SeProD off",
                                                                                               style="dim")))
        if s.offline:
            out.append((9, Text("offline", style="yellow")))
        else:
            out.append((9, Text("offline (no network)", style="yellow") if self.network_down
                        else Text("online", style="green")))
        out.append((1, Text(f"{self.tokens_per_second:.1f} tok/s" if self.tokens_per_second else "– tok/s",
                            style="dim")))
        if self.context:
            out.append((0, Text(self.context,
                                style="green" if "restored" in self.context or "kept" in self.context
                                else "dim")))
        colors = {"ready": "green", "busy": "yellow", "loading": "yellow", "no model": "red"}
        out.append((10, Text(self.state, style=colors.get(self.state, "dim"))))
        return out

    def render(self) -> Text:
        parts = self.parts()
        width = self.content_size.width or 10_000  # not laid out yet: everything

        def joined() -> Text:
            t = Text()
            for i, (_, part) in enumerate(parts):
                if i and not part.plain.startswith(" + "):
                    t.append(" │ ", style="dim")
                t.append_text(part)
            return t

        while joined().cell_len > width and any(rank < 5 for rank, _ in parts):
            parts.remove(min(parts, key=lambda p: p[0]))
        over = joined().cell_len - width
        if over > 0:  # still too long: the model's name gives way (the states stay whole)
            model = parts[0][1]
            model.truncate(max(4, model.cell_len - over), overflow="ellipsis")
        return joined()
