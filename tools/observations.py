"""The words the model reads after a search: results, a cache miss, a failure, a stale copy.

Knows: the observation format (a header naming what was searched and where, then numbered results,
each snippet shortened) and its size cap, and the sentences that tell the model what happened and
what it can do next. Every token here costs prompt time: keep it short. Does not know: HTTP, the
cache, backends' JSON (it takes plain values), the chat format (the agent wraps this text in
``<tool_response>``, with special tokens not parsed).

Why here and not beside the prompts in ``edge_agent/agent/``: :class:`~edge_agent.tools.search.SearchTools`
returns each outcome with its observation already written (the agent's toolbox, the benchmarks'
canned searches and the test fakes all hand over ``outcome.observation``), and ``tools/`` must not
import the agent (data flows ui -> agent -> tools). This module imports nothing of the network
either, so moving it into the agent later is a change of imports, not of code.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Protocol

from edge_agent.tools.text import clean_text

OBS_SNIPPET_CHARS = 300  # the observation shortens stored snippets further
MAX_OBSERVATION_CHARS = 3000


class ResultLike(Protocol):
    title: str
    url: str
    snippet: str


def subject(query: str) -> str:
    """What was searched, for the model: the query in quotes, or "the image" (its hash would cost
    tokens and tell the model nothing)."""
    return f'"{query}"' if query else "the image"


def results(tool: str, what: str, backend: str, found: Sequence[ResultLike], note: str = "") -> str:
    """The compact, numbered observation of a search that answered (``note``: e.g. it is a stale copy):
    one line per result, ``N. title: snippet``. No URLs: the model cannot open them, they cost ~20 tokens
    a result, and on the real Qwen 0.5B an answer written after results with URLs copied the first
    result's title line (1 of 7 dev questions right) where title-and-snippet lines gave the fact (7 of 7).
    The person sees the URLs (ToolFinished.results)."""
    kind = "Search results for" if tool == "text_search" else "Reverse image search results for"
    head = f"{kind} {what} ({backend}{'; ' + note if note else ''}):"
    if not found:
        return f"{head}\nNo results."
    lines = [head]
    for i, r in enumerate(found, 1):
        snippet = clean_text(r.snippet, OBS_SNIPPET_CHARS) if r.snippet else ""
        title = r.title or r.url
        lines.append(f"{i}. {title}: {snippet}" if snippet else f"{i}. {title}")
    return "\n".join(lines)


def stale_note(fetched_at: float, reason: str) -> str:
    """The note on results served from an old cache entry because the search failed now."""
    when = datetime.fromtimestamp(fetched_at, UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"stale copy from {when}; the search failed now: {reason}"


def offline_miss(what: str) -> str:
    return (f"No cached result for {what} (offline). Answer from what you have seen or know, "
            "or try a query searched before.")


def failed(tool: str, backend: str, reason: str, *, network_down: bool, hint: str = "") -> str:
    """A search that failed with nothing cached. ``hint``: the backend's advice (a key to check)."""
    if network_down:
        hint = "The network may be down: answer from what you have, or search again later."
    return f"{tool} failed ({backend}): {reason}." + (f" {hint}" if hint else "")


def failure(tool: str, observation: str) -> str | None:
    """Why a call of ``tool`` failed, as its observation's first sentence, when the observation says it ran
    and failed (:func:`failed`, or the toolbox's ``"{tool} failed: ..."``); None for any other (a call
    refused before it ran says "was not run")."""
    if not observation.startswith(f"{tool} failed"):
        return None
    return observation.split(". ")[0].rstrip(".")


def not_run(tool: str, arguments: dict, why: str) -> str:
    """A search taken back because it could not run (offline, not cached), for a person: what and why."""
    what = (f' "{clean_text(str(arguments.get("query", "")), 60)}"' if tool == "text_search"
            else f" of image {arguments.get('img_idx', 0)}" if tool == "image_search" else "")
    return f"{tool}{what} not run: {why}"


def not_offered(tool: str, why: str) -> str:
    """The question asked for a search that this question does not offer, for a person."""
    return f"the question asks for a search; {tool} is not offered: {why}"


def answered_without(reasons: Sequence[str]) -> str:
    """Under an answer, for a person: the searches it is without, and why (``FinalAnswer.not_searched``)."""
    # a reason may end a sentence of its own ("... look at the image instead."): the clause follows it
    return "; ".join(r.rstrip(". ") for r in reasons) + (
        f": answered without {'its' if len(reasons) == 1 else 'their'} results")


EMPTY_QUERY = "text_search needs a non-empty query: call it again with a few keywords."
EMPTY_IMAGE = "image_search got an empty image."


def image_too_large(size: int, limit: int) -> str:
    return (f"the image is too large to search ({size} bytes; at most {limit}). Zoom into a part and search "
            "that.")


def image_type_refused(mime: str) -> str:
    return f"image search accepts JPEG, PNG, WebP, GIF or BMP images, not {clean_text(mime, 40)!r}."


def cap(text: str) -> str:
    """At most :data:`MAX_OBSERVATION_CHARS`; a cut says so."""
    if len(text) <= MAX_OBSERVATION_CHARS:
        return text
    return text[: MAX_OBSERVATION_CHARS - 12].rstrip() + "\n[truncated]"
