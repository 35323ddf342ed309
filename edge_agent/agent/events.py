"""Typed events yielded by the agent loop.

The TUI, ``ask --json``, the benchmarks and the eval all consume this one stream. Every event is a
frozen dataclass with a ``kind`` string and ``to_json()``; they hold plain data only (no model, no
widget). Times are seconds (float). ``turn`` counts from 1. :func:`event_from_json` is the way back
(stored chats): every subclass registers its ``kind``, and the field types restore the tuples and
nested values that JSON flattens.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

_KINDS: dict[str, type[Event]] = {}  # kind -> class; every subclass adds itself


@dataclass(frozen=True)
class Event:
    kind: ClassVar[str] = "event"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _KINDS[cls.kind] = cls

    def to_json(self) -> dict[str, Any]:
        d = {"event": self.kind}
        d.update(dataclasses.asdict(self))
        return d


def event_from_json(data: Mapping[str, Any]) -> Event | None:
    """The typed event for ``Event.to_json()`` output (after a JSON round trip).

    None for a kind this version does not know, or for a stored event whose fields no longer fit
    its class (written by an older or newer version): a reader skips it rather than fail.
    """
    cls = _KINDS.get(str(data.get("event", "")))
    if cls is None:
        return None
    types = _field_types(cls)
    try:
        return cls(**{name: _from_json(data[name], typ) for name, typ in types.items() if name in data})
    except (TypeError, ValueError):  # a field missing or extra, here or in a nested value
        return None


_TYPES: dict[str, dict[str, Any]] = {}  # event kind -> {field: type}, resolved once


def _field_types(cls: type[Event]) -> dict[str, Any]:
    types = _TYPES.get(cls.kind)
    if types is None:
        hints = typing.get_type_hints(cls)
        types = _TYPES[cls.kind] = {f.name: hints[f.name] for f in dataclasses.fields(cls)}
    return types


def _from_json(value: Any, typ: Any) -> Any:
    """``value`` as JSON gave it, rebuilt as ``typ``: lists back to tuples, objects back to dataclasses."""
    if typing.get_origin(typ) is tuple and isinstance(value, list):
        args = typing.get_args(typ)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_from_json(v, args[0]) for v in value)
        return tuple(value)
    if dataclasses.is_dataclass(typ) and isinstance(typ, type) and isinstance(value, dict):
        return typ(**value)
    return value


@dataclass(frozen=True)
class RunStarted(Event):
    kind: ClassVar[str] = "run_started"
    question: str
    image: str | None
    mode: str  # "ssr" | "freeform"
    seprod: bool
    model: str


@dataclass(frozen=True)
class TurnStarted(Event):
    kind: ClassVar[str] = "turn_started"
    turn: int


@dataclass(frozen=True)
class RationaleCandidate:
    id: str
    text: str
    action: str  # the action type it implies: image_search, text_search, zoom, answer
    score: float  # mean log-prob
    sum: float
    count: int
    prob: float
    # the same rationale's mean log-prob after a neutral question (score "pmi": p from score - neutral)
    neutral: float | None = None


@dataclass(frozen=True)
class RationaleScored(Event):
    """SSR: the candidates scored (``scored``), one chosen."""

    kind: ClassVar[str] = "rationale_scored"
    turn: int
    candidates: tuple[RationaleCandidate, ...]
    chosen: int  # index into candidates
    seconds: float
    library: str = ""  # the library scored: "built-in" or its file (Library.source); "" in older events
    # raw (the paper's mean log-prob) | pmi (mean minus its mean after a neutral question)
    score_kind: str = "raw"
    rechosen: bool = False  # the first choice's move was taken back (MoveWithdrawn): the best of the rest
    why: str = ""  # a rechosen one that goes before the first choice: why (e.g. the answer check first)
    # False: chosen without scoring, the scores could not change the move (``why`` says why); the
    # candidates' score, sum and count are then 0 and the only candidate's prob 1
    scored: bool = True


@dataclass(frozen=True)
class ReasoningToken(Event):
    """Free-form mode: a piece of the reasoning the model writes."""

    kind: ClassVar[str] = "reasoning_token"
    turn: int
    text: str


@dataclass(frozen=True)
class ReasoningDone(Event):
    kind: ClassVar[str] = "reasoning_done"
    turn: int
    text: str
    n_tokens: int
    seconds: float


@dataclass(frozen=True)
class DraftProposed(Event):
    """SeProD: the prophet drafted ``tokens`` in ``mode`` ("grounding" | "answering")."""

    kind: ClassVar[str] = "draft_proposed"
    turn: int
    mode: str
    text: str
    tokens: tuple[int, ...]
    seconds: float
    waited: float = 0.0  # the agent waited this long for it (0: it was ready)
    draft_len: int = 0  # the L_d asked for (the adaptive rule may shorten it)
    note: str = ""  # what the adaptive rule decided for this draft, e.g. "L_d 6 of 16 (...)"


@dataclass(frozen=True)
class DraftVerified(Event):
    kind: ClassVar[str] = "draft_verified"
    turn: int
    mode: str
    accepted: int
    drafted: int
    accepted_text: str
    scores: tuple[float, ...]  # s_j for every drafted token
    seconds: float
    lead: int = 0  # the agent's own whitespace tokens written before the accepted draft
    verdict: str = ""  # grounding: the prophet's "yes" | "no" ("" unclear, or answering)
    verdict_accepted: bool = False  # the agent accepted the verdict (an accepted "no" looks elsewhere)


@dataclass(frozen=True)
class DraftSkipped(Event):
    """SeProD: no draft was used at this point. ``reason``: "not_ready" (waiting would cost more than
    the draft is expected to save), "low_acceptance" (the mode's drafts are not being accepted),
    "failed" (the prophet could not draft), "answered" (SSR's answer check wrote the whole answer),
    "diverged" (the draft does not begin with the answer's start the agent had written)."""

    kind: ClassVar[str] = "draft_skipped"
    turn: int
    mode: str
    reason: str
    detail: str = ""
    waited: float = 0.0


@dataclass(frozen=True)
class ToolCalled(Event):
    kind: ClassVar[str] = "tool_called"
    turn: int
    name: str
    arguments: dict[str, Any]
    action_seconds: float  # time to generate the action


@dataclass(frozen=True)
class MoveWithdrawn(Event):
    """A move that could bring nothing new (the same search again, offline and not cached) was taken back
    before it ran or reached the context; the turn chooses another move."""

    kind: ClassVar[str] = "move_withdrawn"
    turn: int
    action: str
    arguments: dict[str, Any]
    reason: str


@dataclass(frozen=True)
class AnswerChecked(Event):
    """SSR's answer check (``ssr_answer_check``): before answering from what it knows, the agent decoded the
    answer's first tokens; ``sure`` when their ``score`` reached ``threshold`` (the tokens start the answer),
    else the answer is taken back and it searches first. ``pieces``/``logprobs``: each token's text and log
    p under the model, so a person (and the eval) can see what the model was unsure of."""

    kind: ClassVar[str] = "answer_checked"
    turn: int
    pieces: tuple[str, ...]
    logprobs: tuple[float, ...]
    score: float
    threshold: float
    sure: bool
    # the probe stopped before answer_check_tokens: the tokens left could not have reached the threshold
    # (``answer_check.out_of_reach``; the verdict is the whole probe's, the score that of the tokens read)
    early: bool = False
    # the second look (``ssr_answer_check_agree``): the other answers, begun with another first added token,
    # that name the same thing; ``agreed_logprob``: that token's log-prob with theirs (the score's), None
    # when there was no second look (``logprobs`` are each token's own)
    agreed: tuple[str, ...] = ()
    agreed_logprob: float | None = None


@dataclass(frozen=True)
class ToolFinished(Event):
    kind: ClassVar[str] = "tool_finished"
    turn: int
    name: str
    ok: bool
    observation: str  # the text the model sees
    seconds: float
    status: str = "live"  # search: live | cached | stale | offline; zoom: local; error
    image_index: int | None = None  # zoom: index of the new crop
    image_path: str | None = None  # zoom: where the crop was saved
    results: tuple[dict[str, Any], ...] = ()  # search results (title, url, snippet, source)


@dataclass(frozen=True)
class AnswerToken(Event):
    kind: ClassVar[str] = "answer_token"
    turn: int
    text: str
    from_prophet: bool = False


@dataclass(frozen=True)
class TurnFinished(Event):
    kind: ClassVar[str] = "turn_finished"
    turn: int
    action: str  # image_search | text_search | zoom | answer | invalid
    reasoning_seconds: float
    action_seconds: float
    tool_seconds: float
    # evaluating the tool's result into the context (its text, and a crop's image encoding)
    observe_seconds: float = 0.0


@dataclass(frozen=True)
class AgentError(Event):
    """A mistake the agent recovers from (malformed action, failed tool): fed back as an observation."""

    kind: ClassVar[str] = "error"
    turn: int
    title: str
    message: str
    fatal: bool = False


@dataclass(frozen=True)
class FinalAnswer(Event):
    kind: ClassVar[str] = "final_answer"
    answer: str
    turns: int
    # answered | length (cut at answer_max_tokens) | repetition (stopped in a loop: agent.repetition) |
    # turn_limit | no_answer (it only repeated its instructions) | cancelled
    stop_reason: str
    # reasoning/action/tool/total seconds; tokens_evaluated (prompt tokens this process evaluated for this
    # question, read ahead or not; all models, images in embeddings), tokens_read_ahead (of them, read
    # before it was sent), tokens_reused (context tokens kept from an earlier question or restored) ...
    totals: dict[str, float] = field(default_factory=dict)
    context: str = ""  # key of the saved context state at the end of this answer ('' when none)
    # searches this answer is without, each why in a line: one that ran and failed ("text_search failed
    # (searxng): cannot connect ..."), one taken back that could not run ("text_search "x" not run: it is
    # offline and ..."), a search the question asked for that was not offered; () when none
    not_searched: tuple[str, ...] = ()


@dataclass(frozen=True)
class ContextOpened(Event):
    """The question's context is ready (the first think block opens next), and how it got there."""

    kind: ClassVar[str] = "context_opened"
    source: str  # new | live (the chat's KV cache) | restored (its saved state) | rebuilt (history as text)
    reason: str  # why rebuilt: "no saved state", "context full", "the tools changed" ...
    tokens_reused: int  # context tokens kept from an earlier question or restored from a saved state
    # tokens this process evaluated to open it, read ahead or not (images in embeddings)
    tokens_evaluated: int
    system_restored: bool  # the system prompt came from a saved state
    n_ctx_used: int  # KV cells in use after opening
    seconds: float
    # of tokens_evaluated, those read before the question was sent: the user turn's KV cells (image
    # included), and the system prompt when the read-ahead evaluated it (while loading or typing)
    tokens_read_ahead: int = 0
    question_tokens_read_ahead: int = 0  # tokens of the question's own text among them

    @property
    def tokens_at_enter(self) -> int:
        """Tokens evaluated after the question was sent (what it waited for)."""
        return self.tokens_evaluated - self.tokens_read_ahead


@dataclass(frozen=True)
class ImageEvaluated(Event):
    """An image went into the context: its cost (``turn`` 0: the question's own image)."""

    kind: ClassVar[str] = "image_evaluated"
    turn: int
    source: str  # image (attached) | crop (a zoom's result)
    tokens: int  # KV cells (nx * ny)
    positions: int  # M-RoPE positions (max(nx, ny))
    width: int  # pixels the model saw
    height: int
    encode_seconds: float  # vision encoder (0 when the embedding was reused)
    decode_seconds: float  # evaluating its embeddings
    reused: bool  # the embedding came from the cache (same image, same mmproj)
    read_ahead: bool = False  # read into the context on attach, before the question was sent
    index: int | None = None  # an attached image: its number in the question (img_idx; 0 for a single one)


def searches_without(events: typing.Iterable[Event]) -> list[str]:
    """The searches an answer is without, each why in a line: the ``FinalAnswer.not_searched`` of its
    events, and every search in them that ran and failed (an answer stored before that field had only
    these). What the app's footer, ``ask``'s note, ``chats show`` and an export say under an answer."""
    from edge_agent.tools import observations, specs

    out: list[str] = []
    for e in events:
        reasons: typing.Iterable[str] = ()
        if isinstance(e, ToolFinished) and not e.ok and specs.is_search(e.name):
            why = observations.failure(e.name, e.observation)
            reasons = (why,) if why else ()
        elif isinstance(e, FinalAnswer):
            reasons = e.not_searched
        out += [r for r in reasons if r not in out]
    return out
