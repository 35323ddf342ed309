"""The pending user turn: what the person has already given (a photo, the words typed so far), read into the
end of the chat's context before the question is sent.

Knows: a user turn as a list of elements in the order the session evaluates them (each text token, each
image by its digest), tokenized exactly as ``agent.context.append_segments`` would (neighbouring
segments of the same kind in one run), what of it is in the session now (pieces, each with checkpoints
before and after), and how to move the session from what was read ahead to what is asked: keep the
longest common prefix, roll the rest back (``Session.rollback``: ``llama_memory_seq_rm`` from that
position), evaluate what is new. So a question evaluates only what was not read yet, and the result is
the context that evaluating the whole turn at once gives.
Does not know threads, widgets or when read-ahead runs (``edge_agent.engine.read_ahead``), nor chats and saved
states (``edge_agent.chat.continuity`` owns the boundary a pending turn extends and never saves it).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from edge_agent.agent.context import segment_runs
from edge_agent.agent.prompts import Img, Segment
from edge_agent.runtime.state import image_digest
from edge_agent.runtime.types import Checkpoint, ImageChunk, SessionLike


@dataclass(frozen=True)
class Element:
    """One step of a user turn: a text token (``value`` its id) or an image (``value`` its digest)."""

    kind: str  # "t" text token | "i" image
    value: int | str
    question: bool = False  # a token of the person's own text (not the chat format around it)
    png: bytes | None = field(default=None, compare=False, repr=False)


@dataclass
class _Piece:
    elements: list[Element]
    before: Checkpoint
    after: Checkpoint
    chunk: ImageChunk | None = None


@dataclass
class Extended:
    """What :meth:`PendingTurn.extend` kept of the read-ahead and what it evaluated."""

    kept: int = 0  # elements kept from what was read ahead
    kept_cells: int = 0  # KV cells they hold (an image counts its embeddings)
    kept_question: int = 0  # tokens of the person's text among them
    kept_images: list[ImageChunk] = field(default_factory=list)
    images: list[ImageChunk] = field(default_factory=list)  # images evaluated by this call


def elements(s: SessionLike, segs: Sequence[Segment]) -> list[Element]:
    """The segments as elements, tokenized run by run as ``append_segments`` evaluates them."""
    out: list[Element] = []
    for run in segment_runs(segs):
        if isinstance(run, Img):
            out.append(Element("i", image_digest(run.png), png=run.png))
        else:
            out.extend(Element("t", t, not run.special) for t in s.tokenize(run.text, special=run.special))
    return out


def _within(before: Checkpoint, j: int) -> Checkpoint:
    """The point ``j`` text tokens after ``before`` (the tokens between were evaluated, since a later
    append flushed anything ``before`` held pending). No logits are known there: the session evaluates
    the last kept token again, with whatever comes next."""
    return Checkpoint(n_cells=before.n_cells + before.n_pending + j, n_pos=before.n_pos + j,
                      n_history=before.n_history + j, n_pending=0, n_images=before.n_images, logits=None)


class PendingTurn:
    """The elements read ahead after one clean boundary of one live session (at most one at a time)."""

    def __init__(self) -> None:
        self.session: SessionLike | None = None
        self.base: Checkpoint | None = None  # the boundary this turn extends
        self.pieces: list[_Piece] = []

    def on(self, s: SessionLike, base: Checkpoint) -> bool:
        """True when this pending turn extends ``base`` of ``s`` and the session still ends with it."""
        if self.session is not s or self.base is not base:
            return False
        end = self.pieces[-1].after if self.pieces else base
        return (s.n_pos, s.n_cells) == (end.n_pos, end.n_cells)

    def forget(self) -> None:
        """The session was replaced or the turn became part of the chat: nothing is pending any more."""
        self.session, self.base, self.pieces = None, None, []

    def drop(self) -> None:
        """Roll the session back to the boundary: what was read ahead leaves no trace."""
        if self.session is not None and self.base is not None and self.pieces:
            self.session.rollback(self.base)
        self.forget()

    @property
    def read(self) -> list[Element]:
        return [e for p in self.pieces for e in p.elements]

    def question_tokens(self) -> int:
        return sum(e.question for e in self.read)

    def extend(self, s: SessionLike, base: Checkpoint, target: list[Element], *,
               cancel: threading.Event | None = None,
               image_cancel: threading.Event | None = None) -> Extended:
        """Make the session hold ``base`` + ``target``: the longest common prefix with what was read ahead
        is kept, the rest rolled back, the remainder evaluated. ``cancel`` aborts a text step (the session
        then holds the part done so far), ``image_cancel`` an image's decode (None: an image is always
        finished, never decoded twice)."""
        if not self.on(s, base):
            self.forget()
            if (s.n_pos, s.n_cells) != (base.n_pos, base.n_cells):
                s.rollback(base)
            self.session, self.base = s, base
        read = self.read
        k = 0
        while k < min(len(read), len(target)) and read[k] == target[k]:
            k += 1
        out = Extended(kept=k, kept_question=sum(e.question for e in read[:k]))
        self._cut(s, k)
        out.kept_cells = s.n_cells - base.n_cells
        out.kept_images = [p.chunk for p in self.pieces if p.chunk is not None]
        i = k
        while i < len(target):
            before = s.checkpoint()
            if target[i].kind == "i":
                png = target[i].png
                assert png is not None
                chunk = s.append_image(png, cancel=image_cancel)
                self.pieces.append(_Piece([target[i]], before, s.checkpoint(), chunk))
                out.images.append(chunk)
                i += 1
                continue
            j = i
            while j < len(target) and target[j].kind == "t":
                j += 1
            s.append_tokens([int(e.value) for e in target[i:j]], cancel=cancel)
            self.pieces.append(_Piece(target[i:j], before, s.checkpoint()))
            i = j
        return out

    def _cut(self, s: SessionLike, k: int) -> None:
        """Keep the first ``k`` elements read ahead; roll back the rest."""
        pos = 0
        for idx, p in enumerate(self.pieces):
            n = len(p.elements)
            if k <= pos:
                s.rollback(p.before)
                del self.pieces[idx:]
                return
            if k < pos + n:  # inside a run of text tokens
                s.rollback(_within(p.before, k - pos))
                p.elements = p.elements[: k - pos]
                p.after = s.checkpoint()
                del self.pieces[idx + 1 :]
                return
            pos += n
