"""The reasoning of one agent turn, as a collapsible block.

SSR: the library's rationales (and which library: built-in or its file name) with their probabilities
as bars, the chosen one marked. Free-form: the
reasoning text as it streams. SeProD: the prophet's draft with the accepted tokens highlighted and
accepted/drafted counts, a grounding draft's yes/no verdict, waits, and drafts skipped (with why).
Then the tool call and its result (``tool_view``), then the turn's timings
in the block's title. Pure rendering of agent events; knows nothing of the engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.widgets import Collapsible, Static

from edge_agent.agent import events as ev
from edge_agent.agent.answer_check import ONLY_MOVE_LEFT, agreed_note, said
from edge_agent.ui.widgets.tool_view import ToolView

if TYPE_CHECKING:  # Textual's title widget: only its message's type is named here
    from textual.widgets._collapsible import CollapsibleTitle

BAR_WIDTH = 12


def ms(seconds: float) -> str:
    """61 ms / 1.4 s: short, stable widths for titles."""
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def bar(p: float, width: int = BAR_WIDTH) -> Text:
    """A probability as a bar of eighth blocks: ``width`` cells = 1.0."""
    p = min(max(p, 0.0), 1.0)
    eighths = round(p * width * 8)
    full, part = divmod(eighths, 8)
    s = "█" * full + ("" if part == 0 else " ▏▎▍▌▋▊▉"[part])
    return Text(s.ljust(width), style="green")


def rationale_table(e: ev.RationaleScored) -> RenderableType:
    """One row a rationale: mark, bar, p, action, text; the chosen row bold."""
    table = Table.grid(padding=(0, 1), expand=True)
    table.add_column(width=1)
    table.add_column(width=BAR_WIDTH)
    table.add_column(width=4, justify="right")
    table.add_column(width=12, no_wrap=True)
    table.add_column(ratio=1)  # wraps: a rationale is read whole
    for i, c in enumerate(e.candidates):
        chosen = i == e.chosen
        style = "bold" if chosen else "dim"
        table.add_row(
            Text("▶" if chosen else " ", style="bold yellow"),
            bar(c.prob),
            Text(f"{c.prob * 100:.0f}%", style=style),
            Text(c.action, style="bold cyan" if chosen else "cyan"),
            Text(c.text, style=style),
        )
    lib = getattr(e, "library", "")
    where = "" if not lib else f" from {lib if lib.startswith('built-in') else Path(lib).name}"
    kind = " (calibrated: minus each one's score after a neutral question)" if e.score_kind == "pmi" else ""
    if not getattr(e, "scored", True):  # chosen without a scoring pass: the scores could not matter
        why = ONLY_MOVE_LEFT if e.rechosen else e.why
        head = Text(f"SSR: the {e.candidates[e.chosen].action} rationale, not scored: {why}", style="dim")
    elif e.rechosen and e.why:
        n = len(e.candidates)
        head = Text(f"SSR: the best of {n} answer rationale{'s' if n > 1 else ''}, from the same scores: "
                    f"{e.why}", style="dim")
    elif e.rechosen:
        n = len(e.candidates)
        which = "the one other rationale" if n == 1 else f"the best of the other {n} rationales"
        head = Text(f"SSR: {which}, from the same scores{kind}", style="dim")
    else:
        head = Text(f"SSR: {len(e.candidates)} rationales{where} scored in one pass, {ms(e.seconds)}{kind}",
                    style="dim")
    return Group(head, table)


VERDICTS = {"yes": "target seen", "no": "target not here: look elsewhere"}


def draft_text(e: ev.DraftVerified, proposed: ev.DraftProposed | None) -> Text:
    """The prophet's draft: accepted prefix highlighted, the rejected rest struck through; for a
    grounding draft its yes/no verdict (and whether the agent accepted it); waits and L_d changes."""
    t = Text()
    t.append(f"Prophet ({e.mode}) ", style="bold magenta")
    if e.verdict:
        t.append(f"verdict {e.verdict.upper()}", style="bold green" if e.verdict == "yes" else "bold red")
        t.append(f" ({VERDICTS[e.verdict]}" if e.verdict_accepted and e.verdict in VERDICTS else " (not "
                                                                                                 "accepted",
                 style="magenta")
        t.append(") ", style="magenta")
    elif e.mode == "grounding":
        t.append("verdict unclear ", style="dim")
    t.append(f"{e.accepted}/{e.drafted} tokens accepted ", style="magenta")
    if proposed is not None and (proposed.waited >= 0.0005 or proposed.note):
        extra = [f"waited {ms(proposed.waited)}"] if proposed.waited >= 0.0005 else []
        extra += [proposed.note] if proposed.note else []
        t.append(f"({'; '.join(extra)}) ", style="dim")
    t.append(e.accepted_text, style="black on magenta")
    if proposed is not None and proposed.text.startswith(e.accepted_text):
        rest = proposed.text[len(e.accepted_text):]
        if rest:
            t.append(rest, style="dim strike")
    return t


SKIP_REASONS = {"not_ready": "not ready in time", "low_acceptance": "recent drafts were not accepted",
                "answered": "not needed", "diverged": "it begins otherwise than the answer"}


def skipped_text(e: ev.DraftSkipped) -> Text:
    """A draft the agent went on without, and why (not ready in time / mode switched off)."""
    t = Text()
    t.append(f"Prophet ({e.mode}) ", style="bold magenta")
    t.append(f"draft skipped: {SKIP_REASONS.get(e.reason, e.reason)}", style="magenta")
    if e.waited >= 0.0005:
        t.append(f", waited {ms(e.waited)}", style="magenta")
    if e.detail:
        t.append(f" ({e.detail})", style="dim")
    return t


class TurnView(Collapsible):
    """One agent turn. Open while it runs; the answer view collapses it when the run ends."""

    DEFAULT_CSS = """
    TurnView { margin: 0; padding: 0; border-top: none; background: $surface; }
    /* a turn's title wraps in a narrow window instead of losing its end ("reading 2." at 120 columns) */
    TurnView > CollapsibleTitle { max-width: 100%; }
    TurnView > Contents { padding: 0 0 0 2; height: auto; }
    TurnView .rationales, TurnView .freeform, TurnView .draft, TurnView .turn-error { height: auto; }
    TurnView .freeform { color: $text-muted; text-style: italic; }
    TurnView .turn-error { color: $error; }
    """

    def __init__(self, turn: int, images: dict[int, str], *, collapsed: bool = False) -> None:
        super().__init__(title=f"Turn {turn}", collapsed=collapsed, classes="turn")
        self.turn = turn
        self.images = images  # img_idx -> path (0: the question's image, then crops): shared per run
        self._reasoning: list[str] = []
        self._proposed: ev.DraftProposed | None = None
        self._tool: ToolView | None = None
        self._freeform_w: Static | None = None
        self.action = ""
        self._toggled_by_person = False

    def on_collapsible_title_toggle(self, event: CollapsibleTitle.Toggle) -> None:
        self._toggled_by_person = True  # a click or Enter on the title (Collapsible's handler toggles it)

    def scroll_visible(self, *args, **kwargs) -> None:
        # Collapsible scrolls itself into view whenever it opens or closes. Only a person's toggle should:
        # closed by the app (each turn, when its answer is done) or opened and closed with every other turn
        # (Ctrl+T), the scroll released the transcript's anchor, and a chat whose turn closed above the view
        # stopped following its end (Ctrl+T left the view on the last turn's top).
        if self._toggled_by_person:
            self._toggled_by_person = False
            super().scroll_visible(*args, **kwargs)

    async def _add(self, widget) -> None:
        contents = self.query(Collapsible.Contents) if self.is_mounted else None
        if contents:
            await contents.first().mount(widget)
        else:  # not composed yet: compose() yields these
            self._contents_list.append(widget)

    async def apply(self, e: ev.Event) -> None:
        """Render one event of this turn."""
        if isinstance(e, ev.RationaleScored):
            self.action = e.candidates[e.chosen].action if 0 <= e.chosen < len(e.candidates) else ""
            await self._add(Static(rationale_table(e), classes="rationales"))
            self._retitle()
        elif isinstance(e, ev.ReasoningToken):
            self._reasoning.append(e.text)
            (await self._freeform()).update(Text("".join(self._reasoning)))
        elif isinstance(e, ev.ReasoningDone):
            head = Text(f"Free-form reasoning: {e.n_tokens} tokens, {ms(e.seconds)}\n",
                        style="dim not italic")
            (await self._freeform()).update(head + Text(e.text.strip()))
        elif isinstance(e, ev.DraftProposed):
            self._proposed = e
        elif isinstance(e, ev.DraftVerified):
            await self._add(Static(draft_text(e, self._proposed), classes="draft"))
        elif isinstance(e, ev.DraftSkipped):
            await self._add(Static(skipped_text(e), classes="draft"))
        elif isinstance(e, ev.ToolCalled):
            self.action = e.name
            self._tool = ToolView(e, self.images)
            await self._add(self._tool)
            self._retitle()
        elif isinstance(e, ev.ToolFinished):
            if self._tool is None:
                self._tool = ToolView(None, self.images)
                await self._add(self._tool)
            await self._tool.finish(e)
        elif isinstance(e, ev.AgentError):
            await self._add(Static(Text(f"{e.title}: {e.message}"), classes="turn-error"))
        elif isinstance(e, ev.AnswerChecked) and e.sure:  # an unsure one shows as the answer taken back
            line = (f"answer check: sure ({said(e)!r}...: mean log-prob {e.score:.2f} of what it adds to the "
                    f"question, at least {e.threshold:g}{agreed_note(e)})")
            await self._add(Static(Text(line, style="dim"), classes="draft"))
        elif isinstance(e, ev.MoveWithdrawn):
            what = e.arguments.get("query", e.arguments.get("img_idx"))
            move = e.action if what is None else f"{e.action} {what!r}"
            await self._add(Static(Text(f"{move} taken back: {e.reason}", style="dim"), classes="draft"))
        elif isinstance(e, ev.TurnFinished):
            self.action = e.action
            self._retitle(e)

    async def _freeform(self) -> Static:
        if self._freeform_w is None:
            self._freeform_w = Static(classes="freeform")
            await self._add(self._freeform_w)
        return self._freeform_w

    def _retitle(self, done: ev.TurnFinished | None = None) -> None:
        parts = [f"Turn {self.turn}"]
        if self.action:
            parts.append(self.action)
        if done is not None:
            parts.append(f"reasoning {ms(done.reasoning_seconds)}, action {ms(done.action_seconds)}"
                         + (f", tool {ms(done.tool_seconds)}" if done.tool_seconds else "")
                         + (f", reading {ms(done.observe_seconds)}" if done.observe_seconds
                            else ""))
        self.title = " · ".join(parts)
