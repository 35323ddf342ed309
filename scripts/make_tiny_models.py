#!/usr/bin/env python3
"""Write tiny random-weight Qwen3-VL GGUFs for tests: deterministic, seconds, a few hundred KB each.

Usage:  python scripts/make_tiny_models.py OUT_DIR [--seed N]
Import: ``make_tiny_models(out_dir, seed=0) -> dict[str, Path]`` (keys below).

What it writes (byte-identical for a given seed and numpy/gguf version):

=====================  ================================  ===================================================
key                    file                              what
=====================  ================================  ===================================================
``text``               tiny-qwen3vl-f32.gguf             text model, ``general.architecture = qwen3vl``, F32
``text_q8_0``          tiny-qwen3vl-q8_0.gguf            the same weights, 2-D matrices in Q8_0 (norms F32)
``mmproj``             tiny-qwen3vl-mmproj-f32.gguf      vision tower, ``clip.projector_type =
qwen3vl_merger``
``prophet``            tiny-qwen3vl-prophet-f32.gguf     same tokenizer, different (correlated) weights: the
                                                         "base" model for SeProD tests
``mmproj_mismatch``    tiny-qwen3vl-mmproj-mismatch.gguf an mmproj whose projection width does not fit the
                                                         text model (mtmd_init_from_file returns NULL on it)
=====================  ================================  ===================================================

Text model (qwen3vl; the shapes of Qwen3-VL-2B scaled down):
    n_embd 64, 2 blocks, 4 query heads / 2 KV heads of 16 dims (head_k == head_v == n_rot == 16),
    n_ff 128 (SwiGLU), RMSNorm eps 1e-6, rope base 5e6, M-RoPE sections [3, 3, 2, 0] (sums to
    head_dim/2), n_deepstack_layers 1 (must be < block_count: equal aborts llama.cpp on the first
    decode), tied output (no output.weight, like the 2B), context_length 32768.
    Per block: attn_norm, attn_q/k/v, attn_q_norm/k_norm [16], attn_output, ffn_norm, ffn_gate/up/down.
    llama.cpp rejects extra tensors, so nothing else is written.
Tokenizer (``gpt2`` byte-level BPE, ``qwen2`` pre-tokenizer):
    ids 0..255 the 256 bytes (GPT-2 byte-to-unicode text), then one token per merge learned on the small
    English/JSON/chat corpus below (354 merges: every pair seen at least twice, at most N_MERGES; common
    words and JSON punctuation become single tokens), then the 26 Qwen added tokens (ids 610..635, vocab
    636) in Qwen's order: ``<|endoftext|>`` ``<|im_start|>`` ``<|im_end|>`` ... ``<|vision_start|>``
    ``<|vision_end|>`` ``<|vision_pad|>`` ``<|image_pad|>`` ``<|video_pad|>`` (CONTROL) and ``<tool_call>``
    ``</tool_call>`` ``<tool_response>`` ``</tool_response>`` ``<think>`` ``</think>`` (USER_DEFINED, as
    Qwen's tokenizer marks them not special). Note: llama.cpp matches USER_DEFINED tokens even with
    parse_special off, exactly as with the real Qwen3-VL GGUFs (only CONTROL tokens are protected).
    ``<answer>`` is deliberately NOT a token: in real Qwen3-VL it
    is several tokens, and the tiny model should not hide that. bos = pad = ``<|endoftext|>``, eos =
    ``<|im_end|>``, add_bos false. Chat template: Qwen3-VL-Instruct's (tools in ``<tools>``, JSON
    ``<tool_call>``, ``<tool_response>`` user turns, ``<|vision_start|><|image_pad|><|vision_end|>``).
Vision tower (clip, qwen3vl_merger):
    patch 16 (two temporal conv slices ``v.patch_embd.weight`` / ``.weight.1`` + bias), spatial merge 2
    (one image token per 32x32 px), width 32, 2 heads of 16 (M-RoPE needs head size % 4 == 0), ffn 64
    (GELU), 2 blocks, block 0 feeds a deepstack merger ``v.deepstack.0.*``, ``v.post_ln``, merger
    ``mm.0`` (128 -> 128) and ``mm.2`` (128 -> projection_dim 64). ``v.position_embd.weight`` is F32
    and square in count (image_size 64 / patch 16 = 4x4 grid, interpolated to the real grid).
    Invariant checked by mtmd: text n_embd * (1 + n_deepstack) == projection_dim * (1 + vision deepstack
    layers) = 64 * 2 = 128. The mismatch file uses projection_dim 96 (192 != 128).
Images: Qwen's preprocessor resizes to multiples of 32 px and keeps between 8 and 4096 image tokens;
    a 256x256 image is 8x8 = 64 tokens and advances the position counter by 8.

Weights are random (numpy ``default_rng(seed)``): the models produce gibberish. Tests can check
structure, determinism, token and position counts, that logits depend on the image, and output forced
by a grammar; never content. The prophet is the agent model's weights plus noise (a "fine-tune delta"),
so the two models agree on some tokens and disagree on others, as a base and its post-trained model do.

This script needs numpy and gguf only (no llama_cpp), so it runs before llama.cpp is built.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gguf
import numpy as np

# ----------------------------------------------------------------------------------------------
# dimensions
# ----------------------------------------------------------------------------------------------
ARCH = "qwen3vl"
N_EMBD = 64
N_LAYER = 2
N_HEAD = 4
N_HEAD_KV = 2
HEAD_DIM = 16  # == n_rot; n_head * head_dim == n_embd
N_FF = 128
N_DEEPSTACK = 1  # must be < N_LAYER
ROPE_SECTIONS = [3, 3, 2, 0]  # sum == HEAD_DIM // 2 (Qwen3-VL-2B: [24, 20, 20, 0] for head_dim 128)
ROPE_BASE = 5_000_000.0
RMS_EPS = 1e-6
CTX_TRAIN = 32768
N_MERGES = 480

V_EMBD = 32
V_HEAD = 2  # head size 16, divisible by 4 (vision M-RoPE)
V_FF = 64
V_LAYER = 2
V_DEEPSTACK_LAYERS = [0]  # vision blocks whose output feeds a deepstack merger
V_PATCH = 16
V_MERGE = 2
V_IMAGE_SIZE = 64  # -> (64/16)^2 = 16 learned position embeddings
V_EPS = 1e-6

FILES = {
    "text": "tiny-qwen3vl-f32.gguf",
    "text_q8_0": "tiny-qwen3vl-q8_0.gguf",
    "mmproj": "tiny-qwen3vl-mmproj-f32.gguf",
    "prophet": "tiny-qwen3vl-prophet-f32.gguf",
    "mmproj_mismatch": "tiny-qwen3vl-mmproj-mismatch.gguf",
}

# Qwen2/Qwen3 added tokens, in Qwen's id order (151643...). True = control (special), False = user-defined.
QWEN_ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", True),
    ("<|fim_middle|>", True),
    ("<|fim_suffix|>", True),
    ("<|fim_pad|>", True),
    ("<|repo_name|>", True),
    ("<|file_sep|>", True),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]

# Qwen3-VL-Instruct's chat template (as shipped in its GGUFs).
# Qwen3-VL's own chat template (data, verbatim from the model's GGUF): the tiny models carry it so
# llama.cpp's chat handling sees what a real Qwen3-VL file holds.
CHAT_TEMPLATE = (Path(__file__).parent / "data" / "qwen3vl-chat-template.jinja").read_text(encoding="utf-8")
# The BPE merges are learned from this text: ordinary English, the agent's own prompt vocabulary and
# JSON tool calls, so prompts and actions tokenize into plausible word-sized pieces (not bytes).
CORPUS = """
You are a helpful assistant. You can see the image the user attached and you answer the question about
it in a few turns. In each turn you think about what to do next, then you either call a tool or answer.
The user asked: what building is this? What does the small sign say? Where was this photo taken?
Which city is this? What is the name of the store on the left? How many people are in the picture?
The image shows a street with a red car, a tall building, a small sign and some trees in the background.
The text on the sign is too small to read, so I should zoom into the region of the image that holds it.
I zoom into the sign to read the text. The crop shows the sign clearly: it says the name of the street.
I search the web for the name of the building to find more about it. The search results say that the
building is a museum in the old part of the city, and the first result has a title, a url and a snippet.
I search by image to find pages that contain this picture or a similar one. The results show the same
place from another side. Based on the retrieved evidence, the answer is the city museum.
I can answer from the image directly: the car is red and the sky is blue. From my general knowledge,
this style of tower is common in this country. The question asks for a date, a number, a name or a place.
Let me look at the details of the picture again before I answer. The photo was taken at night, in the
rain, near a bridge over a river. There is a bus, a bike, a dog, a man and a woman on the road.
The answer is yes. The answer is no. I am not sure, so I will search for more information first.
First, second, third, last. Before, after, during, between, under, over, above, below, inside, outside.
This is a test of the tokenizer: the quick brown fox jumps over the lazy dog. Hello world!
It is important that the model uses the tools when the image alone is not enough to answer the question.
When the evidence from the search agrees with what I see, I answer with confidence; otherwise I say what
is uncertain and why. The time, the weather, the color, the shape and the size of the object matter.
<tool_call>
{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [120, 340, 560, 780], "label": "the sign", \
"img_idx": 0}}
</tool_call>
<tool_call>
{"name": "text_search", "arguments": {"query": "city museum old town tower"}}
</tool_call>
<tool_call>
{"name": "image_search", "arguments": {"img_idx": 1}}
</tool_call>
<tool_response>
{"results": [{"title": "City Museum - Official Site", "url": "https://example.com/museum", \
"snippet": "The museum is open every day from 10 to 18."}]}
</tool_response>
<think>
The sign is small. I should zoom into the image to read it.
</think>
<answer>The building is the city museum.</answer>
{"name": "text_search", "arguments": {"query": "what is the name of this building"}}
{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [0, 0, 500, 500], "label": "top left", "img_idx": 0}}
{"title": "Street view", "url": "https://example.org/photo/123", "snippet": "A photo of the main street."}
{"type": "function", "function": {"name": "text_search", "description": "Search the web by text.",
"parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "The query."}},
"required": ["query"]}}}
{"type": "function", "function": {"name": "image_zoom_in_tool", "description": "Zoom in on a region of
the image by cropping it.", "parameters": {"type": "object", "properties": {"bbox_2d": {"type": "array",
"items": {"type": "number"}}, "label": {"type": "string"}, "img_idx": {"type": "integer"}}}}}
Search by image. Search by text. Zoom into the image. Answer from the retrieved evidence. Answer from
the image. Answer from general knowledge. true, false, null, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 100, 1000.
"""

# GPT-2/Qwen pre-tokenizer ("qwen2" in llama.cpp), restricted to ASCII letters/digits: the corpus is ASCII.
_PRETOKENIZE = re.compile(
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]"
    r"| ?[^\sA-Za-z0-9]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by every byte-level BPE vocab."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"),
                                                          ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


def train_bpe(text: str, n_merges: int) -> list[tuple[str, str]]:
    """Learn up to ``n_merges`` merges on ``text`` (ties broken by the pair's text: deterministic).

    Classic BPE with incremental pair counts over the unique pre-tokenized words; ~0.1 s for 480 merges.
    """
    b2u = bytes_to_unicode()
    word_freq = Counter(_PRETOKENIZE.findall(text))
    words: list[list[str]] = [[b2u[b] for b in w.encode("utf-8")] for w in word_freq]
    freqs = list(word_freq.values())
    pair_count: Counter[tuple[str, str]] = Counter()
    where: dict[tuple[str, str], set[int]] = {}
    for i, sym in enumerate(words):
        for p in zip(sym, sym[1:], strict=False):
            pair_count[p] += freqs[i]
            where.setdefault(p, set()).add(i)
    merges: list[tuple[str, str]] = []
    while len(merges) < n_merges and pair_count:
        best = max(pair_count.items(), key=lambda kv: (kv[1], kv[0][0] + " " + kv[0][1]))
        (a, b), count = best
        if count < 2:
            break
        merges.append((a, b))
        for i in sorted(where.pop((a, b), ())):
            sym = words[i]
            for p in zip(sym, sym[1:], strict=False):  # remove this word's old pairs
                pair_count[p] -= freqs[i]
                if pair_count[p] <= 0:
                    del pair_count[p]
            out: list[str] = []
            j = 0
            while j < len(sym):
                if j + 1 < len(sym) and sym[j] == a and sym[j + 1] == b:
                    out.append(a + b)
                    j += 2
                else:
                    out.append(sym[j])
                    j += 1
            words[i] = out
            for p in zip(out, out[1:], strict=False):  # add its new pairs
                pair_count[p] += freqs[i]
                where.setdefault(p, set()).add(i)
    return merges


def build_vocab(n_merges: int = N_MERGES) -> tuple[list[str], list[int], list[str]]:
    """Return (tokens, token types, merges as "a b" strings)."""
    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    types = [int(gguf.TokenType.NORMAL)] * 256
    merges = train_bpe(CORPUS, n_merges)
    seen = set(tokens)
    for a, b in merges:
        if a + b not in seen:  # a merge result is always new in BPE training, but stay safe
            tokens.append(a + b)
            types.append(int(gguf.TokenType.NORMAL))
            seen.add(a + b)
    for text, control in QWEN_ADDED_TOKENS:
        tokens.append(text)
        types.append(int(gguf.TokenType.CONTROL if control else gguf.TokenType.USER_DEFINED))
    return tokens, types, [f"{a} {b}" for a, b in merges]


# ----------------------------------------------------------------------------------------------
# weights
# ----------------------------------------------------------------------------------------------
def _normal(rng: np.random.Generator, shape: tuple[int, ...], std: float) -> np.ndarray:
    return (rng.standard_normal(shape) * std).astype(np.float32)


def _norm_weight(rng: np.random.Generator, n: int) -> np.ndarray:
    return (1.0 + rng.standard_normal(n) * 0.1).astype(np.float32)


def text_weights(rng: np.random.Generator, n_vocab: int) -> dict[str, np.ndarray]:
    """Tensors of the text model, numpy shapes (= ggml ne reversed), in file order."""
    t: dict[str, np.ndarray] = {}
    # Embedding std 0.3 with the tied output gives logits of std ~2.4: peaky enough that greedy
    # decoding is stable, flat enough that scores of different continuations differ smoothly.
    t["token_embd.weight"] = _normal(rng, (n_vocab, N_EMBD), 0.3)
    t["output_norm.weight"] = _norm_weight(rng, N_EMBD)
    n_q, n_kv = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    for i in range(N_LAYER):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = _norm_weight(rng, N_EMBD)
        t[p + "attn_q.weight"] = _normal(rng, (n_q, N_EMBD), N_EMBD**-0.5)
        t[p + "attn_k.weight"] = _normal(rng, (n_kv, N_EMBD), N_EMBD**-0.5)
        t[p + "attn_v.weight"] = _normal(rng, (n_kv, N_EMBD), N_EMBD**-0.5)
        t[p + "attn_q_norm.weight"] = _norm_weight(rng, HEAD_DIM)
        t[p + "attn_k_norm.weight"] = _norm_weight(rng, HEAD_DIM)
        t[p + "attn_output.weight"] = _normal(rng, (N_EMBD, n_q), n_q**-0.5)
        t[p + "ffn_norm.weight"] = _norm_weight(rng, N_EMBD)
        t[p + "ffn_gate.weight"] = _normal(rng, (N_FF, N_EMBD), N_EMBD**-0.5)
        t[p + "ffn_up.weight"] = _normal(rng, (N_FF, N_EMBD), N_EMBD**-0.5)
        t[p + "ffn_down.weight"] = _normal(rng, (N_EMBD, N_FF), N_FF**-0.5)
    return t


def vision_weights(rng: np.random.Generator, proj_dim: int) -> dict[str, np.ndarray]:
    """Tensors of the qwen3vl_merger mmproj, numpy shapes (= ggml ne reversed), in file order."""
    t: dict[str, np.ndarray] = {}
    n_grid = (V_IMAGE_SIZE // V_PATCH) ** 2
    fan_in = 3 * V_PATCH * V_PATCH
    merged = V_EMBD * V_MERGE * V_MERGE  # 2x2 patches concatenated per image token
    # Conv3d (kt=2) stored as two Conv2d slices [out, in, kh, kw]; must stay F32/F16.
    t["v.patch_embd.weight"] = _normal(rng, (V_EMBD, 3, V_PATCH, V_PATCH), fan_in**-0.5)
    t["v.patch_embd.weight.1"] = _normal(rng, (V_EMBD, 3, V_PATCH, V_PATCH), fan_in**-0.5)
    t["v.patch_embd.bias"] = _normal(rng, (V_EMBD,), 0.02)
    t["v.position_embd.weight"] = _normal(rng, (n_grid, V_EMBD), 0.5)  # must be F32
    for i in range(V_LAYER):
        p = f"v.blk.{i}."
        t[p + "ln1.weight"] = _norm_weight(rng, V_EMBD)
        t[p + "ln1.bias"] = _normal(rng, (V_EMBD,), 0.02)
        t[p + "attn_qkv.weight"] = _normal(rng, (3 * V_EMBD, V_EMBD), V_EMBD**-0.5)
        t[p + "attn_qkv.bias"] = _normal(rng, (3 * V_EMBD,), 0.02)
        t[p + "attn_out.weight"] = _normal(rng, (V_EMBD, V_EMBD), V_EMBD**-0.5)
        t[p + "attn_out.bias"] = _normal(rng, (V_EMBD,), 0.02)
        t[p + "ln2.weight"] = _norm_weight(rng, V_EMBD)
        t[p + "ln2.bias"] = _normal(rng, (V_EMBD,), 0.02)
        t[p + "ffn_up.weight"] = _normal(rng, (V_FF, V_EMBD), V_EMBD**-0.5)
        t[p + "ffn_up.bias"] = _normal(rng, (V_FF,), 0.02)
        t[p + "ffn_down.weight"] = _normal(rng, (V_EMBD, V_FF), V_FF**-0.5)
        t[p + "ffn_down.bias"] = _normal(rng, (V_EMBD,), 0.02)
    for i in V_DEEPSTACK_LAYERS:
        p = f"v.deepstack.{i}."
        t[p + "norm.weight"] = _norm_weight(rng, merged)
        t[p + "norm.bias"] = _normal(rng, (merged,), 0.02)
        t[p + "fc1.weight"] = _normal(rng, (merged, merged), merged**-0.5)
        t[p + "fc1.bias"] = _normal(rng, (merged,), 0.02)
        t[p + "fc2.weight"] = _normal(rng, (proj_dim, merged), 0.3 * merged**-0.5)
        t[p + "fc2.bias"] = _normal(rng, (proj_dim,), 0.02)
    t["v.post_ln.weight"] = _norm_weight(rng, V_EMBD)
    t["v.post_ln.bias"] = _normal(rng, (V_EMBD,), 0.02)
    t["mm.0.weight"] = _normal(rng, (merged, merged), merged**-0.5)
    t["mm.0.bias"] = _normal(rng, (merged,), 0.02)
    # Output std ~0.3 per dim, like the token embeddings, so an image is neither drowned nor dominant.
    t["mm.2.weight"] = _normal(rng, (proj_dim, merged), 0.3 * merged**-0.5 * 3)
    t["mm.2.bias"] = _normal(rng, (proj_dim,), 0.02)
    return t


# ----------------------------------------------------------------------------------------------
# writers
# ----------------------------------------------------------------------------------------------
def _apply_overrides(w: gguf.GGUFWriter, overrides: Mapping[str, Any] | None) -> None:
    """Replace (or with None, delete) metadata keys: tests use this to write deliberately broken files."""
    for key, value in (overrides or {}).items():
        w.kv_data[0].pop(key, None)
        if value is None:
            continue
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, list(value))


def _finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_text_model(
    path: Path,
    weights: dict[str, np.ndarray],
    vocab: tuple[list[str], list[int], list[str]],
    *,
    name: str,
    quant: gguf.GGMLQuantizationType | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> None:
    tokens, types, merges = vocab
    w = gguf.GGUFWriter(str(path), ARCH)
    w.add_type("model")
    w.add_name(name)
    ftype = gguf.LlamaFileType.ALL_F32 if quant is None else gguf.LlamaFileType.MOSTLY_Q8_0
    w.add_file_type(int(ftype))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(CTX_TRAIN)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_array(f"{ARCH}.rope.dimension_sections", ROPE_SECTIONS)
    w.add_uint32(f"{ARCH}.n_deepstack_layers", N_DEEPSTACK)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    endoftext = tokens.index("<|endoftext|>")
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(endoftext)
    w.add_bos_token_id(endoftext)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    _apply_overrides(w, overrides)
    for tname, arr in weights.items():
        if quant is not None and arr.ndim == 2:
            q = gguf.quants.quantize(arr, quant)
            w.add_tensor(tname, q, raw_shape=q.shape, raw_dtype=quant)
        else:
            w.add_tensor(tname, arr)
    _finish(w)


def write_mmproj(
    path: Path,
    weights: dict[str, np.ndarray],
    *,
    proj_dim: int,
    name: str,
    overrides: Mapping[str, Any] | None = None,
) -> None:
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_type("mmproj")
    w.add_name(name)
    w.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", "qwen3vl_merger")
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.projection_dim", proj_dim)
    w.add_uint32("clip.vision.image_size", V_IMAGE_SIZE)
    w.add_uint32("clip.vision.patch_size", V_PATCH)
    w.add_uint32("clip.vision.embedding_length", V_EMBD)
    w.add_uint32("clip.vision.feed_forward_length", V_FF)
    w.add_uint32("clip.vision.block_count", V_LAYER)
    w.add_uint32("clip.vision.attention.head_count", V_HEAD)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", V_EPS)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    w.add_uint32("clip.vision.spatial_merge_size", V_MERGE)
    w.add_array("clip.vision.is_deepstack_layers", [i in V_DEEPSTACK_LAYERS for i in range(V_LAYER)])
    _apply_overrides(w, overrides)
    for tname, arr in weights.items():
        w.add_tensor(tname, arr)
    _finish(w)


def make_tiny_models(out_dir: str | Path, seed: int = 0) -> dict[str, Path]:
    """Write the five tiny GGUFs into ``out_dir`` (created if needed); return {key: path} (see FILES)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {key: out / fname for key, fname in FILES.items()}
    vocab = build_vocab()
    n_vocab = len(vocab[0])

    # Independent streams per file, so adding a tensor to one model does not change the others.
    rng_text, rng_prophet, rng_vision, rng_mismatch = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4)
    )
    text = text_weights(rng_text, n_vocab)
    # Prophet = agent weights + a "fine-tune delta" of ~half their scale: correlated, not equal.
    prophet = {k: (v + _normal(rng_prophet, v.shape, 0.5 * float(v.std()) + 1e-3)).astype(np.float32)
               for k, v in text.items()}

    write_text_model(paths["text"], text, vocab, name="tiny-qwen3vl")
    write_text_model(paths["text_q8_0"], text, vocab, name="tiny-qwen3vl",
                     quant=gguf.GGMLQuantizationType.Q8_0)
    write_text_model(paths["prophet"], prophet, vocab, name="tiny-qwen3vl-prophet")
    write_mmproj(paths["mmproj"], vision_weights(rng_vision, N_EMBD), proj_dim=N_EMBD,
                 name="tiny-qwen3vl-mmproj")
    bad_dim = N_EMBD + N_EMBD // 2  # 96: 96 * 2 = 192 != 64 * 2
    write_mmproj(paths["mmproj_mismatch"], vision_weights(rng_mismatch, bad_dim), proj_dim=bad_dim,
                 name="tiny-qwen3vl-mmproj-mismatch")
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("out_dir", type=Path, help="directory to write the GGUF files into")
    ap.add_argument("--seed", type=int, default=0, help="random seed (same seed -> byte-identical files)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    paths = make_tiny_models(args.out_dir, args.seed)
    print_files(paths, label="", unit="KiB")
    print(f"wrote {len(paths)} files in {time.perf_counter() - t0:.2f} s", file=sys.stderr)
    return 0


def print_files(paths: dict[str, Path], *, label: str, unit: str) -> None:
    """One line per written file on stdout: its key, path and size (in KiB or MiB), for scripts to read."""
    scale = {"KiB": 1024, "MiB": 2**20}[unit]
    for key, p in paths.items():
        print(f"{label}{key:16s} {p}  ({p.stat().st_size / scale:,.0f} {unit})")


if __name__ == "__main__":
    sys.exit(main())
