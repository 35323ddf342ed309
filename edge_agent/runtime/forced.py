"""Forced text under a grammar, evaluated in one batch and verified like a draft.

Knows: which text a grammar forces after the last sampled token (``Sampler.forced_text``, probed with
the vocabulary's single-character tokens), tokenizing it as a draft, evaluating the pending token and
the draft in ONE llama_decode with a logits row per position, and keeping only what plain decoding
would have produced: at each position the sampler (the same grammar, temperature and random draws)
chooses from that row; a choice equal to the draft's token is kept (its cell is in the KV cache
already), the first one that differs ends the check (it is the next token, pending; the draft's
cells after it are removed). So the tokens are exactly those of token-by-token decoding, whatever
the forced text's tokenization (``], "label": "`` may be written `]` `,` ... or `],` ` "` ...): a
retokenization can never enter the context (SGLang removed its unverified jump-forward decoding for
such bugs). Does not know sessions: :meth:`Session.generate` hands it the context's position and
applies what :func:`verify` returns (:class:`Jumped`).

Cost: a batch of 1 + k tokens costs less than k + 1 decodes token by token, but more than one: on
the project's 2-core VM (llama.cpp's CPU kernels, 1,200 cells deep) a batch of 2 tokens took 1.66x a
one-token decode, 4 tokens 2.68x, 6 tokens 3.84x (the 2B stand-in; the 1.5B Qwen: 1.63x, 2.61x,
3.89x). A draft kept whole pays (the 1.5B's zoom action: 15 decodes instead of 28); one refused at its
first token costs a batch for one token, so ``Session.generate`` stops drafting after the first
refusal (``forced_stop_when_refused``).
"""

from __future__ import annotations

import string
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from edge_agent.core.errors import Cancelled
from edge_agent.runtime.handle import Handle
from edge_agent.runtime.scoring import row_logsumexp

if TYPE_CHECKING:
    from edge_agent.runtime.sampling import Run, Sampler
    from edge_agent.runtime.tokenizer import Tokenizer

PROBE_CHARS = string.printable  # ASCII letters, digits, punctuation and whitespace
MAX_FORCED_CHARS = 48


@dataclass(frozen=True)
class Probe:
    """The single-character tokens a grammar is probed with (``ids[i]`` spells ``chars[i]``)."""

    ids: np.ndarray
    chars: str


_probes: weakref.WeakKeyDictionary[Tokenizer, Probe] = weakref.WeakKeyDictionary()


def probe_of(tok: Tokenizer) -> Probe:
    """The probe of a vocabulary (made once per tokenizer): each probe character that is one token of its
    own."""
    got = _probes.get(tok)
    if got is not None:
        return got
    ids, chars = [], []
    for c in PROBE_CHARS:
        t = tok.tokenize(c, special=False)
        if len(t) == 1 and tok.token_bytes(t[0]) == c.encode():
            ids.append(t[0])
            chars.append(c)
    got = _probes[tok] = Probe(np.asarray(ids, dtype=np.int32), "".join(chars))
    return got


def draft(sampler: Sampler, tok: Tokenizer, probe: Probe, room: int, stop: Sequence[str] = ()) -> list[int]:
    """Tokens of the text the grammar forces now (at most ``room``), [] when nothing is forced. The text
    ends with the first of the ``stop`` strings in it: generation ends there, so nothing after it is worth
    a place in the batch (a tool's grammar goes on to its fixed ``}}\n</tool_call>``)."""
    if room < 1:
        return []
    text = sampler.forced_text(probe.ids, probe.chars, MAX_FORCED_CHARS)
    ends = [text.index(s) + len(s) for s in stop if s and s in text]
    if ends:
        text = text[:min(ends)]
    return tok.tokenize(text, special=False)[:room] if text else []


def jump(h: Handle, sampler: Sampler, run: Run, tok: Tokenizer, probe: Probe, pending: int, p0: int, *,
         room: int, budget: int, scratch: np.ndarray, cancel: threading.Event | None = None) -> Jumped | None:
    """The forced text after ``pending`` (at ``p0``, not evaluated yet), at most ``room`` tokens, in one
    verified batch (:func:`verify`); None when nothing is forced, or when a cancel stopped the batch
    (``run.reason`` "cancelled"; nothing of it stays, ``pending`` is still pending)."""
    b = h.batch
    assert b is not None
    # at most budget - 1: the rows of the pending token and the draft give up to ``budget`` tokens
    guess = draft(sampler, tok, probe, min(b.cap - 1, room, budget - 1), run.stream.stop)
    if not guess:
        return None
    try:
        return verify(h, sampler, run, tok, pending, guess, p0, budget=budget, scratch=scratch, cancel=cancel)
    except Cancelled:
        run.reason = "cancelled"
        return None


@dataclass
class Jumped:
    """What a verified draft adds to the context after the pending token (already in the history)."""

    tokens: list[int]  # tokens sampled from the batch's rows (history and positions grow by their count)
    n_kv: int  # cells of seq 0 now evaluated: the pending token and the draft tokens kept
    logits: np.ndarray | None  # next-token logits when the last token is in the KV cache; None: it is pending
    n_eval: int  # tokens the batch evaluated (kept or not)


def verify(h: Handle, sampler: Sampler, run: Run, tok: Tokenizer, pending: int, guess: list[int], p0: int, *,
           budget: int, scratch: np.ndarray, cancel: threading.Event | None = None) -> Jumped:
    """Evaluate ``pending`` (at position ``p0``) and the draft ``guess`` after it in one decode, then sample
    up to ``budget`` tokens from the rows while they equal the draft (each token through ``sampler`` and
    ``run``: the grammar advanced, the text streamed; ``cancel`` set by a callback ends it after that
    token, ``run.reason`` "cancelled"). Cells past what is kept are removed; on any error all of the
    batch's cells are removed (``pending`` stays pending) and it propagates."""
    b = h.batch
    assert b is not None
    toks = [pending, *guess]
    m = b.fill_run(toks, p0, last_logits=False)
    b.out[:m] = 1  # a row per position: each is checked
    try:
        h.decode(m)
    except BaseException:
        h.seq_rm(0, p0, -1)
        raise
    rows = h.logits_rows(m)
    out: list[int] = []
    kept = 1  # the pending token's cell
    for j in range(min(budget, len(guess) + 1)):
        t = sampler.sample(rows[j])
        sampler.accept(t)
        out.append(t)
        last = len(out) == budget
        lse = row_logsumexp(rows[j : j + 1], scratch)[0]
        run.add(t, float(rows[j][t]) - float(lse), None if tok.is_eog(t) else tok.token_bytes(t), last=last)
        if j >= len(guess) or t != guess[j]:
            if cancel is not None and cancel.is_set():
                run.reason = "cancelled"
            break  # the model's own choice (after the whole draft, or where it differs): pending
        kept += 1
        if cancel is not None and cancel.is_set() and run.reason == "length":
            run.reason = "cancelled"
        if run.reason != "length" or last:
            break
    in_kv = kept - 1 == len(out)  # the last sampled token is a draft token already evaluated
    h.seq_rm(0, p0 + kept, -1)
    logits = rows[kept - 1].copy() if in_kv else None
    return Jumped(tokens=out, n_kv=kept, logits=logits, n_eval=m)
