"""Typed events yielded by the agent loop.

The TUI, ``ask --json``, the benchmarks and the eval all consume this one stream. Every event is a
frozen dataclass with a ``kind`` string and ``to_json()``; they hold plain data only (no model, no
widget). Times are seconds (float). ``turn`` counts from 1.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True)
class Event:
    kind: ClassVar[str] = "event"

    def to_json(self) -> dict[str, Any]:
        d = {"event": self.kind}
        d.update(dataclasses.asdict(self))
        return d


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


@dataclass(frozen=True)
class RationaleScored(Event):
    """SSR: all candidates scored, one chosen."""

    kind: ClassVar[str] = "rationale_scored"
    turn: int
    candidates: tuple[RationaleCandidate, ...]
    chosen: int  # index into candidates
    seconds: float
    library: str = ""  # the library scored: "built-in" or its file (Library.source); "" in older events


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


@dataclass(frozen=True)
class ToolCalled(Event):
    kind: ClassVar[str] = "tool_called"
    turn: int
    name: str
    arguments: dict[str, Any]
    action_seconds: float  # time to generate the action


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
    stop_reason: str  # answered | turn_limit | no_answer (it only repeated its instructions) | cancelled
    totals: dict[str, float] = field(default_factory=dict)  # reasoning/action/tool/total seconds, tokens...
