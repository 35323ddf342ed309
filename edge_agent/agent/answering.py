"""The answer action of the turn loop: SSR's answer check, the answer streamed, the turn closed.

Knows: when SSR checks an answer before it stays (an answer before any tool result, with another move
allowed), decoding the answer's first tokens greedily and scoring them (``answer_check.answer_score``),
SeProD's answering draft as the answer's start (hook 2), streaming the rest under the answer grammar within
the token budget, closing the assistant turn whatever stopped it, and the FinalAnswer of an answered
question (an answer that echoes our own instructions is none). Does not know: the turn order, reasoning,
tools (``loop.py``), llama_cpp, textual or the network.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Generator, Sequence

import numpy as np

from edge_agent.agent.actions import TAIL_STOP, tail_grammar, tail_remainder
from edge_agent.agent.answer_check import added_words, adding, agree, answer_score, probe_done
from edge_agent.agent.events import AgentError, AnswerChecked, AnswerToken, Event, TurnFinished
from edge_agent.agent.prompts import ANSWER_CLOSE, TURN_END, called_tool, echoes_instructions
from edge_agent.agent.repetition import looped_why, until_looping
from edge_agent.agent.run_state import RunState
from edge_agent.runtime.types import Checkpoint, Generation
from edge_agent.tools import specs
from edge_agent.tools.specs.answer import AFTER_LT

# the answer check's second look (Answering._agreeing): the least probability of another first token tried,
# and how many tokens each answer is read to at least
_LEAST_OTHER = math.log(0.05)
_AGREE_READ = 8


class Answering(RunState):
    """The answer's steps on a run's state; ``loop._Run`` inherits them."""

    def _not_offered(self, tool: str) -> str:
        """Why the tool ``tool`` (the name the model calls) is not offered in this question, as a sentence."""
        spec = specs.by_name(tool)
        why = self.tools.not_offered_why(spec.action) if spec is not None else None
        return f" {tool} was not offered: {why}." if why else ""

    def _checks_answer(self, left: set[str]) -> bool:
        """SSR's answer check applies: an answer before any tool result, with another move still allowed."""
        return (self.options.mode == "ssr" and self.options.answer_check is not None and not self.evidence
                and bool(left - {"answer"}))

    def _answer_check(self, turn: int) -> AnswerChecked:
        """Decode the answer's first tokens (greedy, under its grammar) and score them (``answer_score``: the
        mean log-prob of those that add to the question): ``answer_check_tokens`` of them, and on while none
        adds to the question (a full sentence restating a long question: "El Salvador's internet country
        code (top-level domain) is .sv" reaches the fact at its 13th token), at most
        ``answer_check_reach``; sure when the score reaches ``answer_check`` (the
        tokens stay as the answer's start: :meth:`_answer` continues from them), else the caller takes the
        answer back and searches."""
        n, threshold = self.options.answer_check_tokens, self.options.answer_check or 0.0
        reach = max(n, min(self.options.answer_check_reach, self.options.answer_max_tokens))

        def stop_here(tokens: Sequence[int], logprobs: Sequence[float]) -> bool:
            return probe_done([self.session.detokenize([t]) for t in tokens], logprobs, self.question,
                              threshold, n, early=self.options.answer_check_early)

        start = self.session.checkpoint()
        gen = self._generate(max_tokens=reach, grammar=tail_grammar("answer"), stop=[TAIL_STOP["answer"]],
                             until=stop_here)
        pieces = tuple(self.session.detokenize([t]) for t in gen.tokens)
        score = answer_score(pieces, gen.logprobs, self.question)
        early = gen.stop_reason == "until" and len(gen.tokens) < n
        sure = score >= threshold and not early
        agreed: tuple[str, ...] = ()
        mass: float | None = None
        if not sure and self.options.answer_check_agree > 0:
            found = self._agreeing(start, gen, pieces, threshold)
            if found is not None:
                gen, agreed, mass = found
                pieces = tuple(self.session.detokenize([t]) for t in gen.tokens)
                score = answer_score(pieces, _with_first(pieces, gen.logprobs, self.question, mass),
                                     self.question)
                early = False
                sure = score >= threshold
        if sure:
            self._probe = gen
        return AnswerChecked(turn=turn, pieces=pieces, logprobs=tuple(gen.logprobs), score=score,
                             threshold=threshold, sure=sure, early=early, agreed=agreed, agreed_logprob=mass)

    def _agreeing(self, start: Checkpoint, gen: Generation, pieces: Sequence[str], threshold: float
                  ) -> tuple[Generation, tuple[str, ...], float] | None:
        """The answer check's second look at an unsure answer whose first added token is unsure: the model
        may be sure of the thing and not of its first word ("Newton" -1.34 beside "Isaac": both begin Newton).
        The ``answer_check_agree`` likeliest other tokens there (p >= 0.05, :func:`_continues`) are each
        continued greedily, as is the answer's own; the probability of those whose answer names the same
        thing (``answer_check.agree``) is added to the first added token's. Returns the answer's tokens
        read again from there (in the session, as the probe's would be), the other answers that agreed, and
        the first added token's log-prob with theirs; None where nothing could make it sure (the session
        then holds whatever it tried: the caller rolls back)."""
        q, n = self.question, self.options.answer_check_tokens
        marks = adding(pieces, q)
        if True not in marks:
            return None
        i = marks.index(True)
        lps = list(gen.logprobs)
        if lps[i] >= threshold or "<" in "".join(pieces[: i + 1]):
            return None  # its first added token is not what the check doubts (or a "<": the grammar's state)
        self.session.rollback(start)
        if i:
            self.session.append_tokens(gen.tokens[:i], cancel=self.cancel)
        at = self.session.checkpoint()
        dist = self.session.next_logprobs()
        top = [int(t) for t in np.argsort(dist)[::-1][: self.options.answer_check_agree + 1]]
        others = [t for t in top if t != gen.tokens[i] and dist[t] >= _LEAST_OTHER
                  and _continues(self.session.detokenize([t]))][: self.options.answer_check_agree]

        def with_mass_of(tokens: Collection[int]) -> float:  # the first added token's log-prob, theirs added
            return math.log(min(1.0, math.exp(lps[i]) + sum(math.exp(float(dist[t])) for t in tokens)))

        best = with_mass_of(others)
        if not others or answer_score(pieces, _with_first(pieces, lps, q, best), q) < threshold:
            return None  # not even all of them together would make it sure
        read = max(_AGREE_READ, n - i - 1)
        prefix = self.session.detokenize(gen.tokens[:i])
        head = prefix + pieces[i]  # the answer to its first added token (pieces[i]: that token's text)

        def continued(token: int) -> Generation:
            self.session.rollback(at)
            self.session.append_tokens([token], cancel=self.cancel)
            return self._generate(max_tokens=read, grammar=tail_grammar("answer"), stop=[TAIL_STOP["answer"]])

        said = {t: continued(t) for t in others}
        own = continued(gen.tokens[i])  # last: the session holds the answer's own
        words = added_words(head + own.text, q, whole=own.stop_reason != "length")
        agreeing = {t: g for t, g in said.items()
                    if agree(words, added_words(prefix + self.session.detokenize([t]) + g.text, q,
                                                whole=g.stop_reason != "length"))}
        mass = with_mass_of(agreeing)
        tokens = [*gen.tokens[: i + 1], *own.tokens]
        read_again = Generation(
            text=head + own.text, tokens=tokens,
            stop_reason=own.stop_reason, logprobs=[*lps[: i + 1], *own.logprobs])
        shown = tuple((self.session.detokenize([t]) + g.text).strip() for t, g in agreeing.items())
        return read_again, shown, mass

    def _answer_turn(self, turn: int, final: bool, reasoning_s: float, t0: float,
                     retractable: bool = False, then: str = "it searches first"
                     ) -> Generator[Event, None, str | None]:
        """The answer action (its head is in the session; its clock started at ``t0``) to FinalAnswer; None.
        ``retractable`` (no tool result yet, another move allowed): an answer that falls into a loop, or
        that is a tool's call written as code (``prompts.called_tool``), is not closed; returns why it goes
        back (the caller rolls back and chooses again, as after an unsure answer check). Not retractable,
        such a call is no answer ("No answer found")."""
        answer = yield from self._answer(turn)
        tool = called_tool(answer)
        if retractable and (self.answer_end == "repetition" or tool is not None):
            self.answer_parts = []
            return looped_why(answer, then) if tool is None else (
                f"the model wrote a call of {tool} where its answer goes ({_shown(answer)!r}): it chooses "
                "its move again")
        action_s = time.perf_counter() - t0
        self.totals.add(reasoning_s, action_s, 0.0, 0.0)
        yield TurnFinished(turn=turn, action="answer", reasoning_seconds=reasoning_s, action_seconds=action_s,
                           tool_seconds=0.0)
        self._close_answer()
        key = self.context.answered(self.session)  # a follow-up continues from here
        # "You have no tool calls left", a tool's message, or a call written as code: not an answer
        why = (f"The model repeated our instructions instead of answering ({answer!r})."
               if echoes_instructions(answer, self.ours) else
               f"The model wrote a call of {tool} instead of an answer ({_shown(answer)!r})."
               f"{self._not_offered(tool)} Try another mode (Ctrl+R in the app, --mode with ask)."
               if tool is not None else "")
        if why:
            yield AgentError(turn=turn, title="No answer found", fatal=False, message=why)
            yield self._final("no_answer", "", context=key)
            return None
        # stopped at answer_max_tokens (stop_reason "length") or in a loop ("repetition"): says so
        cut = self.answer_end if self.answer_end in ("length", "repetition") else ""
        yield self._final(cut or ("turn_limit" if final else "answered"), answer, context=key)
        return None

    def _answer(self, turn: int) -> Generator[Event, None, str]:
        budget = self.options.answer_max_tokens
        self.totals.answer_tokens = 0
        self.answer_end = "length"
        probe, self._probe = self._probe, None  # the answer check's tokens: the answer's start

        def piece_event(piece: str) -> Event | None:
            # the text before the stop ("</", the close's start: the grammar admits no "</" inside the
            # answer), a "<" held back until the next token shows it is not the stop
            if not piece:
                return None
            self.answer_parts.append(piece)
            return AnswerToken(turn=turn, text=piece)

        # the rest continues the probe's text under the grammar, whose only state there is whether a "<" was
        # the last character (then a character that may follow one comes next)
        after_lt = probe is not None and probe.text.endswith("<")
        if probe is not None:
            if (first := piece_event(probe.text)) is not None:
                yield first
            self.totals.answer_tokens += len(probe.tokens)
            budget -= len(probe.tokens)
            if probe.stop_reason in ("stop", "eos"):
                self.answer_end, budget = probe.stop_reason, 0
                self.answer_last = self.session.detokenize(probe.tokens[-1:])
        if self.drafter is not None:
            # SeProD hook 2: the accepted answering draft continues the answer (the drafter yields it as
            # AnswerToken(from_prophet=True)); generation continues from it. The drafter verifies it after
            # the answer check's tokens when there are any (the draft starts where the answer starts), and
            # drafts nothing when they hold the whole answer. Accepted tokens (and the agent's own lead
            # token before them) count against the answer's token budget, and the drafter never puts more
            # than the budget in: the same answer length with or without SeProD.
            v = yield from self.drafter.answer(
                self.session, turn=turn, image=self.current_image, question=self.question,
                max_tokens=budget, written=tuple(probe.tokens) if probe is not None else (),
                done=budget <= 0)  # (a draft is cut before its first "<": none goes on from a probe's "<")
            if v.accepted_text:
                self.answer_parts.append(v.accepted_text)
            self.totals.answer_tokens += len(v.lead) + v.accepted
            budget -= len(v.lead) + v.accepted
        if budget > 0:  # the accepted draft or the check's tokens may have used the whole budget
            gen = yield from self._stream(
                lambda on_token, stop: self.session.generate(
                    # stops at the "</" of "</answer>": nothing follows the answer in this episode
                    max_tokens=budget, grammar=AFTER_LT if after_lt else tail_grammar("answer"),
                    stop=[TAIL_STOP["answer"]],
                    until=until_looping(self.session.detokenize) if self.options.stop_loops else None,
                    temperature=self.options.temperature,
                    seed=self.options.seed + self.turn, on_token=on_token, cancel=stop),
                piece_event,
            )
            self.totals.answer_tokens += len(gen.tokens)
            self.answer_end = "repetition" if gen.stop_reason == "until" else gen.stop_reason
            self.answer_last = self.session.detokenize(gen.tokens[-1:])
            if self.drafter is not None:  # the agent's decode time per token prices the next drafts
                self.drafter.observe_decode(gen.seconds, len(gen.tokens))
        return "".join(self.answer_parts).strip()

    def _close_answer(self) -> None:
        """End the assistant turn after the answer: ``</answer><|im_end|>\n``, whatever stopped it
        (after a stop, what its token brought of the close tag is in the session already: `</`, `.</`
        ...; an end-of-turn token is taken back first)."""
        if self.answer_end == "eos":
            self.session.drop_last_token()
        rest = tail_remainder("answer", self.answer_last) if self.answer_end == "stop" else ANSWER_CLOSE
        self.session.append_text(rest + TURN_END, cancel=self.cancel)


def _continues(piece: str) -> bool:
    """Whether another first token may be tried in the answer's place: it writes text (an end of turn or
    another special token writes none) and no "<" (the answer grammar's one state: after it only the close
    may follow)."""
    return bool(piece) and "<" not in piece


def _with_first(pieces: Sequence[str], logprobs: Sequence[float], question: str,
                logprob: float) -> list[float]:
    """``logprobs`` with the first token that adds to ``question`` given ``logprob``."""
    out = list(logprobs)
    marks = adding(pieces, question)
    if True in marks:
        out[marks.index(True)] = logprob
    return out


def _shown(answer: str, n: int = 80) -> str:
    """An answer as a message quotes it: at most ``n`` characters."""
    text = " ".join(answer.split())
    return text if len(text) <= n else text[: n - 3] + "..."
