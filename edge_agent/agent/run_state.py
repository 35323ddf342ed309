"""One question's run: its state and the plumbing every step of the turn loop shares.

Knows: what a run holds (the context and its session once opened, the question, its images, the tools, the
options, cancellation, the drafter, the answer's parts, the totals), one generation counted and made
cancellable (plain or streamed from a worker, ``streaming.py``), an observation cut to its token budget,
the events that report an image and the final answer. Does not know: the order of the turns, the reasoning
modes, actions or the answer (``loop.py`` and ``answering.py`` build on it), llama_cpp, textual or the
network.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Sequence

from edge_agent.agent.context import ChatContext, Opened
from edge_agent.agent.events import Event, FinalAnswer, ImageEvaluated
from edge_agent.agent.intent import no_search_for
from edge_agent.agent.options import AGENT_MODES, AgentOptions, DraftHooks
from edge_agent.agent.prompts import ImageArg, question_images
from edge_agent.agent.ssr import SsrChooser
from edge_agent.agent.streaming import stream
from edge_agent.agent.toolbox import ToolExecutor
from edge_agent.agent.totals import RunTotals
from edge_agent.core.errors import Cancelled
from edge_agent.runtime.state import image_digest
from edge_agent.runtime.types import Checkpoint, Generation, ImageChunk, SessionLike, UntilFn


class RunState:
    """One question's state (``loop._Run`` is the turn loop on it) and its shared plumbing."""

    def __init__(self, context: ChatContext, question: str, tools: ToolExecutor, image: ImageArg,
                 options: AgentOptions, cancel: threading.Event | None, drafter: DraftHooks | None,
                 image_label: str | None) -> None:
        if options.mode not in AGENT_MODES:  # "direct" has no turns: agent.direct.run_direct
            raise ValueError(f"mode must be one of {AGENT_MODES}, not {options.mode!r}")
        self.context = context
        self.session: SessionLike  # the question's session, from context.open()
        self.opened: Opened | None = None
        self.answer_end = "length"  # how the answer's generation stopped (stop | eos | length | repetition)
        self.answer_last = ""  # the text of the answer's last token (after a stop: it brought the "</")
        self.question = question.strip()
        self.tools = tools
        self.image = image
        self.options = options
        self.cancel = cancel or threading.Event()
        self.drafter = drafter
        self.image_label = image_label
        # a sum, a piece of writing, a greeting: what no search can help with ("sum", ...), no search offered
        self.no_search = no_search_for(self.question)
        # SSR's scoring and choices (seeded draws) in this question; the library's rationales for its kind
        self.ssr = SsrChooser(options, kind=self.no_search or "")
        self.turn = 0
        self.answer_parts: list[str] = []
        self.numbers = {image_digest(p): i for i, p in enumerate(question_images(image)) if p is not None}
        self.current_image = (question_images(image) or [None])[-1]  # the prophet looks at it, then the crops
        self.ground_target: str | None = None  # set after a successful zoom
        self.close_pending = ""  # SSR: the think block's close, appended with the action's head
        # before this turn's reasoning was pasted (SSR) / its action (free-form)
        self._base: Checkpoint | None = None
        self.ours: list[str] = []  # text we put in the context (tool messages, notes): never an answer
        self.evidence = False  # a tool's result is in this question's context (needs_evidence rationales)
        self.asked: str | None = None  # the search the question asks for (SSR's first turn takes it)
        self.not_searched: list[str] = []  # the searches the answer is without, why (FinalAnswer's)
        self._probe: Generation | None = None  # the answer check's decoded start of the answer
        self.totals = RunTotals()  # FinalAnswer.totals: timings and counters

    def _image_event(self, turn: int, source: str, img: ImageChunk, *,
                     read_ahead: bool = False) -> ImageEvaluated:
        return ImageEvaluated(turn=turn, source=source, tokens=img.n_tokens, positions=img.n_pos,
                              width=img.width,
                              height=img.height, encode_seconds=img.encode_seconds,
                              decode_seconds=img.decode_seconds, reused=img.reused, read_ahead=read_ahead,
                              index=self.numbers.get(img.digest) if source == "image" else None)

    def _has_image(self) -> bool:
        return self.image is not None or self.tools.n_images() > 0

    # ---- plumbing -------------------------------------------------------------------------------
    def _generate(self, *, max_tokens: int, grammar: str, stop: Sequence[str] = (),
                  until: UntilFn | None = None) -> Generation:
        gen = self.session.generate(max_tokens=max_tokens, grammar=grammar, stop=stop,
                                    temperature=self.options.temperature, seed=self.options.seed + self.turn,
                                    cancel=self.cancel, until=until)
        self.totals.n_generated += len(gen.tokens)
        if gen.stop_reason == "cancelled":
            raise Cancelled()
        return gen

    def _stream(self, call: Callable[[Callable[[str, int], None], threading.Event], Generation],
                make_event: Callable[[str], Event | None]) -> Generator[Event, None, Generation]:
        """:func:`streaming.stream` of one generation; counts its tokens; a cancelled one raises Cancelled."""
        gen = yield from stream(call, make_event, self.cancel)
        self.totals.n_generated += len(gen.tokens)
        if gen.stop_reason == "cancelled" or self.cancel.is_set():
            raise Cancelled()
        return gen

    def _within_budget(self, observation: str) -> str:
        """The observation cut to ``observation_max_tokens`` tokens (0: no limit), saying so."""
        n = self.options.observation_max_tokens
        if n <= 0:
            return observation
        toks = self.session.tokenize(observation, special=False)
        if len(toks) <= n:
            return observation
        return self.session.detokenize(toks[:n]).rstrip() + f" [... cut to {n} tokens]"

    def _check(self) -> None:
        if self.cancel.is_set():
            raise Cancelled()

    def _final(self, stop_reason: str, answer: str | None = None, *, context: str = "") -> FinalAnswer:
        opened = self.opened is not None
        totals = self.totals.final(turns=self.turn, opened=self.opened, drafter=self.drafter,
                                   n_evaluated=self.session.n_evaluated if opened else 0,
                                   n_pos=self.session.n_pos if opened else 0)
        text = answer if answer is not None else "".join(self.answer_parts).strip()
        return FinalAnswer(answer=text, turns=self.turn, stop_reason=stop_reason, totals=totals,
                           context=context, not_searched=tuple(self.not_searched))

    def _without(self, why: str) -> None:
        """The answer goes without a search, for this reason (each reason once)."""
        if why not in self.not_searched:
            self.not_searched.append(why)
