"""One question's agent events -> one result record (the line ``results.jsonl`` stores).

Knows: the agent's event stream (``edge_agent.agent.events``) and the record's fields. Does not
know: how events were produced (the engine), how records are stored or aggregated.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from edge_agent.agent import events as ev
from edge_agent.evaluation.dataset import Question
from edge_agent.evaluation.matching import match_answer
from edge_agent.evaluation.modes import ModeSpec
from edge_agent.tools import specs


def summarize_events(events: Iterable[ev.Event]) -> dict[str, Any]:
    """Fold one question's event stream into the plain-data part of a result record.

    Per turn: the chosen rationale (SSR) or the reasoning text the model wrote (free-form: what
    ``edge-agent library build`` learns from), the action taken, and reasoning / action / tool /
    observe seconds. Per question: tool calls by name, search outcome statuses, SeProD acceptance,
    the final answer. Model time = the episode's total minus tool time when the final answer
    carries totals (so the prompt's prefill and evaluating observations count: the model did that
    work), else reasoning + action + observe summed over turns.
    """
    turns: dict[int, dict[str, Any]] = {}

    def turn(n: int) -> dict[str, Any]:
        return turns.setdefault(n, {"turn": n, **dict.fromkeys(_TURN_FIELDS)})

    tools: Counter[str] = Counter()
    searches: list[dict[str, str]] = []
    called: dict[int, str] = {}  # turn -> the search's query (image searches: "image N")
    withdrawn = 0
    checks: list[dict[str, Any]] = []  # SSR's answer checks (AnswerChecked)
    drafts: dict[str, Any] = {"rounds": 0, "accepted": 0, "drafted": 0, "skipped": {}}
    final: ev.FinalAnswer | None = None
    errors: list[str] = []
    fatal: str | None = None
    for e in events:
        if isinstance(e, ev.RationaleScored):
            t = turn(e.turn)
            chosen = e.candidates[e.chosen]
            t.update(rationale=chosen.id, rationale_action=chosen.action, rationale_prob=chosen.prob,
                     scoring_seconds=e.seconds)
        elif isinstance(e, ev.ReasoningDone):
            turn(e.turn)["reasoning"] = e.text
        elif isinstance(e, ev.ToolCalled):
            tools[e.name] += 1
            args = e.arguments
            called[e.turn] = (str(args.get("query", "")) if "query" in args
                              else f"image {args.get('img_idx', 0)}")
        elif isinstance(e, ev.ToolFinished):
            if specs.is_search(e.name):  # text_search, image_search (zoom is local)
                searches.append({"name": e.name, "status": e.status, "query": called.get(e.turn, "")})
        elif isinstance(e, ev.MoveWithdrawn):
            withdrawn += 1
        elif isinstance(e, ev.AnswerChecked):
            checks.append({"turn": e.turn, "pieces": list(e.pieces), "logprobs": list(e.logprobs),
                           "score": e.score, "sure": e.sure, "agreed": list(e.agreed),
                           "agreed_logprob": e.agreed_logprob})
        elif isinstance(e, ev.DraftVerified):
            drafts["rounds"] += 1
            drafts["accepted"] += e.accepted
            drafts["drafted"] += e.drafted
        elif isinstance(e, ev.DraftSkipped):  # rounds that used no draft, by why (SKIP_REASONS)
            drafts["skipped"][e.reason] = drafts["skipped"].get(e.reason, 0) + 1
        elif isinstance(e, ev.TurnFinished):
            turn(e.turn).update(action=e.action, reasoning_seconds=e.reasoning_seconds,
                                action_seconds=e.action_seconds, tool_seconds=e.tool_seconds,
                                observe_seconds=getattr(e, "observe_seconds", 0.0))
        elif isinstance(e, ev.AgentError):
            errors.append(f"{e.title}: {e.message}")
            if e.fatal:
                fatal = f"{e.title}: {e.message}"
        elif isinstance(e, ev.FinalAnswer):
            final = e
    turn_log = [turns[k] for k in sorted(turns)]
    turn_model, totals = _turn_model_seconds(turn_log), dict(final.totals) if final else {}
    return {
        "prediction": final.answer if final else "",
        "turns": final.turns if final else len(turn_log),
        "stop_reason": final.stop_reason if final else "error",
        "totals": totals,
        "tools": dict(sorted(tools.items())),
        "searches": searches,
        "withdrawn_moves": withdrawn,
        "answer_checks": checks,
        "drafts": drafts,
        "turn_log": turn_log,
        "model_seconds": _model_seconds(totals, turn_model),
        "turn_model_seconds": turn_model,
        "agent_errors": errors,
        "error": fatal if final is None else None,
    }


# a turn's fields in a record's turn_log, besides its number (None until an event sets them)
_TURN_FIELDS = ("action", "rationale", "rationale_action", "rationale_prob", "reasoning", "scoring_seconds",
                "reasoning_seconds", "action_seconds", "tool_seconds", "observe_seconds")


def _model_seconds(totals: dict[str, Any], turn_model: float) -> float:
    """The episode's total minus tool time when the final answer carries totals, else the turns' sum."""
    if "total" in totals and "tool" in totals:
        return max(0.0, float(totals["total"]) - float(totals["tool"]))
    return turn_model


def _turn_model_seconds(turn_log: list[dict[str, Any]]) -> float:
    return sum((t["reasoning_seconds"] or 0.0) + (t["action_seconds"] or 0.0) + (t["observe_seconds"] or 0.0)
               for t in turn_log)


def make_record(q: Question, mode: ModeSpec, events: Iterable[ev.Event], *, wall_seconds: float | None = None,
                error: str | None = None) -> dict[str, Any]:
    """A result record for one (question, mode): what results.jsonl stores, one per line."""
    rec: dict[str, Any] = {"id": q.id, "mode": mode.name, "question": q.question, "answers": list(q.answers)}
    summary = summarize_events(events)
    if error is not None:
        summary["error"] = error
    exact, contains = match_answer(summary["prediction"], q.answers)
    rec.update(summary)
    rec.update(exact=exact, contains=contains, wall_seconds=wall_seconds)
    return rec

