"""SSR's choice of a rationale in one question: score, select, and choose again among the rest.

Knows: which of the library's rationales are candidates for the allowed actions (with or without an
image), the candidate strings (the text, or "[k]" in the index-only ablation), the ONE batched scoring
call, the value a choice is made from (``ssr_score`` raw: the paper's mean token log-prob; pmi: minus
the candidate's mean after a neutral question, ``edge_agent.engine.calibration``), softmax selection with
``tau`` (argmax or one seeded draw), the RationaleScored event, and choosing again from the same
scores when the chosen move was taken back or another kind of move must go first. Does not know: the
chat format, the loop's turns, llama.cpp (a ``SessionLike`` is handed in).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from edge_agent.agent.answer_check import ONLY_RATIONALE
from edge_agent.agent.events import RationaleCandidate, RationaleScored
from edge_agent.agent.options import AgentOptions
from edge_agent.agent.rationales import ANY_ACTION, Rationale, index_label, select
from edge_agent.runtime.types import ContinuationScore, SessionLike


@dataclass
class _Scored:
    rationales: list[Rationale]
    candidates: list[str]
    scores: list[ContinuationScore]
    values: list[float]  # what p came from: the mean, or the mean minus the neutral mean
    scored: bool = True  # False: a choice the scores could not change (:meth:`SsrChooser.unscored`)


def _no_score(tokens: Sequence[int]) -> ContinuationScore:
    """A candidate's tokens with no score computed (a choice the scores could not change)."""
    return ContinuationScore(tokens=list(tokens), logprobs=np.zeros(0), ranks=np.zeros(0, dtype=np.int64),
                             sum=0.0, mean=0.0, count=0)


class SsrChooser:
    """One question's SSR choices (the seeded draws continue across its turns)."""

    def __init__(self, options: AgentOptions, *, kind: str = "") -> None:
        self.options = options
        self._rng: np.random.Generator | None = None  # made on first use: a greedy question draws nothing
        self._last: _Scored | None = None
        self.tokens: Sequence[int] = ()  # the chosen rationale's tokens (pasted when not adopted)
        self.kind = kind  # the kind of message ("writing", "greeting"): the library's rationales for it

    def choose(self, session: SessionLike, turn: int, allowed: frozenset[str], *, has_image: bool,
               has_evidence: bool = True,
               cancel: threading.Event | None = None) -> tuple[str | None, RationaleScored, bool]:
        """Score the rationales for ``allowed`` and choose one: its action (None: a rationale that implies
        none, the model chooses), the event, and whether the chosen one can be adopted (its cells are
        kept). Nothing is pasted (the caller pastes, next on the session)."""
        idx, rats, cands = self._candidates(allowed, has_image=has_image, has_evidence=has_evidence)
        t0 = time.perf_counter()
        # ONE batched decode, shared prefixes once. keep=True leaves the candidates' KV cells in
        # place so the chosen one can be adopted into the conversation without re-evaluating it
        # (possible when the context has a sequence per candidate).
        adopt = not self.options.index_only and len(cands) <= session.max_candidates
        scores = session.score(cands, keep=adopt, cancel=cancel)
        values = [sc.mean for sc in scores]  # the paper's score
        if self.options.ssr_score == "pmi":  # how much better each fits this context than a neutral one
            values = [v - n for v, n in zip(values, self._neutral(cands), strict=True)]
        self._last = _Scored(rats, cands, list(scores), values)
        choice, probs = self._select(values)
        action = None if rats[choice].action == ANY_ACTION else rats[choice].action
        return action, self._event(turn, choice, probs, time.perf_counter() - t0), adopt

    def _candidates(self, allowed: frozenset[str], *, has_image: bool, has_evidence: bool,
                    fallback: bool = True) -> tuple[list[int], list[Rationale], list[str]]:
        """The library's rationales for ``allowed`` (none: with ``fallback``, its answer rationales): their
        indices, the rationales, and the strings scored (the text, or "[k]" in the index-only ablation)."""
        lib = self.options.library
        kind = "" if self.options.index_only else self.kind  # (the ablation's prompt lists no such plan)
        idx = lib.for_actions(allowed, has_image=has_image, has_evidence=has_evidence, kind=kind)
        if not idx and fallback:
            idx = lib.for_actions({"answer"}, has_image=has_image, has_evidence=has_evidence,
                                  kind=kind) or lib.for_actions({"answer"})
        rats = [lib.rationales[k] for k in idx]
        cands = [index_label(k) if self.options.index_only else r.text
                 for k, r in zip(idx, rats, strict=True)]
        return idx, rats, cands

    def only_one(self, turn: int, allowed: frozenset[str], *, has_image: bool, has_evidence: bool,
                 tokenize: Callable[[str], list[int]],
                 why: str = ONLY_RATIONALE) -> tuple[str | None, RationaleScored] | None:
        """The one rationale there is to choose, without scoring: a softmax over one score is 1 whatever the
        score, so the move and the pasted rationale are those of a scoring (offline with nothing cached a text
        question's only move is the answer: 0.13 s a question saved on the 1.5B here, its tokens appended with
        the action's head instead of a scoring pass, ``scripts/bench_first_turn.py --offline``). Its
        action (None: one that implies none) and the event; None when there are more, or when a draw at
        random would follow (the seeded draws of later turns stay those of a scored run)."""
        if self.options.sample:
            return None
        _, rats, cands = self._candidates(allowed, has_image=has_image, has_evidence=has_evidence)
        if len(rats) != 1:
            return None
        self._last = _Scored(rats, cands, [_no_score(tokenize(cands[0]))], [0.0], scored=False)
        choice, probs = self._select([0.0])
        action = None if rats[0].action == ANY_ACTION else rats[0].action
        return action, self._event(turn, choice, probs, 0.0, why=why)

    def unscored(self, turn: int, allowed: frozenset[str], *, has_image: bool, has_evidence: bool,
                 tokenize: Callable[[str], list[int]], why: str) -> RationaleScored | None:
        """The answer rationale, chosen without scoring, when the scores could not change what happens: the
        caller checks the answer first whatever SSR chooses (``loop._answer_first``), the candidates are one
        answer rationale and at most one text search rationale (the one a taken-back answer leaves), and
        nothing is drawn at random (greedy: the seeded draws of later turns stay those of a scored run).
        The same rationale is pasted and the same search follows a taken-back answer as after a scoring; a
        scoring pass (~0.4 s on the 1.5B here) is not spent. None when a scoring could choose otherwise."""
        if self.options.sample:
            return None
        _, rats, cands = self._candidates(allowed, has_image=has_image, has_evidence=has_evidence,
                                          fallback=False)
        answers = [k for k, r in enumerate(rats) if r.action == "answer"]
        others = [r for r in rats if r.action != "answer"]
        if len(answers) != 1 or len(others) > 1 or any(r.action != "text_search" for r in others):
            return None
        scores = [_no_score(tokenize(c)) for c in cands]
        full = _Scored(rats, cands, scores, [0.0] * len(rats), scored=False)
        a = answers[0]
        self._last = _Scored([rats[a]], [cands[a]], [scores[a]], [0.0], scored=False)
        try:
            choice, probs = self._select([0.0])
            return self._event(turn, choice, probs, 0.0, why=why)
        finally:
            self._last = full

    def rechoose(self, session: SessionLike, turn: int, left: frozenset[str], *, has_image: bool,
                 has_evidence: bool = True, cancel: threading.Event | None = None) -> RationaleScored:
        """After a move was taken back (the context is again the one last scored): the best of the same
        scoring's rationales whose action is in ``left``, or a new scoring when none is. Never adopted."""
        last = self._last
        assert last is not None, "rechoose() follows choose()"
        keep = [k for k, r in enumerate(last.rationales) if r.action in left or r.action == ANY_ACTION]
        if not keep:
            return self.choose(session, turn, left, has_image=has_image, has_evidence=has_evidence,
                               cancel=cancel)[1]
        self._last = _Scored([last.rationales[k] for k in keep], [last.candidates[k] for k in keep],
                             [last.scores[k] for k in keep], [last.values[k] for k in keep], last.scored)
        choice, probs = self._select(self._last.values)
        return self._event(turn, choice, probs, 0.0, rechosen=True)

    def best_of(self, turn: int, actions: frozenset[str], *, why: str) -> tuple[RationaleScored, int] | None:
        """The best of the last scoring's rationales whose action is in ``actions``, from the same scores:
        the event (``rechosen``, ``why`` it was chosen over the first choice) and its index in that scoring
        (to adopt it); None when there is none. The scoring stays whole: a later :meth:`rechoose` still
        sees every rationale."""
        last = self._last
        assert last is not None, "best_of() follows choose()"
        keep = [k for k, r in enumerate(last.rationales) if r.action in actions]
        if not keep:
            return None
        self._last = _Scored([last.rationales[k] for k in keep], [last.candidates[k] for k in keep],
                             [last.scores[k] for k in keep], [last.values[k] for k in keep])
        try:
            choice, probs = self._select(self._last.values)
            return self._event(turn, choice, probs, 0.0, rechosen=True, why=why), keep[choice]
        finally:
            self._last = last

    def _select(self, values: Sequence[float]) -> tuple[int, np.ndarray]:
        if self.options.sample and self._rng is None:
            self._rng = np.random.default_rng(self.options.seed)
        choice, probs = select(list(values), tau=self.options.tau, sample=self.options.sample, rng=self._rng)
        assert self._last is not None
        self.tokens = self._last.scores[choice].tokens
        return choice, probs

    def _neutral(self, cands: Sequence[str]) -> list[float]:
        table = self.options.neutral
        missing = [c for c in cands if table is None or c not in table]
        if table is None or missing:
            raise ValueError("ssr_score 'pmi' needs each candidate's neutral score (AgentOptions.neutral): "
                             f"{missing}")
        return [table[c] for c in cands]

    def _event(self, turn: int, choice: int, probs: Sequence[float] | np.ndarray, seconds: float, *,
               rechosen: bool = False, why: str = "") -> RationaleScored:
        assert self._last is not None
        last = self._last
        pmi = self.options.ssr_score == "pmi" and last.scored
        neutral: list[float | None] = (list(self._neutral(last.candidates)) if pmi
                                       else [None] * len(last.candidates))
        return RationaleScored(
            turn=turn,
            candidates=tuple(
                RationaleCandidate(id=r.id, text=r.text, action=r.action, score=float(sc.mean),
                                   sum=float(sc.sum),
                                   count=int(sc.count), prob=float(p), neutral=n)
                for r, sc, p, n in zip(last.rationales, last.scores, probs, neutral, strict=True)
            ),
            chosen=choice, seconds=seconds, library=self.options.library.source,
            score_kind="pmi" if pmi else "raw", rechosen=rechosen, why=why, scored=last.scored,
        )
