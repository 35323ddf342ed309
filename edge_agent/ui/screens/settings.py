"""The settings screen: mode, tau, SeProD, offline, search backends and their keys, temperature,
rationale library, max turns and models (with a button that opens the download screen); saved with
Settings.save().

Each field shows the help text from ``Settings`` field metadata. Values are checked by
``Settings.updated().validate()`` so the screen and the config file accept the same things; a new
rationale library file is loaded (validated) before the screen closes.
Dismisses with the new Settings (or None when cancelled).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static, Switch

from edge_agent.agent.prompts import check_n_ctx
from edge_agent.agent.rationales import load_library
from edge_agent.core.config import Settings
from edge_agent.core.errors import ConfigError, EdgeAgentError

# (field, kind) in the order shown. kind: select | bool | text | secret
FIELDS: list[tuple[str, str]] = [
    ("mode", "select"),
    ("ssr_tau", "text"),
    ("max_turns", "text"),
    ("temperature", "text"),
    ("system_prompt", "text"),
    ("type_ahead", "bool"),
    ("seprod", "bool"),
    ("seprod_tau", "text"),
    ("offline", "bool"),
    ("text_search", "select"),
    ("searxng_url", "text"),
    ("brave_api_key", "secret"),
    ("image_search", "select"),
    ("gcv_api_key", "secret"),
    ("serpapi_api_key", "secret"),
    ("public_image_url_prefix", "text"),
    ("rationales", "text"),
    ("model", "text"),
    ("mmproj", "text"),
    ("prophet", "text"),
    ("prophet_mmproj", "text"),
    ("n_ctx", "text"),
    ("kv_type", "select"),
    ("crop_max_tokens", "text"),
]
MODEL_FIELDS = ("model", "mmproj", "prophet", "prophet_mmproj")
CHOICES: dict[str, list[tuple[str, str]]] = {
    "mode": [("SSR: scored rationales", "ssr"), ("free-form: the model writes its reasoning", "freeform"),
             ("direct: the model alone in a plain chat (no tools)", "direct")],
    "text_search": [("Wikipedia (no key)", "wikipedia"), ("SearXNG (your instance: searxng_url)", "searxng"),
                    ("Brave Search (brave_api_key)", "brave")],
    "kv_type": [("auto: f16, a large model's context growing to n_ctx as a chat needs it", "auto"),
                ("f16: all of n_ctx from the start", "f16"), ("q8_0: half the memory, slower on a CPU",
                                                              "q8_0")],
    "image_search": [("none (off)", "none"), ("Google Cloud Vision (gcv_api_key)", "gcv"),
                     ("SerpApi Google Lens (serpapi_api_key)", "serpapi")],
}


def field_doc(name: str) -> str:
    for f in dataclasses.fields(Settings):
        if f.name == name:
            return f.metadata.get("doc", "")
    return ""


def model_choices(settings: Settings) -> str:
    """'Installed: a, b. To download: c, d.' from the catalog and registry (local files only)."""
    from edge_agent.modelfiles.overview import overview

    try:
        rows = overview(settings)
    except EdgeAgentError as e:
        return f"(model list unavailable: {e.message})"
    ready = [_with_memory(r) for r in rows if r.status in ("installed", "added", "demo")]
    pull = [_with_memory(r) for r in rows if r.status in ("available", "partial")]
    parts = []
    if ready:
        parts.append("Installed: " + ", ".join(ready) + ".")
    if pull:
        parts.append("To download (the button below, or edge-agent models pull NAME): " + ", ".join(pull[:4])
                     + (", …" if len(pull) > 4 else "") + ".")
    return " ".join(parts)


def _with_memory(row: Any) -> str:
    """'name (~2.3 GB, 3.9 with a prophet)': the memory a choice takes, before it is loaded."""
    if row.memory is None:
        return str(row.name)
    extra = f", {row.memory_with_prophet / 2**30:.1f} with a prophet" if row.memory_with_prophet else ""
    return f"{row.name} (~{row.memory / 2**30:.1f} GB{extra})"


class SettingsScreen(ModalScreen[Settings | None]):
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel"), Binding("ctrl+s", "save", "Save")]

    DEFAULT_CSS = """
    SettingsScreen { align: center middle; }
    SettingsScreen #settings { width: 90; max-width: 100%; height: 90%; border: thick $accent;
                               background: $surface;
                               padding: 0 1; }
    SettingsScreen VerticalScroll { height: 1fr; }
    SettingsScreen .field { height: auto; margin: 0 0 1 0; }
    SettingsScreen .field Horizontal { height: auto; }
    SettingsScreen .field Label { width: 16; text-style: bold; }
    SettingsScreen .field Input, SettingsScreen .field Select { width: 1fr; }
    SettingsScreen .field Input { height: 1; border: none; padding: 0 1; background: $boost; }
    SettingsScreen .doc { color: $text-muted; padding: 0 0 0 16; height: auto; }
    SettingsScreen #buttons { height: auto; align: right middle; }
    SettingsScreen #buttons Button { margin: 0 0 0 1; }
    """

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self.settings = settings

    def compose(self) -> ComposeResult:
        with Vertical(id="settings"):
            yield Static("[b]Settings[/b]  Ctrl+S or Enter saves (to the config file) · Esc cancels",
                         id="settings-title")
            with VerticalScroll():
                for name, kind in FIELDS:
                    value = getattr(self.settings, name)
                    with Vertical(classes="field"):
                        with Horizontal():
                            yield Label(name)
                            if kind == "select":
                                yield Select(CHOICES[name], value=value, allow_blank=False, id=f"f-{name}")
                            elif kind == "bool":
                                yield Switch(value=bool(value), id=f"f-{name}")
                            else:
                                yield Input(str(value), password=kind == "secret", id=f"f-{name}")
                        doc = field_doc(name)
                        if name == "model":
                            doc += "\n" + model_choices(self.settings)
                        yield Static(doc, classes="doc", markup=False)
                        if name == "model":
                            yield Button("Download a model…", id="download-model")
            with Horizontal(id="buttons"):
                yield Button("Cancel", id="cancel")
                yield Button("Save", id="save", variant="primary")

    def values(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for name, kind in FIELDS:
            w = self.query_one(f"#f-{name}")
            assert isinstance(w, Input | Select | Switch)
            out[name] = w.value.strip() if isinstance(w, Input) and kind == "text" else w.value
        return out

    @on(Button.Pressed, "#save")
    def action_save(self) -> None:
        try:
            new = self.settings.updated(self.values(), source="the settings screen")
            new.validate(check=check_n_ctx)
            if new.rationales != self.settings.rationales:
                load_library(new.rationales)  # a bad library file is refused here, not at the next question
        except ConfigError as e:
            self.notify(e.message, title=e.title, severity="error")
            return
        self.dismiss(new)

    @on(Input.Submitted)
    def submitted(self) -> None:
        """Enter in a field saves, as the title says."""
        self.action_save()

    @on(Button.Pressed, "#cancel")
    def cancel(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed, "#download-model")
    def download(self) -> None:
        from edge_agent.ui.screens.download import DownloadScreen

        def done(name: str | None) -> None:
            if name:
                self.query_one("#f-model", Input).value = name
                self.query_one("#f-mmproj", Input).value = ""
                self.notify(f"Save to use {name}.", title="Model downloaded", timeout=5)

        self.app.push_screen(DownloadScreen(self.settings), done)
