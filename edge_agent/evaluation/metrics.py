"""Metrics per mode from result records: success, turns, tools, reasoning time, cache use, SeProD.

Knows: the record fields (:mod:`edge_agent.evaluation.summary`) and search outcome statuses.
Does not know: events, files, the engine. Pure functions of plain data.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from edge_agent.evaluation.modes import ModeSpec

# Search outcome statuses (ToolFinished.status, see tools/search.py): live (the network), cached,
# stale (network down, an old cached entry), offline (a cache miss with --offline), unconfigured
# (no backend: the same answer online and offline), unreachable (the network was down, nothing cached),
# error.
CACHE_HIT_STATUSES = frozenset({"cached", "stale"})
SEARCH_STATUSES = frozenset({"live", "cached", "stale", "offline", "unconfigured", "unreachable", "error"})
# A question that searched "ran entirely from the cache" when every search it made ended in one of these
# (and at least one was a cache hit: a question that never searched is not evidence of coverage).
OFFLINE_OK_STATUSES = CACHE_HIT_STATUSES | {"unconfigured"}


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def distribution(values: Sequence[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "mean": None, "p50": None, "p95": None, "max": None}
    return {"n": len(values), "mean": sum(values) / len(values), "p50": percentile(values, 50),
            "p95": percentile(values, 95), "max": max(values)}


def _share(num: int, den: int) -> float | None:
    return num / den if den else None


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float] | None:
    """The 95% Wilson score interval of a proportion k/n (sound for small n and for 0 or n successes)."""
    if n <= 0:
        return None
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def repeated_searches(record: dict[str, Any]) -> int:
    """Searches in one question that ran a normalised query (or image) this question had already run."""
    from edge_agent.tools.text import query_key

    seen: set[tuple[str, str]] = set()
    n = 0
    for sr in record["searches"]:
        key = (sr["name"], query_key(sr.get("query", "")))
        n += key in seen
        seen.add(key)
    return n


def intent_agreement(turn_logs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Free-form turns whose reasoning states a next step (``agent.intent``) and whether the action took
    it."""
    from edge_agent.agent.intent import stated_action

    stated = [(stated_action(t["reasoning"]), t["action"]) for t in turn_logs if t.get("reasoning")]
    with_plan = [(s, a) for s, a in stated if s is not None and a is not None]
    agree = sum(1 for s, a in with_plan if s == a)
    return {"turns": len(stated), "with_plan": len(with_plan), "agree": agree, "share": _share(agree,
            len(with_plan))}


def mode_metrics(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Aggregate the records of one mode. Times in seconds; shares in 0..1 (None when undefined)."""
    n = len(records)
    turn_logs = [t for r in records for t in r["turn_log"]]
    reasoning = [t["reasoning_seconds"] for t in turn_logs if t["reasoning_seconds"] is not None]
    scored = [t for t in turn_logs if t["rationale"] is not None]
    # a rationale that implies no action: not checked
    typed = [t for t in scored if t["rationale_action"] != "any"]
    consistent = [t for t in typed if t["action"] == t["rationale_action"]]
    mix = Counter(t["rationale"] for t in scored)
    mix_by_action = Counter(t["rationale_action"] for t in scored)
    tools: Counter[str] = Counter()
    for r in records:
        tools.update(r["tools"])
    actions = Counter(t["action"] for t in turn_logs if t["action"] is not None)
    status: Counter[str] = Counter(s["status"] for r in records for s in r["searches"])
    n_search = sum(v for k, v in status.items() if k != "unconfigured")
    hits = sum(status[s] for s in CACHE_HIT_STATUSES)
    searched = [r for r in records if any(s["status"] != "unconfigured" for s in r["searches"])]
    covered = [r for r in searched
               if r["error"] is None and all(s["status"] in OFFLINE_OK_STATUSES for s in r["searches"])]
    drafted = sum(r["drafts"]["drafted"] for r in records)
    accepted = sum(r["drafts"]["accepted"] for r in records)
    return {
        "questions": n,
        "errors": sum(1 for r in records if r["error"]),
        "success": {
            "exact": _share(sum(r["exact"] for r in records), n),
            "contains": _share(sum(r["contains"] for r in records), n),
            "exact_count": sum(r["exact"] for r in records),
            "contains_count": sum(r["contains"] for r in records),
            "exact_ci95": wilson(sum(r["exact"] for r in records), n),
            "contains_ci95": wilson(sum(r["contains"] for r in records), n),
        },
        "searches_per_question": _share(sum(len(r["searches"]) for r in records), n),
        "repeated_searches_per_question": _share(sum(repeated_searches(r) for r in records), n),
        "withdrawn_moves_per_question": _share(sum(r.get("withdrawn_moves", 0) for r in records), n),
        "reasoning_action_agreement": intent_agreement(turn_logs),
        "stop_reasons": dict(sorted(Counter(r["stop_reason"] for r in records).items())),
        "turns_per_question": distribution([r["turns"] for r in records]),
        "tool_calls": dict(sorted(tools.items())),
        "tool_calls_per_question": _share(sum(tools.values()), n),
        "actions": dict(sorted(actions.items())),
        "rationale_mix": {k: v / len(scored) for k, v in sorted(mix.items())},
        "rationale_mix_by_action": {k: v / len(scored) for k, v in sorted(mix_by_action.items())},
        "scored_turns": len(scored),
        "action_consistency": _share(len(consistent), len(typed)),
        "reasoning_seconds_per_turn": distribution(reasoning),
        "model_seconds_per_question": distribution([r["model_seconds"] for r in records]),
        "wall_seconds_per_question": distribution([r["wall_seconds"] for r in records
                                                   if r.get("wall_seconds") is not None]),
        # total = searches that could have hit the cache (an unconfigured backend never touches it)
        "searches": {"total": n_search, **{s: status[s] for s in sorted(SEARCH_STATUSES | set(status))}},
        "cache_hits": hits,
        "cache_hit_rate": _share(hits, n_search),
        # of the questions that searched, those whose every search the cache answered; questions that never
        # searched are counted apart (they say nothing about the cache)
        "offline_coverage": {
            "questions": len(covered),
            "searched": len(searched),
            "share": _share(len(covered), len(searched)),
            "without_search": sum(1 for r in records if r not in searched),
        },
        "seprod": {"rounds": sum(r["drafts"]["rounds"] for r in records), "drafted": drafted,
                   "accepted": accepted,
                   "acceptance": _share(accepted, drafted),
                   # hooks reached without a draft used, by why (records before this field: none)
                   "skipped": dict(sorted(sum((Counter(r["drafts"].get("skipped", {})) for r in records),
                                              Counter()).items()))},
    }


TIMING_KEYS = ("reasoning_seconds_per_turn", "model_seconds_per_question", "wall_seconds_per_question")


def compute_metrics(records: Iterable[dict[str, Any]], modes: Sequence[ModeSpec] | None = None) -> dict[str,
                                                                                                        dict[
        str, Any]]:
    """Metrics per mode name, in the order of ``modes`` (or first appearance)."""
    by_mode: dict[str, list[dict[str, Any]]] = {m.name: [] for m in modes or ()}
    for r in records:
        if modes is None or r["mode"] in by_mode:
            by_mode.setdefault(r["mode"], []).append(r)
    return {name: mode_metrics(recs) for name, recs in by_mode.items()}

