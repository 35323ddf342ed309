"""Traces -> turns: the free-form turns in the three trace formats edge-agent writes.

Knows: ``eval`` results (``results.json`` / ``results.jsonl`` or their folder), exported chats
(the JSON of ``Chats.export``) and ``ask --json`` logs (one event per line); how to pull each
free-form turn out of them (the reasoning the model wrote, the action it then took) and whether its
question was answered correctly where the source knows: an ``eval`` record is correct when its
normalised prediction contains a gold answer (the eval's "contains" metric); a chat or ``ask``
answer that failed or was cancelled counts as failed, an answered one has no gold answer and counts
as unknown. Does not know what the turns become (``generalise``, ``build``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_agent.agent.rationales import library_actions
from edge_agent.core.errors import EdgeAgentError

HELP = ("SOURCES are `edge-agent eval` results (the --out folder, results.json or results.jsonl) run with "
        "--modes freeform, chats exported from the app (Ctrl+O, e: the .json file), or `edge-agent ask "
        "--mode freeform --json` output saved to a file.")


class LibraryBuildError(EdgeAgentError):
    title = "Cannot build a rationale library"



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
    # traces that ended in an error (e.g. an image for a text model)
    errors: list[str] = field(default_factory=list)


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
            raise LibraryBuildError(f"{path} is neither JSON nor JSON lines ({e.msg}, line {e.lineno}). "
                                    f"{HELP}") from None
    if rows is None:
        if isinstance(data, dict) and data.get("format") == "edge-agent-chat":
            return _read_chat(data, name, out)
        if isinstance(data, dict) and isinstance(data.get("records"), list):
            return _read_records(data["records"], name, path, out)
        if isinstance(data, dict) and ("event" in data or "turn_log" in data):
            rows = [data]  # an ask --json log or an eval's results.jsonl of one line
        elif isinstance(data, list):
            rows = data
        else:
            raise LibraryBuildError(f"{path} is not an eval result, an exported chat or an ask --json log. "
                                    f"{HELP}")
    if rows and all(isinstance(r, dict) and "event" in r for r in rows):
        return _read_ask_log(rows, name, out)
    if rows and all(isinstance(r, dict) and "turn_log" in r for r in rows):
        return _read_records(rows, name, path, out)
    raise LibraryBuildError(f"{path} is not an eval result, an exported chat or an ask --json log. {HELP}")


def _read_records(records: list[Any], name: str, path: Path, out: Read) -> None:
    # In (question id, mode) order, not the file's: a cluster run appends records as they arrive, and the
    # same records must build the same library (the clustering depends on the order it sees turns in).
    for rec in sorted(records, key=lambda r: (str(r.get("id")), str(r.get("mode"))) if isinstance(r,
                                                                                                  dict)
                      else ("", "")):
        if not isinstance(rec, dict) or not isinstance(rec.get("turn_log"), list):
            raise LibraryBuildError(f"{path} holds a record without a turn log: not an edge-agent eval "
                                    f"result. {HELP}")
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
    if action not in library_actions():
        out.invalid_turns += 1
        return
    out.turns.append(Turn(trace=trace, turn=int(turn) if isinstance(turn, int) else 0, text=text,
                          action=action,
                          correct=correct))


def _read_chat(data: dict[str, Any], name: str, out: Read) -> None:
    for n, m in enumerate(data.get("messages") or [], 1):
        if not isinstance(m, dict) or m.get("role") != "assistant" or not isinstance(m.get("events"), list):
            continue
        status = m.get("status")
        correct = None if status in ("answered", "length", "repetition", "turn_limit") else False
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
        ok = final is not None and fatal is None and final.get("stop_reason") in ("answered", "length",
                                                                                  "repetition", "turn_limit")
        _add_events(out, f"{name}:run{n}", events, None if ok else False)

