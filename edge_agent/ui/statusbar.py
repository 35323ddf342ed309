"""The status bar: models, mode, SeProD, online/offline, tokens per second, engine state.

"offline" is shown when the setting says so, and also when the last search could not reach the
network (``network_down``, set from the agent's events) until a search gets through again.
"""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from edge_agent.config import Settings


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

    def render(self) -> Text:
        s = self.settings
        sep = Text(" │ ", style="dim")
        t = Text()
        t.append(self.model_name, style="bold")
        if self.text_only:
            t.append(" (text only)", style="yellow")
        if self.prophet_name:
            t.append(f" + prophet {self.prophet_name}", style="magenta")
        t.append_text(sep)
        t.append("SSR" if s.mode == "ssr" else "free-form", style="bold cyan")
        if s.mode == "ssr":
            t.append(f" τ {s.ssr_tau:g}", style="cyan")
        t.append_text(sep)
        if self.prophet_name and s.seprod:
            t.append(f"SeProD τ {s.seprod_tau:g}", style="magenta")
        else:
            t.append("SeProD off", style="dim")
        t.append_text(sep)
        if s.offline:
            t.append("offline", style="yellow")
        elif self.network_down:
            t.append("offline (no network)", style="yellow")
        else:
            t.append("online", style="green")
        t.append_text(sep)
        t.append(f"{self.tokens_per_second:.1f} tok/s" if self.tokens_per_second else "– tok/s", style="dim")
        if self.context:
            t.append_text(sep)
            t.append(self.context, style="green" if "restored" in self.context or "kept" in self.context else "dim")
        t.append_text(sep)
        colors = {"ready": "green", "busy": "yellow", "loading": "yellow", "no model": "red"}
        t.append(self.state, style=colors.get(self.state, "dim"))
        return t
