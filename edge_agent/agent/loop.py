"""The agent's turn loop: a generator of typed events (SSR and free-form modes).

Knows: the order of one episode (prompt -> turns -> final answer), both reasoning modes, when a tool runs
and how its result re-enters the context, moves taken back, the turn limit, cancellation, per-turn
timings, and the two SeProD hook points. Talks to the model only through ``runtime.types.SessionLike``
and to the tools only through ``toolbox.ToolExecutor``; imports neither llama_cpp, textual, nor network.
A run's state and shared plumbing are ``run_state.RunState``; the answer action (SSR's answer check,
the answer streamed and closed) is ``answering.Answering``, which ``_Run`` inherits.

One turn::

    [SeProD grounding draft, only in the turn after a zoom]          <- drafter.ground()
    reasoning   SSR: the library's candidates scored in one batch after "<think>\n" (agent.ssr), the chosen
                     text pasted; free-form: the model writes up to freeform_max_tokens, until "</think>"
    action      SSR: the rationale's head appended, the tail generated under its grammar; free-form: the
                action its reasoning states (agent.intent), else the model's choice under a grammar
                admitting every allowed action. A move that brings nothing new is taken back (MoveWithdrawn)
    answer ->   [SeProD answering draft: the accepted text starts the answer] <- drafter.answer()
                the answer streamed under the answer grammar; FinalAnswer
    tool   ->   the tool runs; its observation (and a crop, as a new image) comes back as a
                <tool_response> user turn; the next think block opens

Mistakes (an action cut off, a refused box, a search that failed) are observations the model reads and
AgentError(fatal=False) events; a user-fixable failure of the model itself (context full) ends the stream
with AgentError(fatal=True); bugs propagate. After ``max_turns`` tool turns only the answer is allowed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Iterator, Sequence

from edge_agent.agent.actions import (
    CHOICE_GRAMMAR,
    CHOICE_STOP,
    HEADS,
    NAME_PREFIX,
    TAIL_REST,
    TAIL_STOP,
    ActionError,
    ToolCall,
    name_grammar,
    parse_action,
    tail_cut,
    tail_grammar,
    tail_remainder,
)
from edge_agent.agent.answer_check import (
    ANSWER_FIRST,
    ANSWER_UNSCORED,
    ASKED_SEARCH,
    NO_SEARCH,
    ONLY_RATIONALE,
    then_what,
    unsure_why,
)
from edge_agent.agent.answering import Answering
from edge_agent.agent.context import ChatContext, FreshContext, append_segments
from edge_agent.agent.events import (
    AgentError,
    ContextOpened,
    Event,
    MoveWithdrawn,
    RationaleScored,
    ReasoningDone,
    ReasoningToken,
    RunStarted,
    ToolCalled,
    ToolFinished,
    TurnFinished,
    TurnStarted,
    searches_without,
)
from edge_agent.agent.intent import asks_to_search, stated_action
from edge_agent.agent.options import AgentOptions, DraftHooks
from edge_agent.agent.prompts import (
    ANSWER_OPEN,
    THINK_CLOSE,
    TURN_LIMIT_NOTE,
    ImageArg,
    observation_segments,
    system_prompt,
)
from edge_agent.agent.rationales import ANY_ACTION
from edge_agent.agent.toolbox import ToolExecutor, ToolOutcome
from edge_agent.core.errors import Cancelled, EdgeAgentError
from edge_agent.runtime.types import ImageChunk, SessionLike
from edge_agent.tools import observations, specs

THINK_STOP = "</think>"
HEAD_MAX_TOKENS = 16  # free-form choice steps: a tag or a tool name (<= ~6 tokens)


def run_agent(
    session: SessionLike | None,
    question: str,
    *,
    tools: ToolExecutor,
    image: ImageArg = None,
    options: AgentOptions | None = None,
    cancel: threading.Event | None = None,
    drafter: DraftHooks | None = None,
    history: Sequence[tuple[str, str]] = (),
    image_label: str | None = None,
    context: ChatContext | None = None,
) -> Iterator[Event]:
    """Answer ``question`` (about ``image``: PNG bytes of image 0 of ``tools``; a list: 0..n-1) in turns.

    ``context``: the chat's context (``edge_agent.chat.continuity``: continues the chat's KV cache or
    a saved state); without one, ``session`` must be a fresh (empty) session and ``history`` the
    earlier (question, answer) pairs, evaluated as text (``agent.context.FreshContext``).
    Yields RunStarted, ContextOpened ... FinalAnswer, or ends with AgentError(fatal=True). Closing
    the generator early stops any generation in flight and rolls the context back.
    """
    if context is None:
        if session is None:
            raise ValueError("run_agent needs a session or a context")
        context = FreshContext(session, history)
    return _Run(context, question, tools, image, options or AgentOptions(), cancel, drafter,
                image_label).events()


def system_for(tools: ToolExecutor, options: AgentOptions) -> str:
    """The system prompt of every question with these tools and options: it lists what the session can
    ever offer (``ToolExecutor.offered_actions``), not what is usable now, so a chat's context survives
    attaching, detaching and a search going down (availability is per question: candidates withdrawn,
    grammar heads removed)."""
    offered = tools.offered_actions()
    lib = options.library if options.mode == "ssr" and options.index_only else None
    has_image = any(specs.by_action(a).needs_image for a in offered)
    return system_prompt(sorted(offered), has_image=has_image, library=lib, extra=options.instructions)


class _Run(Answering):
    """The turn loop on one question's state (``run_state.RunState``), with the answer's steps."""

    # ---- the episode ----------------------------------------------------------------------------
    def events(self) -> Iterator[Event]:
        self.totals.t_start = time.perf_counter()
        yield RunStarted(question=self.question, image=self.image_label, mode=self.options.mode,
                         seprod=self.drafter is not None, model=self.options.model_name)
        kept = False
        try:
            kept = yield from self._episode()
        except Cancelled:
            yield self._final("cancelled")
        except EdgeAgentError as e:
            yield AgentError(turn=self.turn, title=e.title, message=e.message, fatal=True)
        finally:
            if not kept:  # cancelled, failed, or the consumer closed the stream: back to a clean boundary
                self.context.abandon()

    def _episode(self) -> Generator[Event, None, bool]:
        """The question's turns; True once an answer is closed and kept in the context."""
        t = time.perf_counter()
        system = system_for(self.tools, self.options)
        opened = self.context.open(system, self.question, self.image, cancel=self.cancel)
        if self.drafter is not None:
            # After the agent has read the question's image: the prophet decodes the agent's embedding
            # instead of encoding the image itself first (an encode cannot be preempted, and the agent
            # would wait for the prophet's one-thread encode); while the agent reads, the prophet would
            # only wait for the cores anyway (runtime.cores).
            self.totals.prophet_evaluated0 = self.drafter.tokens_evaluated
            self.drafter.start(image=self.current_image, question=self.question)
        self.session = opened.session
        self.opened = opened
        self.totals.evaluated0 = self.session.n_evaluated - opened.tokens_evaluated
        self.totals.phase_seconds["prompt"] = time.perf_counter() - t
        yield ContextOpened(source=opened.source, reason=opened.reason, tokens_reused=opened.tokens_reused,
                            tokens_evaluated=opened.tokens_evaluated, system_restored=opened.system_restored,
                            n_ctx_used=self.session.n_cells, seconds=opened.seconds,
                            tokens_read_ahead=opened.tokens_read_ahead,
                            question_tokens_read_ahead=opened.question_read_ahead)
        for img, ahead in [(i, True) for i in opened.images_read_ahead] + [(i, False) for i in opened.images]:
            yield self._image_event(0, "image", img, read_ahead=ahead)
        self._check()
        for turn in range(1, self.options.max_turns + 2):
            self.turn = turn
            final = turn > self.options.max_turns
            # read every turn: a tool found unreachable leaves the candidates, the grammar and the prompt
            available = self.tools.available_actions()
            answered = yield from self._turn(turn, self._allowed(turn, available, final), final)
            if answered:
                return True
        return False

    def _allowed(self, turn: int, available: frozenset[str], final: bool) -> frozenset[str]:
        allowed = frozenset({"answer"}) if final else available
        if self.no_search:  # a search cannot work out a sum (dev: it never helped a product), write, greet
            allowed -= {s.action for s in specs.searches()}
        if self.options.policy is not None:
            allowed = frozenset(self.options.policy(turn, allowed)) & allowed  # a policy only narrows
        elif turn == 1 and not final and self.options.mode == "ssr" and self.options.asked_search:
            # The person asked to search or to check: the first turn searches (a search that cannot bring
            # anything new is still taken back, and the agent answers). Without this a sure answer check
            # answered "Are you sure? Please check." with the same words, unsearched.
            self.asked = asks_to_search(self.question, allowed)
            if self.asked is not None:
                allowed = frozenset({self.asked})
        if turn == 1:  # a search asked for that none can serve: the answer says so (FinalAnswer.not_searched)
            wanted = asks_to_search(self.question, frozenset(s.action for s in specs.searches()))
            if wanted is not None and wanted not in allowed and (why := self.tools.not_offered_why(wanted)):
                self._without(observations.not_offered(wanted, why))
        return allowed or frozenset({"answer"})

    def _turn(self, turn: int, allowed: frozenset[str], final: bool) -> Generator[Event, None, bool]:
        """One turn: reasoning, action, then the answer (True) or a tool and its observation (False)."""
        yield TurnStarted(turn=turn)
        # ---- reasoning ----
        t0 = time.perf_counter()
        yield from self._ground(turn)
        action: str | None
        if self.options.mode == "ssr":
            action, scored, adopt = self._ssr_reason(turn, allowed)
            reasoning_s = time.perf_counter() - t0
            # as soon as the scores are known (the clock stopped: the consumer's time is not ours)
            yield scored
            t0 = time.perf_counter()
            index = scored.chosen
            if scored.scored and self._answer_first(action, allowed):
                first = self.ssr.best_of(turn, frozenset({"answer"}), why=ANSWER_FIRST)
                if first is not None:
                    scored, index = first
                    action = "answer"
                    yield scored
            self._ssr_paste(scored, adopt, index)  # the action waits for the rationale, the person does not
            reasoning_s += time.perf_counter() - t0
        else:
            reasoning = yield from self._free_reason(turn)
            action = stated_action(reasoning, allowed)  # a reasoning that says it will search, searches
            reasoning_s = time.perf_counter() - t0
            self._base = self.session.checkpoint()
        self._check()

        # ---- action ----
        t0 = time.perf_counter()
        action, call, error = yield from self._act(turn, action, allowed, final, reasoning_s, t0)
        if action == "answer":
            return True
        action_s = time.perf_counter() - t0
        self._check()

        # ---- tool ----
        t0 = time.perf_counter()
        if call is not None:
            yield ToolCalled(turn=turn, name=call.name, arguments=dict(call.arguments),
                             action_seconds=action_s)
            out = self.tools.run(call, cancel=self.cancel)
            done = ToolFinished(turn=turn, name=call.name, ok=out.ok, observation=out.observation,
                                seconds=out.seconds,
                                status=out.status, image_index=out.image_index, image_path=out.image_path,
                                results=tuple(out.results))
            yield done
            for why in searches_without([done]):  # a search that ran and failed
                self._without(why)
        else:
            yield AgentError(turn=turn, title="Malformed action", message=error or "unknown", fatal=False)
            out = ToolOutcome(False, f"Error: {error} Try again.", 0.0, "error")
        tool_s = time.perf_counter() - t0
        self._check()

        # ---- observation: back into the context (a crop as a new image) ----
        t0 = time.perf_counter()
        crops = self._observe(turn, out)
        observe_s = time.perf_counter() - t0
        for img in crops:
            yield self._image_event(turn, "crop", img)
        if out.image is not None:  # the prophet looks at the crop from now on
            self.current_image = out.image
            self.ground_target = out.label or self.question
            if self.drafter is not None:
                self.drafter.start(image=out.image, question=self.question, target=self.ground_target)
        self.totals.add(reasoning_s, action_s, tool_s, observe_s)
        yield TurnFinished(turn=turn, action=action if call is not None else "invalid",
                           reasoning_seconds=reasoning_s,
                           action_seconds=action_s, tool_seconds=tool_s, observe_seconds=observe_s)
        return False

    def _act(self, turn: int, action: str | None, allowed: frozenset[str], final: bool, reasoning_s: float,
             t0: float) -> Generator[Event, None, tuple[str, ToolCall | None, str | None]]:
        """The action: its head, then the answer (to FinalAnswer) or the tool call's tail. Returns (action,
        call, error). A call that could bring nothing new (``ToolExecutor.nothing_new``: the same search
        again, offline and not cached) is taken back before it runs or stays in the context (rolled back
        to before the pasted rationale / the head) and the turn chooses again without that action: SSR
        the best remaining rationale of the same scoring, free-form the model. When only the answer is
        left, the agent answers with what it has."""
        left = set(allowed)
        checked = False
        while True:
            try:
                action = self._head(action, frozenset(left))
                if action == "answer":
                    check = None if checked or not self._checks_answer(left) else self._answer_check(turn)
                    checked = True
                    if check is not None:
                        yield check
                    then = then_what(left - {"answer"})
                    unsure = None if check is None or check.sure else unsure_why(check, then)
                    if unsure is None:
                        # a loop before any tool result is the model not knowing: back, and search
                        retractable = not self.evidence and bool(left - {"answer"}) and self._base is not None
                        unsure = yield from self._answer_turn(turn, final, reasoning_s, t0, retractable, then)
                        if unsure is None:
                            return "answer", None, None
                    call = ToolCall("answer", {})
                else:
                    call = self._tool_call(action)
            except ActionError as e:
                return action or "invalid", None, str(e)
            why = unsure if action == "answer" else self.tools.nothing_new(call)
            if why is None or self._base is None:
                return action, call, None
            yield MoveWithdrawn(turn=turn, action=action, arguments=dict(call.arguments), reason=why)
            if action != "answer" and (cannot := self.tools.cannot_run(call)):
                self._without(observations.not_run(call.name, dict(call.arguments), cannot))
            self.session.rollback(self._base)
            self.close_pending = ""
            left = left - {action} if action == "answer" else (left - {action}) | {"answer"}
            action = None
            if self.options.mode == "ssr":
                scored = self.ssr.rechoose(self.session, turn, frozenset(left), has_image=self._has_image(),
                                           has_evidence=self.evidence, cancel=self.cancel)
                yield scored
                self._ssr_paste(scored, False)
                action = scored.candidates[scored.chosen].action
                action = None if action == ANY_ACTION else action

    def _ground(self, turn: int) -> Generator[Event, None, None]:
        """SeProD hook 1, in the turn after a zoom: the accepted grounding draft opens the think
        block, so the rationale scoring (SSR) or the model's own reasoning (free-form) conditions
        on it. The target is the zoom label the agent wrote (the drafter cleans it: untrusted output)."""
        if self.drafter is not None and self.ground_target is not None:
            v = yield from self.drafter.ground(self.session, turn=turn, image=self.current_image,
                                               target=self.ground_target)
            opened = v.accepted_text
            if v.steer:  # the prophet said "no" and the agent accepted it: look elsewhere
                self.session.append_text(v.steer, special=False)
                opened += v.steer
            if self.options.mode == "ssr" and opened and not opened.endswith("\n"):
                self.session.append_text("\n")  # the rationale starts on its own line
        self.ground_target = None

    def _tool_call(self, action: str) -> ToolCall:
        """The rest of a tool call whose head is in the session, under the tool's grammar."""
        # Decode only up to the end of the last free value (the stop string); the fixed rest is
        # prefilled, less what the token that brought the stop holds of it (`"}}`).
        stop, cut = TAIL_STOP[action], tail_cut(action)
        until = None if cut is None else (lambda tokens, _lps: cut(self.session.detokenize(tokens)))
        gen = self._generate(max_tokens=self.options.action_max_tokens, stop=[stop], until=until,
                             grammar=tail_grammar(action, n_images=max(1, self.tools.n_images())))
        value, rest = gen.text, None
        if gen.stop_reason == "stop":
            rest = tail_remainder(action, self.session.detokenize(gen.tokens[-1:]))
        elif gen.stop_reason == "until" and self.session.drop_last_token():
            # past the value's end (a query's ninth word): its first token is taken back (it was pending:
            # nothing evaluated) and the value closed there
            value, rest = self.session.detokenize(gen.tokens[:-1]), stop + TAIL_REST[action]
        text = HEADS[action] + value
        if rest:  # evaluated with the observation that follows (one decode)
            self.session.append_text(rest, defer=True)
        if rest is not None:  # the call as written, closed
            text += stop + TAIL_REST[action]
        parsed = parse_action(text)
        if parsed.type != action or parsed.call is None:  # cannot happen under the grammar
            raise ActionError(f"Expected a {action} action.")
        return parsed.call

    def _observe(self, turn: int, out: ToolOutcome) -> list[ImageChunk]:
        """A tool's outcome back into the context (a crop as a new image); returns the crops evaluated."""
        note = TURN_LIMIT_NOTE if turn >= self.options.max_turns else ""
        observation = self._within_budget(out.observation)
        if not out.ok:  # our words (what failed, what is left), not a page's: never to be the answer
            self.ours.append(observation)
        else:
            self.evidence = True  # "answer from the evidence" applies from now on
        segments = observation_segments(observation, out.image, note=note)
        return append_segments(self.session, segments, cancel=self.cancel)

    # ---- reasoning ------------------------------------------------------------------------------
    def _ssr_reason(self, turn: int, allowed: frozenset[str]) -> tuple[str | None, RationaleScored, bool]:
        """Score the rationales and choose one (:class:`SsrChooser`); nothing is pasted yet
        (:meth:`_ssr_paste`, the next call on the session). The point before is this turn's base: a move taken
        back returns there."""
        self._base = self.session.checkpoint()
        if self.options.skip_unneeded_scoring and self._answer_first("text_search", allowed):
            # the answer goes first whatever SSR would choose: score only when the scores could matter
            forced = self.ssr.unscored(turn, allowed, has_image=False, has_evidence=self.evidence,
                                       tokenize=lambda text: self.session.tokenize(text, special=False),
                                       why=ANSWER_UNSCORED)
            if forced is not None:
                return "answer", forced, False
        if self.options.skip_unneeded_scoring and self.options.policy is None:
            # (a policy, in benchmarks and tests, forces a move the model would choose among others: scored
            # as the app scores that turn)
            why = (ASKED_SEARCH if turn == 1 and self.asked is not None
                   else NO_SEARCH[self.no_search] if self.no_search and not self.evidence else ONLY_RATIONALE)
            only = self.ssr.only_one(turn, allowed, has_image=self._has_image(), has_evidence=self.evidence,
                                     tokenize=lambda text: self.session.tokenize(text, special=False),
                                     why=why)
            if only is not None:
                return only[0], only[1], False
        return self.ssr.choose(self.session, turn, allowed, has_image=self._has_image(),
                               has_evidence=self.evidence,
                               cancel=self.cancel)

    def _answer_first(self, action: str | None, allowed: frozenset[str]) -> bool:
        """SSR chose a text search before any tool result, for a question without an image, and the answer
        check applies: the check decides instead. The best answer rationale of the same scores goes first;
        when the model is not sure of its answer the search follows (the answer taken back, as after a first
        choice to answer). On a fresh question SSR's first choice is the answer (every question of the
        eval's dev and test runs); after earlier searches in a chat the context leans to searching, and
        "What is 17 times 23?" as a follow-up searched the web, where the model alone answers it."""
        return (action == "text_search" and "answer" in allowed and not self._has_image()
                and self._checks_answer(set(allowed)))

    def _ssr_paste(self, scored: RationaleScored, adopt: bool, index: int | None = None) -> None:
        """Paste the chosen rationale: adopted (no decode at all; ``index``: its place in the scoring, when
        the event shows a part of it) or its scored tokens appended."""
        if self.options.index_only:
            self.session.append_text(scored.candidates[scored.chosen].text, special=False, defer=True)
        elif adopt:
            self.session.adopt(scored.chosen if index is None else index)
        else:
            self.session.append_tokens(self.ssr.tokens, defer=True)
        # The rationale (when not adopted) and "\n</think>\n\n" are evaluated together with the action's
        # head (one decode instead of three; counted as action time): see _head.
        self.close_pending = THINK_CLOSE

    def _free_reason(self, turn: int) -> Generator[Event, None, str]:
        t0 = time.perf_counter()
        gen = yield from self._stream(
            lambda on_token, stop: self.session.generate(
                max_tokens=self.options.freeform_max_tokens, stop=[THINK_STOP],
                temperature=self.options.temperature,
                seed=self.options.seed + self.turn, on_token=on_token, cancel=stop),
            lambda piece: ReasoningToken(turn=turn, text=piece),
        )
        # the rest of the think block waits for the action's head or choice (one decode, not two)
        if gen.stop_reason == "stop":  # the session holds "</think>" already
            rest = THINK_CLOSE[THINK_CLOSE.index(THINK_STOP) + len(THINK_STOP):]
            self.session.append_text(rest, defer=True)
        else:
            if gen.stop_reason == "eos":
                self.session.drop_last_token()  # an end-of-turn token inside the think block: take it back
            self.session.append_text(THINK_CLOSE, defer=True)
        text = gen.text
        yield ReasoningDone(turn=turn, text=text, n_tokens=len(gen.tokens), seconds=time.perf_counter() - t0)
        return text

    # ---- action ---------------------------------------------------------------------------------
    def _head(self, action: str | None, allowed: frozenset[str]) -> str:
        """Put the head of the action into the context; returns its type."""
        if action is None and len(allowed) == 1:
            action = next(iter(allowed))
        if action is not None:  # SSR (the rationale decided) or only one choice: prefill the head
            self.session.append_text(self.close_pending + HEADS[action])
            self.close_pending = ""
            return action
        if self.close_pending:
            self.session.append_text(self.close_pending)
            self.close_pending = ""
        # Free-form: the model chooses, in two small grammar-constrained steps whose grammars end
        # with their stop strings: the tag (<answer> or <tool_call>), then the tool's name. The
        # fixed parts between are prefilled, not decoded.
        tools = [s.action for s in specs.tools() if s.action in allowed]
        if "answer" in allowed:
            gen = self._generate(max_tokens=HEAD_MAX_TOKENS, grammar=CHOICE_GRAMMAR, stop=[CHOICE_STOP])
            if gen.stop_reason != "stop":
                raise ActionError("The action was cut off before it said whether to answer or call a tool.")
            if gen.text + CHOICE_STOP == ANSWER_OPEN:
                return "answer"
        else:
            self.session.append_text("<tool_call>")
        if len(tools) == 1:
            self.session.append_text(HEADS[tools[0]][len("<tool_call>"):])
            return tools[0]
        self.session.append_text(NAME_PREFIX)
        gen = self._generate(max_tokens=HEAD_MAX_TOKENS, grammar=name_grammar(tools), stop=['"'])
        spec = specs.by_name(gen.text) if gen.stop_reason == "stop" else None
        if spec is None:
            raise ActionError("The tool call was cut off before its name was complete.")
        self.session.append_text(spec.head_rest())
        return spec.action
