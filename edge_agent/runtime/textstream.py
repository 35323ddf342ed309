"""Turning generated token pieces into text: UTF-8 across token boundaries, and stop strings.

Knows bytes and strings only (no llama_cpp, no tokens' meaning). A byte-level BPE token can end in the
middle of a UTF-8 character, and a stop string can span several tokens; this module holds back exactly
the text that is not final yet, so a streaming consumer never sees half a character or the beginning
of a stop string that later completes.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class StopStream:
    """Feed token pieces (bytes); get back the text that became final, and whether a stop string hit.

    Invariant: the concatenation of everything ``feed`` and ``flush`` returned == ``text``, where
    ``text`` is all decoded text cut before the first stop string (if one occurred).
    """

    def __init__(self, stop: Sequence[str] = ()) -> None:
        self.stop = [s for s in stop if s]
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._text = ""  # all decoded text so far (until a stop hit; then cut at the stop)
        self._released = 0  # chars of _text already handed out
        self.stopped = False
        self.stop_string: str | None = None

    @property
    def text(self) -> str:
        return self._text

    def feed(self, piece: bytes) -> str:
        """Add one token's bytes; returns the newly final text ('' while held back)."""
        if self.stopped:
            return ""
        old = len(self._text)
        self._text += self._dec.decode(piece)
        if self.stop:
            hit = -1
            for s in self.stop:
                i = self._text.find(s, max(0, old - len(s) + 1))
                if i >= 0 and (hit < 0 or i < hit):
                    hit, self.stop_string = i, s
            if hit >= 0:
                self.stopped = True
                self._text = self._text[:hit]
                return self._release(len(self._text))
            return self._release(len(self._text) - self._held())
        return self._release(len(self._text))

    def flush(self) -> str:
        """End of generation: release whatever was held back (an unfinished stop prefix, partial UTF-8)."""
        if not self.stopped:
            self._text += self._dec.decode(b"", final=True)
        return self._release(len(self._text))

    def _held(self) -> int:
        # Longest suffix of the text that is a proper prefix of some stop string.
        best = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self._text)), best, -1):
                if self._text.endswith(s[:k]):
                    best = k
                    break
        return best

    def _release(self, upto: int) -> str:
        out = self._text[self._released : upto]
        self._released = max(self._released, upto)
        return out
