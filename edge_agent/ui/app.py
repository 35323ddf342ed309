"""The edge-agent Textual app: owns the settings, the chat store and the engine's life.

Start-up never touches the network and never blocks: the chat screen shows at once while the
model loads in a thread worker that reports progress; a missing/broken model opens the first-run
screen. Everything the user sees lives in the screens and widgets of this package.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any

from textual import work
from textual.app import App, SystemCommand
from textual.screen import Screen

from edge_agent.chats import ChatStore
from edge_agent.config import Settings
from edge_agent.errors import ConfigError, EdgeAgentError, ModelFileError
from edge_agent.ui.chat_screen import ChatScreen
from edge_agent.ui.first_run import FirstRunScreen
from edge_agent.ui.messages import EngineFailed, EngineProgress, EngineReady
from edge_agent.ui.statusbar import model_label

log = logging.getLogger(__name__)

EngineFactory = Callable[..., Any]  # (settings, *, progress) -> engine


def default_engine_factory(settings: Settings, *, progress: Callable[[str, float], None] | None = None) -> Any:
    from edge_agent.engine import Engine  # llama.cpp is imported here, in the worker thread

    return Engine.from_settings(settings, progress=progress)


# Settings that take new model files or a new llama context: the engine is rebuilt.
RELOAD_FIELDS = frozenset({"model", "mmproj", "prophet", "prophet_mmproj", "n_ctx", "n_threads", "n_threads_batch",
                           "extra_buffers", "rationales", "text_search", "image_search"})


def apply_live(engine: Any, new: Settings, changed: set[str]) -> bool:
    """Give a loaded engine the new settings without reloading models; False when it needs a reload.

    The engine builds each question's options from ``engine.settings``; the search tools and the
    SeProD drafter keep their own copies of ``offline`` and ``seprod_tau``/``seprod_draft_len``.
    """
    if engine is None:
        return True
    engine.settings = new
    tools, drafter = getattr(engine, "tools", None), getattr(engine, "drafter", None)
    if "offline" in changed and tools is not None and hasattr(tools, "offline"):
        tools.offline = new.offline
    if drafter is not None:
        if hasattr(drafter, "tau"):
            drafter.tau = new.seprod_tau
        if hasattr(drafter, "draft_len"):
            drafter.draft_len = new.seprod_draft_len
    # SeProD switched on after loading without it: the prophet must be loaded now.
    return not ("seprod" in changed and new.seprod and new.prophet and drafter is None)


class EdgeAgentApp(App):
    TITLE = "edge-agent"
    CSS_PATH = "app.tcss"

    def __init__(self, settings: Settings, *, engine_factory: EngineFactory | None = None,
                 store: ChatStore | None = None, persist_settings: bool = True,
                 open_chat: int | None = None) -> None:
        super().__init__()
        self.settings = settings
        self.engine_factory = engine_factory or default_engine_factory
        self.store = store or ChatStore(settings.chats_path, secrets=settings.secrets())
        self.persist_settings = persist_settings
        self.engine: Any = None
        self.engine_state = "starting"  # loading | ready | no model
        self.engine_lock = threading.Lock()  # held by the thread that is using the model
        self._load_gen = 0  # bumps per load: an engine from an older load is closed, not used
        self.open_chat = open_chat

    # --- start and stop ---
    async def on_mount(self) -> None:
        if self.settings.theme and self.settings.theme in self.available_themes:
            self.theme = self.settings.theme  # the theme picked last time (Ctrl+P, Change theme)
        self.theme_changed_signal.subscribe(self, self._theme_changed)
        chat = ChatScreen(self.store, self.store.recent_questions())
        await self.push_screen(chat)
        self.start_loading()
        self.prune_crops()
        if self.open_chat is not None:
            try:
                await chat.open_chat(self.store.load(self.open_chat))
            except EdgeAgentError as e:
                self.notify(e.message, title=e.title, severity="error")

    @work(thread=True, group="crops", exit_on_error=False)
    def prune_crops(self) -> None:
        """Worker thread: delete week-old crop folders no saved chat shows (deleted chats, `ask --json`)."""
        from edge_agent.crops import prune_crops

        try:
            n = prune_crops(self.settings.crops_dir, chats_path=self.settings.chats_path)
        except (OSError, EdgeAgentError) as e:  # never worth failing the app for
            log.warning("crop cleanup skipped: %s", e)
            return
        if n:
            log.info("deleted %d old crop folders", n)

    @work(thread=True, group="prepare", exit_on_error=False)
    def prepare_image(self, path: str) -> None:
        """Worker thread: read an attached image before its question (``Engine.prepare_image``: the
        vision encode happens while the person types, not after they press Enter). After a running
        answer; nothing when no engine is loaded. What cannot be read is left for the question."""
        with self.engine_lock:
            engine = self.engine
            if engine is not None:
                engine.prepare_image(path)

    def _theme_changed(self, theme: Any) -> None:
        name = getattr(theme, "name", str(theme))
        if name != self.settings.theme:
            self.change_settings({"theme": name})

    def start_loading(self) -> None:
        self.engine_state = "loading"
        chat = self.chat_screen
        if chat is not None:
            chat.status.state = "loading"
            chat.show_loading("Loading the model…", -1)
        if chat is not None and chat.running is not None and chat.cancel_event is not None:
            chat.cancel_event.set()  # the old model is about to go: stop its answer
        self._load_gen += 1
        old, self.engine = self.engine, None  # questions wait for the new engine from here on
        self.load_engine(self.settings, self._load_gen, old)

    @work(thread=True, exclusive=True, group="engine", exit_on_error=False)
    def load_engine(self, settings: Settings, gen: int = 0, old: Any = None) -> None:
        """Worker thread: close ``old``, build the engine (loads GGUFs) posting progress; the UI
        thread alone assigns ``self.engine`` (on EngineReady). Never touches widgets."""
        t0 = time.monotonic()
        with self.engine_lock:  # a running answer on ``old`` finishes (or sees its cancel) first
            if old is not None:
                old.close()
            try:
                engine = self.engine_factory(settings, progress=lambda text, frac: self.post_message(
                    EngineProgress(text, frac)))
            except ModelFileError as e:
                self.post_message(EngineFailed(e.title, e.message, no_model=True, gen=gen))
                return
            except EdgeAgentError as e:
                self.post_message(EngineFailed(e.title, e.message, no_model=True, gen=gen))
                return
            except Exception as e:  # a bug or a llama.cpp failure: say so, keep the app alive
                log.error("engine load failed:\n%s", traceback.format_exc())
                self.post_message(EngineFailed("Model failed to load", f"{type(e).__name__}: {e}", no_model=True, gen=gen))
                return
        self.post_message(EngineReady(engine, time.monotonic() - t0, gen))

    def on_engine_progress(self, m: EngineProgress) -> None:
        if self.chat_screen is not None:
            self.chat_screen.show_loading(m.text, m.fraction)

    def on_engine_ready(self, m: EngineReady) -> None:
        if m.gen != self._load_gen:
            m.engine.close()  # settings changed while it loaded: a newer load is on its way
            return
        self.engine = m.engine
        self.engine_state = "ready"
        if isinstance(self.screen, FirstRunScreen):
            self.pop_screen()
        chat = self.chat_screen
        if chat is not None:
            chat.show_loading("", None)
            chat.status.state = "ready"
            chat.status.set_models(*self.model_names(), text_only=not self.engine_sees_images())
            chat.set_text_only(not self.engine_sees_images())
        self.notify(f"{self.model_names()[0]} loaded in {m.seconds:.1f} s.", title="Model ready", timeout=3)

    def on_engine_failed(self, m: EngineFailed) -> None:
        if m.gen != self._load_gen:
            return  # a newer load is on its way
        self.engine_state = "no model"
        chat = self.chat_screen
        if chat is not None:
            chat.show_loading("", None)
            chat.status.state = "no model"
        if isinstance(self.screen, FirstRunScreen):
            self.pop_screen()
        self.push_screen(FirstRunScreen(self.settings, m.title, m.message))

    def on_first_run_screen_chosen(self, m: FirstRunScreen.Chosen) -> None:
        if m.changes:
            self.change_settings(m.changes)  # model fields changed: reloads
        else:
            self.start_loading()

    def drafting(self) -> bool:
        """SeProD is on: a prophet is loaded and the setting is on."""
        return self.engine is not None and getattr(self.engine, "drafter", None) is not None and self.settings.seprod

    def engine_sees_images(self) -> bool:
        model = getattr(self.engine, "model", None)
        return bool(getattr(model, "has_vision", True)) if model is not None else True

    def model_names(self) -> tuple[str, str | None]:
        """Display names of the loaded agent and prophet models."""
        e = self.engine
        name = getattr(e, "model_name", None) or model_label(self.settings.model) or "default model"
        prophet = getattr(e, "prophet_name", None) or model_label(self.settings.prophet) or None
        return str(name), (str(prophet) if prophet else None)

    async def on_unmount(self) -> None:
        chat = self.chat_screen
        if chat is not None and chat.cancel_event is not None:
            chat.cancel_event.set()
        # Wait (bounded) for a running ask to notice the cancel before freeing the model under it.
        if self.engine_lock.acquire(timeout=10):
            try:
                if self.engine is not None:
                    self.engine.close()
                    self.engine = None
            finally:
                self.engine_lock.release()
        self.store.close()

    @property
    def chat_screen(self) -> ChatScreen | None:
        for s in self.screen_stack:
            if isinstance(s, ChatScreen):
                return s
        return None

    # --- settings ---
    def change_settings(self, changes: dict[str, Any]) -> None:
        """Apply, persist (only what changed, on top of the config file) and reload models if needed."""
        try:
            new = self.settings.updated(changes, source="the app")
            new.validate()
        except ConfigError as e:
            self.notify(e.message, title=e.title, severity="error")
            return
        changed = {f.name for f in dataclasses.fields(Settings) if getattr(new, f.name) != getattr(self.settings, f.name)}
        self.settings = new
        if self.persist_settings and changed:
            try:
                base = Settings.load(env={"EDGE_AGENT_HOME": str(new.home)})
                base.updated({k: getattr(new, k) for k in changed}).save()
            except (EdgeAgentError, OSError) as e:
                self.notify(str(e), title="Settings not saved", severity="error")
        chat = self.chat_screen
        if chat is not None:
            chat.status.set_settings(new)
        if (changed & RELOAD_FIELDS) or not apply_live(self.engine, new, changed):
            self.start_loading()
        elif changed:
            self.notify(", ".join(f"{k} = {getattr(new, k)}" for k in sorted(changed)), title="Settings saved",
                        timeout=3)

    def action_settings(self) -> None:
        from edge_agent.ui.settings_screen import SettingsScreen

        def done(new: Settings | None) -> None:
            if new is not None:
                self.change_settings({f.name: getattr(new, f.name) for f in dataclasses.fields(Settings)
                                      if f.name != "home"})

        self.push_screen(SettingsScreen(self.settings), done)

    # --- command palette ---
    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        s = self.settings
        yield SystemCommand("Mode: SSR", "Score six rationales, generate only the action",
                            lambda: self.change_settings({"mode": "ssr"}))
        yield SystemCommand("Mode: free-form", "The model writes its reasoning each turn",
                            lambda: self.change_settings({"mode": "freeform"}))
        yield SystemCommand(f"SeProD {'off' if s.seprod else 'on'}", "Prophet drafting (needs a prophet model)",
                            lambda: self.change_settings({"seprod": not self.settings.seprod}))
        yield SystemCommand(f"Go {'online' if s.offline else 'offline'}",
                            "Offline: searches are served from the cache only",
                            lambda: self.change_settings({"offline": not self.settings.offline}))
        yield SystemCommand("Settings", "Mode, tau, SeProD, offline, max turns, models", self.action_settings)
        chat = self.chat_screen
        if chat is not None:
            yield SystemCommand("Chats", "Resume, rename, delete or export a chat", chat.action_chats)
            yield SystemCommand("New chat", "Start an empty chat", chat.action_new_chat)
            yield SystemCommand("Export chat", "Markdown + JSON with tool calls, crops and scores",
                                lambda: chat.export(chat.chat_id))
            yield SystemCommand("Attach image", "Pick an image file", chat.action_pick_image)
            yield SystemCommand("Detach image", "Ask the next questions without the image (Ctrl+D)",
                                chat.action_detach_image)
            yield SystemCommand("Retry last answer", "Answer the last question again (/retry)", chat.action_retry)
            yield SystemCommand("Edit last question", "Change the last question and send it again (/edit)",
                                chat.action_edit_last)
            yield SystemCommand("Reasoning: open/close", "The last answer's reasoning blocks",
                                chat.action_toggle_reasoning)
