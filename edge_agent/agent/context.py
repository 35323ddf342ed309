"""How a question's context is opened and kept: the seam between the turn loop and chat continuity.

Knows: what "opening" a question means (a session that holds the system prompt, whatever the chat
already said, and the new user turn, up to the first think block), how that was achieved (a new
context, the live KV cache of the same chat, a saved state restored from disk, or the chat rebuilt
from its text), and the two ends of a question (answered: keep and save; cancelled or failed: back to
the last clean boundary). ``FreshContext`` is the plain form (a fresh session, the earlier exchanges as
text): tests, benchmarks and the eval use it. ``edge_agent.chat.continuity.ChatContexts`` implements the
continuing one with saved states. Does not know llama_cpp, files or widgets.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from edge_agent.agent.prompts import ImageArg, Img, Segment, Text, history_segments, question_segments
from edge_agent.runtime.types import ImageChunk, SessionLike

SOURCES = ("new", "live", "restored", "rebuilt")


@dataclass
class Opened:
    """A session holding the question's whole context, and how it got there."""

    session: SessionLike
    source: str  # new: nothing of this chat existed; live: the chat's KV cache was still loaded;
    #              restored: the chat's saved state was read from disk; rebuilt: earlier exchanges as text
    reason: str = ""  # why "rebuilt" (no saved state, context full, tools changed)
    tokens_reused: int = 0  # context tokens not evaluated (kept KV cells or a restored state)
    tokens_evaluated: int = 0  # tokens evaluated to open it (images counted in embeddings)
    system_restored: bool = False  # the system prompt came from a saved state
    images: list[ImageChunk] = field(default_factory=list)  # images evaluated while opening
    # read ahead before the question was sent (edge_agent.chat.pending_turn) and kept: KV cells of the user
    # turn (its image included), tokens of the person's own text, and the images
    tokens_read_ahead: int = 0
    question_read_ahead: int = 0
    images_read_ahead: list[ImageChunk] = field(default_factory=list)
    seconds: float = 0.0


class ChatContext(Protocol):
    """What the loop asks of a chat's context (one question at a time)."""

    def open(self, system: str, question: str, image: ImageArg, *,
             cancel: threading.Event | None = None) -> Opened:
        """A session ending with the new user turn and ``<think>\\n`` opened, ready for the first turn.
        ``image`` (PNG bytes; a list: several) is put in the user turn unless the context already holds it."""
        ...

    def answered(self, session: SessionLike) -> str:
        """The answer is closed (``</answer><|im_end|>``): keep this context for a follow-up and save
        it; returns the key of the saved state ('' when not saved)."""
        ...

    def abandon(self) -> None:
        """The question was cancelled or failed: go back to the last clean boundary (the end of the
        previous answer, or the system prompt), so the next question starts from a valid chat."""
        ...


def segment_runs(segs: Sequence[Segment]) -> list[Segment]:
    """The segments with neighbouring texts of the same kind merged (one tokenize and decode call per
    run of text): what ``append_segments`` evaluates, and what ``pending_turn`` tokenizes to match it."""
    out: list[Segment] = []
    for seg in segs:
        last = out[-1] if out else None
        if isinstance(seg, Text) and isinstance(last, Text) and last.special == seg.special:
            out[-1] = Text(last.text + seg.text, special=seg.special)
        else:
            out.append(seg)
    return out


def append_segments(s: SessionLike, segs: Sequence[Segment], *,
                    cancel: threading.Event | None = None) -> list[ImageChunk]:
    """Append segments, merging neighbours of the same kind (one tokenize call per run of text); the
    runs of text before the last segment wait (``defer``) and are evaluated with the next image or the
    last text: one decode call per image and one for the rest (an observation's wrapper, its untrusted
    text and the next think block: 3 decodes before, 1 now). Returns the images evaluated."""
    images: list[ImageChunk] = []
    runs = segment_runs(segs)
    for i, run in enumerate(runs):
        if isinstance(run, Img):
            images.append(s.append_image(run.png, cancel=cancel))
        elif run.text:
            s.append_text(run.text, special=run.special, cancel=cancel, defer=i < len(runs) - 1)
    return images


class FreshContext:
    """A fresh, empty session: the system prompt, the earlier exchanges as text, the question."""

    def __init__(self, session: SessionLike, history: Sequence[tuple[str, str]] = ()) -> None:
        self.session = session
        self.history = list(history)

    def open(self, system: str, question: str, image: ImageArg, *,
             cancel: threading.Event | None = None) -> Opened:
        t0 = time.perf_counter()
        s = self.session
        n0 = s.n_evaluated
        segs: list[Segment] = [Text(system), *history_segments(self.history), *question_segments(question,
                                                                                                 image)]
        images = append_segments(s, segs, cancel=cancel)
        return Opened(s, "new" if not self.history else "rebuilt",
                      reason="" if not self.history else "history as text",
                      tokens_evaluated=s.n_evaluated - n0, images=images, seconds=time.perf_counter() - t0)

    def answered(self, session: SessionLike) -> str:
        return ""

    def abandon(self) -> None:
        pass
