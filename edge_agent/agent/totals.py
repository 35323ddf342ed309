"""A question's counters and timings: what ``FinalAnswer.totals`` reports.

Knows: the seconds of each phase (prompt, reasoning, action, tool, observe), the tokens generated and the
answer's, and which prompt tokens this process evaluated for the question (all models; an image counts its
embeddings; read ahead or not) or kept from an earlier question. The loop (``agent.loop``) counts into one
``RunTotals`` per question. Does not know: the loop's control flow, models beyond their counters.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from edge_agent.agent.context import Opened
from edge_agent.agent.options import DraftHooks


@dataclass
class RunTotals:
    phase_seconds: dict[str, float] = field(
        default_factory=lambda: {"prompt": 0.0, "reasoning": 0.0, "action": 0.0, "tool": 0.0, "observe": 0.0})
    n_generated: int = 0
    answer_tokens: int = 0  # tokens of the answer: the accepted draft (and its lead) + generated
    t_start: float = 0.0
    evaluated0: int = 0  # the session's n_evaluated before this question
    prophet_evaluated0: int = 0

    def add(self, reasoning: float, action: float, tool: float, observe: float) -> None:
        for phase, s in (("reasoning", reasoning), ("action", action), ("tool", tool), ("observe", observe)):
            self.phase_seconds[phase] += s

    def final(self, *, turns: int, opened: Opened | None, n_evaluated: int, n_pos: int,
              drafter: DraftHooks | None) -> dict[str, float]:
        """The totals at the end of the question (``n_evaluated`` / ``n_pos``: the session's, once opened)."""
        totals: dict[str, float] = {k: round(v, 6) for k, v in self.phase_seconds.items()}
        totals["total"] = round(time.perf_counter() - self.t_start, 6)
        totals["turns"] = float(turns)
        totals["generated_tokens"] = float(self.n_generated)
        # accepted draft tokens included; <= answer_max_tokens
        totals["answer_tokens"] = float(self.answer_tokens)
        # Prompt tokens this process evaluated for this question (all models; an image counts its
        # embeddings; read ahead or not) and the context tokens it did not evaluate because they were kept
        # from an earlier question or restored.
        evaluated = reused = pos = ahead = 0
        if opened is not None:
            evaluated = n_evaluated - self.evaluated0
            reused, pos = opened.tokens_reused, n_pos
            ahead = opened.tokens_read_ahead  # read before the question was sent: in tokens_evaluated too
        if drafter is not None:
            evaluated += drafter.tokens_evaluated - self.prophet_evaluated0
            totals.update(drafter.totals())
        totals["n_pos"] = float(pos)
        totals["tokens_evaluated"] = float(evaluated)
        totals["tokens_reused"] = float(reused)
        totals["tokens_read_ahead"] = float(ahead)
        return totals
