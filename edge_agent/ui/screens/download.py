"""The download screen: pick a catalog model, watch it download, cancel, resume.

Lists the catalog's agent models with their download size (the catalog's, the one number used
everywhere) and whether they are installed or partly downloaded. Enter starts ``modelfiles.pull.pull`` in a
thread worker; its progress (bytes of the file being fetched, total, rate) is posted back to the screen. Esc
cancels a running download at the next chunk: the ``.part`` file stays, so choosing the model again
resumes where it stopped (``hub`` verifies the whole file at the end). Dismisses with the installed
model's name (None when closed without one). Does not know how downloads work inside: that is ``hub``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, OptionList, ProgressBar, Static
from textual.widgets.option_list import Option

from edge_agent.core.config import Settings
from edge_agent.core.errors import EdgeAgentError


class DownloadCancelled(Exception):
    """Raised from the progress callback inside the worker when the user pressed Esc."""


class _Progress:
    """``hub.Progress`` for the screen: calls back on the UI thread at most ~10 times a second; raises
    DownloadCancelled at the next chunk once ``cancel`` is set (the .part file stays for a resume)."""

    def __init__(self, screen: DownloadScreen, cancel: threading.Event) -> None:
        self.screen, self.cancel = screen, cancel
        self.label, self.total, self.start_done, self.t0, self.last = "", 0, 0, 0.0, 0.0

    def start(self, label: str, total: int, done: int) -> None:
        self.label, self.total, self.start_done, self.t0, self.last = (label, total, done, time.monotonic(),
                                                                       0.0)
        self.screen.app.call_from_thread(self.screen.show_progress, label, total, done, 0.0, done > 0)

    def advance(self, done: int) -> None:
        if self.cancel.is_set():
            raise DownloadCancelled()
        now = time.monotonic()
        if now - self.last >= 0.1 or done >= self.total:
            self.last = now
            rate = (done - self.start_done) / max(now - self.t0, 1e-6)
            self.screen.app.call_from_thread(self.screen.show_progress, self.label, self.total, done, rate,
                                             False)

    def finish(self) -> None:
        pass


class DownloadScreen(ModalScreen[str | None]):
    BINDINGS = [
        Binding("escape", "cancel", "Cancel / close"),
        Binding("enter", "download", "Download", show=True),
    ]
    DEFAULT_CSS = """
    DownloadScreen { align: center middle; }
    DownloadScreen #download { width: 100; max-width: 100%; height: 80%; border: thick $accent;
                               background: $surface;
                               padding: 0 1; }
    DownloadScreen OptionList { height: 1fr; border: none; }
    DownloadScreen #dl-status { height: auto; color: $text-muted; }
    DownloadScreen ProgressBar { width: 100%; height: 1; }
    """

    def __init__(self, settings: Settings, *, hub_client: Any = None) -> None:
        super().__init__()
        self.settings = settings
        self.hub_client = hub_client  # tests: a HubClient with a short backoff
        self.entries: list[Any] = []
        self.running: str | None = None  # the model being downloaded
        self.cancel_event = threading.Event()
        self.installed: str | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="download"):
            yield Static("[b]Download a model[/b]  Enter downloads · Esc cancels a download, or closes",
                         id="dl-title")
            yield OptionList(id="dl-list")
            yield Static("", id="dl-status")
            yield ProgressBar(total=1.0, show_eta=True, id="dl-bar")
        yield Footer()

    def on_mount(self) -> None:
        self.reload()

    def reload(self) -> None:
        from edge_agent.modelfiles.catalog import human_size, load_catalog
        from edge_agent.modelfiles.overview import overview

        try:
            status = {r.name: r.status for r in overview(self.settings)}
            catalog = load_catalog()
        except EdgeAgentError as e:
            self.query_one("#dl-status", Static).update(Text(f"{e.title}: {e.message}", style="red"))
            return
        self.entries = [e for e in catalog.entries if "agent" in e.roles and not e.is_demo
                        and e.wheels is None]
        ol = self.query_one(OptionList)
        highlighted = ol.highlighted
        ol.clear_options()
        words = {"installed": ("installed", "green"), "partial": ("partly downloaded: resumes", "yellow")}
        for entry in self.entries:
            t = Text()
            t.append(f"{entry.name}", style="bold")
            size = human_size(entry.download_size) if entry.download_size else "?"
            t.append(f"  {size}", style="cyan")
            st = words.get(status.get(entry.name, ""))
            if st:
                t.append(f"  {st[0]}", style=st[1])
            t.append(f"\n  {entry.description}", style="dim")
            ol.add_option(Option(t, id=entry.name))
        ol.highlighted = highlighted if highlighted is not None and highlighted < len(self.entries) else 0
        ol.focus()

    def selected(self) -> Any:
        i = self.query_one(OptionList).highlighted
        return self.entries[i] if i is not None and 0 <= i < len(self.entries) else None

    # --- actions ---
    @on(OptionList.OptionSelected)
    def action_download(self) -> None:
        entry = self.selected()
        if entry is None:
            return
        if self.running is not None:
            self.notify(f"{self.running} is downloading. Esc cancels it.", title="Busy", severity="warning")
            return
        self.running = entry.name
        self.cancel_event = threading.Event()
        self.query_one("#dl-status", Static).update(Text(f"Starting {entry.name}…", style="yellow"))
        self.pull(entry, self.cancel_event)

    def action_cancel(self) -> None:
        if self.running is None:
            self.dismiss(self.installed)
            return
        self.cancel_event.set()
        self.query_one("#dl-status", Static).update(Text("Cancelling…", style="yellow"))

    # --- the worker ---
    @work(thread=True, exclusive=True, group="download", exit_on_error=False)
    def pull(self, entry: Any, cancel: threading.Event) -> None:
        from edge_agent.modelfiles import hub
        from edge_agent.modelfiles import pull as model_pull

        def say(msg: str) -> None:
            self.app.call_from_thread(self.show_note, msg)

        try:
            m = model_pull.pull(entry, self.settings, client=self.hub_client, progress=_Progress(self,
                                                                                                 cancel),
                                                                                                 notify=say,
                         cancel=cancel)  # Esc stops a stalled read or a retry's wait at once too
        except (DownloadCancelled, hub.DownloadCancelled):
            self.app.call_from_thread(self.finished, entry.name, "cancelled", "")
        except EdgeAgentError as e:
            self.app.call_from_thread(self.finished, entry.name, "failed", f"{e.title}: {e.message}")
        else:
            self.app.call_from_thread(self.finished, m.name, "installed", "")

    # --- called on the UI thread ---
    def show_progress(self, label: str, total: int, done: int, rate: float, resumed: bool) -> None:
        from edge_agent.modelfiles.catalog import human_size

        self.query_one(ProgressBar).update(total=max(total, 1), progress=done)
        t = Text(f"{self.running}: {label}  {human_size(done)} / {human_size(total)}", style="yellow")
        if rate > 0:
            t.append(f"  {human_size(rate)}/s", style="dim")
        if resumed:
            t.append(f"  (resuming at {human_size(done)})", style="cyan")
        t.append("  · Esc cancels (it resumes later)", style="dim")
        self.query_one("#dl-status", Static).update(t)

    def show_note(self, msg: str) -> None:
        self.notify(msg, title="Download", timeout=4)

    def finished(self, name: str, outcome: str, message: str) -> None:
        self.running = None
        status = self.query_one("#dl-status", Static)
        if outcome == "installed":
            self.installed = name
            status.update(Text(f"{name} is installed. Esc closes; the app switches to it.", style="green"))
            self.notify(f"{name} is installed and will be used now.", title="Model installed", timeout=5)
            self.dismiss(name)
            return
        if outcome == "cancelled":
            status.update(Text(f"Download of {name} cancelled. The part already downloaded is kept: choose "
                               f"it "
                               "again to resume.", style="yellow"))
        else:
            status.update(Text(message + " Choose it again to retry (it resumes).", style="red"))
        self.reload()
