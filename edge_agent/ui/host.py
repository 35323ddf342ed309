"""The engine's host: the one object of the app that owns the engine, its lock and its workers.

Not a widget. It loads the engine in a thread worker (progress, ready and failure are posted to the
app as messages), runs each question in a thread worker that records it in the chat store by
``chat.recorder``'s rule (as ``ask`` does: from the first event the model read) and posts each event to
the screen that asked, reads attached images ahead, applies settings (live through
``Engine.update_settings`` or by loading a new engine) and saves them. Screens receive the host and
ask it questions; they never see the engine's parts. The engine is used by one thread at a time: the
one that holds ``lock``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from textual.message_pump import MessagePump

from edge_agent.agent.prompts import check_n_ctx
from edge_agent.chat.lock import ChatLock
from edge_agent.chat.recorder import AnswerStatus, ExchangeRecorder
from edge_agent.chat.store import ChatStore
from edge_agent.core.config import Settings
from edge_agent.core.errors import Cancelled, EdgeAgentError
from edge_agent.engine.face import AskRequest, EngineFace
from edge_agent.modelfiles.catalog import load_catalog
from edge_agent.ui.messages import (
    AgentEvent,
    AskFinished,
    EngineFailed,
    EngineProgress,
    EngineReady,
    ExchangeOpened,
)
from edge_agent.ui.widgets.preview import looks_like_image_path
from edge_agent.ui.widgets.statusbar import model_label

if TYPE_CHECKING:
    from textual.app import App

log = logging.getLogger(__name__)

# Model files: saved once a load with them succeeded (a pair the loader rejects is never saved).
MODEL_FIELDS = frozenset({"model", "mmproj", "prophet", "prophet_mmproj"})


EngineFactory = Callable[..., EngineFace]  # (settings, *, progress) -> engine


def default_engine_factory(settings: Settings, *,
                           progress: Callable[[str, float], None] | None = None) -> EngineFace:
    from edge_agent.engine.engine import Engine  # llama.cpp is imported here, in the worker thread

    return Engine.from_settings(settings, progress=progress)


def reload_fields() -> frozenset[str]:
    from edge_agent.engine.engine import RELOAD_FIELDS  # numpy and the agent: not at the app's import

    return RELOAD_FIELDS


@dataclass(frozen=True)
class Question:
    """One question of a chat as the engine gets it: ``ask_id``, the screen's id for it (its events, its
    cancel and its end are keyed by it: the chat store has it only once the model read it);
    ``images``: its files (the engine gets one, or a tuple of several); ``context``: the key the chat's
    last kept answer was saved under; ``history``: the chat's (question, answer, image) exchanges, for a
    rebuild (and a plain chat's prompt), both read before the question (``ChatStore.continuation``)."""

    ask_id: int
    text: str
    images: tuple[str, ...]
    history: list[tuple[str, str, str | tuple[str, ...] | None]]
    context: str
    # the chat it is asked in (None: a new chat, made when the model has read the question), whose lock
    # (edge_agent.chat.lock) the answer holds until it is saved
    chat_id: int | None = None
    replace_last: bool = False  # a /retry or an edited question: it takes the last exchange's place

    @property
    def image(self) -> str | tuple[str, ...] | None:
        return (self.images[0] if len(self.images) == 1 else self.images) or None


class EngineHost:
    """Owns the engine (``engine``, None while loading or when no model loads), its ``lock``, the
    workers that use it, and the current ``settings``. ``state``: starting | loading | ready | no model."""

    def __init__(self, app: App[Any], settings: Settings, store: ChatStore, *,
                 engine_factory: EngineFactory | None = None, persist_settings: bool = True) -> None:
        self.app = app
        self.settings = settings
        self.store = store
        self.engine_factory = engine_factory or default_engine_factory
        self.persist_settings = persist_settings
        self.engine: EngineFace | None = None
        self.state = "starting"
        self.lock = threading.Lock()  # held by the thread that is using the engine
        self._gen = 0  # bumps per load: an engine from an older load is closed, not used
        self._loading_with = settings  # the settings the newest load started with
        self._unsaved: dict[str, Any] = {}  # model files waiting for a load to succeed before saving
        self._cancels: dict[int, threading.Event] = {}  # ask id -> its cancel event
        self._locks: dict[int, tuple[ChatLock, int]] = {}  # chat id -> its lock and the answers holding it
        self._locks_guard = threading.Lock()

    # --- what the screens read ---
    @property
    def sees_images(self) -> bool:
        """False when the loaded model has no vision projector (True while none is loaded: not known)."""
        return self.engine is None or self.engine.model.has_vision

    @property
    def on_demo(self) -> bool:
        """The loaded model is the offline demo (SmolLM2-135M)."""
        return self.engine is not None and self.engine.model_name == load_catalog().demo.name

    @property
    def drafting(self) -> bool:
        """SeProD is on: a prophet is loaded and the setting is on."""
        return self.engine is not None and self.engine.drafter is not None and self.settings.seprod

    def model_names(self) -> tuple[str, str | None]:
        """Display names of the agent model and (when drafting) the prophet."""
        name = (self.engine.model_name if self.engine is not None else "") or model_label(self.settings.model)
        prophet = model_label(self.settings.prophet) if self.engine is None or self.drafting else ""
        return name or "default model", prophet or None

    # --- loading ---
    def load(self) -> None:
        """Stop the running answer and load an engine with the current settings (the old one is
        closed by the loading worker once the answer has let go of it)."""
        self.state = "loading"
        self.cancel()
        self._gen += 1
        self._loading_with = self.settings
        old, self.engine = self.engine, None  # questions wait for the new engine from here on
        self.app.run_worker(lambda: self._load(self.settings, self._gen, old), thread=True, exclusive=True,
                            group="engine", exit_on_error=False)

    def _load(self, settings: Settings, gen: int, old: EngineFace | None) -> None:
        """Worker thread: close ``old``, build the engine (loads GGUFs) posting progress; the UI
        thread alone assigns ``self.engine`` (``adopt``). Never touches widgets."""
        t0 = time.monotonic()
        post = self.app.post_message

        def progress(text: str, fraction: float) -> None:
            post(EngineProgress(text, fraction))

        with self.lock:  # a running answer on ``old`` finishes (or sees its cancel) first
            if old is not None:
                old.close()
            try:
                engine = self.engine_factory(settings, progress=progress)
            except EdgeAgentError as e:
                post(EngineFailed(e.title, e.message, no_model=True, gen=gen))
                return
            except Exception as e:  # a bug or a llama.cpp failure: say so, keep the app alive
                log.error("engine load failed:\n%s", traceback.format_exc())
                post(EngineFailed("Model failed to load", f"{type(e).__name__}: {e}", no_model=True, gen=gen))
                return
        post(EngineReady(engine, time.monotonic() - t0, gen))

    def adopt(self, m: EngineReady) -> bool:
        """UI thread: take the engine a load made; False (and it is closed) when a newer load is on its
        way. Model files that waited for this load are saved now."""
        if m.gen != self._gen:
            m.engine.close()
            return False
        self.engine, self.state = m.engine, "ready"
        late = {f.name for f in dataclasses.fields(Settings)
                if getattr(self.settings, f.name) != getattr(self._loading_with, f.name)}
        if late and not m.engine.update_settings(self.settings, late):  # changed while it loaded
            self.load()
            return False
        if self._unsaved:  # the whole pair that loaded (not only what the last try changed: issue 30 item 3)
            self._save({k: getattr(self._loading_with, k) for k in MODEL_FIELDS})
            self._unsaved = {}
        return True

    def failed(self, m: EngineFailed) -> bool:
        """UI thread: a load failed; False when it was an older load (a newer one is on its way)."""
        if m.gen != self._gen:
            return False
        self.state = "no model"
        self._unsaved = {}  # the files it rejected are not saved
        return True

    def close(self) -> None:
        """At exit: stop the running answer, wait (bounded) for it to let go, close the engine."""
        self.cancel()
        if self.lock.acquire(timeout=10):
            try:
                if self.engine is not None:
                    self.engine.close()
                    self.engine = None
            finally:
                self.lock.release()

    # --- settings ---
    def change_settings(self, changes: dict[str, Any]) -> tuple[set[str], bool]:
        """Validate, apply and save ``changes``: (the names that changed, whether a new engine is being
        loaded for them). Applied to the loaded engine when it can take them, else a new engine is loaded.
        Model files are saved once a load with them succeeds. Raises ConfigError for a bad value."""
        new = self.settings.updated(changes, source="the app")
        new.validate(check=check_n_ctx)
        changed = {f.name for f in dataclasses.fields(Settings) if getattr(new,
                                                                           f.name) != getattr(self.settings,
                                                                                              f.name)}
        self.settings = new
        if not changed:
            return changed, False
        live = self.engine.update_settings(new,
                                           changed) if self.engine is not None else not (
                                               changed & reload_fields())
        if not live:
            self._unsaved.update({k: getattr(new, k) for k in changed & MODEL_FIELDS})
            self.load()
        self._save({k: getattr(new, k) for k in changed if k not in self._unsaved})
        return changed, not live

    def _save(self, values: dict[str, Any]) -> None:
        """Write ``values`` on top of the config file (only these: the file keeps what else it says)."""
        if not self.persist_settings or not values:
            return
        try:
            base = Settings.load(env={"EDGE_AGENT_HOME": str(self.settings.home)})
            base.updated(values).save()
        except (EdgeAgentError, OSError) as e:
            self.app.notify(str(e), title="Settings not saved", severity="error")

    # --- one writer per chat ---
    def claim(self, chat_id: int) -> str | None:
        """Hold chat ``chat_id``'s lock for a question (None); when another process (an ``ask``, another app)
        is answering in it, who that is (and nothing is held)."""
        with self._locks_guard:
            lock, n = self._locks.get(chat_id, (ChatLock(self.settings.home, chat_id, "the edge-agent app"),
                                                0))
            if n == 0 and not lock.try_acquire():
                return lock.holder()
            self._locks[chat_id] = (lock, n + 1)
            return None

    def release(self, chat_id: int | None) -> None:
        """A question of ``chat_id`` is done (its answer saved): the lock goes when no other one holds it."""
        with self._locks_guard:
            if chat_id is None or chat_id not in self._locks:
                return
            lock, n = self._locks[chat_id]
            if n <= 1:
                del self._locks[chat_id]
                lock.release()
            else:
                self._locks[chat_id] = (lock, n - 1)

    # --- questions ---
    def prepare_image(self, path: str) -> None:
        """Read an attached image before its question, in a worker (``Engine.prepare_image``: the vision
        encode happens while the person types). After a running answer; nothing without an engine."""
        def read() -> None:
            with self.lock:
                if self.engine is not None:
                    self.engine.prepare_image(path)

        self.app.run_worker(read, thread=True, group="prepare", exit_on_error=False)

    def read_ahead(self, text: str, image: str | Sequence[str] | None, chat_id: int | None) -> None:
        """What the person has given so far for the next question of chat ``chat_id`` (None: a new chat):
        the attached ``image`` (a tuple: several) and the ``text`` typed (a command or a path is not a
        question). The engine
        reads them into the chat's context in its own background thread (``Engine.read_ahead``: the photo
        at once, whole words as they are typed), which the question takes over when it is sent. Returns
        at once; nothing without an engine."""
        if self.engine is None:
            return
        if text.lstrip().startswith("/") or looks_like_image_path(text.strip()) is not None:
            text = ""
        context = self.store.continuation(chat_id).context if chat_id is not None else ""
        self.engine.read_ahead(text, image, context=context)

    def ask(self, q: Question, reply_to: MessagePump) -> None:
        """Answer ``q`` in a worker that records each event and posts it to ``reply_to`` (ExchangeOpened
        once it is written, AgentEvent, then AskFinished). The caller checked that an engine is loaded and
        holds ``q.chat_id``'s claim."""
        engine, cancel = self.engine, threading.Event()
        assert engine is not None
        self._cancels[q.ask_id] = cancel
        mode = self.settings.mode
        self.app.run_worker(lambda: self._ask(engine, q, mode, cancel, reply_to), thread=True, group="ask",
                            exit_on_error=False)

    def cancel(self, ask_id: int | None = None) -> None:
        """Stop the answer to question ``ask_id`` (None: every running answer)."""
        for aid, event in list(self._cancels.items()):
            if ask_id is None or aid == ask_id:
                event.set()

    def _claim_new(self, chat_id: int) -> None:
        """A question's new chat was just made: its lock is held until the answer is saved (nobody else
        can be answering in it; another process that took it meanwhile keeps it, and nothing is held)."""
        if self.claim(chat_id) is not None:
            log.warning("chat %s was taken by another process as it was made", chat_id)

    def _ask(self, engine: EngineFace, q: Question, mode: str, cancel: threading.Event,
             reply_to: MessagePump) -> None:
        """Worker thread: runs the engine, records (chat.recorder: from the first event the model read)
        and posts each event. Never touches widgets."""
        record = ExchangeRecorder(self.store, q.chat_id, q.text, q.images, engine.files,
                                  replace_last=q.replace_last, on_new_chat=self._claim_new)
        status = AnswerStatus()
        with self.lock:
            try:
                if not cancel.is_set():
                    for event in engine.ask(AskRequest(q.text, q.image, mode=mode, history=q.history,
                                                       context=q.context), cancel=cancel):
                        written = record.message_id is not None
                        record.add(event)
                        if not written and record.chat_id is not None and record.message_id is not None:
                            reply_to.post_message(ExchangeOpened(q.ask_id, record.chat_id, record.message_id))
                        reply_to.post_message(AgentEvent(q.ask_id, event))
                        status.see(event)
                status.end(cancelled=cancel.is_set())
            except (Cancelled, EdgeAgentError) as e:
                status.failed(e)
            except Exception as e:  # a bug: report it, keep the app and the chat usable
                log.error("engine failed:\n%s", traceback.format_exc())
                status.failed(e)
                status.title = "Internal error"
                status.message = f"{type(e).__name__}: {e}. This is a bug in edge-agent; the chat is kept."
            finally:
                record.finish(status.status or "error")
                self._cancels.pop(q.ask_id, None)
                self.release(record.chat_id)
        reply_to.post_message(AskFinished(q.ask_id, status.status, status.title, status.message))
