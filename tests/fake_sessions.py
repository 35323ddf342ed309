"""Fake sessions for pure agent logic (the real runtime has its own tests): characters are tokens.

- ``LoopSession``: the turn loop's session (scripted generations, scores from a function), for
  ``tests/test_agent_logic.py``.
- ``ProphetModel`` / ``PairSession``: a prophet that "generates" a script and an agent session whose
  per-token scores favour letters, for SeProD's drafter logic (``tests/test_seprod.py``).
Both implement the parts of ``runtime.types.SessionLike`` their tests drive, nothing more.
"""

from __future__ import annotations

import math

import numpy as np

from edge_agent.runtime.types import Checkpoint, ContinuationScore, Generation, ImageChunk

EOS = "\u2403"  # the fake's end-of-generation token


class LoopSession:
    """Characters are tokens. Scores come from ``score_fn(text, n_calls)``; ``generate`` replays
    ``outputs`` (strings, or callables (session, grammar) -> string; a trailing EOS char is an
    end-of-generation token). Like the runtime, every generated token stays in the context (stop
    strings and EOS included), the returned text is cut before a stop string, and the last sampled
    token is pending until the next append."""

    max_candidates = 8

    def __init__(self, score_fn=None, outputs=()):
        self.log: list[tuple[str, str, bool]] = []
        self.n_pos = 0
        self.n_cells = 0
        self.n_evaluated = 0
        self.pending = 0
        self.kept: list[str] = []
        self.score_fn = score_fn or (lambda text, n: -len(text))
        self.outputs = list(outputs)
        self.n_score = 0
        self.scored: list[list[str]] = []
        self.grammars: list[str | None] = []
        self.stops: list[tuple[str, ...]] = []

    @property
    def text(self) -> str:
        return "".join(t for kind, t, _ in self.log)

    def append_text(self, text, *, special=True, cancel=None):
        self.log.append(("text", text, special))
        self.n_pos += len(text)
        self.n_cells += len(text) + self.pending
        self.n_evaluated += len(text) + self.pending
        self.pending = 0
        return len(text)

    def append_tokens(self, tokens, *, cancel=None):
        return self.append_text("".join(chr(t) for t in tokens), special=False)

    def append_image(self, image, *, cancel=None):
        self.log.append(("image", "<IMG>", True))
        self.n_pos += 7
        self.n_cells += 49 + self.pending
        self.n_evaluated += 49 + self.pending
        self.pending = 0
        return ImageChunk(n_tokens=49, n_pos=7, nx=7, ny=7, width=224, height=224)

    def tokenize(self, text, *, special=False):
        return [ord(c) for c in text]

    def detokenize(self, tokens):
        return "".join(chr(t) for t in tokens)

    def drop_last_token(self):
        if not self.pending:
            return False
        kind, t, sp = self.log.pop()
        if t[:-1]:
            self.log.append((kind, t[:-1], sp))
        self.n_pos -= 1
        self.pending = 0
        return True

    def adopt(self, index, n_tokens=None):
        text = self.kept[index] if n_tokens is None else self.kept[index][:n_tokens]
        self.kept = []
        return self.append_text(text, special=False)

    def key(self):
        return ""

    def save_state(self, label=""):
        raise NotImplementedError
    def checkpoint(self):
        return Checkpoint(self.n_cells, self.n_pos, len(self.text), n_pending=self.pending)

    def rollback(self, cp):
        drop = len(self.text) - cp.n_history
        while drop > 0:
            kind, t, sp = self.log.pop()
            keep = t[: max(0, len(t) - drop)]
            drop -= len(t) - len(keep)
            if keep:
                self.log.append((kind, keep, sp))
        self.n_pos, self.n_cells, self.pending = cp.n_pos, cp.n_cells, cp.n_pending

    def next_logprobs(self):
        raise NotImplementedError

    def score(self, candidates, *, special=False, keep=False, cancel=None):
        self.kept = [c if isinstance(c, str) else "".join(chr(t) for t in c) for c in candidates] if keep else []
        self.n_score += 1
        self.scored.append(list(candidates))
        out = []
        for c in candidates:
            m = float(self.score_fn(c, self.n_score))
            toks = [ord(ch) for ch in c]
            out.append(ContinuationScore(toks, np.full(len(toks), m), np.zeros(len(toks), np.int64),
                                         m * len(toks), m, len(toks)))
        return out

    def generate(self, *, max_tokens, stop=(), temperature=0.0, seed=0, grammar=None, on_token=None, cancel=None):
        self.grammars.append(grammar)
        self.stops.append(tuple(stop))
        out = self.outputs.pop(0)
        if callable(out):
            out = out(self, grammar)
        text, reason, kept = out, "length", out
        if out.endswith(EOS):
            text, reason = out[:-1], "eos"
        hits = [(out.index(s), s) for s in stop if s in out]
        if hits:
            i, s = min(hits)
            text, reason, kept = out[:i], "stop", out[: i + len(s)]
        for ch in kept:
            if cancel is not None and cancel.is_set():
                return Generation(text="", tokens=[], stop_reason="cancelled")
            if on_token:
                on_token(ch, ord(ch))
        self.append_text(kept, special=True)
        self.pending = 1
        return Generation(text=text, tokens=[ord(c) for c in kept], stop_reason=reason)


class ProphetModel:
    """Tokens are code points; ``script`` is what the prophet 'generates' greedily."""

    has_vision = True
    n_ctx = 4096

    def __init__(self, script: str = "", logprob: float = -0.1):
        self.n_vocab = 0x110000
        self.script = script
        self.logprob = logprob
        self.sessions: list[PairSession] = []

    def tokenize(self, text, *, special):
        return [ord(c) for c in text]

    def detokenize(self, tokens):
        return "".join(chr(t) for t in tokens)

    def session(self):
        s = PairSession(self)
        self.sessions.append(s)
        return s

    def close(self):
        pass


class PairSession:
    def __init__(self, model: ProphetModel):
        self.model = model
        self.log: list[tuple[str, object]] = []
        self.tokens: list[int] = []
        self.n_pos = 0
        self.n_cells = 0
        self.adopted: list[tuple[list[int], int]] = []

    def append_text(self, text, *, special=True):
        self.log.append(("text" if special else "untrusted", text))
        self.tokens += [ord(c) for c in text]
        return len(text)

    def append_tokens(self, tokens):
        self.log.append(("tokens", list(tokens)))
        self.tokens += list(tokens)
        return len(tokens)

    def append_image(self, image):
        self.log.append(("image", image))
        self.tokens.append(-1)

    def checkpoint(self):
        return Checkpoint(len(self.tokens), len(self.tokens), len(self.log))

    def next_logprobs(self):
        # the agent's greedy next token: queued ``prefer`` tokens first, else "x" (content)
        lp = np.full(0x110000, -30.0, dtype=np.float32)
        lp[self.prefer.pop(0) if getattr(self, "prefer", None) else ord("x")] = 0.0
        return lp

    def rollback(self, cp):
        self.log.append(("rollback", cp.n_cells))
        del self.tokens[cp.n_cells:]

    def generate(self, *, max_tokens, **kw):
        toks = [ord(c) for c in self.model.script[:max_tokens]]
        self.log.append(("generate", max_tokens))
        return Generation("".join(map(chr, toks)), toks, "length", [self.model.logprob] * len(toks))

    def adopt(self, index, n_tokens=None):
        """Like the runtime: the kept candidate's first n tokens join the context (logged as tokens)."""
        toks = list(self.candidates[index][:n_tokens])
        if toks:
            self.log.append(("tokens", toks))
            self.tokens += toks
        return len(toks)

    def score(self, candidates, *, special=False, keep=False, cancel=None):
        self.kept = keep
        self.candidates = [list(c) for c in candidates]
        # agent's opinion: p_s = 0.5 for letters, 1e-6 for anything else; rank 0 / rank 5000
        (c,) = candidates
        lp = np.array([math.log(0.5) if chr(t).isalpha() else math.log(1e-6) for t in c])
        ranks = np.array([0 if chr(t).isalpha() else 5000 for t in c], dtype=np.int64)
        return [ContinuationScore(list(c), lp, ranks, float(lp.sum()), float(lp.mean()), len(c))]
