"""Question sets: the JSONL format ``{id, image, question, answers: [...]}``, read and validated.

Knows: the file format (image paths relative to the file; an int id is read as a string; one answer
may be a bare string; ``follows``, optional: a question asked before this one in the same chat, so this
one is a follow-up) and how to say which line is wrong and how to fix it. Does not know: modes,
the engine, matching or results.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from edge_agent.core.errors import EdgeAgentError


@dataclass(frozen=True)
class Question:
    """One line of a question set; any of ``answers`` counts as correct."""

    id: str
    question: str
    answers: tuple[str, ...]
    image: Path | None  # absolute; None for a text-only question
    follows: str | None = None  # asked first in the same chat (not scored): this question is its follow-up


class DatasetError(EdgeAgentError):
    title = "Bad question set"


def dataset_name(path: Path | str) -> str:
    """A short name for a question set: the file's stem, or its folder's name for a generic DATA.jsonl."""
    path = Path(path)
    generic = {"data", "dataset", "questions", "test", "val", "eval"}
    return path.resolve().parent.name if path.stem.lower() in generic else path.stem


def load_dataset(path: Path | str, *, limit: int | None = None) -> list[Question]:
    """Read and validate a JSONL question set; every problem names its line and how to fix it."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"Question file not found: {path}. Pass a JSONL file with one "
                           f"{{id, image, question, answers}} per line.")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path} is not UTF-8 text ({e}).") from e
    base = path.resolve().parent
    out: list[Question] = []
    seen: set[str] = set()
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path.name} line {no}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{where} is not valid JSON ({e.msg}). Each line must be one JSON "
                               "object.") from None
        if not isinstance(row, dict):
            raise DatasetError(f"{where} must be a JSON object with id, image, question, answers.")
        qid = row.get("id")
        if isinstance(qid, int) and not isinstance(qid, bool):
            qid = str(qid)
        if not isinstance(qid, str) or not qid.strip():
            raise DatasetError(f"{where}: 'id' must be a non-empty string.")
        if qid in seen:
            raise DatasetError(f"{where}: id {qid!r} appears twice. Ids must be unique (results are keyed by "
                               f"id).")
        seen.add(qid)
        question = row.get("question")
        if not isinstance(question, str) or not question.strip():
            raise DatasetError(f"{where}: 'question' must be a non-empty string.")
        answers = row.get("answers")
        if isinstance(answers, str):
            answers = [answers]
        if (
            not isinstance(answers, list)
            or not answers
            or not all(isinstance(a, str | int | float) and not isinstance(a, bool) for a in answers)
        ):
            raise DatasetError(f"{where}: 'answers' must be a non-empty list of strings (any of them counts "
                               f"as correct).")
        image_raw = row.get("image")
        image: Path | None = None
        if image_raw not in (None, ""):
            if not isinstance(image_raw, str):
                raise DatasetError(f"{where}: 'image' must be a path string (relative to {path.name}) or "
                                   f"null.")
            image = (base / image_raw).resolve()
            if not image.is_file():
                raise DatasetError(f"{where}: image {image_raw} not found at {image}. Image paths are "
                                   f"relative to the folder of {path.name}.")
        follows = row.get("follows")
        if follows is not None and (not isinstance(follows, str) or not follows.strip()):
            raise DatasetError(f"{where}: 'follows' must be the text of the question asked before this one "
                               "in the same chat (a non-empty string), or left out.")
        out.append(Question(qid, question.strip(), tuple(str(a) for a in answers), image,
                            follows.strip() if follows else None))
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise DatasetError(f"{path} holds no questions.")
    return out

