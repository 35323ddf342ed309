"""The chat transcript: the user's questions (with the attached image) and the agent's answers.

An :class:`AnswerView` renders one run of the agent from its event stream: a collapsible block per
turn (``reasoning.TurnView``), the prophet's share of the answer, the answer as streamed Markdown
(``readable.readable_markdown``: block markers the model wrote by accident stay text; control characters
are removed from every event first) and a footer line (status, turns, tokens per second). A resumed
chat replays stored events through the same code, so it looks the same as when it was live. An
exchange a /retry or /edit replaced stays in view, dimmed and marked.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.geometry import Size
from textual.message import Message
from textual.widgets import Markdown, Static
from textual.widgets.markdown import MarkdownStream

from edge_agent.agent import events as ev
from edge_agent.core.textclean import clean_event, clean_model_text
from edge_agent.tools import observations
from edge_agent.ui.widgets.preview import ImagePreview
from edge_agent.ui.widgets.put import put
from edge_agent.ui.widgets.readable import readable_markdown
from edge_agent.ui.widgets.reasoning import TurnView, ms

STATUS_TEXT = {
    "running": ("thinking…", "yellow"),
    "answered": ("answered", "green"),
    "turn_limit": ("turn limit reached", "yellow"),
    "length": ("cut off at answer_max_tokens (raise it in the settings, Ctrl+S)", "yellow"),
    "repetition": ("stopped: the answer began repeating itself (/retry, or switch mode: Ctrl+R)", "yellow"),
    "no_answer": ("no answer found (the model only repeated its instructions): /retry or rephrase", "yellow"),
    "cancelled": ("cancelled (/retry answers it again)", "yellow"),
    "error": ("failed", "red"),
    "interrupted": ("interrupted (the app stopped): /retry answers it again", "yellow"),
}


class UserMessage(Horizontal):
    DEFAULT_CSS = """
    UserMessage { height: auto; margin: 1 0 0 0; padding: 0 1; background: $boost; }
    UserMessage .who { width: 5; color: $accent; text-style: bold; }
    UserMessage .question { width: 1fr; height: auto; }
    UserMessage ImagePreview { margin: 0 1 0 0; }
    UserMessage.-replaced .question { color: $text-muted; text-style: strike; }
    """

    def __init__(self, text: str, image: str | Sequence[str] | None, *, replaced: bool = False) -> None:
        super().__init__(classes="user-message -replaced" if replaced else "user-message")
        self.images = [image] if isinstance(image, str) else list(image or ())
        self.text, self.image = clean_model_text(text), (self.images[0] if self.images else None)

    def compose(self) -> ComposeResult:
        yield Static("You", classes="who")
        for path in self.images[:4]:  # several: one thumbnail each (a question rarely has more)
            yield ImagePreview(path, width=16 if len(self.images) == 1 else 12, height=6, classes="thumb")
        yield Static(Text(self.text), classes="question")


class AnswerView(Vertical):
    """One agent run. ``apply(event)`` renders events as they come; ``finish(status)`` closes it."""

    DEFAULT_CSS = """
    AnswerView { height: auto; margin: 0 0 1 0; padding: 0 1; }
    AnswerView .turns { height: auto; }
    AnswerView .prophet-note { height: auto; color: $text-muted; }
    AnswerView Markdown.answer { margin: 0; padding: 0; background: transparent; }
    AnswerView .answer-footer { height: auto; color: $text-muted; }
    AnswerView .context-note { height: auto; color: $text-muted; }
    AnswerView.-replaced { opacity: 60%; }
    """

    def __init__(self, message_id: int | None, image: str | Sequence[str] | None, *,
                 collapse_when_done: bool = True, replaced: bool = False, ask_id: int | None = None) -> None:
        super().__init__(classes="answer-view -replaced" if replaced else "answer-view")
        self.message_id = message_id  # the stored answer's (None: not written yet, see chat.recorder)
        self.ask_id = ask_id  # a question asked in this session: the screen's id for it
        attached = [image] if isinstance(image, str) else list(image or ())
        self.images: dict[int, str] = dict(enumerate(attached))  # img_idx -> file (crops join as they come)
        self.n_attached = len(attached)
        self.collapse_when_done = collapse_when_done
        self.turns: dict[int, TurnView] = {}
        self.text = ""  # the answer as the model wrote it (without control characters)
        self._shown = ""  # what the Markdown widget holds: readable_markdown(self.text)
        self.replaced = replaced
        self.status = "running"
        self.final: ev.FinalAnswer | None = None
        self.mode = ""  # the run's mode (RunStarted): a plain chat ("direct") has no turn blocks
        self.answer_tokens = 0
        self.prophet_tokens = 0
        self._stream: MarkdownStream | None = None
        self._prophet_draft: ev.DraftVerified | None = None
        self._replaying = False  # a stored answer: turns are built closed, nothing scrolls
        self.detail = ""  # the error line under the footer, once set
        # the searches this answer is without, why (events.searches_without: "text_search failed (...)...")
        self.searches_missing: list[str] = []
        # Parts exist before mounting so a stored answer can be built whole, then mounted once.
        self._context_note = Static(classes="context-note")  # how the context was opened; images' cost
        self._context_note.display = False  # until the engine says (a scripted or stored answer may not)
        self._context_lines: list[Text] = []
        self._turns_box = Vertical(classes="turns")
        self._note = Static(classes="prophet-note")
        self._md = Markdown("", classes="answer")
        self._footer = Static(Text(*STATUS_TEXT["running"]), classes="answer-footer")

    def compose(self) -> ComposeResult:
        yield self._context_note
        yield self._turns_box
        yield self._note
        yield self._md
        yield self._footer

    async def _turn(self, n: int) -> TurnView:
        if n not in self.turns:
            if not self._replaying and self.collapse_when_done:
                for t in self.turns.values():  # only the running turn stays open while live
                    t.collapsed = True
            view = TurnView(n, self.images, collapsed=self._replaying)
            self.turns[n] = view
            await put(self._turns_box, view)
        return self.turns[n]

    def _phase(self, e: ev.Event) -> None:
        """While running, the footer says what the agent is doing now."""
        turn = getattr(e, "turn", None)
        words = {
            ev.TurnStarted: "choosing a move",
            ev.ReasoningToken: "reasoning",
            ev.DraftProposed: "the prophet is drafting",
            ev.DraftVerified: "checking the prophet's draft",
            ev.ToolFinished: "reading the result",
            ev.AnswerToken: "answering",
        }.get(type(e))
        if isinstance(e, ev.RationaleScored) and 0 <= e.chosen < len(e.candidates):
            words = f"writing the {e.candidates[e.chosen].action} action"
        elif isinstance(e, ev.ToolCalled):
            words = f"running {e.name}"
        if words and self.status == "running" and not self._replaying:
            self._footer.update(Text(f"turn {turn}: {words}…" if turn else f"{words}…", style="yellow"))

    async def apply(self, e: ev.Event) -> None:
        e = clean_event(e)
        self._phase(e)
        turn = getattr(e, "turn", None)
        if isinstance(e, ev.RunStarted):
            self.mode = e.mode
        elif self.mode == "direct" and isinstance(e, ev.TurnStarted | ev.TurnFinished):
            return  # the model alone: nothing but the answer
        self._note_without(e)
        if isinstance(e, ev.ContextOpened | ev.ImageEvaluated):
            self._context_lines.append(context_line(e, self.images if self.n_attached > 1 else None))
            self._context_note.update(Text("\n").join(self._context_lines))
            self._context_note.display = True
        elif isinstance(e, ev.TurnStarted):
            await self._turn(e.turn)
        elif isinstance(e, ev.AnswerToken):
            await self._answer_token(e)
        elif isinstance(e, ev.FinalAnswer):
            self.final = e
            await self._set_answer(e.answer)
            await self.finish(e.stop_reason)
        elif isinstance(e, ev.DraftVerified) and e.mode == "answering":
            self._prophet_draft = e
            await (await self._turn(e.turn)).apply(e)
        elif isinstance(e, ev.AgentError) and e.fatal:
            await self.finish("error", f"{e.title}: {e.message}")
        elif isinstance(e, ev.MoveWithdrawn) and e.action == "answer" and self.text:
            await self._set_answer("")  # an answer that looped is taken back (the turn says why); it searches
            self.answer_tokens = 0
            await (await self._turn(e.turn)).apply(e)
        elif turn is not None:
            await (await self._turn(turn)).apply(e)

    async def _answer_token(self, e: ev.AnswerToken) -> None:
        self.answer_tokens += 1
        if e.from_prophet:
            self.prophet_tokens += 1
            self._note.update(self._prophet_note())
        self.text += e.text
        shown = readable_markdown(self.text)
        if not shown.startswith(self._shown):  # an escape changed with the new text (rare): write it whole
            await self._set_answer(self.text)
            return
        if self._stream is None:
            self._stream = Markdown.get_stream(self._md)
        await self._stream.write(shown[len(self._shown):])
        self._shown = shown

    def _prophet_note(self) -> Text:
        """Where the answer's start came from, in words and counts: the text itself is the answer below
        (and the prophet's draft is in its turn's block), not repeated here."""
        d = self._prophet_draft
        n = d.accepted if d is not None else self.prophet_tokens
        note = Text(f"The answer's first {n} tokens are the prophet's draft", style="magenta")
        if d is not None:
            note.append(f" ({d.accepted}/{d.drafted} drafted tokens accepted)", style="dim")
        return note

    async def _set_answer(self, text: str) -> None:
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self.text = clean_model_text(text)
        self._shown = readable_markdown(self.text)
        if self._md.is_mounted:
            await self._md.update(self._shown)
        else:  # a stored answer being built: the widget parses it when it mounts
            self._md = Markdown(self._shown, classes="answer")

    def _note_without(self, e: ev.Event) -> None:
        """A search the answer is without (failed, not run, asked for and not offered): the footer says so,
        the turn that holds it being closed."""
        if isinstance(e, ev.ToolFinished | ev.FinalAnswer):
            self.searches_missing += [r for r in ev.searches_without([e]) if r not in self.searches_missing]

    async def finish(self, status: str, detail: str = "") -> None:
        """End of the run (answered, turn_limit, cancelled, error, interrupted): footer, collapse turns."""
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        if self.status != "running" and (status == "cancelled" or self._replaying):
            return  # already closed (an Esc before the engine's own end; a stored fatal error)
        self.status = status
        self.detail = detail or self.detail
        self._update_footer()
        if not self.text and status != "answered":
            self._md.display = False
        if self.collapse_when_done and not self._replaying:
            for t in self.turns.values():
                t.collapsed = True

    def _update_footer(self) -> None:
        """The line under a finished answer: status, turns, time, speed; replaced; the error."""
        label, style = STATUS_TEXT.get(self.status, (self.status, "dim"))
        if self.status == "length" and self.final is not None and self.final.totals.get("answer_tokens"):
            label = label.replace("at answer_max_tokens",
                                  f"at {int(self.final.totals['answer_tokens'])} tokens "
                                  "(answer_max_tokens)")
        foot = Text(label, style=style)
        if self.turns:
            foot.append(f" · {len(self.turns)} turn{'s' if len(self.turns) != 1 else ''}", style="dim")
        tps = self.tokens_per_second()
        totals = self.final.totals if self.final else {}
        if totals.get("total"):
            foot.append(f" · {ms(float(totals['total']))}", style="dim")
        if tps:
            foot.append(f" · {tps:.1f} tok/s", style="dim")
        if self.replaced:
            foot.append(" · replaced by a later answer (/retry or /edit)", style="dim")
        if self.searches_missing and self.status != "running":
            foot.append("\n" + (observations.answered_without(self.searches_missing) if self.text
                                else "; ".join(self.searches_missing)), style="yellow")
        if self.detail:
            foot.append(f"\n{self.detail}", style="red")
        self._footer.update(foot)

    async def replay(self, events: list[ev.Event], status: str, text: str) -> None:
        """Render a stored answer: the same views as live, the answer text set once."""
        self._replaying = True
        for e in map(clean_event, events):
            if isinstance(e, ev.AnswerToken):
                self.answer_tokens += 1
                self.prophet_tokens += e.from_prophet
            elif isinstance(e, ev.FinalAnswer):
                self.final = e
                self._note_without(e)
            else:
                await self.apply(e)
        if self.prophet_tokens and self._prophet_draft is not None:
            self._note.update(self._prophet_note())
        if text:
            await self._set_answer(text)
        await self.finish("answered" if status == "done" else status)

    def tokens_per_second(self) -> float | None:
        """The engine's own measure when it gave one (totals), else None."""
        totals = self.final.totals if self.final else {}
        for key in ("tokens_per_second", "answer_tokens_per_second", "tok_s"):
            if totals.get(key):
                return float(totals[key])
        # The agent loop reports generated tokens and the model's seconds per phase.
        model_s = float(totals.get("reasoning", 0.0)) + float(totals.get("action", 0.0))
        if totals.get("generated_tokens") and model_s > 0:
            return float(totals["generated_tokens"]) / model_s
        return None

    def set_expanded(self, expanded: bool) -> None:
        for t in self.turns.values():
            t.collapsed = not expanded

    def mark_replaced(self) -> None:
        """A /retry or /edit took this answer's place: dimmed, and the footer says so."""
        if not self.replaced:
            self.replaced = True
            self.add_class("-replaced")
            if self.status != "running":
                self._update_footer()


class Transcript(VerticalScroll):
    """The chat so far; follows the bottom while an answer streams. Posts ``ReachedTop`` when scrolled to
    the top (a long chat then mounts its earlier messages)."""

    BINDINGS = [Binding("home", "top", "Top", show=False)]

    class ReachedTop(Message):
        pass

    _anchor_when_full = True  # anchored once the chat fills the view (until then it reads from the top)

    def restart(self) -> None:
        """A new or another chat is about to be shown: not anchored until it fills the view."""
        self.anchor(False)
        self._anchor_when_full = True

    def watch_virtual_size(self, size: Size) -> None:
        # Anchored, the end stays in view as answers stream, pages are built and the terminal resizes,
        # until the user scrolls up (scrolling back to the end anchors it again). Not before the chat
        # fills the view: an anchored short chat would sit at the bottom (as one would whose open
        # reasoning blocks filled the view while it ran, then closed).
        full = size.height > self.scrollable_content_region.height
        if full and self._anchor_when_full:
            self._anchor_when_full = False
            self.anchor()
        elif not full and not self._anchor_when_full:
            self.restart()
            self.scroll_home(animate=False, immediate=True)

    def action_top(self) -> None:
        """Home: to the top; already there, a long chat's earlier messages are asked for."""
        at_top = self.scroll_y <= 0
        self.scroll_home(animate=False)
        if at_top:
            self.post_message(self.ReachedTop())

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if new_value <= 0 < old_value:
            self.post_message(self.ReachedTop())

    DEFAULT_CSS = """
    Transcript { height: 1fr; padding: 0 1; scrollbar-size-vertical: 1; }
    Transcript .empty-hint { color: $text-muted; margin: 1 2; height: auto; }
    Transcript .help { margin: 1 2; height: auto; }
    """

    def mark_last_replaced(self, upto: AnswerView | None = None) -> None:
        """The last exchange shown (its question and answer), or the last before ``upto``'s question and
        answer, was replaced by a /retry or /edit."""
        kids = list(self.children)
        if upto is not None:
            kids = kids[:max(0, kids.index(upto) - 1)]
        starts = [i for i, w in enumerate(kids) if isinstance(w,
                                                              UserMessage) and not w.has_class("-replaced")]
        for w in kids[starts[-1]:] if starts else ():
            if isinstance(w, AnswerView):
                w.mark_replaced()
            else:
                w.add_class("-replaced")

    def answers(self) -> list[AnswerView]:
        return list(self.query(AnswerView))

    def answer(self, message_id: int) -> AnswerView | None:
        """The view of stored answer ``message_id``."""
        return next((a for a in self.query(AnswerView) if a.message_id == message_id), None)

    def asked(self, ask_id: int) -> AnswerView | None:
        """The view of the answer to question ``ask_id`` (asked in this session), while it is shown."""
        return next((a for a in self.query(AnswerView) if a.ask_id == ask_id), None)


CONTEXT_WORDS = {
    "live": "continued in memory",
    "restored": "restored from its saved state",
    "rebuilt": "rebuilt from the chat's text",
    "new": "new",
}


def context_line(e: ev.ContextOpened | ev.ImageEvaluated, several: dict[int, str] | None = None) -> Text:
    """One dim line: how the question's context was opened, or what an image cost (``several``: the
    question's images by number, when it has more than one: the line names which)."""
    if isinstance(e, ev.ImageEvaluated):
        what = "image" if e.source == "image" else f"crop (turn {e.turn})"
        if several is not None and e.source == "image" and e.index is not None:
            what = f"image {e.index}" + (f" ({Path(several[e.index]).name})" if e.index in several else "")
        enc = "embedding reused" if e.reused else f"encoded {ms(e.encode_seconds)}"
        when = " on attach" if e.read_ahead else ""
        return Text(f"{what}: {e.tokens} tokens ({e.width}x{e.height} px), {enc}, read{when} "
                    f"{ms(e.decode_seconds)}",
                    style="dim")
    line = Text("context: ", style="dim")
    line.append(CONTEXT_WORDS.get(e.source, e.source), style="green" if e.source in ("live",
                                                                                     "restored")
                else "yellow")
    if e.reason:
        line.append(f" ({e.reason})", style="dim")
    parts = []
    if e.tokens_reused:
        parts.append(f"{e.tokens_reused:,} tokens kept")
    parts.append(f"{e.tokens_at_enter:,} read in {ms(e.seconds)}")
    if e.tokens_read_ahead:  # read while the question was typed (the photo on attach)
        parts.append(f"{e.question_tokens_read_ahead:,} question tokens read ahead")
    if e.system_restored:
        parts.append("system prompt restored")
    line.append(" · " + ", ".join(parts), style="dim")
    return line
