"""Text <-> token ids of one loaded model, with the rule that keeps untrusted text from becoming special
tokens.

Knows: tokenizing (no BOS added), the guard for untrusted text, token pieces (cached), detokenizing,
the first tokens of a fresh context (BOS when the model wants one), end-of-generation tokens. Does
not know sessions, positions or chat formats. Reaches llama.cpp only through
:class:`~edge_agent.runtime.handle.Handle`.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Sequence

from edge_agent.runtime.handle import Handle

RECENT_TEXTS = 256  # texts whose ids are kept (a few KB)
RECENT_MAX_CHARS = 2000  # longer texts (a search result, a long history) are not kept


class Tokenizer:
    """The vocabulary of a :class:`Handle` (one per loaded model; shared by its sessions)."""

    def __init__(self, handle: Handle) -> None:
        self._h = handle
        self._pieces: dict[tuple[int, bool], bytes] = {}
        # recent texts' ids: a question is tokenized while typed, at Enter, for its room and its turn; the
        # rationale candidates every turn (a pure function of the text: the ids are the same ones)
        self._recent: OrderedDict[tuple[str, bool], tuple[int, ...]] = OrderedDict()
        self._recent_lock = threading.Lock()
        self._guard_built = False
        self._guard: re.Pattern[str] | None = None
        self.n_vocab, self.add_bos, self.bos, self.eos = (handle.n_vocab, handle.add_bos, handle.bos,
                                                          handle.eos)

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        """Token ids of ``text`` (no BOS added). ``special=False``: ``<|im_end|>``, ``<tool_call>`` etc. stay
        plain text.

        llama.cpp's ``parse_special=False`` only protects CONTROL tokens: USER_DEFINED ones such as
        ``</tool_response>`` or ``<tool_call>`` are still matched, so a search snippet could close the
        tool response and forge a tool call. For untrusted text we therefore cut every occurrence of a
        non-normal token's text after its first character, so it is spelled with ordinary tokens.
        """
        self._h.check_open()
        key = (text, special)
        with self._recent_lock:
            ids = self._recent.get(key)
            if ids is not None:
                self._recent.move_to_end(key)
                return list(ids)
        out = self._tokenize(text, special=special)
        if len(text) <= RECENT_MAX_CHARS:
            with self._recent_lock:
                self._recent[key] = tuple(out)
                while len(self._recent) > RECENT_TEXTS:
                    self._recent.popitem(last=False)
        return out

    def _tokenize(self, text: str, *, special: bool) -> list[int]:
        if not special:
            guard = self.special_texts()
            if guard is not None and guard.search(text):
                out: list[int] = []
                pos = 0
                for m in guard.finditer(text):
                    out += self._h.tokenize(text[pos : m.start()], False)
                    out += self._h.tokenize(m.group()[0], False) + self.tokenize(m.group()[1:], special=False)
                    pos = m.end()
                return out + self._h.tokenize(text[pos:], False)
        return self._h.tokenize(text, special)

    def special_texts(self) -> re.Pattern[str] | None:
        """A pattern matching the text of every control / user-defined token (built once: ~0.1 s at
        V=151k)."""
        if not self._guard_built:
            texts = {self._h.token_text(t) for t in range(self.n_vocab) if self._h.is_special(t)}
            texts.discard("")
            ordered = sorted(texts, key=len, reverse=True)  # longest first: "<tool_call>" before "<"
            self._guard = re.compile("|".join(map(re.escape, ordered))) if ordered else None
            self._guard_built = True
        return self._guard

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        """Raw bytes of one token (control tokens render as b'' unless ``special``)."""
        key = (token, special)
        piece = self._pieces.get(key)
        if piece is None:
            piece = self._pieces[key] = self._h.piece(token, special)
        return piece

    def first_tokens(self, text: str) -> list[int]:
        """The tokens a fresh session's first ``append_text(text)`` evaluates (BOS when the model wants
        one)."""
        toks = self.tokenize(text, special=True)
        return self.with_bos(toks)

    def with_bos(self, toks: list[int]) -> list[int]:
        """``toks`` with the model's BOS in front when it wants one and they do not start with it."""
        if self.add_bos and (not toks or toks[0] != self.bos):
            return [self.bos, *toks]
        return toks

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        return b"".join(self.token_bytes(int(t), special=special) for t in tokens).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return self._h.is_eog(token)

    def token_text(self, token: int) -> str:
        """The vocabulary's text of a token (for special tokens: its literal, e.g. '<|im_end|>')."""
        return self._h.token_text(token)
