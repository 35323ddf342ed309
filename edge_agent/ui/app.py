"""The edge-agent Textual app: owns the settings, the chat store and the engine's life.

Start-up never touches the network and never blocks: the chat screen shows at once while the
model loads in a thread worker that reports progress; a missing/broken model opens the first-run
screen. Everything the user sees lives in the screens and widgets of this package.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from typing import Any

from textual import work
from textual.app import App, SystemCommand
from textual.screen import Screen
from textual.theme import Theme

from edge_agent.chat.store import ChatStore
from edge_agent.core.config import Settings
from edge_agent.core.errors import ConfigError, EdgeAgentError
from edge_agent.ui.host import EngineFactory, EngineHost
from edge_agent.ui.messages import EngineFailed, EngineProgress, EngineReady, HostChanged, SettingsRequested
from edge_agent.ui.screens.chat import ChatScreen
from edge_agent.ui.screens.first_run import FirstRunScreen

log = logging.getLogger(__name__)


class EdgeAgentApp(App[None]):
    TITLE = "edge-agent"
    CSS_PATH = "app.tcss"

    def __init__(self, settings: Settings, *, engine_factory: EngineFactory | None = None,
                 store: ChatStore | None = None, persist_settings: bool = True,
                 open_chat: int | None = None) -> None:
        super().__init__()
        self.store = store or ChatStore(settings.chats_path, secrets=settings.secrets())
        self.host = EngineHost(self, settings, self.store, engine_factory=engine_factory,
                               persist_settings=persist_settings)
        self.open_chat = open_chat

    @property
    def settings(self) -> Settings:
        return self.host.settings

    # --- start and stop ---
    async def on_mount(self) -> None:
        if self.settings.theme and self.settings.theme in self.available_themes:
            self.theme = self.settings.theme  # the theme picked last time (Ctrl+P, Change theme)
        self.theme_changed_signal.subscribe(self, self._theme_changed)
        chat = ChatScreen(self.host, self.store.recent_questions())
        await self.push_screen(chat)
        self.say_recovered()
        self.start_loading()
        self.prune_crops()
        self.check_search_cache()
        if self.open_chat is not None:
            try:
                await chat.open_chat(self.store.load(self.open_chat))
            except EdgeAgentError as e:
                self.notify(e.message, title=e.title, severity="error")

    @work(thread=True, group="crops", exit_on_error=False)
    def prune_crops(self) -> None:
        """Worker thread: delete week-old crop folders no saved chat shows (deleted chats, `ask --json`)."""
        from edge_agent.chat.crops import prune_crops

        try:
            n = prune_crops(self.settings.crops_dir, chats_path=self.settings.chats_path)
        except (OSError, EdgeAgentError) as e:  # never worth failing the app for
            log.warning("crop cleanup skipped: %s", e)
            return
        if n:
            log.info("deleted %d old crop folders", n)

    @work(thread=True, group="cache-check", exit_on_error=False)
    def check_search_cache(self) -> None:
        """Worker thread: open the search cache now, so a damaged one is set aside and salvaged (and said)
        at start, not in the middle of an answer's search."""
        from edge_agent.tools.cache import SearchCache

        try:
            SearchCache(self.settings.cache_path).stats()
        except EdgeAgentError as e:  # the search itself reports it, with the fix
            log.warning("search cache check: %s", e)
        self.call_from_thread(self.say_recovered)

    def say_recovered(self) -> None:
        """A damaged settings file, chat history or search cache was set aside and salvaged: say so, once."""
        from edge_agent.core.recovery import take_notices

        for message in take_notices():
            self.notify(message, title="Recovered a damaged file", severity="warning", timeout=30)

    def _theme_changed(self, theme: Theme) -> None:
        if theme.name != self.settings.theme:
            self.change_settings({"theme": theme.name})

    def _tell_chat(self, loading: tuple[str, float] | None = None) -> None:
        chat = self.chat_screen
        if chat is not None:
            chat.post_message(HostChanged(loading))

    def start_loading(self) -> None:
        self.host.load()
        self._tell_chat(("Loading the model…", -1))

    def on_engine_progress(self, m: EngineProgress) -> None:
        self._tell_chat((m.text, m.fraction))

    def on_engine_ready(self, m: EngineReady) -> None:
        if not self.host.adopt(m):
            return  # settings changed while it loaded: a newer load is on its way
        if isinstance(self.screen, FirstRunScreen):
            self.pop_screen()
        self._tell_chat()
        self.notify(f"{self.host.model_names()[0]} loaded in {m.seconds:.1f} s.", title="Model ready",
                    timeout=3)
        self.say_recovered()  # the search cache is first opened while the model loads

    def on_engine_failed(self, m: EngineFailed) -> None:
        if not self.host.failed(m):
            return  # a newer load is on its way
        self._tell_chat()
        if isinstance(self.screen, FirstRunScreen):
            self.pop_screen()
        self.push_screen(FirstRunScreen(self.settings, m.title, m.message))

    def on_first_run_screen_chosen(self, m: FirstRunScreen.Chosen) -> None:
        if m.changes:
            self.change_settings(m.changes)  # model fields changed: reloads
        else:
            self.start_loading()

    async def on_unmount(self) -> None:
        self.host.close()  # stops the running answer, waits (bounded) for it, closes the engine
        self.store.close()

    @property
    def chat_screen(self) -> ChatScreen | None:
        for s in self.screen_stack:
            if isinstance(s, ChatScreen):
                return s
        return None

    # --- settings ---
    def on_settings_requested(self, m: SettingsRequested) -> None:
        self.change_settings(m.changes)

    def change_settings(self, changes: dict[str, Any]) -> None:
        """Apply and save (only what changed, on top of the config file); reload models if needed."""
        try:
            changed, reloading = self.host.change_settings(changes)
        except ConfigError as e:
            self.notify(e.message, title=e.title, severity="error")
            return
        if reloading:
            self._tell_chat(("Loading the model…", -1))
        else:
            self._tell_chat()
            if changed:
                self.notify(", ".join(f"{k} = {getattr(self.settings, k)}" for k in sorted(changed)),
                            title="Settings saved", timeout=3)

    def action_settings(self) -> None:
        from edge_agent.ui.screens.settings import SettingsScreen

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
        yield SystemCommand("Mode: direct", "The model alone in a plain chat: no tools, no agent",
                            lambda: self.change_settings({"mode": "direct"}))
        yield SystemCommand(f"SeProD {'off' if s.seprod else 'on'}",
                            "Prophet drafting (needs a prophet model)",
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
                                chat.action_export)
            yield SystemCommand("Attach image", "Pick an image file", chat.action_pick_image)
            yield SystemCommand("Detach image", "The next questions go without the last image (Ctrl+D)",
                                chat.action_detach_image)
            yield SystemCommand("Retry last answer", "Answer the last question again (/retry)",
                                chat.action_retry)
            yield SystemCommand("Edit last question", "Change the last question and send it again (/edit)",
                                chat.action_edit_last)
            yield SystemCommand("Reasoning: open/close", "The last answer's reasoning blocks",
                                chat.action_toggle_reasoning)
