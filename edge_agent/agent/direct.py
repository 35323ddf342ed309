"""The ``direct`` mode: the model alone in a plain chat, no tools, no agent, no rationales.

What a user of LM Studio or llama.cpp gets: the chat's messages (the user's own instructions as a system
message, the earlier exchanges, the question with its images) rendered by the model's own chat template
(``runtime.chat_template``, as ``Llama.create_chat_completion`` renders them), then the answer generated
to the end of the turn (at most ``answer_max_tokens``), streamed as the agent's ``AnswerToken`` events and
a ``FinalAnswer``, so the app, ``ask --json`` and the eval read it unchanged (no RationaleScored, no
ToolCalled).

Knows: the messages of a plain chat (an image goes into the first user message that carries it, never
twice), how a rendered prompt becomes segments (the template's own text with its special tokens, every
text a person or a model wrote as plain text, each image placeholder of the template as the image), how
a session is made to hold a prompt keeping the longest common prefix of what it holds already (the rest
rolled back, the remainder evaluated: the context equals evaluating the prompt from scratch), and the
episode's events. Talks to the model only through ``runtime.types`` sessions; rendering comes in as a
function. Does not know llama_cpp, chats, saved states or widgets (``chat.continuity.DirectQuestion``
continues a chat's context; :class:`FreshDirect` starts from an empty session).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from edge_agent.agent.context import Opened, segment_runs
from edge_agent.agent.events import (
    AnswerToken,
    ContextOpened,
    Event,
    FinalAnswer,
    ImageEvaluated,
    RunStarted,
    TurnFinished,
    TurnStarted,
)
from edge_agent.agent.options import AgentOptions
from edge_agent.agent.prompts import Img, Segment, Text
from edge_agent.agent.repetition import until_looping
from edge_agent.agent.streaming import stream
from edge_agent.core.errors import Cancelled, EdgeAgentError
from edge_agent.runtime.types import ChatSessionLike, Checkpoint, ImageChunk, SessionLike

Render = Callable[[Sequence[Mapping[str, Any]]], str]  # messages -> prompt text (generation prompt included)
IMAGE = -1  # a session history's entry for an image (runtime.state.IMAGE)
_MARK = "\ue000{}\ue001"  # stands for a message's text while the template renders (private-use characters)


@dataclass(frozen=True)
class Exchange:
    """An earlier question of the chat, its answer, and the images asked with it (PNG bytes)."""

    question: str
    answer: str
    images: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class ChatMessage:
    role: str  # system | user | assistant
    text: str
    images: tuple[bytes, ...] = ()


def messages(history: Sequence[Exchange], question: str, images: Sequence[bytes] = (), *,
             instructions: str = "") -> list[ChatMessage]:
    """The plain chat: ``instructions`` (the ``system_prompt`` setting) as a system message, each earlier
    exchange as a user and an assistant message, then the question. An image is put in the first user
    message that carries it; a later message that carries it again refers to it (it is not repeated)."""
    from edge_agent.runtime.state import image_digest

    seen: set[str] = set()

    def new(pngs: Sequence[bytes]) -> tuple[bytes, ...]:
        out = []
        for png in pngs:
            d = image_digest(png)
            if d not in seen:
                seen.add(d)
                out.append(png)
        return tuple(out)

    out = [ChatMessage("system", " ".join(instructions.split()))] if instructions.strip() else []
    for h in history:
        out += [ChatMessage("user", h.question.strip(), new(h.images)), ChatMessage("assistant",
                                                                                    h.answer.strip())]
    out.append(ChatMessage("user", question.strip(), new(images)))
    return out


def _content(m: ChatMessage, text: str, with_images: bool) -> Any:
    if not m.images:
        return text
    return [*([{"type": "image"}] * (len(m.images) if with_images else 0)), {"type": "text", "text": text}]


def _placeholder(render: Render) -> str:
    """What the template writes for one image part ("" when it writes nothing)."""
    mark = _MARK.format(0)
    with_image = render([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": mark}]}])
    without = render([{"role": "user", "content": [{"type": "text", "text": mark}]}])
    head_with, head_without = with_image.split(mark)[0], without.split(mark)[0]
    p = 0
    while p < len(head_without) and head_with[p] == head_without[p]:
        p += 1
    return head_with[p : len(head_with) - (len(head_without) - p)]


def prompt_segments(render: Render, msgs: Sequence[ChatMessage]) -> list[Segment]:
    """The prompt of ``msgs`` as segments: the template's text (special tokens parsed), each message's
    text as plain text (``special=False``: what a person, a web page or a model wrote never becomes a
    control token), each image where the template puts its placeholder (the runtime adds the projector's
    own markers), or right before its message's text when the template writes none.

    The template renders markers in place of the texts, so its text is told apart from theirs exactly;
    the texts are put back verbatim (templates that rewrite a message's text are not followed)."""
    rendered = render([{"role": m.role, "content": _content(m, _MARK.format(i), True)} for i,
                       m in enumerate(msgs)])
    ph = _placeholder(render) if any(m.images for m in msgs) else ""
    out: list[Segment] = []
    pos = 0
    for i, m in enumerate(msgs):
        mark = _MARK.format(i)
        at = rendered.find(mark, pos)
        if at < 0:
            raise EdgeAgentError(f"The model's chat template dropped message {i + 1} ({m.role}): it cannot "
                                 f"be used "
                                 "for a plain chat. Use the ssr or freeform mode.",
                                 title="Chat template failed")
        out += _with_images(rendered[pos:at], m.images, ph)
        out.append(Text(m.text, special=False))
        pos = at + len(mark)
    out.append(Text(rendered[pos:]))
    return [s for s in out if not (isinstance(s, Text) and not s.text)]


def _with_images(head: str, images: Sequence[bytes], ph: str) -> list[Segment]:
    """The template's text before a message's text, its last ``len(images)`` placeholders replaced by the
    images (those the template wrote none for go at its end)."""
    cuts: list[int] = []
    end = len(head)
    while ph and len(cuts) < len(images):
        at = head.rfind(ph, 0, end)
        if at < 0:
            break
        cuts.insert(0, at)
        end = at
    out: list[Segment] = []
    pos = 0
    for at, png in zip(cuts, images, strict=False):
        out += [Text(head[pos:at]), Img(png)]
        pos = at + len(ph)
    out.append(Text(head[pos:]))
    out += [Img(png) for png in images[len(cuts):]]
    return out


# ---- a session holding a prompt --------------------------------------------------------------------
@dataclass
class Held:
    """What :func:`hold` kept of a session and what it evaluated."""

    kept: int  # history entries kept (tokens; an image counts one)
    kept_cells: int  # KV cells they hold
    images: list[ImageChunk] = field(default_factory=list)  # images evaluated now
    seconds: float = 0.0


def _elements(s: ChatSessionLike, segs: Sequence[Segment]) -> list[tuple[str, Any, bytes | None]]:
    from edge_agent.runtime.state import image_digest

    out: list[tuple[str, Any, bytes | None]] = []
    for run in segment_runs(segs):
        if isinstance(run, Img):
            out.append(("i", image_digest(run.png), run.png))
        else:
            out += [("t", t, None) for t in s.tokenize(run.text, special=run.special)]
    return out


def _units(s: ChatSessionLike) -> list[tuple[tuple[str, Any], int]]:
    """What ``s`` holds as elements (a text token; an image by its digest, with the projector's markers
    around it), each with the history length at its end."""
    out: list[tuple[tuple[str, Any], int]] = []
    images = iter(s.images)
    skip = 0
    for j, t in enumerate(s.history):
        if t == IMAGE:
            im = next(images)
            if im.wrap_before:
                del out[len(out) - im.wrap_before:]
            skip = im.wrap_after
            out.append((("i", im.digest), j + 1 + skip))
        elif skip:
            skip -= 1
        else:
            out.append((("t", t), j + 1))
    return out


def point(s: ChatSessionLike, k: int) -> Checkpoint:
    """The point after the first ``k`` history entries of ``s`` (counted as they were evaluated). No
    logits are known there: the session evaluates the last kept token again with what follows."""
    cells = pos = n_img = 0
    images = s.images
    for t in s.history[:k]:
        if t == IMAGE:
            cells, pos, n_img = cells + images[n_img].n_tokens, pos + images[n_img].n_pos, n_img + 1
        else:
            cells, pos = cells + 1, pos + 1
    return Checkpoint(n_cells=cells, n_pos=pos, n_history=k, n_pending=0, n_images=n_img, logits=None)


def hold(s: ChatSessionLike, segs: Sequence[Segment], *, cancel: threading.Event | None = None) -> Held:
    """Make ``s`` hold exactly ``segs``: the longest common prefix with what it holds is kept, the rest
    rolled back, the remainder evaluated (text as token ids: no BOS is added that the template did not
    write, as ``create_chat_completion`` adds none)."""
    t0 = time.perf_counter()
    target = _elements(s, segs)
    have = _units(s)
    k = 0
    while k < min(len(have), len(target)) and have[k][0] == target[k][:2]:
        k += 1
    cut = have[k - 1][1] if k else 0
    if cut < len(s.history):  # (no logits are known at the cut: the last kept token is evaluated again)
        s.rollback(point(s, cut))
    out = Held(kept=cut, kept_cells=s.n_cells)
    i = k
    while i < len(target):
        if target[i][0] == "i":
            png = target[i][2]
            assert png is not None
            out.images.append(s.append_image(png, cancel=cancel))
            i += 1
            continue
        j = i
        while j < len(target) and target[j][0] == "t":
            j += 1
        s.append_tokens([int(e[1]) for e in target[i:j]], cancel=cancel)
        i = j
    out.seconds = time.perf_counter() - t0
    return out


class DirectContext(Protocol):
    """What the direct mode asks of a chat's context (one question at a time)."""

    def open(self, segments: Sequence[Segment], *, cancel: threading.Event | None = None) -> Opened:
        """A session holding exactly ``segments`` (the prompt, its generation prompt at the end)."""
        ...

    def answered(self, session: SessionLike) -> str:
        """The answer is in the session: keep it for a follow-up; returns the key it was saved under."""
        ...

    def abandon(self) -> None:
        """The question was cancelled or failed."""
        ...


class FreshDirect:
    """A fresh, empty session (tests, benchmarks): the prompt evaluated from scratch."""

    def __init__(self, session: ChatSessionLike) -> None:
        self.session = session

    def open(self, segments: Sequence[Segment], *, cancel: threading.Event | None = None) -> Opened:
        n0 = self.session.n_evaluated
        held = hold(self.session, segments, cancel=cancel)
        return Opened(self.session, "new", tokens_evaluated=self.session.n_evaluated - n0, images=held.images,
                      seconds=held.seconds)

    def answered(self, session: SessionLike) -> str:
        return ""

    def abandon(self) -> None:
        pass


# ---- the episode ---------------------------------------------------------------------------------
def run_direct(context: DirectContext, render: Render, question: str, *, history: Sequence[Exchange] = (),
               images: Sequence[bytes] = (), options: AgentOptions | None = None,
               cancel: threading.Event | None = None, image_label: str | None = None) -> Iterator[Event]:
    """Answer ``question`` (about ``images``, PNG bytes) in a plain chat: RunStarted, ContextOpened,
    ImageEvaluated per image read, TurnStarted, AnswerToken..., TurnFinished, FinalAnswer (stop_reason
    ``answered``; ``length`` when it stopped at ``answer_max_tokens``; ``cancelled``), or a fatal
    AgentError for a problem the user can fix (a full context, a template that fails)."""
    return _Direct(context, render, question, history, images, options or AgentOptions(mode="direct"),
                   cancel or threading.Event(), image_label).events()


class _Direct:
    def __init__(self, context: DirectContext, render: Render, question: str, history: Sequence[Exchange],
                 images: Sequence[bytes], options: AgentOptions, cancel: threading.Event,
                 image_label: str | None) -> None:
        self.context, self.render, self.question = context, render, question.strip()
        self.history, self.images, self.options, self.cancel = history, images, options, cancel
        self.image_label = image_label
        self.parts: list[str] = []
        self.seconds = {"prompt": 0.0, "reasoning": 0.0, "action": 0.0, "tool": 0.0, "observe": 0.0}
        self.opened: Opened | None = None
        self.evaluated0 = 0
        self.n_generated = 0
        self.turn = 0
        self.t0 = 0.0

    def events(self) -> Iterator[Event]:
        from edge_agent.agent.events import AgentError

        self.t0 = time.perf_counter()
        yield RunStarted(question=self.question, image=self.image_label, mode="direct", seprod=False,
                         model=self.options.model_name)
        kept = False
        try:
            kept = yield from self._episode()
        except Cancelled:
            yield self._final("cancelled")
        except EdgeAgentError as e:
            yield AgentError(turn=self.turn, title=e.title, message=e.message, fatal=True)
        finally:
            if not kept:
                self.context.abandon()

    def _episode(self) -> Generator[Event, None, bool]:
        msgs = messages(self.history, self.question, self.images, instructions=self.options.instructions)
        segs = prompt_segments(self.render, msgs)
        opened = self.context.open(segs, cancel=self.cancel)
        self.opened, s = opened, opened.session
        self.evaluated0 = s.n_evaluated - opened.tokens_evaluated
        self.seconds["prompt"] = opened.seconds
        yield ContextOpened(source=opened.source, reason=opened.reason, tokens_reused=opened.tokens_reused,
                            tokens_evaluated=opened.tokens_evaluated, system_restored=opened.system_restored,
                            n_ctx_used=s.n_cells, seconds=opened.seconds)
        for img in opened.images:
            yield ImageEvaluated(turn=0, source="image", tokens=img.n_tokens, positions=img.n_pos,
                                 width=img.width,
                                 height=img.height, encode_seconds=img.encode_seconds,
                                 decode_seconds=img.decode_seconds, reused=img.reused)
        if self.cancel.is_set():
            raise Cancelled()
        self.turn = 1
        yield TurnStarted(turn=1)
        t0 = time.perf_counter()
        gen = yield from stream(lambda on_token, stop: s.generate(
            max_tokens=self.options.answer_max_tokens, temperature=self.options.temperature,
            seed=self.options.seed + 1, on_token=on_token, cancel=stop,
            until=until_looping(s.detokenize)), self._piece, self.cancel)
        if gen.stop_reason == "cancelled" or self.cancel.is_set():
            raise Cancelled()
        self.n_generated = len(gen.tokens)
        self.seconds["action"] = time.perf_counter() - t0
        yield TurnFinished(turn=1, action="answer", reasoning_seconds=0.0,
                           action_seconds=self.seconds["action"],
                           tool_seconds=0.0)
        key = self.context.answered(s)
        # stopped at answer_max_tokens or in a loop (agent.repetition): says so
        cut = {"length": "length", "until": "repetition"}.get(gen.stop_reason, "answered")
        yield self._final(cut, key)
        return True

    def _piece(self, piece: str) -> Event | None:
        if not piece:
            return None
        if not self.parts:
            piece = piece.lstrip()
            if not piece:
                return None
        self.parts.append(piece)
        return AnswerToken(turn=1, text=piece)

    def _final(self, stop_reason: str, context: str = "") -> FinalAnswer:
        totals: dict[str, float] = {k: round(v, 6) for k, v in self.seconds.items()}
        totals["total"] = round(time.perf_counter() - self.t0, 6)
        totals["turns"] = float(self.turn)
        totals["generated_tokens"] = totals["answer_tokens"] = float(self.n_generated)
        evaluated = reused = n_pos = 0
        if self.opened is not None:
            s = self.opened.session
            evaluated, reused, n_pos = s.n_evaluated - self.evaluated0, self.opened.tokens_reused, s.n_pos
        totals.update(n_pos=float(n_pos), tokens_evaluated=float(evaluated), tokens_reused=float(reused),
                      tokens_read_ahead=0.0)
        return FinalAnswer(answer="".join(self.parts).strip(), turns=self.turn, stop_reason=stop_reason,
                           totals=totals, context=context)

