#!/usr/bin/env python3
"""Write Qwen3-VL-2B- and 4B-Instruct-shaped GGUFs with random weights: what the shipped models cost.

Usage:  python scripts/make_standin_models.py --size 2b|4b OUT_DIR [--seed N] [--force] [--no-check]
Import: ``make_standin_models(out_dir, "2b") -> dict[str, Path]`` (keys ``text``, ``prophet``, ``mmproj``).

Cost does not depend on the weights' values: a model with the real shapes, tensor types and vocabulary
costs what the real one costs, token for token, byte for byte. Random weights give gibberish, so use
these files for time and memory, never for answers.

Files (in ``OUT_DIR``; cached: a second run with the same script version, size and seed reuses them):

==============  ======================================  ==========================================
key             file                                     what
==============  ======================================  ==========================================
``text``        standin-qwen3vl-{size}-Q4_K_M.gguf      the agent: text model, Q4_K_M mix
``prophet``     standin-qwen3vl-{size}-prophet-Q4_K_M   same shapes and tokenizer, other weights
``mmproj``      standin-qwen3vl-{size}-mmproj-Q8_0.gguf  the vision tower + mergers (one for both)
==============  ======================================  ==========================================

Shapes: the published ``config.json`` of ``Qwen/Qwen3-VL-2B-Instruct`` and ``Qwen/Qwen3-VL-4B-Instruct``
(Hugging Face; read here through public copies of those files, e.g. a transformers-4.57 dump of the 4B
config and the Qwen3-VL-2B meta of InfiniLM, and the measured 2B notes in shared/notes):

==========================================  ==============  ==============
config.json field                           2B              4B
==========================================  ==============  ==============
text_config.hidden_size                     2048            2560
text_config.num_hidden_layers               28              36
text_config.num_attention_heads             16              32
text_config.num_key_value_heads             8               8
text_config.head_dim                        128             128
text_config.intermediate_size               6144            9728
text_config.rope_theta                      5,000,000       5,000,000
text_config.rope_scaling.mrope_section      [24, 20, 20]    [24, 20, 20]
text_config.rms_norm_eps                    1e-6            1e-6
text_config.max_position_embeddings         262144          262144
tie_word_embeddings                         true            true
vocab_size                                  151936          151936
vision_config.depth                         24              24
vision_config.hidden_size                   1024            1024
vision_config.num_heads                     16              16
vision_config.intermediate_size             4096            4096
vision_config.out_hidden_size               2048            2560
vision_config.patch_size / temporal         16 / 2          16 / 2
vision_config.spatial_merge_size            2               2
vision_config.num_position_embeddings       2304 (48x48)    2304
vision_config.deepstack_visual_indexes      [5, 11, 17]     [5, 11, 17]
==========================================  ==============  ==============

How the fields become GGUF keys and tensors: as llama.cpp's ``convert_hf_to_gguf.py`` writes them
(``qwen3vl.rope.dimension_sections`` = mrope_section + [0]; ``qwen3vl.n_deepstack_layers`` = 3;
``clip.projector_type`` ``qwen3vl_merger``; ``clip.vision.image_size`` = sqrt(2304) * 16 = 768;
``clip.vision.is_deepstack_layers``; tensors as in ``scripts/make_tiny_models.py``, which documents the
keys llama.cpp requires).

Tensor types: the catalog's default files (``models/catalog.json``): text Q4_K_M, mmproj Q8_0. The
Q4_K_M mix is llama.cpp's (``llama_tensor_get_type``): Q4_K everywhere except the tied token embedding
(= the output matrix: Q6_K) and ``attn_v`` / ``ffn_down`` in the layers ``use_more_bits`` picks (Q6_K);
norms F32. The Q8_0 mmproj keeps the patch embedding, position embedding, norms and biases in F32.
Check: the tensor bytes this script writes differ from the catalog's published file sizes
(Qwen3VL-2B-Instruct-Q4_K_M.gguf 1,107,409,952; 4B 2,497,281,664; mmproj Q8_0 445,053,216 / 453,974,304)
by the metadata alone (the tokenizer, ~5.95 MB, and a few KB of keys) - see :func:`expected_sizes`; the
2B files written, tokenizer included: 1,107,409,728 and 445,052,928 bytes (224 and 288 bytes short).

Tokenizer: Qwen3-VL's (``scripts/standin_tokenizer.py``): the tokens, types and 151,387 merges of the
real Qwen2.5-Coder-0.5B-Instruct GGUF (installed by ``scripts/install_qwen_models.py``; a clear error
names that command when it is missing), with Qwen3's ``<tool_response>``, ``</tool_response>``,
``<think>``, ``</think>`` at 151665-151668 as user-defined tokens. So every text takes the tokens it
takes on Qwen3-VL, and the file sizes equal the published ones but for a few KB of keys.

Weights: written directly as quantized blocks from a seeded ``numpy`` generator (no F32 copy of the
model exists at any time: memory stays at one tensor's bytes), with block scales chosen so each
matrix has std ~ 1/sqrt(fan_in) (token embedding 0.05: logits of std ~2); activations stay finite,
which the script checks after writing by loading each model in llama.cpp and decoding text and an image
(``--no-check`` skips it). ~1.6 GB (2B) / ~3 GB (4B) per text model; minutes on 2 cores, mostly disk.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import gguf
import numpy as np

if __package__ in (None, ""):  # run as a script: make `scripts` and `edge_agent` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.make_tiny_models import ARCH, CHAT_TEMPLATE, print_files  # noqa: E402
from scripts.standin_tokenizer import TokenizerMissing, qwen3vl_vocabulary, tokenizer_source  # noqa: E402

# Bump when the files this script writes change in any way: the cache key.
VERSION = 3

Q = gguf.GGMLQuantizationType
QK_K = 256


@dataclass(frozen=True)
class Shape:
    """One Qwen3-VL size: the config.json fields this script uses (see the module docstring)."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rope_theta: float
    mrope: tuple[int, int, int]
    ctx_train: int
    v_depth: int
    v_hidden: int
    v_heads: int
    v_ffn: int
    v_out: int
    v_patch: int
    v_merge: int
    v_positions: int
    deepstack: tuple[int, ...]
    rms_eps: float = 1e-6
    v_eps: float = 1e-6
    catalog_text_bytes: int = 0  # the catalog's Q4_K_M / Q8_0 file sizes, for the size check
    catalog_mmproj_bytes: int = 0

    def reduced(self, depth: int, vision_depth: int) -> Shape:
        """The same widths at a smaller depth (tests): deepstack mergers on the last vision blocks,
        as many as the real model has (mtmd checks text and vision deepstack counts against each other)."""
        n = len(self.deepstack)
        if depth <= n or vision_depth < n:
            raise ValueError(f"depth must be > {n} and vision depth >= {n} (the {n} deepstack layers)")
        return replace(self, layers=depth, v_depth=vision_depth,
                       deepstack=tuple(range(vision_depth - n, vision_depth)),
                       catalog_text_bytes=0, catalog_mmproj_bytes=0)


SHAPES: dict[str, Shape] = {
    "2b": Shape("2b", hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128, ffn=6144, vocab=151936,
                rope_theta=5e6, mrope=(24, 20, 20), ctx_train=262144, v_depth=24, v_hidden=1024, v_heads=16,
                v_ffn=4096, v_out=2048, v_patch=16, v_merge=2, v_positions=2304, deepstack=(5, 11, 17),
                catalog_text_bytes=1_107_409_952, catalog_mmproj_bytes=445_053_216),
    "4b": Shape("4b", hidden=2560, layers=36, heads=32, kv_heads=8, head_dim=128, ffn=9728, vocab=151936,
                rope_theta=5e6, mrope=(24, 20, 20), ctx_train=262144, v_depth=24, v_hidden=1024, v_heads=16,
                v_ffn=4096, v_out=2560, v_patch=16, v_merge=2, v_positions=2304, deepstack=(5, 11, 17),
                catalog_text_bytes=2_497_281_664, catalog_mmproj_bytes=453_974_304),
}


@dataclass(frozen=True)
class Tensor:
    """One tensor to write: ``ne`` in ggml order (fastest dimension first), its type and weight std."""

    name: str
    ne: tuple[int, ...]
    qtype: gguf.GGMLQuantizationType
    std: float

    @property
    def n(self) -> int:
        return math.prod(self.ne)

    @property
    def nbytes(self) -> int:
        block, size = gguf.GGML_QUANT_SIZES[self.qtype]
        return self.n // block * size


# ----------------------------------------------------------------------------------------------
# the tensor plans
# ----------------------------------------------------------------------------------------------
def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's rule for which layers of a Q4_K_M model get Q6_K attn_v / ffn_down."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def text_plan(s: Shape) -> list[Tensor]:
    """The text model's tensors as a Q4_K_M file holds them (tied output: no output.weight)."""
    h, q, kv = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim
    t = [Tensor("token_embd.weight", (h, s.vocab), Q.Q6_K, 0.05),
         Tensor("output_norm.weight", (h,), Q.F32, 1.0)]
    for i in range(s.layers):
        p, more = f"blk.{i}.", use_more_bits(i, s.layers)
        t += [
            Tensor(p + "attn_norm.weight", (h,), Q.F32, 1.0),
            Tensor(p + "attn_q.weight", (h, q), Q.Q4_K, h**-0.5),
            Tensor(p + "attn_k.weight", (h, kv), Q.Q4_K, h**-0.5),
            Tensor(p + "attn_v.weight", (h, kv), Q.Q6_K if more else Q.Q4_K, h**-0.5),
            Tensor(p + "attn_q_norm.weight", (s.head_dim,), Q.F32, 1.0),
            Tensor(p + "attn_k_norm.weight", (s.head_dim,), Q.F32, 1.0),
            Tensor(p + "attn_output.weight", (q, h), Q.Q4_K, 0.5 * q**-0.5),
            Tensor(p + "ffn_norm.weight", (h,), Q.F32, 1.0),
            Tensor(p + "ffn_gate.weight", (h, s.ffn), Q.Q4_K, h**-0.5),
            Tensor(p + "ffn_up.weight", (h, s.ffn), Q.Q4_K, h**-0.5),
            Tensor(p + "ffn_down.weight", (s.ffn, h), Q.Q6_K if more else Q.Q4_K, 0.5 * s.ffn**-0.5),
        ]
    return t


def mmproj_plan(s: Shape) -> list[Tensor]:
    """The qwen3vl_merger projector's tensors as a Q8_0 mmproj holds them."""
    d, f, p = s.v_hidden, s.v_ffn, s.v_patch
    m = d * s.v_merge * s.v_merge  # 2x2 patches concatenated per image token
    fan_patch = 3 * p * p * 2
    t = [
        Tensor("v.patch_embd.weight", (p, p, 3, d), Q.F32, fan_patch**-0.5),
        Tensor("v.patch_embd.weight.1", (p, p, 3, d), Q.F32, fan_patch**-0.5),
        Tensor("v.patch_embd.bias", (d,), Q.F32, 0.02),
        Tensor("v.position_embd.weight", (d, s.v_positions), Q.F32, 0.1),  # must be F32
    ]
    for i in range(s.v_depth):
        b = f"v.blk.{i}."
        t += [
            Tensor(b + "ln1.weight", (d,), Q.F32, 1.0), Tensor(b + "ln1.bias", (d,), Q.F32, 0.02),
            Tensor(b + "attn_qkv.weight", (d, 3 * d), Q.Q8_0, d**-0.5),
            Tensor(b + "attn_qkv.bias", (3 * d,), Q.F32, 0.02),
            Tensor(b + "attn_out.weight", (d, d), Q.Q8_0, 0.5 * d**-0.5),
            Tensor(b + "attn_out.bias", (d,), Q.F32, 0.02),
            Tensor(b + "ln2.weight", (d,), Q.F32, 1.0), Tensor(b + "ln2.bias", (d,), Q.F32, 0.02),
            Tensor(b + "ffn_up.weight", (d, f), Q.Q8_0, d**-0.5),
            Tensor(b + "ffn_up.bias", (f,), Q.F32, 0.02),
            Tensor(b + "ffn_down.weight", (f, d), Q.Q8_0, 0.5 * f**-0.5),
            Tensor(b + "ffn_down.bias", (d,), Q.F32, 0.02),
        ]
    for i in s.deepstack:
        b = f"v.deepstack.{i}."
        t += [
            Tensor(b + "norm.weight", (m,), Q.F32, 1.0), Tensor(b + "norm.bias", (m,), Q.F32, 0.02),
            Tensor(b + "fc1.weight", (m, m), Q.Q8_0, m**-0.5), Tensor(b + "fc1.bias", (m,), Q.F32, 0.02),
            Tensor(b + "fc2.weight", (m, s.v_out), Q.Q8_0, m**-0.5),
            Tensor(b + "fc2.bias", (s.v_out,), Q.F32, 0.02),
        ]
    t += [
        Tensor("v.post_ln.weight", (d,), Q.F32, 1.0), Tensor("v.post_ln.bias", (d,), Q.F32, 0.02),
        Tensor("mm.0.weight", (m, m), Q.Q8_0, m**-0.5), Tensor("mm.0.bias", (m,), Q.F32, 0.02),
        Tensor("mm.2.weight", (m, s.v_out), Q.Q8_0, m**-0.5), Tensor("mm.2.bias", (s.v_out,), Q.F32, 0.02),
    ]
    return t


def expected_sizes(s: Shape) -> dict[str, int]:
    """Tensor bytes of each file (without metadata and alignment padding)."""
    return {"text": sum(t.nbytes for t in text_plan(s)), "mmproj": sum(t.nbytes for t in mmproj_plan(s))}


# ----------------------------------------------------------------------------------------------
# quantized blocks from random bits
# ----------------------------------------------------------------------------------------------
def _random_bytes(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` uniformly random bytes (raw 64-bit draws: ~5x faster than ``integers`` on uint8)."""
    raw = rng.bit_generator.random_raw((n + 7) // 8)
    return np.asarray(raw, dtype=np.uint64).view(np.uint8)[:n]


def _f16_bytes(x: float) -> np.ndarray:
    return np.array([x], dtype="<f2").view(np.uint8)


def _k4_scales(sc: int, m: int) -> np.ndarray:
    """The 12 packed bytes of a Q4_K block whose 8 sub-blocks all have 6-bit scale ``sc`` and min ``m``
    (ggml's get_scale_min_k4 reads them back)."""
    q = np.zeros(12, dtype=np.uint8)
    for j in range(8):
        if j < 4:
            q[j] |= sc & 63
            q[j + 4] |= m & 63
        else:
            q[j + 4] = (sc & 0xF) | ((m & 0xF) << 4)
            q[j - 4] |= (sc >> 4) << 6
            q[j] |= (m >> 4) << 6
    return q


def blocks(t: Tensor, rng: np.random.Generator) -> np.ndarray:
    """The tensor's bytes: quantized blocks of uniformly random quants with std ``t.std``, or F32 normals.

    - Q4_K (144 B per 256): y = d*sc*q - dmin*m with q in 0..15, sc = m = 16, dmin = 7.5 d:
      y = 16 d (q - 7.5), std 16 d * 4.61.
    - Q6_K (210 B per 256): y = d*scale*(q - 32), q in 0..63, scale 16: std 16 d * 18.5.
    - Q8_0 (34 B per 32): y = d*q, q int8 uniform: std d * 73.9.
    """
    if t.qtype == Q.F32:
        if t.std == 1.0 and len(t.ne) == 1:  # a norm's weight: ~1
            return (1.0 + rng.standard_normal(t.n, dtype=np.float32) * 0.1).astype(np.float32)
        return rng.standard_normal(t.n, dtype=np.float32) * np.float32(t.std)
    block, size = gguf.GGML_QUANT_SIZES[t.qtype]
    nb = t.n // block
    out = _random_bytes(rng, nb * size).reshape(nb, size)
    if t.qtype == Q.Q4_K:
        d = t.std / (16 * 4.61)
        out[:, 0:2] = _f16_bytes(d)
        out[:, 2:4] = _f16_bytes(7.5 * d)
        out[:, 4:16] = _k4_scales(16, 16)
    elif t.qtype == Q.Q6_K:
        out[:, 192:208] = 16  # int8 scales
        out[:, 208:210] = _f16_bytes(t.std / (16 * 18.5))
    elif t.qtype == Q.Q8_0:
        out[:, 0:2] = _f16_bytes(t.std / 73.9)
    else:
        raise ValueError(f"no writer for {t.qtype.name}")
    return out


# ----------------------------------------------------------------------------------------------
# files
# ----------------------------------------------------------------------------------------------
def _text_metadata(w: gguf.GGUFWriter, s: Shape, name: str, tokenizer: Path) -> None:
    w.add_type("model")
    w.add_name(name)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q4_K_M))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(s.ctx_train)
    w.add_embedding_length(s.hidden)
    w.add_block_count(s.layers)
    w.add_feed_forward_length(s.ffn)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_rope_freq_base(s.rope_theta)
    w.add_layer_norm_rms_eps(s.rms_eps)
    w.add_array(f"{ARCH}.rope.dimension_sections", [*s.mrope, 0])
    w.add_uint32(f"{ARCH}.n_deepstack_layers", len(s.deepstack))
    tokens, types, merges = qwen3vl_vocabulary(tokenizer)
    if len(tokens) != s.vocab:
        raise ValueError(f"the tokenizer has {len(tokens)} tokens, the shape {s.vocab}")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)


def _mmproj_metadata(w: gguf.GGUFWriter, s: Shape, name: str) -> None:
    w.add_type("mmproj")
    w.add_name(name)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q8_0))
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", "qwen3vl_merger")
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.projection_dim", s.v_out)
    w.add_uint32("clip.vision.image_size", math.isqrt(s.v_positions) * s.v_patch)
    w.add_uint32("clip.vision.patch_size", s.v_patch)
    w.add_uint32("clip.vision.embedding_length", s.v_hidden)
    w.add_uint32("clip.vision.feed_forward_length", s.v_ffn)
    w.add_uint32("clip.vision.block_count", s.v_depth)
    w.add_uint32("clip.vision.attention.head_count", s.v_heads)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", s.v_eps)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    w.add_uint32("clip.vision.spatial_merge_size", s.v_merge)
    w.add_array("clip.vision.is_deepstack_layers", [i in s.deepstack for i in range(s.v_depth)])


def write_gguf(path: Path, arch: str, metadata: Callable[[gguf.GGUFWriter], None], plan: list[Tensor],
               rng: np.random.Generator, progress: Callable[[str], None]) -> None:
    """Stream ``plan`` into ``path``: tensor infos first, then one tensor's bytes at a time
    (memory: the largest tensor, ~0.3 GB for the 4B token embedding). Written to a temporary name and
    renamed, so an interrupted run leaves no file that looks complete."""
    tmp = path.with_name(path.name + ".part")
    w = gguf.GGUFWriter(str(tmp), arch)
    metadata(w)
    for t in plan:
        block, size = gguf.GGML_QUANT_SIZES[t.qtype]
        if t.qtype == Q.F32:
            w.add_tensor_info(t.name, tuple(reversed(t.ne)), np.dtype(np.float32), t.nbytes)
        else:
            byte_shape = (*reversed(t.ne[1:]), t.ne[0] // block * size)
            w.add_tensor_info(t.name, byte_shape, np.dtype(np.uint8), t.nbytes, raw_dtype=t.qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    total, done, t0, last = sum(t.nbytes for t in plan), 0, time.perf_counter(), 0.0
    for t in plan:
        w.write_tensor_data(blocks(t, rng))
        done += t.nbytes
        if time.perf_counter() - last > 5 or done == total:
            last = time.perf_counter()
            progress(f"  {path.name}: {done / 2**20:,.0f} / {total / 2**20:,.0f} MiB ({last - t0:.0f} s)")
    w.close()
    tmp.replace(path)


def file_names(size: str) -> dict[str, str]:
    return {
        "text": f"standin-qwen3vl-{size}-Q4_K_M.gguf",
        "prophet": f"standin-qwen3vl-{size}-prophet-Q4_K_M.gguf",
        "mmproj": f"standin-qwen3vl-{size}-mmproj-Q8_0.gguf",
    }


def _gguf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gguf")
    except PackageNotFoundError:
        return ""


def _stale(manifest: Path, key: dict[str, Any], paths: dict[str, Path]) -> set[str]:
    """The files to write: all of them without a manifest of this key, else those missing or of
    another size than written (each file has its own random stream, so one can be rewritten alone)."""
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set(paths)
    if data.get("key") != key:
        return set(paths)
    sizes = data.get("bytes", {})
    return {k for k, p in paths.items() if not p.is_file() or p.stat().st_size != sizes.get(k)}


def make_standin_models(
    out_dir: str | Path,
    size: str,
    *,
    seed: int = 0,
    force: bool = False,
    check: bool = True,
    shape: Shape | None = None,
    progress: Callable[[str], None] | None = None,
    tokenizer: Path | None = None,
) -> dict[str, Path]:
    """Write (or reuse) the stand-in files for ``size`` ("2b"/"4b") in ``out_dir``; {key: path}.

    ``shape``: another :class:`Shape` (tests: ``SHAPES["2b"].reduced(4, 4)``); its files get a suffix.
    ``check``: load each text model with the mmproj in llama.cpp and decode text and an image; raise
    when a logit is NaN or infinite. ``tokenizer``: the real Qwen GGUF to take the tokenizer from
    (default: the installed one, ``standin_tokenizer.tokenizer_source``; TokenizerMissing without it).
    """
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    s = shape or SHAPES[size]
    source = tokenizer or tokenizer_source()  # before anything is written: TokenizerMissing names the fix
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tag = size if shape is None else f"{size}-L{s.layers}-V{s.v_depth}"
    paths = {k: out / v.replace(f"-{size}-", f"-{tag}-") for k, v in file_names(size).items()}
    manifest = out / f"standin-qwen3vl-{tag}.json"
    from edge_agent.runtime.model import file_identity

    key = json.loads(json.dumps({"version": VERSION, "seed": seed, "shape": s.__dict__,
                                 "gguf": _gguf_version(),
                                 "tokenizer": file_identity(source)}))
    todo = set(paths) if force else _stale(manifest, key, paths)
    if not todo:
        say(f"stand-in {tag}: reusing {out} (script version {VERSION})")
        return paths
    manifest.unlink(missing_ok=True)
    t0 = time.perf_counter()
    rngs = dict(zip(("text", "prophet", "mmproj"),
                    (np.random.default_rng(x) for x in np.random.SeedSequence(seed).spawn(3)), strict=True))
    for k in ("text", "prophet"):
        if k in todo:
            name = f"standin-qwen3vl-{tag}" + ("-prophet" if k == "prophet" else "")
            write_gguf(paths[k], ARCH, lambda w, name=name: _text_metadata(w, s, name, source), text_plan(s),
                       rngs[k], say)
    if "mmproj" in todo:
        write_gguf(paths["mmproj"], "clip", lambda w: _mmproj_metadata(w, s, f"standin-qwen3vl-{tag}-mmproj"),
                   mmproj_plan(s), rngs["mmproj"], say)
    written = time.perf_counter() - t0
    checks = {}
    if check:
        for k in ("text", "prophet"):
            checks[k] = check_finite(paths[k], paths["mmproj"])
            say(f"  {paths[k].name}: logits finite (text and image; {checks[k]['seconds']:.1f} s)")
    manifest.write_text(json.dumps({
        "key": key, "bytes": {k: p.stat().st_size for k, p in paths.items()},
        "write_seconds": round(written, 1),
        "checks": checks,
    }, indent=1), encoding="utf-8")
    return paths


def check_finite(model: Path, mmproj: Path) -> dict[str, Any]:
    """Load ``model`` + ``mmproj`` in llama.cpp, evaluate a chat prefix, a 64x64 image and text; raise
    ValueError when any next-token logit is NaN or infinite. Returns what was evaluated."""
    import io

    from PIL import Image

    from edge_agent.runtime import Model

    t0 = time.perf_counter()
    img = Image.new("RGB", (64, 64))
    img.putdata([((x * 4) % 256, (y * 4) % 256, 128) for y in range(64) for x in range(64)])
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    rows = []
    with Model.load(model, mmproj, n_ctx=512, n_seq_max=2, n_batch=128) as m:
        s = m.session()
        s.append_text("<|im_start|>user\n")
        rows.append(s.next_logits())
        s.append_image(buf.getvalue())
        s.append_text("What is in the picture?<|im_end|>\n<|im_start|>assistant\n")
        rows.append(s.next_logits())
        n_eval = s.n_evaluated
    for r in rows:
        if not np.isfinite(r).all():
            raise ValueError(f"{model.name}: non-finite logits ({int((~np.isfinite(r)).sum())} of {r.size})")
    return {"tokens_evaluated": n_eval, "logit_std": round(float(np.std(rows[-1])), 3),
            "seconds": round(time.perf_counter() - t0, 2)}


def _iter_sizes(arg: str) -> Iterator[str]:
    for x in arg.split(","):
        if x.strip().lower() not in SHAPES:
            raise argparse.ArgumentTypeError(f"--size must be one of {', '.join(SHAPES)}, not {x!r}")
        yield x.strip().lower()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    ap.add_argument("out_dir", type=Path, help="directory for the GGUF files (reused when already written)")
    ap.add_argument("--size", default="2b", help="2b, 4b or both (2b,4b)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="write the files again even when cached")
    ap.add_argument("--no-check", action="store_true", help="skip loading the files and checking logits")
    args = ap.parse_args(argv)
    try:
        sizes = list(_iter_sizes(args.size))
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))
    for size in sizes:
        t0 = time.perf_counter()
        try:
            paths = make_standin_models(args.out_dir, size, seed=args.seed, force=args.force,
                                        check=not args.no_check)
        except TokenizerMissing as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print_files(paths, label=f"{size} ", unit="MiB")
        print(f"{size}: ready in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
