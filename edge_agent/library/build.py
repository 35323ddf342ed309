"""The build: turns -> moves -> clusters per action -> at most 15 entries, with provenance.

Knows: which turns count (those of questions answered correctly or of unknown outcome, unless
``take_all``), how a cluster's representative is chosen, the caps (per action, in all, the
runtime's 15) and that a library needs an answering move. Does not know trace formats
(``readers``), how a text is generalised (``generalise``) or clustered (``cluster``), or files
(``write``); ``Build.library_json`` is the file's content. Clustering takes vectors from an ``embed(texts) ->
(n, d)`` callable (``edge_agent.runtime.embed``: the agent model's mean-pooled hidden states); without one,
TF-IDF word vectors. Pure: no llama_cpp, no network, no files.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_agent.agent.rationales import MAX_RATIONALES, library_actions, parse_library
from edge_agent.library.cluster import cluster, lexical_vectors, normalise
from edge_agent.library.generalise import DEFAULT_MAX_CHARS, Move, generalise
from edge_agent.library.readers import HELP, LibraryBuildError, Read, Turn
from edge_agent.tools import specs

Embed = Callable[[Sequence[str]], np.ndarray]

DEFAULT_PER_ACTION = 3
DEFAULT_SIMILARITY = 0.5  # average cosine similarity at which two clusters merge
DEFAULT_MIN_SUPPORT = 2  # a move must recur: a cluster of one turn is not a move
MAX_UNIQUE = 1500  # most distinct texts clustered per action (the most frequent ones; O(n^2) memory)

_IMAGE_WORDS = re.compile(r"\b(image|picture|photo|crop|see|seen|visible|shown|shows|look|looks|zoomed)\b",
                          re.I)


@dataclass(frozen=True)
class Entry:
    """One library entry with its provenance."""

    id: str
    action: str
    text: str
    needs_image: bool
    size: int  # turns in its cluster
    share: float  # of all turns used
    examples: tuple[str, ...]  # trace ids ("<source>:<question>#t<turn>")
    variants: int  # distinct generalised texts in the cluster


@dataclass
class Build:
    """A built library and what the build saw."""

    entries: list[Entry]
    read: Read
    used: int  # turns clustered
    skipped_failed: int  # turns of questions answered wrongly (or runs that failed)
    skipped_garbage: int  # turns with nothing generic left after generalising
    clusters: dict[str, int]  # action -> clusters found (before the caps)
    method: str  # "lexical (TF-IDF)" or what embedded the texts
    dropped: list[str] = field(default_factory=list)  # why clusters were left out (caps, support)

    def library_json(self, *, sources: Sequence[str] = ()) -> dict[str, Any]:
        """The library file's content: ``rationales`` as the loader reads them, plus provenance."""
        return {
            "version": 1,
            "about": (f"Built by `edge-agent library build` from {self.used} free-form turns of "
                      f"{self.read.traces} traces; clustered by {self.method}. Each entry's provenance: the "
                      f"turns its cluster "
                      "covers (size, share of all turns used) and example trace ids."),
            "built": {"sources": list(sources), "turns": self.used, "traces": self.read.traces,
                      "method": self.method,
                      "skipped_failed": self.skipped_failed, "skipped_garbage": self.skipped_garbage},
            "rationales": [
                {"id": e.id, "action": e.action, "text": e.text, "needs_image": e.needs_image,
                 "provenance": {"cluster_size": e.size, "share": round(e.share, 4), "variants": e.variants,
                                "examples": list(e.examples)}}
                for e in self.entries
            ],
        }


@dataclass
class _Texts:
    """The moves as clustering sees them: one row per distinct text and action, most frequent first."""

    groups: dict[str, dict[str, list[tuple[Turn, Move]]]]  # action -> lower-cased text -> its turns
    order: list[tuple[str, str]]  # row -> (action, lower-cased text)
    texts: list[str]  # row -> the text as first written

    @classmethod
    def of(cls, moves: list[tuple[Turn, Move]]) -> _Texts:
        groups: dict[str, dict[str, list[tuple[Turn, Move]]]] = {}
        for t, m in moves:
            groups.setdefault(t.action, {}).setdefault(m.text.lower(), []).append((t, m))
        order = [(a, k) for a in library_actions() if a in groups
                 for k, _ in sorted(groups[a].items(), key=lambda kv: -len(kv[1]))[:MAX_UNIQUE]]
        return cls(groups, order, [groups[a][k][0][1].text for a, k in order])

    def items(self, row: int) -> list[tuple[Turn, Move]]:
        action, key = self.order[row]
        return self.groups[action][key]


def build_library(
    read: Read,
    *,
    take_all: bool = False,
    per_action: int = DEFAULT_PER_ACTION,
    max_total: int = MAX_RATIONALES,
    max_chars: int = DEFAULT_MAX_CHARS,
    similarity: float = DEFAULT_SIMILARITY,
    min_support: int = DEFAULT_MIN_SUPPORT,
    embed: Embed | None = None,
    method: str = "",
) -> Build:
    """Cluster the turns' moves within each action and pick at most ``per_action`` representatives
    per action and ``max_total`` in all (never more than the runtime's 15).

    By default only turns of questions answered correctly (or of unknown outcome) are used; with
    ``take_all`` every turn. A cluster's representative is, among its members at least as close to
    the cluster's centre as the median member, the one with the fewest placeholders, then the
    shortest. Raises LibraryBuildError (saying what to change) when nothing usable is left or no
    answer move is found (the loader refuses a library the agent could never answer with).
    """
    if per_action < 1:
        raise LibraryBuildError("--per-action must be at least 1.")
    max_total = max(1, min(max_total, MAX_RATIONALES))
    kept = _usable_turns(read, take_all)
    moves, garbage = _moves(kept, max_chars)
    rows = _Texts.of(moves)
    vectors, how = _vectors(rows.texts, embed, method)
    used = len(moves)
    dropped: list[str] = []
    candidates: list[Entry] = []
    n_clusters: dict[str, int] = {}  # actions with turns only
    for action in library_actions():
        found, n = _pick(rows, vectors, action, used=used, similarity=similarity,
                         min_support=min_support, per_action=per_action, dropped=dropped)
        candidates += found
        if n:
            n_clusters[action] = n
    if not any(e.action == "answer" for e in candidates):
        more = ("Pass --min-support 1 or more sources." if take_all
                else "Pass --min-support 1, --all, or more sources.")
        raise LibraryBuildError(
            f"No answering move recurs in the {used} usable turns (--min-support {min_support}): the agent "
            f"could never answer with this library. {more}")
    entries = _capped(candidates, max_total, dropped)
    build = Build(entries, read, used, len(read.turns) - len(kept), garbage, n_clusters, how, dropped)
    parse_library(build.library_json(), source="the built library")  # the loader's own checks
    return build


def _usable_turns(read: Read, take_all: bool) -> list[Turn]:
    """The turns to learn from; raises LibraryBuildError saying why there are none."""
    if not read.turns:
        why = []
        if read.scored_turns:
            why.append(f"{read.scored_turns} SSR turns have no written reasoning (run the eval with --modes "
                       f"freeform)")
        if read.missing_text:
            why.append(f"{read.missing_text} free-form turns were recorded without their reasoning text "
                       "(results of an older edge-agent: rerun the eval with a new --out)")
        if read.invalid_turns:
            why.append(f"{read.invalid_turns} turns ended in a malformed action")
        if read.errors:
            why.append(f"{len(read.errors)} of {read.traces} questions ended in an error ({read.errors[0]})")
        detail = ("; ".join(why) + ".") if why else f"{read.traces} traces were read."
        raise LibraryBuildError(f"The sources hold no free-form turns: {detail} {HELP}")
    kept = [t for t in read.turns if take_all or t.correct is not False]
    if not kept:  # only without take_all
        n_failed = len({t.trace for t in read.turns})
        raise LibraryBuildError(
            f"All {n_failed} questions in the sources were answered wrongly or failed, so no turn is known "
            f"to "
            "lead somewhere good. Pass --all to build from every turn anyway, or evaluate more questions.")
    return kept


def _moves(turns: list[Turn], max_chars: int) -> tuple[list[tuple[Turn, Move]], int]:
    """(turn, its generic move) for every turn that has one, and how many had none."""
    moves: list[tuple[Turn, Move]] = []
    for t in turns:
        m = generalise(t.text, max_chars=max_chars)
        if m is not None:
            moves.append((t, m))
    if not moves:
        raise LibraryBuildError(
            f"None of the {len(turns)} turns' reasoning has a generic move left after removing specifics "
            "(it was empty, too short or not text). Use traces of a model that writes its reasoning in "
            "words.")
    return moves, len(turns) - len(moves)


def _vectors(texts: list[str], embed: Embed | None, method: str) -> tuple[np.ndarray, str]:
    """L2-normalised rows for ``texts`` (all embedded together, so centring sees them all) and how."""
    if embed is None:
        return lexical_vectors(texts), "lexical (TF-IDF word and word-pair vectors)"
    vec = np.asarray(embed(texts), dtype=np.float64)
    if vec.shape[0] != len(texts):
        raise ValueError("embed returned the wrong number of vectors")  # a bug in the embedder
    vec = normalise(vec - vec.mean(axis=0, keepdims=True)) if len(texts) > 1 else normalise(vec)
    return vec, method or "model embeddings"


def _pick(rows: _Texts, vectors: np.ndarray, action: str, *, used: int, similarity: float, min_support: int,
          per_action: int, dropped: list[str]) -> tuple[list[Entry], int]:
    """One action's clusters that recur, at most ``per_action``, each as an entry (without its id),
    and how many clusters there were; what is left out is said in ``dropped``."""
    idx = [i for i, (a, _) in enumerate(rows.order) if a == action]
    if not idx:
        return [], 0
    sub = vectors[idx]
    weights = [len(rows.items(i)) for i in idx]
    clusters = cluster(sub, weights, similarity)
    out: list[Entry] = []
    small = 0
    for c in clusters:
        size = sum(weights[j] for j in c)
        if size < min_support:
            small += 1
            continue
        if len(out) >= per_action:
            dropped.append(f"{action}: a cluster of {size} turns (--per-action {per_action})")
            continue
        close = sub[c] @ sub[c].mean(axis=0)
        cut = float(np.median(close))
        best = min((j for j, s in zip(c, close, strict=True) if s >= cut - 1e-12),
                   key=lambda j: (rows.items(idx[j])[0][1].placeholders, len(rows.texts[idx[j]]),
                                  rows.texts[idx[j]]))
        items = [x for j in c for x in rows.items(idx[j])]
        examples = tuple(dict.fromkeys(f"{t.trace}#t{t.turn}" for t, _ in items))[:3]
        text = rows.texts[idx[best]]
        needs_image = specs.by_action(action).needs_image or bool(_IMAGE_WORDS.search(text))
        out.append(Entry("", action, text, needs_image, size, size / used, examples, len(c)))
    if small:
        dropped.append(f"{action}: {small} clusters under --min-support {min_support} turns")
    return out, len(clusters)


def _capped(candidates: list[Entry], max_total: int, dropped: list[str]) -> list[Entry]:
    """The library's entries: the biggest clusters (always the biggest answer cluster) up to
    ``max_total``, one action per text, in library order (by action, biggest first) with ids."""
    ranked = sorted(candidates, key=lambda e: -e.size)
    first_answer = next(e for e in ranked if e.action == "answer")
    chosen = [first_answer]
    for e in ranked:
        if e is first_answer:
            continue
        if len(chosen) < max_total:
            chosen.append(e)
        else:
            dropped.append(f"{e.action}: a cluster of {e.size:g} turns (at most {max_total} rationales in "
                           f"all)")
    # Identical texts under two actions would score alike: keep one, the answer's first (a library
    # needs an answer), then the bigger cluster's.
    kept_texts: dict[str, Entry] = {}
    for e in sorted(chosen, key=lambda e: (e.action != "answer", -e.size)):
        if e.text.lower() in kept_texts:
            dropped.append(f"{e.action}: {e.text!r} (the same text leads to "
                           f"{kept_texts[e.text.lower()].action})")
        else:
            kept_texts[e.text.lower()] = e
    entries: list[Entry] = []
    for action in library_actions():
        same = sorted((e for e in kept_texts.values() if e.action == action), key=lambda e: -e.size)
        entries += [Entry(f"{action}_{rank}", action, e.text, e.needs_image, e.size, e.share, e.examples,
                          e.variants)
                    for rank, e in enumerate(same, 1)]
    return entries
