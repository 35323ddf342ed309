"""What the turn loop is configured with: its options, and the protocol of the SeProD drafter it calls.

Knows: every knob of one episode (mode, limits, temperature, the rationale library, a policy that
narrows the allowed actions) and the hooks a drafter offers (``edge_agent.agent.seprod.Drafter``
implements them). Does not know llama_cpp, the loop's control flow or the chat format.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from edge_agent.agent.events import Event
from edge_agent.agent.rationales import Library, builtin_library
from edge_agent.runtime.types import SessionLike

AGENT_MODES = ("ssr", "freeform")  # how the agent's turn reasons: scored rationales or written text
# ssr_answer_check at or below this: no check (a mean log-prob that low is no answer at all)
CHECK_OFF = -20.0
REASONING_MODES = (*AGENT_MODES, "direct")  # direct: the model alone in a plain chat (agent.direct), no turns

# (turn, allowed action types) -> the action types allowed in this turn. For experiments and tests
# that force a path (e.g. zoom in turn 1, then answer); the default allows everything available.
Policy = Callable[[int, frozenset[str]], Iterable[str]]


class DraftOutcome(Protocol):
    """What a SeProD hook returns (``edge_agent.agent.seprod_math.Verification``): what it put in the
    session."""

    accepted: int  # draft tokens now in the agent's session
    accepted_text: str
    lead: tuple[int, ...]  # the agent's own tokens written before them
    verdict: str  # grounding: "yes" | "no" | ""
    steer: str  # text for the loop to append after accepted_text ("" for none)


class DraftHooks(Protocol):
    """The SeProD hooks (``edge_agent.agent.seprod.Drafter``). Each hook is a generator of events
    that puts accepted draft tokens into the agent's session and returns a :class:`DraftOutcome`."""

    def start(self, *, image: bytes | None, question: str, target: str | None = None) -> None: ...

    def reset(self, *, new_chat: bool = False) -> None:
        """A new question (``new_chat``: also forget the chat's acceptance statistics)."""
        ...

    def close(self) -> None: ...

    def retune(self, *, tau: float, draft_len: int) -> None:
        """The settings' acceptance threshold and draft length, from the next question on."""

    def ground(self, session: SessionLike, *, turn: int, image: bytes | None,
               target: str) -> Generator[Event, None, DraftOutcome]: ...

    def answer(self, session: SessionLike, *, turn: int, image: bytes | None, question: str,
               max_tokens: int | None = None, written: Sequence[int] = (),
               done: bool = False) -> Generator[Event, None, DraftOutcome]:
        """Where the answer continues; ``written``: the answer's tokens already in the session (the
        answer check's), ``done``: they hold the whole answer."""
        ...

    def observe_decode(self, seconds: float, tokens: int) -> None:
        """The agent decoded ``tokens`` tokens in ``seconds`` (prices later drafts)."""

    @property
    def tokens_evaluated(self) -> int:
        """Prompt tokens the prophet has evaluated so far (images in embeddings), all questions."""
        ...

    def totals(self) -> dict[str, float]:
        """This question's SeProD counters for ``FinalAnswer.totals``."""
        ...


@dataclass
class AgentOptions:
    mode: str = "ssr"  # ssr | freeform | direct
    max_turns: int = 5  # tool turns; then one more turn that must answer
    tau: float = 1.0
    sample: bool = False  # SSR: one seeded categorical draw instead of argmax
    index_only: bool = False  # SSR ablation: score "[k]" instead of the rationale's text
    # raw: mean log-prob (the paper) | pmi: minus the candidate's mean after a neutral question
    ssr_score: str = "raw"
    neutral: Mapping[str,
                     float] | None = None  # pmi: candidate text -> its mean log-prob after a neutral question
    # SSR, an answer before any tool result: the least mean log-prob of its first tokens to answer without
    # searching first (None: no check; answer_check_tokens tokens, kept as the answer's start)
    answer_check: float | None = None
    answer_check_tokens: int = 10
    # ... and on past them while none of them adds to the question, at most this many (<= answer_check_tokens:
    # exactly answer_check_tokens)
    answer_check_reach: int = 0
    # ... and where its first added token is unsure, this many likeliest other tokens there are continued; the
    # probability of those that name the same thing is added to it (Answering._agreeing; 0: none)
    answer_check_agree: int = 0
    # SSR: no scoring pass when the scores could not change the move (the answer checked first, the search
    # the only other move: SsrChooser.unscored); False scores anyway (tests compare the two)
    skip_unneeded_scoring: bool = True
    # SSR: a question that asks to search or to check ("Are you sure? Please check.", "Search the web for
    # ...": intent.asks_to_search) searches in its first turn, the answer check and the scores aside; False:
    # the scores decide (the paper's method)
    asked_search: bool = False
    # SSR's answer check stops decoding once its threshold is out of reach (answer_check.out_of_reach);
    # False reads all answer_check_tokens (the same verdict: tests and scripts/bench_first_turn.py compare)
    answer_check_early: bool = True
    # an answer that falls into a loop ends there (agent.repetition, stop_reason "repetition"); False decodes
    # to answer_max_tokens or the answer's end, as llama.cpp alone does (scripts/bench_question.py compares
    # answers of the same length: random weights loop, and a shorter answer flattered SSR's ratio)
    stop_loops: bool = True
    seed: int = 0
    temperature: float = 0.0  # actions and answers (and free-form reasoning)
    freeform_max_tokens: int = 128
    answer_max_tokens: int = 256
    action_max_tokens: int = 128  # the tail of a tool call (a label <= 40 and a query <= 80 chars fit)
    observation_max_tokens: int = 320  # a tool result's text is cut to this many tokens (0: no limit)
    library: Library = field(default_factory=builtin_library)
    policy: Policy | None = None
    model_name: str = ""
    instructions: str = ""  # the user's own addition to the system prompt (setting system_prompt)

    @classmethod
    def from_settings(cls, settings: Any, **overrides: Any) -> AgentOptions:
        """Options from a ``config.Settings`` (the library loaded from ``settings.rationales``)."""
        from edge_agent.agent.rationales import load_library

        kw: dict[str, Any] = dict(
            mode=settings.mode, max_turns=settings.max_turns, tau=settings.ssr_tau,
            sample=settings.ssr_sample,
            index_only=settings.ssr_index_only, ssr_score=settings.ssr_score,
            answer_check=settings.ssr_answer_check if settings.ssr_answer_check > CHECK_OFF else None,
            answer_check_tokens=settings.ssr_answer_check_tokens,
            answer_check_reach=settings.ssr_answer_check_reach,
            answer_check_agree=settings.ssr_answer_check_agree,
            seed=settings.seed, temperature=settings.temperature,
            freeform_max_tokens=settings.freeform_max_tokens, answer_max_tokens=settings.answer_max_tokens,
            observation_max_tokens=settings.observation_max_tokens,
            instructions=settings.system_prompt, asked_search=settings.ssr_search_when_asked,
        )
        kw.update({k: v for k, v in overrides.items() if v is not None})
        if "library" not in kw:
            kw["library"] = load_library(settings.rationales)
        return cls(**kw)
