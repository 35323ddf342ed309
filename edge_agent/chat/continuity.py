"""Chat continuity: every token of a chat evaluated once, kept in the KV cache and saved on disk.

Knows: the live session of the agent model and its clean boundaries (the end of the system prompt,
the end of each answer), saved states (``runtime.state.StateStore``), and the order in which a
question's context is found: (1) the chat's own context, live in the KV cache (a rollback at most), or
(2) its saved state restored from disk, then only the new user turn is evaluated; otherwise (3) the
system prompt, live or restored or evaluated (and then saved), followed by the chat's earlier exchanges
as text and the question (a compact rebuild: also what happens when the context would overflow).
Does not know widgets, the chat store's tables or the loop's turns: the engine hands it the key the
chat's last answer was saved under and the chat's (question, answer) pairs.

Clean boundaries: a question that is cancelled or fails is rolled back to where it started (the end of
the previous answer), so the partial answer never reaches the model's context; it stays in the chat's
transcript for the person.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from edge_agent.agent.context import Opened, append_segments
from edge_agent.agent.prompts import (
    ImageArg,
    Img,
    Segment,
    Text,
    history_segments,
    question_images,
    question_segments,
)
from edge_agent.chat.pending_turn import PendingTurn, elements
from edge_agent.runtime.state import KeyHasher, SessionState, StateError, StateStore, image_digest
from edge_agent.runtime.types import ChatModelLike, ChatSessionLike, Checkpoint, ImageChunk, SessionLike


@dataclass
class _Boundary:
    key: str
    cp: Checkpoint
    system_key: str


@dataclass(frozen=True)
class AheadState:
    """What is read ahead now: the images of the pending turn (``image`` the last, None: none) and the
    person's text."""

    image: ImageChunk | None
    question_tokens: int
    cells: int  # KV cells of the pending turn
    images: tuple[ImageChunk, ...] = ()


class ChatContexts:
    """The agent model's contexts across questions and chats (one engine, one question at a time).

    ``reserve``: KV cells a question may need beyond its user turn (turns, crops, tool results, the
    answer); a chat continued past ``n_ctx - reserve`` is rebuilt compactly instead.
    ``image_tokens``: what one attached image is expected to cost (for that estimate).
    """

    def __init__(self, model: ChatModelLike, store: StateStore | None, *, reserve: int = 2048,
                 image_tokens: int = 576) -> None:
        self.model = model
        self.store = store
        self.reserve = reserve
        self.image_tokens = image_tokens
        self.live: ChatSessionLike | None = None
        self.boundaries: list[_Boundary] = []  # clean points of the live session, oldest first
        self._system_keys: dict[str, str] = {}  # system prompt text -> its key (tokenizing it costs ms)
        # the next question's user turn as far as it is known, after the last boundary; never saved
        self.pending = PendingTurn()
        self.found_ahead: tuple[_Boundary,
                                str] | None = None  # a boundary the read-ahead restored / evaluated
        # called with the session whenever it is found holding exactly a system prompt (a new chat's context,
        # a read-ahead after it), before the rest is read: the engine's SSR neutral scores, read there once
        # (``to_boundary`` first); it must leave the session as it found it
        self.on_system: Callable[[ChatSessionLike, str], None] | None = None

    def question(self, continue_from: str = "", history: Sequence[tuple[str, str]] = ()) -> QuestionContext:
        """The context of one question: continuing the chat whose last answer was saved as
        ``continue_from`` ('' for a new chat); ``history`` for a rebuild."""
        return QuestionContext(self, continue_from, list(history))

    def direct(self, continue_from: str = "", has_history: bool = False) -> DirectQuestion:
        """The context of one question of the ``direct`` mode (``agent.direct.DirectContext``): continuing
        the plain chat saved as ``continue_from``; ``has_history``: the chat has earlier exchanges."""
        return DirectQuestion(self, continue_from, has_history)

    # ---- the live session's boundaries ------------------------------------------------------------
    def live_at(self, key: str) -> tuple[ChatSessionLike, _Boundary] | None:
        """The live session rolled back to its boundary ``key`` (later boundaries forgotten), except a
        pending turn read ahead from exactly there (the question decides what of it to keep); None when
        the live session never passed it."""
        for i, b in enumerate(self.boundaries):
            if b.key == key and self.live is not None:
                if not self.pending.on(self.live, b.cp):
                    self.pending.forget()
                    self.live.rollback(b.cp)
                del self.boundaries[i + 1 :]
                return self.live, b
        return None

    def restore_saved(self, key: str, st: SessionState | None = None) -> tuple[ChatSessionLike,
                                                                               _Boundary] | None:
        """The state saved under ``key`` (``st``: read already) restored into a new live session; None when
        there is none or it does not fit (a state that does not fit is removed)."""
        if self.store is None:
            return None
        st = st if st is not None else self.store.get(key, self.model.identity)
        if st is None:
            return None
        try:
            s = self.model.restore(st)
        except StateError:
            self.store.discard(key)
            self.live, self.boundaries = None, []
            return None
        b = _Boundary(key, s.checkpoint(), str(st.extra.get("system_key", "")))
        self.live, self.boundaries = s, [b]
        self.pending.forget()
        return s, b

    def mark(self, s: ChatSessionLike, system_key: str, label: str) -> str:
        """Record the session's current point as a clean boundary (and save it); returns its key.
        ``system_key``: the key of the system prompt this context starts with ('' when it is this point)."""
        key = s.key()
        system_key = system_key or key  # '' : this point is the end of the system prompt itself
        self.boundaries.append(_Boundary(key, s.checkpoint(), system_key))
        if self.store is not None and not self.store.has(key):
            state: SessionState = s.save_state(label)
            state.extra = {"system_key": system_key}
            self.store.put(state)
        return key

    def system_key(self, system: str) -> str:
        """The key a session holding exactly ``system`` has."""
        key = self._system_keys.get(system)
        if key is None:
            key = self._system_keys[
                system] = KeyHasher(self.model.identity).tokens(self.model.first_tokens(system)).key()
        return key

    def system_session(self, system: str) -> tuple[ChatSessionLike, str, str]:
        """A session holding exactly ``system``: (session, its key, "live" | "restored" | "evaluated")."""
        key = self.system_key(system)
        found = self.live_at(key)
        if found is not None:
            self._system_ready(found[0], system)
            return found[0], key, "live"
        found = self.restore_saved(key)
        if found is not None:
            self._system_ready(found[0], system)
            return found[0], key, "restored"
        s = self.model.session()
        self.live, self.boundaries = s, []
        self.pending.forget()
        s.append_text(system)
        # keyed by what the session holds (first_tokens tokenizes as append_text does: the same key)
        key = self._system_keys[system] = self.mark(s, "", "system prompt")
        self._system_ready(s, system)
        return s, key, "evaluated"

    def _system_ready(self, s: ChatSessionLike, system: str) -> None:
        if self.on_system is not None:
            self.on_system(s, system)

    def to_boundary(self, s: ChatSessionLike) -> None:
        """For an ``on_system`` hook that must read after the system prompt: what was read ahead after it
        is rolled back first (read again by the question)."""
        if self.pending.session is s:
            self.pending.drop()

    def continuing(self, key: str, sys_key: str) -> tuple[tuple[ChatSessionLike, _Boundary] | None, str, str]:
        """The chat saved as ``key``: ((session, boundary) or None, "live" | "restored", why not)."""
        found = self.live_at(key)
        source = "live"
        if found is None:
            found, source = self.restore_saved(key), "restored"
        if found is None:
            return None, source, "no saved state"
        if found[1].system_key != sys_key:
            return None, source, "the settings changed the system prompt"
        return found, source, ""

    def unless_held(self, s: ChatSessionLike, b: _Boundary, image: ImageArg) -> ImageArg:
        """``image`` unless the chat up to ``b`` holds it already (then the question refers to it); of
        several images, each one held is None (its number stays)."""
        held = {i.digest for i in s.images[: b.cp.n_images]}
        pngs = [p if p is not None and image_digest(p) not in held else None for p in question_images(image)]
        return pngs if len(pngs) > 1 else (pngs[0] if pngs else None)

    def fits(self, s: SessionLike, b: _Boundary, segs: Sequence[Segment]) -> bool:
        return b.cp.n_cells + self.estimate(s, segs) + self.reserve <= self.model.n_ctx

    def estimate(self, s: SessionLike, segs: Sequence[Segment]) -> int:
        n = 0
        for seg in segs:
            if isinstance(seg, Img):
                n += self.image_tokens
            elif isinstance(seg, Text):
                n += len(s.tokenize(seg.text, special=seg.special))
        return n

    # ---- read-ahead ---------------------------------------------------------------------------------
    def read_ahead(self, system: str, continue_from: str, image: ImageArg, text: str, *, closed: bool = False,
                   cancel: threading.Event | None = None) -> AheadState | None:
        """Read what the person has given so far (``image``: the attached photos' model PNGs; ``text``: the
        question's stable prefix; ``closed``: it is the whole question, the turn's end is read too) into
        the pending user turn after the chat ``continue_from`` ('' a new chat: after the system prompt,
        evaluated or restored here if need be). Keeps what was read already as far as it still matches.
        ``cancel`` stops a text step (raises ``Cancelled``); an image is always finished (it is never
        decoded twice). None: nothing can be read ahead (the question will rebuild the chat, or the
        context is too full)."""
        sys_key = self.system_key(system)
        if continue_from:
            found, how, _ = self.continuing(continue_from, sys_key)
            if found is None:
                return None
            s, b = found
        else:
            s, _, how = self.system_session(system)
            b = self.boundaries[-1]
        if how != "live":  # the question reports how its context was found, as if it had found it itself
            self.found_ahead = (b, how)
        segs = question_segments(text, self.unless_held(s, b, image), closed=closed)
        if not self.fits(s, b, [*segs, Text("x" * 16)]):
            return None
        self.pending.extend(s, b.cp, elements(s, segs), cancel=cancel)
        return self.ahead()

    def ahead(self) -> AheadState:
        """What the pending turn holds now."""
        p = self.pending
        images = [piece.chunk for piece in p.pieces if piece.chunk is not None]
        s = p.session
        cells = s.n_cells - p.base.n_cells if s is not None and p.base is not None else 0
        return AheadState(images[-1] if images else None, p.question_tokens(), cells, tuple(images))

    def drop_ahead(self) -> None:
        """Roll back what was read ahead (a new chat, leaving a chat): the chat's context as it was."""
        self.pending.drop()

    def how_found(self, b: _Boundary, how: str) -> str:
        """``how`` a question found boundary ``b`` ("live" | "restored" | "evaluated"), or how the
        read-ahead before it found it (then the question says "restored" for a chat read from disk)."""
        ahead, self.found_ahead = self.found_ahead, None
        return ahead[1] if ahead is not None and ahead[0] is b and how == "live" else how

    def flush(self) -> None:
        if self.store is not None:
            self.store.flush()


class QuestionContext:
    """``agent.context.ChatContext`` for one question of one chat."""

    def __init__(self, owner: ChatContexts, continue_from: str, history: list[tuple[str, str]]) -> None:
        self.owner = owner
        self.continue_from = continue_from
        self.history = history
        self.base: _Boundary | None = None  # where this question started (rolled back to on abandon)
        self.system_key = ""
        self.session: ChatSessionLike | None = None  # the session open() handed the loop

    def open(self, system: str, question: str, image: ImageArg, *,
             cancel: threading.Event | None = None) -> Opened:
        t0 = time.perf_counter()
        o = self.owner
        sys_key = o.system_key(system)
        reason = ""
        if self.continue_from:
            found, source, reason = o.continuing(self.continue_from, sys_key)
            if found is not None:
                s, b = found
                segs = question_segments(question, o.unless_held(s, b, image))
                if o.fits(s, b, segs):
                    return self._extend(s, b, sys_key, o.how_found(b, source), "live", segs, cancel, t0)
                reason = "the context is full: earlier answers kept as text"
        s, sys_key, how = o.system_session(system)
        b = o.boundaries[-1]
        # A system prompt the read-ahead evaluated (while loading or typing) was evaluated by this process
        # for this question: it counts as evaluated and as read ahead, never as reused.
        found_how = o.how_found(b, how)
        system_ahead = b.cp.n_cells if how == "live" and found_how == "evaluated" else 0
        how = found_how
        pairs = self._fit(s, b, question, image)
        if not pairs and not self.continue_from:  # a new chat: what was read ahead may be kept
            return self._extend(s, b, sys_key, "new", how, question_segments(question, image), cancel, t0,
                                system_ahead=system_ahead)
        o.pending.drop()  # the chat is rebuilt from its text: nothing read ahead fits before it
        self.base, self.system_key = b, sys_key
        reused = s.n_cells if how != "evaluated" else 0
        n0 = s.n_evaluated - (s.n_cells if how == "evaluated" else 0)  # an evaluated system prompt counts
        segs = [*history_segments(pairs), *question_segments(question, image)]
        images = append_segments(s, segs, cancel=cancel)
        self.session = s
        if not reason:
            reason = "history as text"
        return Opened(s, "rebuilt", reason=reason, tokens_reused=reused,
                      tokens_evaluated=s.n_evaluated - n0, tokens_read_ahead=system_ahead,
                      system_restored=how == "restored", images=images, seconds=time.perf_counter() - t0)

    def _extend(self, s: ChatSessionLike, b: _Boundary, sys_key: str, source: str, how: str,
                segs: list[Segment], cancel: threading.Event | None, t0: float, *,
                system_ahead: int = 0) -> Opened:
        """The question's user turn after boundary ``b``: what was read ahead and still matches is kept,
        the rest evaluated now (``how``: how the system prompt was found, for a new chat; ``system_ahead``:
        its cells when the read-ahead evaluated it). Tokens evaluated count the kept read-ahead too (this
        process evaluated them for this question); tokens read ahead say how many of them were."""
        self.base, self.system_key, self.session = b, sys_key, s
        n0 = s.n_evaluated - (b.cp.n_cells if how == "evaluated" else 0)  # an evaluated system prompt counts
        ext = self.owner.pending.extend(s, b.cp, elements(s, segs), cancel=cancel, image_cancel=cancel)
        self.owner.pending.forget()  # the turn is this question's now (rolled back with it if abandoned)
        return Opened(s, source, tokens_reused=b.cp.n_cells if how != "evaluated" else 0,
                      tokens_evaluated=s.n_evaluated - n0 + ext.kept_cells, images=ext.images,
                      system_restored=how == "restored", tokens_read_ahead=ext.kept_cells + system_ahead,
                      question_read_ahead=ext.kept_question, images_read_ahead=ext.kept_images,
                      seconds=time.perf_counter() - t0)

    def _fit(self, s: SessionLike, b: _Boundary, question: str, image: ImageArg) -> list[tuple[str, str]]:
        """The latest earlier exchanges that fit beside the question and the reserve (oldest dropped)."""
        if not self.history:
            return []
        o = self.owner
        room = o.model.n_ctx - b.cp.n_cells - o.reserve - o.estimate(s, question_segments(question, image))
        out: list[tuple[str, str]] = []
        for q, a in reversed(self.history):
            need = o.estimate(s, history_segments([(q, a)]))
            if need > room:
                break
            out.append((q, a))
            room -= need
        return out[::-1]

    def answered(self, session: SessionLike) -> str:
        o = self.owner
        if self.session is None or session is not self.session:
            raise ValueError("answered() takes the session this question's open() handed out")
        key = o.mark(self.session, self.system_key, "chat")
        if o.store is not None and self.continue_from and self.continue_from != key:
            o.store.discard(self.continue_from)  # the chat goes on from here: its older state is superseded
        return key

    def abandon(self) -> None:
        o = self.owner
        o.pending.forget()
        if self.base is None or o.live is None:
            return
        for i, b in enumerate(o.boundaries):
            if b is self.base:
                o.live.rollback(b.cp)
                del o.boundaries[i + 1 :]
                return


DIRECT = "direct"  # the system_key of a plain chat's boundaries: never an agent's system prompt key


class DirectQuestion:
    """``agent.direct.DirectContext`` for one question of one chat: the prompt (the chat rendered by the
    model's template) is matched against the chat's context, live in the KV cache or restored from its
    saved state (or, failing both, whatever the live session holds), keeping the longest common prefix
    and evaluating the rest (``agent.direct.hold``). So the context is always exactly the prompt of the
    visible exchanges, whatever was kept. An agent's context is never taken for a plain chat's: its
    boundaries and states carry another system key."""

    def __init__(self, owner: ChatContexts, continue_from: str, has_history: bool) -> None:
        self.owner, self.continue_from, self.has_history = owner, continue_from, has_history
        self.session: ChatSessionLike | None = None

    def _base(self) -> tuple[ChatSessionLike, str, str]:
        """(session, how it was found: live | restored | other | fresh, why not the chat's own)."""
        o, key = self.owner, self.continue_from
        o.pending.drop()  # what was read ahead for an agent's question is not this prompt
        why = ""
        live = next((b for b in o.boundaries if b.key == key), None) if key and o.live is not None else None
        if live is not None and o.live is not None:
            if live.system_key == DIRECT:
                return o.live, "live", ""
            why = "the chat was not a plain chat"
        elif key:
            st = o.store.get(key, o.model.identity) if o.store is not None else None
            if st is not None and st.extra.get("system_key") == DIRECT:
                found = o.restore_saved(key, st)
                if found is not None:
                    return found[0], "restored", ""
            why = "no saved state" if st is None else "the chat was not a plain chat"
        if o.live is not None:
            return o.live, "other", why
        o.live, o.boundaries = o.model.session(), []
        return o.live, "fresh", why

    def open(self, segments: Sequence[Segment], *, cancel: threading.Event | None = None) -> Opened:
        from edge_agent.agent.direct import hold

        s, how, why = self._base()
        n0 = s.n_evaluated
        held = hold(s, segments, cancel=cancel)
        o = self.owner
        # still what the session holds
        o.boundaries = [b for b in o.boundaries if b.cp.n_history <= held.kept]
        self.session = s
        if how in ("live", "restored"):
            source = how
        else:
            source = "rebuilt" if self.has_history else "new"
        return Opened(s, source, reason=why if source == "rebuilt" else "", tokens_reused=held.kept_cells,
                      tokens_evaluated=s.n_evaluated - n0, images=held.images, seconds=held.seconds)

    def answered(self, session: SessionLike) -> str:
        o = self.owner
        if self.session is None or session is not self.session:
            raise ValueError("answered() takes the session this question's open() handed out")
        key = o.mark(self.session, DIRECT, "plain chat")
        if o.store is not None and self.continue_from and self.continue_from != key:
            o.store.discard(self.continue_from)  # the chat goes on from here: its older state is superseded
        return key

    def abandon(self) -> None:
        """Nothing to undo: the next prompt is matched against whatever the session holds."""
        self.owner.pending.forget()
