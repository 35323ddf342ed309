"""The main screen: transcript, image panel, prompt, status bar.

Questions go to the engine host (``host.EngineHost.ask``), whose thread worker records the exchange in
the chat store (by ``chat.recorder``'s rule: once the model read the question) and posts each event to
this screen as a message; the screen shows the question at once and only renders. Escape
cancels the run and frees the prompt at once; a new question waits for the engine lock, so the model
is never used by two threads. Nothing here calls the model on the UI thread. The screen talks to the
app through messages (``SettingsRequested``) and hears from it through ``HostChanged``.
Its images are ``images.ImageActions`` and its chats (new, open, page back, export)
``chat_history.ChatHistory``: its base classes.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Footer, Header, Input, ProgressBar, Static

from edge_agent.agent import events as ev
from edge_agent.chat.store import Continuation, Message
from edge_agent.modelfiles.overview import better_than_demo
from edge_agent.tools import specs
from edge_agent.ui.host import EngineHost, Question
from edge_agent.ui.messages import AgentEvent, AskFinished, ExchangeOpened, HostChanged, SettingsRequested
from edge_agent.ui.screens import slash_commands
from edge_agent.ui.screens.chat_history import ChatHistory
from edge_agent.ui.screens.images import TEXT_ONLY_IMAGE, ImagePanel, names, one_or_all
from edge_agent.ui.widgets.preview import looks_like_image_path
from edge_agent.ui.widgets.prompt import (
    KEY_HELP,
    PLACEHOLDER_TEXT,
    PLACEHOLDER_VISION,
    SLASH_HELP,
    AttachmentBar,
    PromptInput,
    parse_slash,
    path_and_question,
    path_like,
)
from edge_agent.ui.widgets.statusbar import StatusBar, next_mode
from edge_agent.ui.widgets.transcript import AnswerView, Transcript, UserMessage

EMPTY_HINT = (
    "Attach an image (/image PATH, Ctrl+F, or paste a path) and ask about it.\n"
    "Each answer shows its reasoning: Ctrl+T opens or closes it. Esc stops an answer. "
    "Ctrl+P: all commands."
)
EMPTY_HINT_TEXT_ONLY = (
    "This model reads text only: ask a question (it can search the web, or the cache offline).\n"
    "For questions about images choose a vision model: Ctrl+S, or `edge-agent models pull "
    "qwen3-vl-2b-instruct`.\nEach answer shows its reasoning: Ctrl+T opens or closes it. Esc stops an "
    "answer. Ctrl+P: all commands."
)


class ChatScreen(ChatHistory):
    BINDINGS = [
        Binding("escape", "cancel", "Stop answer"),
        Binding("ctrl+f", "pick_image", "Attach image"),
        Binding("ctrl+d", "detach_image", "Detach image", show=False, priority=True),
        Binding("ctrl+t", "toggle_reasoning", "Reasoning"),
        Binding("ctrl+r", "toggle_mode", "Mode"),
        Binding("ctrl+o", "chats", "Chats"),
        Binding("ctrl+n", "new_chat", "New chat"),
        Binding("ctrl+s", "app.settings", "Settings"),
        Binding("ctrl+y", "copy_answer", "Copy answer", show=False),
    ]

    DEFAULT_CSS = """
    ChatScreen #main { height: 1fr; }
    ChatScreen #loading { height: auto; padding: 0 1; display: none; }
    ChatScreen #loading.-visible { display: block; }
    ChatScreen #loading ProgressBar { width: 40; }
    ChatScreen #loading-label { width: 1fr; }
    ChatScreen PromptInput { margin: 0 1; }
    ChatScreen #read-only { height: auto; padding: 0 1; background: $warning 30%; }
    """

    def __init__(self, host: EngineHost, history: list[str]) -> None:
        super().__init__()
        self.host = host
        self.store = host.store
        self.chat_id: int | None = None
        self.attached: list[str] = []  # the next question's images (ImageActions)
        self.sent = False
        self.images: list[str] = []
        self.running: int | None = None  # the ask id of the answer being computed (Question.ask_id)
        self._asks = 0  # the last ask id given
        self._replacing: set[int] = set()  # asks that take the last exchange's place once written
        self._prompt_history = history
        self._t0 = 0.0
        self._tokens = 0
        # Ctrl+T: every answer's reasoning open (new ones too), or every one closed
        self.reasoning_open = False
        self.text_only = False  # the loaded model reads no images
        self.better_model: str | None = None  # on the demo: an installed real model to use instead
        self._replace_last = False  # /edit: the next question replaces the last exchange in the context
        # a question sent while the model loads: sent once it is ready, if the prompt still holds it
        self._send_when_ready: str | None = None
        self._older: list[tuple[Message, list[str]]] = []  # a long chat's messages not mounted yet

    def compose(self) -> ComposeResult:
        yield Header()
        banner = Static(Text(f"Read-only: {self.store.read_only} Answers work; chats, settings and saved "
                             f"contexts "
                             "of this session are not saved.", style="bold"), id="read-only")
        banner.display = bool(self.store.read_only)
        yield banner
        with Horizontal(id="main"):
            with Transcript(id="transcript"):
                yield Static(self.empty_hint(), classes="empty-hint")
            yield ImagePanel(id="image-panel")
        with Horizontal(id="loading"):
            yield Static("Loading the model…", id="loading-label")
            yield ProgressBar(total=1.0, show_eta=False, id="loading-bar")
        yield AttachmentBar(id="attachment")
        yield PromptInput(self._prompt_history, id="prompt")
        yield StatusBar(self.host.settings, id="status")
        yield Footer()

    def on_resize(self, event: events.Resize) -> None:
        # The image panel needs ~36 columns; below 100 the transcript gets the whole width.
        self.query_one(ImagePanel).display = event.size.width >= 100

    def on_mount(self) -> None:
        self.sub_title = "new chat"
        self.query_one(AttachmentBar).show([], 0)
        self.query_one(PromptInput).focus()

    def empty_hint(self) -> str:
        if not self.text_only:
            return EMPTY_HINT
        if self.better_model:  # as `models list` says it
            return (f"{EMPTY_HINT_TEXT_ONLY}\nThis is the 135M demo model: {self.better_model} is installed "
                    "and answers text questions far better (Ctrl+S, model).")
        return EMPTY_HINT_TEXT_ONLY

    def set_text_only(self, text_only: bool) -> None:
        """Say what the loaded model can do: the prompt's placeholder, the attachment line, the hint."""
        self.text_only = text_only
        if text_only and self.attached:  # attached while the model loaded
            self.notify(f"{names(self.attached)} detached: {TEXT_ONLY_IMAGE}",
                        title="Model cannot see images", severity="warning", timeout=8)
            self.attached = []
        self.query_one(PromptInput).placeholder = PLACEHOLDER_TEXT if text_only else PLACEHOLDER_VISION
        bar = self.query_one(AttachmentBar)
        bar.text_only = text_only
        self._show_images()
        for hint in self.query(".empty-hint").results(Static):
            hint.update(self.empty_hint())

    # --- small accessors ---
    @property
    def status(self) -> StatusBar:
        return self.query_one(StatusBar)

    def on_host_changed(self, m: HostChanged) -> None:
        """The engine loads, loaded, failed to load, or the settings changed: show it."""
        host, status = self.host, self.status
        status.set_settings(host.settings)
        if m.loading is not None:
            self.show_loading(*m.loading)
        elif host.state != "loading":
            self.show_loading("", None)
        if self.running is None or host.state != "ready":
            status.state = host.state
        if host.state == "ready":
            status.set_models(*host.model_names(), text_only=not host.sees_images)
            self.better_model = better_than_demo() if host.on_demo else None
            self.set_text_only(not host.sees_images)
            self.read_ahead()  # a photo attached (or words typed) while the model loaded
        if host.state != "loading" and self._send_when_ready is not None:
            waiting, self._send_when_ready = self._send_when_ready, None
            prompt = self.query_one(PromptInput)
            if host.state == "ready" and prompt.value.strip() == waiting:  # not edited meanwhile
                self.call_later(prompt.action_submit)

    def show_loading(self, text: str, fraction: float | None) -> None:
        box = self.query_one("#loading")
        if fraction is None:
            box.remove_class("-visible")
            return
        box.add_class("-visible")
        self.query_one("#loading-label", Static).update(text)
        bar = self.query_one(ProgressBar)
        bar.update(total=None if fraction < 0 else 1.0, progress=max(fraction, 0.0))

    @on(Input.Changed, "#prompt")
    def read_ahead(self) -> None:
        """What is given so far (the photo, the words typed) is read into the chat's context meanwhile;
        not during an answer, nor for an edited question (it continues from an earlier point)."""
        if self.running is None and not self._replace_last:
            text, images = self.given(self.query_one(PromptInput).value)  # a pasted path: its photo + words
            self.host.read_ahead(text, one_or_all(images), self.chat_id)

    # --- the prompt ---
    @on(Input.Submitted, "#prompt")
    async def submitted(self, event: Input.Submitted) -> None:
        """Enter: a command, a path to attach, or a question. The prompt is emptied only when its text is
        used: refused (busy, no model, not an image), it stays as it was, to send again or fix."""
        text = event.value.strip()
        prompt = self.query_one(PromptInput)
        if not text:
            return
        slash = parse_slash(text)
        if slash is not None:
            command = slash_commands.find(slash.name, slash.arg)
            if command is not None and command.busy_refused and self._say_busy():
                return
            prompt.value = ""
            await self.run_slash(slash.name, slash.arg)
            return
        path = looks_like_image_path(text) or path_like(text)
        if path is not None:  # a path is never a question: attach it, or say why it cannot be
            if self.attach(path):
                prompt.value = ""
            return
        pasted = path_and_question(text)  # a path, then the question: attached, and the words asked
        if not self._can_ask(sent=text) or (pasted is not None and not self.attach(pasted[0])):
            return  # the prompt stays as it was (to fix the path, or send again)
        prompt.value = ""
        prompt.remember(text)
        await self.ask(pasted[1] if pasted is not None else text, self.attached)
        self.sent = bool(self.attached)

    async def run_slash(self, name: str, arg: str) -> None:
        command = slash_commands.find(name, arg)
        if command is None:
            self.notify(f"Unknown command /{name}.\n{SLASH_HELP}", title="Unknown command",
                        severity="warning")
            return
        done = command.run(self, arg)
        if done is not None:
            await done

    async def show_help(self) -> None:
        """/help: a block in the transcript that stays (a toast vanished before it was read)."""
        for hint in self.query(".empty-hint"):
            await hint.remove()
        await self.transcript.mount(Static(Text(f"{KEY_HELP}\n{SLASH_HELP}", style="dim"), classes="help"))
        self.transcript.scroll_end(animate=False)

    def _last_question(self) -> tuple[str, list[str]] | None:
        """The chat's last question and the images it was about (None: nothing asked yet)."""
        return self.store.last_question(self.chat_id) if self.chat_id is not None else None

    def _say_busy(self) -> bool:
        """True (and says so) while an answer runs."""
        if self.running is None:
            return False
        self.notify("An answer is still running. Press Esc to stop it first.", title="Busy",
                    severity="warning")
        return True

    def _can_ask(self, sent: str | None = None) -> bool:
        """True when a question can go to the model now; else says why. ``sent``: the prompt's text, sent
        with Enter: while the model loads it waits for it (sent once it is ready, if still in the prompt)."""
        if self.host.engine is None:
            if self.host.state == "loading" and sent is not None:
                self._send_when_ready = sent
                self.notify("The model is still loading: your question goes as soon as it is ready (edit it "
                            "or press Esc to hold it back).", title="Model loading", timeout=6)
            elif self.host.state == "loading":
                self.notify("The model is still loading; try again in a moment.", title="Model loading",
                            severity="warning")
            else:
                self.notify("No model is loaded. Open the settings (Ctrl+S) to choose one.", title="No model",
                            severity="error")
            return False
        if self._say_busy():
            return False
        holder = self.host.claim(self.chat_id) if self.chat_id is not None else None
        if holder is not None:  # another process is answering in this chat: one writer at a time
            self.notify(f"Chat {self.chat_id} is being answered by {holder}. Ask again when it is done, or "
                        f"in a new "
                        "chat (Ctrl+N).", title="Chat busy", severity="warning", timeout=8)
            return False
        self.host.release(self.chat_id)  # only asked whether it is free: ask() holds it for the answer
        return True

    async def action_retry(self) -> None:
        """Answer the last question again (a new answer; also after a stopped or failed one), with
        the context the first answer had: the new exchange takes the last one's place."""
        last = self._last_question()
        if last is None:
            self.notify("Nothing to answer again yet: ask a question first.", title="Nothing to retry",
                        timeout=4)
            return
        await self.ask(last[0], last[1], replace_last=True)

    def action_edit_last(self) -> None:
        """Put the last question back in the prompt; sent, it replaces the last exchange in the context."""
        if self._say_busy():
            return
        last = self._last_question()
        if last is None:
            self.notify("Nothing to edit yet: ask a question first.", title="Nothing to edit", timeout=4)
            return
        prompt = self.query_one(PromptInput)
        prompt.value = last[0]
        prompt.cursor_position = len(last[0])
        prompt.focus()
        self._replace_last = True
        self.notify("Edit the question and press Enter to send it again.", title="Edit last question",
                    timeout=4)

    async def ask(self, question: str, images: str | list[str] | None, *, replace_last: bool = False) -> None:
        """Ask in this chat about ``images`` (a file, several, or none). ``replace_last``: the model does not
        see the chat's last exchange (a retry or an edited question takes its place)."""
        images = [images] if isinstance(images, str) else list(images or ())
        if not self._can_ask():
            return
        replace_last = (replace_last or self._replace_last) and self.chat_id is not None
        self._replace_last = False
        if self.chat_id is not None and self.host.claim(self.chat_id) is not None:  # taken since the check
            self.notify(f"Chat {self.chat_id} is busy: ask again in a moment.", title="Chat busy",
                        severity="warning")
            return
        # The chat continues from the model's kept context of its last answer that was not replaced (or,
        # failing that, its exchanges as text): a retry or an edited question continues from the one before.
        # Read now; the exchange is written once the model has read the question (chat.recorder).
        cont = (self.store.continuation(self.chat_id, replace_last=replace_last) if self.chat_id is not None
                else Continuation(0))
        self._asks += 1
        ask_id = self._asks
        if replace_last:
            self._replacing.add(ask_id)
        for hint in self.query(".empty-hint"):
            await hint.remove()
        view = AnswerView(None, images, collapse_when_done=not self.reasoning_open, ask_id=ask_id)
        await self.transcript.mount_all([UserMessage(question, images), view])  # shown at once
        self.transcript.scroll_end(animate=False)
        self.running = ask_id
        self._t0 = time.monotonic()
        self._tokens = 0
        self.status.state = "busy"
        self.host.ask(Question(ask_id, question, tuple(images), cont.turns, cont.context, self.chat_id,
                               replace_last), self)

    def on_exchange_opened(self, m: ExchangeOpened) -> None:
        """The question reached the model and is written (in a new chat: made now); ignored when another
        chat is shown by now."""
        view = self.transcript.asked(m.ask_id)
        if view is None:
            return
        view.message_id, self.chat_id = m.message_id, m.chat_id
        self.sub_title = self.store.load_title(m.chat_id)
        if m.ask_id in self._replacing:  # the transcript marks what the store marked
            self.transcript.mark_last_replaced(upto=view)

    async def on_agent_event(self, m: AgentEvent) -> None:
        view = self.transcript.asked(m.ask_id)
        if view is None or view.status != "running":
            return  # cancelled from the UI already: late events are stored, not shown
        await view.apply(m.event)  # the transcript is anchored: it follows the end unless scrolled up
        if isinstance(m.event, ev.ToolFinished) and specs.is_search(m.event.name):
            if m.event.status == "unreachable":
                self.status.network_down = True
            elif m.event.status == "live":
                self.status.network_down = False
        if isinstance(m.event, ev.ContextOpened):
            self.status.context = {"live": "context kept", "restored": "context restored",
                                   "rebuilt": "context rebuilt",
                                   "new": "new context"}.get(m.event.source, "")
        if isinstance(m.event, ev.AnswerToken):
            self._tokens += 1
            dt = time.monotonic() - self._t0
            if dt > 0.5:
                self.status.tokens_per_second = self._tokens / dt
        if isinstance(m.event, ev.FinalAnswer):
            tps = view.tokens_per_second()
            if tps:
                self.status.tokens_per_second = tps

    async def on_ask_finished(self, m: AskFinished) -> None:
        self._replacing.discard(m.ask_id)
        view = self.transcript.asked(m.ask_id)
        if view is not None and view.status == "running":
            await view.finish(m.status, f"{m.title}: {m.message}" if m.title else "")
        if m.status == "error" and m.title:
            self.notify(m.message, title=m.title, severity="error", timeout=10)
        if self.running == m.ask_id:
            self.running = None
            self.status.state = "ready"
            self.read_ahead()  # what was typed meanwhile, after the new answer

    async def action_cancel(self) -> None:
        if self._send_when_ready is not None:  # a question waiting for the model: kept, not sent
            self._send_when_ready = None
            self.notify("Held back: press Enter to send it when you like.", title="Question not sent",
                        timeout=3)
            return
        if self.running is None:
            return
        self.host.cancel(self.running)
        view = self.transcript.asked(self.running)
        if view is not None:
            await view.finish("cancelled")
        self.running = None
        self.status.state = "ready"
        self.notify("Stopped. Ask again when you like.", title="Answer cancelled", timeout=3)
        self.query_one(PromptInput).focus()

    def action_copy_answer(self) -> None:
        """Ctrl+Y: the answer in focus (clicked), else the last one, to the clipboard (the terminal's, through
        Textual: OSC 52, which most terminals take)."""
        answers = self.transcript.answers()
        focused = next((a for a in answers if a.has_focus_within), None)
        answer = focused or next((a for a in reversed(answers) if a.text.strip()), None)
        if answer is None or not answer.text.strip():
            self.notify("There is no answer to copy yet.", title="Nothing to copy", timeout=3)
            return
        self.app.copy_to_clipboard(answer.text.strip())
        self.notify(f"The answer ({len(answer.text.strip())} characters) is on the clipboard.",
                    title="Copied",
                    timeout=3)

    # --- reasoning, mode, settings ---
    def action_toggle_reasoning(self) -> None:
        """Open every answer's reasoning, new answers' too (or close them all)."""
        answers = self.transcript.answers()
        self.reasoning_open = any(t.collapsed for a in answers for t in a.turns.values()) or (
            not self.reasoning_open and not any(a.turns for a in answers))
        for a in answers:
            a.collapse_when_done = not self.reasoning_open
            a.set_expanded(self.reasoning_open)

    def action_toggle_mode(self) -> None:
        self.post_message(SettingsRequested({"mode": next_mode(self.host.settings.mode)}))
