"""Build an SSR rationale library from the agent's own free-form traces.

Knows: the three trace formats edge-agent writes (``eval`` results: ``results.json`` /
``results.jsonl`` or their folder; exported chats: the JSON of ``Chats.export``; ``ask --json``
logs: one event per line), how to pull the free-form turns out of them (the reasoning the model
wrote, the action it then took, and whether the question was answered correctly where the source
knows), how to turn one turn's reasoning into a generic move (its decision sentence, quoted strings,
numbers and proper names generalised, chat markup removed), how to cluster those moves within each
action (average-linkage agglomerative clustering on cosine similarity), and how to write the
clusters' representatives as a library in the format ``rationales.parse_library`` validates, with
provenance in a side field the loader ignores.

Does not know: models or tokens. Clustering takes vectors from an ``embed(texts) -> (n, d)`` callable
(``edge_agent.runtime.embed``: the agent model's mean-pooled hidden states); without one, TF-IDF word
vectors. Pure: no llama_cpp, no network, no files written but the one ``write_library`` is asked to.

Correctness: an ``eval`` record is correct when its normalised prediction contains a gold answer (the
eval's "contains" metric); a chat or ``ask`` answer that failed or was cancelled counts as failed, an
answered one has no gold answer and counts as unknown (kept by default).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.agent.prompts import echoes_instructions
from edge_agent.agent.rationales import ACTIONS, FORBIDDEN, MAX_RATIONALES, parse_library
from edge_agent.errors import EdgeAgentError

Embed = Callable[[Sequence[str]], np.ndarray]

DEFAULT_PER_ACTION = 3
DEFAULT_MAX_CHARS = 120  # a rationale is scored on every turn: short ones cost less (see `library show`)
DEFAULT_SIMILARITY = 0.5  # average cosine similarity at which two clusters merge
DEFAULT_MIN_SUPPORT = 2  # a move must recur: a cluster of one turn is not a move
MAX_UNIQUE = 1500  # most distinct texts clustered per action (the most frequent ones; O(n^2) memory)
PLACEHOLDER = "it"
HELP = ("SOURCES are `edge-agent eval` results (the --out folder, results.json or results.jsonl) run with "
        "--modes freeform, chats exported from the app (Ctrl+O, e: the .json file), or `edge-agent ask "
        "--mode freeform --json` output saved to a file.")


class LibraryBuildError(EdgeAgentError):
    title = "Cannot build a rationale library"


# ---- Traces -> turns ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """One free-form turn: what the model wrote, then what it did."""

    trace: str  # "<source>:<question or run>" (a question of an eval, a message of a chat, a run of ask)
    turn: int
    text: str  # the reasoning as written
    action: str  # image_search | text_search | zoom | answer
    correct: bool | None  # None: the source does not know


@dataclass
class Read:
    """What reading the sources found (the counts explain a small or failed build)."""

    turns: list[Turn] = field(default_factory=list)
    traces: int = 0  # questions / answers / runs seen
    scored_turns: int = 0  # SSR turns: no written reasoning, nothing to learn from
    invalid_turns: int = 0  # turns whose action did not parse
    missing_text: int = 0  # free-form turns recorded without their reasoning text (an older eval)
    errors: list[str] = field(default_factory=list)  # traces that ended in an error (e.g. an image for a text model)


def read_sources(paths: Iterable[str | Path]) -> Read:
    """Every free-form turn in ``paths`` (eval results, chat exports, ``ask --json`` logs)."""
    out = Read()
    for p in paths:
        _read_one(Path(p).expanduser(), out)
    return out


def _read_one(path: Path, out: Read) -> None:
    if path.is_dir():
        for name in ("results.jsonl", "results.json"):
            if (path / name).is_file():
                return _read_one(path / name, out)
        raise LibraryBuildError(f"{path} is a folder without results.jsonl or results.json. {HELP}")
    if not path.is_file():
        raise LibraryBuildError(f"Source not found: {path}. {HELP}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise LibraryBuildError(f"{path} is not UTF-8 text (is it an image or a database?). {HELP}") from None
    if not text.strip():
        raise LibraryBuildError(f"{path} is empty. {HELP}")
    name = path.stem if path.name not in ("results.json", "results.jsonl") else path.parent.name
    try:
        data: Any = json.loads(text)
        rows = None
    except json.JSONDecodeError:
        data = None
        try:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as e:
            raise LibraryBuildError(f"{path} is neither JSON nor JSON lines ({e.msg}, line {e.lineno}). {HELP}") from None
    if rows is None:
        if isinstance(data, dict) and data.get("format") == "edge-agent-chat":
            return _read_chat(data, name, out)
        if isinstance(data, dict) and isinstance(data.get("records"), list):
            return _read_records(data["records"], name, path, out)
        if isinstance(data, dict) and "event" in data:
            rows = [data]  # an ask --json log of one line
        elif isinstance(data, list):
            rows = data
        else:
            raise LibraryBuildError(f"{path} is not an eval result, an exported chat or an ask --json log. {HELP}")
    if rows and all(isinstance(r, dict) and "event" in r for r in rows):
        return _read_ask_log(rows, name, out)
    if rows and all(isinstance(r, dict) and "turn_log" in r for r in rows):
        return _read_records(rows, name, path, out)
    raise LibraryBuildError(f"{path} is not an eval result, an exported chat or an ask --json log. {HELP}")


def _read_records(records: list[Any], name: str, path: Path, out: Read) -> None:
    for rec in records:
        if not isinstance(rec, dict) or not isinstance(rec.get("turn_log"), list):
            raise LibraryBuildError(f"{path} holds a record without a turn log: not an edge-agent eval result. {HELP}")
        out.traces += 1
        correct = bool(rec.get("contains") or rec.get("exact")) and not rec.get("error")
        trace = f"{name}:{rec.get('id', out.traces)}"
        if rec.get("error"):
            out.errors.append(str(rec["error"]))
        if rec.get("mode") not in (None, "freeform"):
            out.scored_turns += len(rec["turn_log"])
            continue
        for t in rec["turn_log"]:
            if not isinstance(t, dict):
                continue
            if t.get("rationale") is not None:
                out.scored_turns += 1
                continue
            text = t.get("reasoning")
            if not isinstance(text, str):
                out.missing_text += 1
                continue
            _add(out, trace, t.get("turn", 0), text, t.get("action"), correct)


def _events_turns(events: Iterable[dict[str, Any]]) -> tuple[dict[int, str], dict[int, str], int]:
    """(reasoning text by turn, action by turn, scored turns) from a list of event dicts."""
    texts: dict[int, str] = {}
    actions: dict[int, str] = {}
    scored = 0
    for e in events:
        kind, turn = e.get("event"), e.get("turn")
        if not isinstance(turn, int):
            continue
        if kind == "reasoning_done" and isinstance(e.get("text"), str):
            texts[turn] = e["text"]
        elif kind == "turn_finished" and isinstance(e.get("action"), str):
            actions[turn] = e["action"]
        elif kind == "rationale_scored":
            scored += 1
    return texts, actions, scored


def _add_events(out: Read, trace: str, events: list[dict[str, Any]], correct: bool | None) -> None:
    texts, actions, scored = _events_turns(events)
    out.traces += 1
    out.scored_turns += scored
    for turn in sorted(texts):
        _add(out, trace, turn, texts[turn], actions.get(turn), correct)


def _add(out: Read, trace: str, turn: Any, text: str, action: Any, correct: bool | None) -> None:
    if action not in ACTIONS:
        out.invalid_turns += 1
        return
    out.turns.append(Turn(trace=trace, turn=int(turn) if isinstance(turn, int) else 0, text=text, action=action,
                          correct=correct))


def _read_chat(data: dict[str, Any], name: str, out: Read) -> None:
    for n, m in enumerate(data.get("messages") or [], 1):
        if not isinstance(m, dict) or m.get("role") != "assistant" or not isinstance(m.get("events"), list):
            continue
        status = m.get("status")
        correct = None if status in ("answered", "turn_limit") else False
        _add_events(out, f"{name}:m{n}", [e for e in m["events"] if isinstance(e, dict)], correct)


def _read_ask_log(rows: list[dict[str, Any]], name: str, out: Read) -> None:
    runs: list[list[dict[str, Any]]] = []
    for r in rows:
        if r.get("event") == "run_started" or not runs:
            runs.append([])
        runs[-1].append(r)
    for n, events in enumerate(runs, 1):
        final = next((e for e in reversed(events) if e.get("event") == "final_answer"), None)
        fatal = next((e for e in events if e.get("event") == "error" and e.get("fatal")), None)
        if fatal is not None:
            out.errors.append(f"{fatal.get('title', 'Error')}: {fatal.get('message', '')}")
        ok = final is not None and final.get("stop_reason") in ("answered", "turn_limit") and fatal is None
        _add_events(out, f"{name}:run{n}", events, None if ok else False)


# ---- One turn's reasoning -> a generic move ----------------------------------------------------------

_MARKUP = re.compile(r"<\|im_start\|>\s*(?:system|user|assistant|tool)?|<\|[^|>]{0,40}\|>|</?(?:think|tool_call|tool_response|answer|image|img)[^>]{0,20}>|<\|", re.I)
_JSONISH = re.compile(r"\{[^{}]{0,300}\}")
_BOX = re.compile(r"[\[(]\s*[-+]?\d[\d\s,.;:-]*[\])]")  # [x1, y1, x2, y2], (12, 34)
_QUOTED = re.compile(r"\"[^\"\n]{1,120}\"|“[^”\n]{1,120}”|«[^»\n]{1,120}»|(?<![\w])'[^'\n]{1,80}'(?![\w])|`[^`\n]{1,80}`")
_NUMBER = re.compile(r"(?<![\w])[-+]?\d[\d,.:/]*(?:%|st|nd|rd|th|px|x\d+)?(?![\w])")
_WORD = re.compile(r"[A-Za-z][A-Za-z'’-]*")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"“'(])|\n+")
_DECISION = re.compile(
    r"\b(?:I should|I need to|I need|I will|I'll|I must|I can|I have to|I am going to|I'm going to|"
    r"let me|let's|I want to|the next step|so I|therefore|I'd|it's best to|it is best to|I could)\b", re.I)
# Capitalised words that are not names (sentence-internal capitals a model writes anyway).
_NOT_NAMES = frozenset("""I I'm I'll I've I'd OK Okay Wikipedia Web Internet English""".split())


@dataclass(frozen=True)
class Move:
    """A turn's reasoning reduced to a generic, library-sized text."""

    text: str
    placeholders: int  # specifics replaced by a placeholder (fewer: a more naturally generic text)


def decision_sentence(text: str) -> str:
    """The sentence of a reasoning that commits to the move: the last one that says what to do next
    ("I should ...", "Let me ..."), else the last sentence; a last fragment of under four words
    without final punctuation (cut off by the token limit) is left out."""
    parts = [p.strip() for p in _SENTENCE_END.split(" ".join(text.replace("\n", " \n ").split(" "))) if p and p.strip()]
    if len(parts) > 1 and not parts[-1].endswith((".", "!", "?", ":", '"', ")")) and len(parts[-1].split()) < 4:
        parts.pop()  # a few words cut off by the token limit decide nothing
    if not parts:
        return ""
    for p in reversed(parts):
        if _DECISION.search(p):
            return p
    return parts[-1]


def generalise(text: str, *, max_chars: int = DEFAULT_MAX_CHARS) -> Move | None:
    """A generic move from one reasoning text, or None when nothing generic is left.

    Removes chat markup, JSON and box coordinates; replaces quoted strings and proper names with
    "it" and drops numbers; keeps the decision sentence, cut at a word boundary to ``max_chars``;
    no final period (like the built-in library). Garbage (mostly non-letters, under three words) and
    echoes of the words the model is told ("You have no tool calls left") give None.
    """
    s = _MARKUP.sub(" ", text)
    for f in FORBIDDEN:
        s = s.replace(f, " ")
    s = decision_sentence(s)
    n = 0
    s, k = _JSONISH.subn(" ", s)
    n += k
    s, k = _BOX.subn(f" {PLACEHOLDER} ", s)
    n += k
    s, k = _QUOTED.subn(f" {PLACEHOLDER} ", s)
    n += k
    s, k = _NUMBER.subn(" ", s)
    n += k
    s, k = _names(s)
    n += k
    s = _tidy(s)
    if not s:
        return None
    if len(s) > max_chars:
        cut = s[: max_chars + 1].rsplit(" ", 1)[0]
        s = _tidy(cut)
    words = _WORD.findall(s)
    letters = sum(c.isalpha() or c.isspace() for c in s)
    if len(words) < 3 or letters < 0.8 * len(s) or any(f in s for f in FORBIDDEN):
        return None
    if words[0].lower() == "you" or echoes_instructions(s):
        return None  # the prompt's or a tool's words to the model, repeated: not the model's own move
    return Move(s, n)


def _names(s: str) -> tuple[str, int]:
    """Replace runs of capitalised words that are not at a sentence start (and ALL-CAPS words) with
    the placeholder; returns (text, runs replaced)."""
    tokens = s.split(" ")
    out: list[str] = []
    n = 0
    run = False
    start = True  # at a sentence start
    for tok in tokens:
        if not tok:
            continue
        core = tok.strip(".,;:!?()\"'“”")
        is_cap = bool(core) and core[0].isupper() and core not in _NOT_NAMES and _WORD.fullmatch(core) is not None
        caps = len(core) >= 2 and core.isupper() and core not in _NOT_NAMES and core.isalpha()
        if (is_cap and not start) or caps:
            tail = tok[len(tok.rstrip(".,;:!?)\"'”")):]
            if not run:
                out.append(PLACEHOLDER + tail)
                n += 1
            else:
                out[-1] = PLACEHOLDER + tail
            run = not tail
        else:
            out.append(tok)
            run = False
        start = tok.endswith((".", "!", "?", ":"))
    return " ".join(out), n


def _tidy(s: str) -> str:
    s = re.sub(r"\(\s*\)|\[\s*\]", " ", s)
    s = re.sub(rf"\b({PLACEHOLDER})(\s+(?:and\s+|,\s*)?{PLACEHOLDER}\b)+", PLACEHOLDER, s)
    s = " ".join(s.split())
    s = re.sub(r"\s+([,.;:!?])", r"\1", s)
    s = re.sub(r"([,;:])(?:\s*[,;:])+", r"\1", s)
    s = s.strip(" ,;:-–—.!?\"'“”()")
    s = s.rstrip(" ,;:-–—.!?")
    return s[:1].upper() + s[1:] if s else s


# ---- Clustering --------------------------------------------------------------------------------------


def lexical_vectors(texts: Sequence[str]) -> np.ndarray:
    """TF-IDF over lower-cased words and word pairs, L2-normalised: (n, vocabulary) float64."""
    docs = []
    for t in texts:
        w = [x.lower() for x in _WORD.findall(t)]
        docs.append(Counter(w + [f"{a} {b}" for a, b in zip(w, w[1:], strict=False)]))
    vocab = sorted({k for d in docs for k in d})
    index = {k: i for i, k in enumerate(vocab)}
    df = Counter(k for d in docs for k in d)
    n = len(docs)
    m = np.zeros((n, max(1, len(vocab))), dtype=np.float64)
    for r, d in enumerate(docs):
        for k, c in d.items():
            m[r, index[k]] = (1 + math.log(c)) * (math.log((1 + n) / (1 + df[k])) + 1)
    return _normalise(m)


def _normalise(m: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    return m / np.where(norms > 0, norms, 1.0)


def cluster(vectors: np.ndarray, weights: Sequence[int], threshold: float) -> list[list[int]]:
    """Average-linkage agglomerative clustering on cosine similarity of L2-normalised rows.

    ``weights[i]`` = how many turns row i stands for (identical texts are one row). Merges the most
    similar pair until no pair's average (turn-weighted) similarity reaches ``threshold``. Returns
    clusters as row-index lists, largest (by weight) first. O(n^2) memory, O(n^3) time worst case.
    """
    n = len(vectors)
    if n == 0:
        return []
    sim = np.asarray(vectors @ vectors.T, dtype=np.float64)
    np.fill_diagonal(sim, -np.inf)
    w = np.asarray(weights, dtype=np.float64)
    members: list[list[int] | None] = [[i] for i in range(n)]
    alive = np.ones(n, dtype=bool)
    while alive.sum() > 1:
        flat = int(np.argmax(sim))
        a, b = divmod(flat, n)
        if not sim[a, b] >= threshold:
            break
        # Lance-Williams update for average linkage: sim(a+b, k) = (w_a sim(a,k) + w_b sim(b,k)) / (w_a + w_b)
        new = (w[a] * sim[a] + w[b] * sim[b]) / (w[a] + w[b])
        sim[a, :] = new
        sim[:, a] = new
        sim[a, a] = -np.inf
        sim[b, :] = -np.inf
        sim[:, b] = -np.inf
        w[a] += w[b]
        alive[b] = False
        members[a] = (members[a] or []) + (members[b] or [])
        members[b] = None
    out = [m for m in members if m is not None]
    weight = np.asarray(weights, dtype=np.float64)
    out.sort(key=lambda m: (-float(weight[m].sum()), min(m)))
    return out


# ---- The build ---------------------------------------------------------------------------------------


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
            "about": (f"Built by `edge-agent library build` from {self.used} free-form turns of {self.read.traces} "
                      f"traces; clustered by {self.method}. Each entry's provenance: the turns its cluster "
                      "covers (size, share of all turns used) and example trace ids."),
            "built": {"sources": list(sources), "turns": self.used, "traces": self.read.traces, "method": self.method,
                      "skipped_failed": self.skipped_failed, "skipped_garbage": self.skipped_garbage},
            "rationales": [
                {"id": e.id, "action": e.action, "text": e.text, "needs_image": e.needs_image,
                 "provenance": {"cluster_size": e.size, "share": round(e.share, 4), "variants": e.variants,
                                "examples": list(e.examples)}}
                for e in self.entries
            ],
        }


_IMAGE_WORDS = re.compile(r"\b(image|picture|photo|crop|see|seen|visible|shown|shows|look|looks|zoomed)\b", re.I)


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
    if not read.turns:
        why = []
        if read.scored_turns:
            why.append(f"{read.scored_turns} SSR turns have no written reasoning (run the eval with --modes freeform)")
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
    skipped_failed = len(read.turns) - len(kept)
    if not kept:
        n_failed = len({t.trace for t in read.turns})
        raise LibraryBuildError(
            f"All {n_failed} questions in the sources were answered wrongly or failed, so no turn is known to "
            "lead somewhere good. Pass --all to build from every turn anyway, or evaluate more questions.")
    moves: list[tuple[Turn, Move]] = []
    garbage = 0
    for t in kept:
        m = generalise(t.text, max_chars=max_chars)
        if m is None:
            garbage += 1
        else:
            moves.append((t, m))
    if not moves:
        raise LibraryBuildError(
            f"None of the {len(kept)} turns' reasoning has a generic move left after removing specifics "
            "(it was empty, too short or not text). Use traces of a model that writes its reasoning in words.")

    # One row per distinct text, per action; all texts embedded together (so centring sees them all).
    groups: dict[str, dict[str, list[tuple[Turn, Move]]]] = {}
    for t, m in moves:
        groups.setdefault(t.action, {}).setdefault(m.text.lower(), []).append((t, m))
    order = [(a, k) for a in ACTIONS if a in groups
             for k, _ in sorted(groups[a].items(), key=lambda kv: -len(kv[1]))[:MAX_UNIQUE]]
    texts = [groups[a][k][0][1].text for a, k in order]
    if embed is not None:
        vec = np.asarray(embed(texts), dtype=np.float64)
        if vec.shape[0] != len(texts):
            raise ValueError("embed returned the wrong number of vectors")  # a bug in the embedder
        vec = _normalise(vec - vec.mean(axis=0, keepdims=True)) if len(texts) > 1 else _normalise(vec)
        how = method or "model embeddings"
    else:
        vec = lexical_vectors(texts)
        how = "lexical (TF-IDF word and word-pair vectors)"

    used = len(moves)
    candidates: list[tuple[Entry, float]] = []  # (entry, size) before the caps
    n_clusters: dict[str, int] = {}
    dropped: list[str] = []
    for action in ACTIONS:
        rows = [i for i, (a, _) in enumerate(order) if a == action]
        if not rows:
            continue
        sub = vec[rows]
        weights = [len(groups[action][order[i][1]]) for i in rows]
        clusters = cluster(sub, weights, similarity)
        n_clusters[action] = len(clusters)
        picked = 0
        for c in clusters:
            size = sum(weights[j] for j in c)
            if size < min_support:
                continue
            if picked >= per_action:
                dropped.append(f"{action}: a cluster of {size} turns (--per-action {per_action})")
                continue
            picked += 1
            centre = sub[c].mean(axis=0)
            close = sub[c] @ centre
            cut = float(np.median(close))
            best = min((j for j, s in zip(c, close, strict=True) if s >= cut - 1e-12),
                       key=lambda j: (groups[action][order[rows[j]][1]][0][1].placeholders,
                                      len(texts[rows[j]]), texts[rows[j]]))
            items = [x for j in c for x in groups[action][order[rows[j]][1]]]
            examples = tuple(dict.fromkeys(f"{t.trace}#t{t.turn}" for t, _ in items))[:3]
            text = texts[rows[best]]
            needs_image = action in ("zoom", "image_search") or bool(_IMAGE_WORDS.search(text))
            candidates.append((Entry("", action, text, needs_image, size, size / used, examples, len(c)), size))
        small = sum(1 for c in clusters if sum(weights[j] for j in c) < min_support)
        if small:
            dropped.append(f"{action}: {small} clusters under --min-support {min_support} turns")

    if not any(e.action == "answer" for e, _ in candidates):
        raise LibraryBuildError(
            f"No answering move recurs in the {used} usable turns (--min-support {min_support}): the agent could "
            "never answer with this library. Pass --min-support 1, --all, or more sources.")
    # The global cap: keep the biggest clusters, and always the biggest answer cluster.
    ranked = sorted(candidates, key=lambda es: -es[1])
    first_answer = next(e for e, _ in ranked if e.action == "answer")
    chosen = [first_answer]
    for e, weight in ranked:
        if e is first_answer:
            continue
        if len(chosen) < max_total:
            chosen.append(e)
        else:
            dropped.append(f"{e.action}: a cluster of {weight:g} turns (at most {max_total} rationales in all)")
    # Identical texts under two actions would score alike: keep one, the answer's first (a library
    # needs an answer), then the bigger cluster's.
    kept_texts: dict[str, Entry] = {}
    for e in sorted(chosen, key=lambda e: (e.action != "answer", -e.size)):
        if e.text.lower() in kept_texts:
            dropped.append(f"{e.action}: {e.text!r} (the same text leads to {kept_texts[e.text.lower()].action})")
        else:
            kept_texts[e.text.lower()] = e
    # Library order: by action, biggest first; ids by action and rank.
    entries: list[Entry] = []
    for action in ACTIONS:
        same = sorted((e for e in kept_texts.values() if e.action == action), key=lambda e: -e.size)
        entries += [Entry(f"{action}_{rank}", action, e.text, e.needs_image, e.size, e.share, e.examples, e.variants)
                    for rank, e in enumerate(same, 1)]
    build = Build(entries, read, used, skipped_failed, garbage, n_clusters, how, dropped)
    parse_library(build.library_json(), source="the built library")  # the loader's own checks
    return build


def write_library(build: Build, path: str | Path, *, sources: Sequence[str] = ()) -> Path:
    """Write the library (the loader's format + provenance) to ``path`` atomically."""
    from edge_agent.files import atomic_write

    path = Path(path).expanduser()
    atomic_write(path, json.dumps(build.library_json(sources=sources), indent=2, ensure_ascii=False) + "\n")
    return path

