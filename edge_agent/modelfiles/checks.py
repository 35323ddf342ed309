"""Inspect and validate GGUF model files in Python, before llama.cpp sees them (the bytes: ``gguf_header``).

llama.cpp aborts the whole process (GGML_ASSERT) on several files that do not fit together: an mmproj
whose projection width does not match the text model, Qwen3-VL with as many deepstack layers as blocks,
a vision tower without a patch bias... This module reads only the GGUF *header* (metadata and tensor
table; never tensor data) and turns every such problem into a :class:`ModelFileError` whose message says
how to fix it.

What it knows: the GGUF container format, the metadata keys and tensor names llama.cpp 0.3.36
(vendored llama.cpp 0c1e570) reads for the architectures we support, Qwen's image resize rule.
What it does not know: whether llama.cpp will really load a file (weights can still be garbage), and
nothing of llama_cpp itself (this module never imports it; the runtime calls these checks first).

Speed: the header is parsed with ``struct`` over an ``mmap``; large arrays (tokens, merges, scores)
are walked, not decoded, and tensor data is never touched. ``gguf.GGUFReader`` builds numpy views for
every array element and took 4.4-7.7 s on SmolLM2-135M (49k tokens + 49k merges, 2 busy cores); this
parser takes ~35 ms on the same file and ~120 ms on a 2.9 GiB file with Qwen's 151k tokens + 151k
merges (``python -m edge_agent.modelfiles.checks FILE`` prints the time). The ``gguf`` package is used for its
constants (value types, tensor type sizes, file type names); tests check this parser against GGUFReader
and the token lists against llama.cpp's.
"""

from __future__ import annotations

import hashlib
import math
import mmap
import os
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import gguf

from edge_agent.core.errors import ConfigError, ModelFileError
from edge_agent.modelfiles.gguf_header import (  # noqa: F401  (GGUF_MAGIC, ArrayRef, TensorInfo: its API)
    GGUF_MAGIC,
    ArrayRef,
    TensorInfo,
    _check_path,
    _Corrupt,
    _parse,
)

# Text architectures llama.cpp 0.3.36 loads that edge-agent is meant for. Vision needs one of
# VISION_PROJECTORS; the rest work for text-only use (tests, benchmarks, the prophet).
VISION_PROJECTORS: dict[str, frozenset[str]] = {
    "qwen3vl": frozenset({"qwen3vl_merger"}),
    "qwen3vlmoe": frozenset({"qwen3vl_merger"}),
    "qwen2vl": frozenset({"qwen2vl_merger", "qwen2.5vl_merger"}),  # Qwen2-VL and Qwen2.5-VL
    "gemma3": frozenset({"gemma3"}),
}
TEXT_ONLY_ARCHS = frozenset(
    {"llama", "qwen2", "qwen3", "qwen3moe", "qwen2moe", "gemma", "gemma2", "gemma3n", "phi3", "mistral3",
     "smollm3", "granite", "olmo2", "exaone", "lfm2"}
)
SUPPORTED_TEXT_ARCHS = frozenset(VISION_PROJECTORS) | TEXT_ONLY_ARCHS
# Architectures whose positions are M-RoPE: an image of nx*ny tokens advances the position by max(nx, ny).
MROPE_ARCHS = frozenset({"qwen3vl", "qwen3vlmoe", "qwen2vl"})
MMPROJ_ARCHS = frozenset({"clip"})

# Qwen3-VL text widths -> the size users know (a wrong-size mmproj is the usual mistake).
_QWEN3VL_SIZES = {2048: "2B", 2560: "4B", 4096: "8B", 5120: "32B"}

@dataclass(frozen=True)
class ModelInfo:
    """What a GGUF header says, for display and for the checks below. Cheap: no tensor data is read."""

    path: Path
    kind: Literal["text", "mmproj"]
    architecture: str
    name: str
    file_type: str  # from general.file_type, e.g. "Q4_K_M", "F16"; "" when absent
    quantization: str  # the tensor type holding most bytes, e.g. "Q4_K"
    size_bytes: int
    n_tensors: int
    # text models
    n_embd: int = 0
    n_layer: int = 0
    n_ctx_train: int = 0
    n_vocab: int = 0
    vocab_hash: str = ""  # sha256 of the serialized token list: equal hash <=> same tokens
    tokenizer_model: str = ""
    eos_token_id: int | None = None
    has_chat_template: bool = False
    chat_template: str = field(default="", repr=False, compare=False)  # tokenizer.chat_template (jinja2)
    n_deepstack: int = 0  # text side: extra input widths consumed by deepstack layers (Qwen3-VL)
    # mmproj files
    projector_type: str = ""
    has_vision: bool = False
    projection_dim: int = 0  # width of the main projection output (mm.2.bias for Qwen mergers)
    vision_deepstack: int = 0  # vision blocks with a deepstack merger
    image_size: int = 0
    patch_size: int = 0
    spatial_merge_size: int = 0
    metadata: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    tensors: tuple[TensorInfo, ...] = field(default=(), repr=False, compare=False)

    @property
    def n_embd_inp(self) -> int:
        """Width of one input embedding row: what an mmproj must produce per image token."""
        return self.n_embd * (1 + self.n_deepstack)

    @property
    def n_embd_out(self) -> int:
        """Width of one image embedding an mmproj produces (main path + deepstack paths)."""
        if self.projector_type == "qwen3vl_merger":
            return self.projection_dim * (1 + self.vision_deepstack)
        return self.projection_dim

    @property
    def uses_mrope(self) -> bool:
        return self.architecture in MROPE_ARCHS

    @property
    def supports_vision(self) -> bool:
        return self.kind == "text" and self.architecture in VISION_PROJECTORS

    def tensor(self, name: str) -> TensorInfo | None:
        return next((t for t in self.tensors if t.name == name), None)

    def summary(self) -> str:
        """One line for `edge-agent models` and logs."""
        size = f"{self.size_bytes / 2**20:.1f} MiB"
        q = self.file_type or self.quantization
        if self.kind == "mmproj":
            return f"{self.path.name}: mmproj {self.projector_type}, {q}, {size}, out width {self.n_embd_out}"
        return (f"{self.path.name}: {self.architecture} '{self.name}', {q}, {size}, n_embd {self.n_embd}, "
                f"{self.n_layer} layers, vocab {self.n_vocab}, ctx {self.n_ctx_train}")


# ----------------------------------------------------------------------------------------------
# inspect
# ----------------------------------------------------------------------------------------------
def inspect(path: str | os.PathLike[str]) -> ModelInfo:
    """Read a GGUF header into a :class:`ModelInfo`. Raises ModelFileError for anything unreadable."""
    p = Path(path).expanduser()
    meta, tensors, size = _parse(p)
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ModelFileError(f"{p} has no general.architecture: it is not a llama.cpp model file. "
                             "Use a GGUF converted by llama.cpp (e.g. from a -GGUF repository).")
    gtype = meta.get("general.type", "")
    if gtype == "adapter":
        raise ModelFileError(f"{p} is a LoRA adapter, not a model. Pass the base model GGUF instead.")
    kind: Literal["text", "mmproj"] = "mmproj" if (arch in MMPROJ_ARCHS or gtype == "mmproj") else "text"
    common = dict(
        path=p,
        kind=kind,
        architecture=arch,
        name=str(meta.get("general.name", "") or p.stem),
        file_type=_file_type_name(meta.get("general.file_type")),
        quantization=_dominant_type(tensors),
        size_bytes=size,
        n_tensors=len(tensors),
        metadata={k: v for k, v in meta.items() if not isinstance(v,
                                                                  ArrayRef)
                  and k != "tokenizer.chat_template"},
        tensors=tuple(tensors),
    )
    if kind == "mmproj":
        return _inspect_mmproj(meta, tensors, common)
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab_hash, n_vocab = "", 0
    if isinstance(tokens, ArrayRef):
        with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            vocab_hash = hashlib.sha256(mm[tokens.start : tokens.end]).hexdigest()
        n_vocab = tokens.count
    elif isinstance(tokens, list):  # tiny vocabularies are decoded already
        vocab_hash = hashlib.sha256(b"".join(struct.pack("<Q",
                                                         len(t.encode())) + t.encode()
                                             for t in tokens)).hexdigest()
        n_vocab = len(tokens)
    eos = meta.get("tokenizer.ggml.eos_token_id")
    return ModelInfo(
        **common,
        n_embd=_int(meta.get(f"{arch}.embedding_length")),
        n_layer=_int(meta.get(f"{arch}.block_count")),
        n_ctx_train=_int(meta.get(f"{arch}.context_length")),
        n_vocab=n_vocab,
        vocab_hash=vocab_hash,
        tokenizer_model=str(meta.get("tokenizer.ggml.model", "")),
        eos_token_id=eos if isinstance(eos, int) else None,
        has_chat_template=bool(meta.get("tokenizer.chat_template")),
        chat_template=str(meta.get("tokenizer.chat_template") or ""),
        n_deepstack=_int(meta.get(f"{arch}.n_deepstack_layers")),
    )


def _inspect_mmproj(meta: dict[str, Any], tensors: list[TensorInfo], common: dict[str, Any]) -> ModelInfo:
    ptype = meta.get("clip.vision.projector_type") or meta.get("clip.projector_type") or ""
    names = {t.name: t for t in tensors}
    proj_dim = _int(meta.get("clip.vision.projection_dim"))
    if ptype in ("qwen3vl_merger", "qwen2vl_merger", "qwen2.5vl_merger") and "mm.2.bias" in names:
        proj_dim = names["mm.2.bias"].shape[0]  # what clip_n_mmproj_embd really uses
    ds_blocks = {t.name.split(".")[2] for t in tensors if t.name.startswith("v.deepstack.")
                 and ".fc1." in t.name}
    return ModelInfo(
        **common,
        projector_type=str(ptype),
        has_vision=bool(meta.get("clip.has_vision_encoder", False)),
        projection_dim=proj_dim,
        vision_deepstack=len(ds_blocks),
        n_embd=_int(meta.get("clip.vision.embedding_length")),
        n_layer=_int(meta.get("clip.vision.block_count")),
        image_size=_int(meta.get("clip.vision.image_size")),
        patch_size=_int(meta.get("clip.vision.patch_size")),
        spatial_merge_size=_int(meta.get("clip.vision.spatial_merge_size"))
        or (2 if ptype.startswith("qwen") else 0),
    )


def _int(v: Any) -> int:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else 0


def _file_type_name(ft: Any) -> str:
    if not isinstance(ft, int):
        return ""
    try:
        name = gguf.LlamaFileType(ft).name
    except ValueError:
        return f"type {ft}"
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def _dominant_type(tensors: list[TensorInfo]) -> str:
    by_type: dict[str, int] = {}
    for t in tensors:
        by_type[t.type] = by_type.get(t.type, 0) + t.nbytes
    return max(by_type, key=lambda k: by_type[k]) if by_type else ""


def read_tokens(path: str | os.PathLike[str]) -> list[str]:
    """The full token list of a text GGUF (decoded; ~0.1-0.3 s for 150k tokens)."""
    p = Path(path).expanduser()
    meta, _, size = _parse(p)
    ref = meta.get("tokenizer.ggml.tokens")
    if isinstance(ref, list):
        return [str(t) for t in ref]
    if not isinstance(ref, ArrayRef):
        raise ModelFileError(f"{p} has no token list (tokenizer.ggml.tokens): it is not a text model with a "
                             f"tokenizer.")
    out: list[str] = []
    with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        off = ref.start
        for _ in range(ref.count):
            (n,) = struct.unpack_from("<Q", mm, off)
            out.append(mm[off + 8 : off + 8 + n].decode("utf-8", errors="replace"))
            off += 8 + n
    return out


# ----------------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------------
def _supported_list() -> str:
    vision = ", ".join(sorted(VISION_PROJECTORS))
    text = ", ".join(sorted(TEXT_ONLY_ARCHS))
    return f"with images: {vision} (Qwen3-VL recommended); text only: {text}"


def _inspected(path_or_info: str | os.PathLike[str] | ModelInfo, want: str) -> tuple[ModelInfo, Path]:
    """The file's ModelInfo, refused when it is the other kind (a text model given as the mmproj...)."""
    info = path_or_info if isinstance(path_or_info, ModelInfo) else inspect(path_or_info)
    p = info.path
    if info.kind != want and want == "text":
        raise ModelFileError(
            f"{p} is a vision projector (mmproj, {info.projector_type or 'clip'}), not a language model. "
            "Pass it as the mmproj (--mmproj) and pass the matching text model GGUF as the model.",
            title="mmproj given as the model")
    if info.kind != want:
        raise ModelFileError(
            f"{p} is a '{info.architecture}' language model, not a vision projector (mmproj). Pass the "
            f"model's "
            "mmproj file (usually named mmproj-*.gguf, next to the model) as --mmproj.",
            title="Model given as the mmproj")
    return info, p


def validate_text_model(path_or_info: str | os.PathLike[str] | ModelInfo, *,
                        need_vision: bool = False) -> ModelInfo:
    """Inspect a file meant as the text (agent or prophet) model and check what would abort llama.cpp."""
    info, p = _inspected(path_or_info, "text")
    arch = info.architecture
    if arch not in SUPPORTED_TEXT_ARCHS:
        raise ModelFileError(
            f"{p} is a '{arch}' model, which edge-agent does not support. Use a GGUF of a supported "
            f"architecture, {_supported_list()}.", title="Unsupported model")
    if need_vision and arch not in VISION_PROJECTORS:
        raise ModelFileError(
            f"{p} is a '{arch}' model without vision support, so it cannot look at images. Use a vision "
            f"model: {', '.join(sorted(VISION_PROJECTORS))} (Qwen3-VL-2B/4B-Instruct GGUF + its mmproj).",
            title="Model cannot see images")
    m = info.metadata
    if not info.n_vocab or info.tokenizer_model == "":
        raise ModelFileError(f"{p} has no tokenizer (tokenizer.ggml.tokens / tokenizer.ggml.model). Use a "
                             f"complete "
                             "GGUF conversion of the model.")
    if not info.n_embd or not info.n_layer:
        raise ModelFileError(f"{p} lacks {arch}.embedding_length or {arch}.block_count: the file is "
                             f"incomplete. "
                             "Download a complete GGUF conversion.")
    if info.tensor("token_embd.weight") is None:
        raise ModelFileError(f"{p} has no token_embd.weight tensor: the file is incomplete. Download it "
                             f"again.")
    if arch in ("qwen3vl", "qwen3vlmoe"):
        sections = m.get(f"{arch}.rope.dimension_sections")
        if not isinstance(sections, list) or len(sections) < 3:
            raise ModelFileError(f"{p}: {arch}.rope.dimension_sections (M-RoPE sections) is missing. The "
                                 f"file was "
                                 "converted by an old or broken script: use a current Qwen3-VL GGUF.")
        if info.n_deepstack >= info.n_layer:
            raise ModelFileError(
                f"{p}: {arch}.n_deepstack_layers = {info.n_deepstack} is not less than its {info.n_layer} "
                f"blocks; "
                "llama.cpp would abort on the first decode. The file is broken: use another conversion.")
    head_k = _int(m.get(f"{arch}.attention.key_length"))
    head_v = _int(m.get(f"{arch}.attention.value_length"))
    n_rot = _int(m.get(f"{arch}.rope.dimension_count"))
    if arch in MROPE_ARCHS and head_k and ((head_v and head_k != head_v) or (n_rot and n_rot != head_k)):
        raise ModelFileError(f"{p}: attention key length {head_k}, value length {head_v} and rope dimension "
                             f"{n_rot} must be equal for {arch}; llama.cpp would abort. Use another "
                             f"conversion.")
    return info


def validate_mmproj(path_or_info: str | os.PathLike[str] | ModelInfo) -> ModelInfo:
    """Inspect a file meant as the vision projector and check what would make clip/mtmd fail or abort."""
    info, p = _inspected(path_or_info, "mmproj")
    if not info.has_vision:
        raise ModelFileError(f"{p} is an mmproj without a vision encoder (audio only?). Use the model's "
                             f"vision mmproj.")
    known = set().union(*VISION_PROJECTORS.values())
    if info.projector_type not in known:
        raise ModelFileError(
            f"{p} is a '{info.projector_type}' projector, which edge-agent does not support. Supported: "
            f"{', '.join(sorted(known))}. Use the mmproj of a Qwen3-VL GGUF.", title="Unsupported mmproj")
    m = info.metadata
    missing = [k for k in ("clip.vision.embedding_length", "clip.vision.block_count",
                           "clip.vision.attention.head_count",
                           "clip.vision.image_size", "clip.vision.patch_size",
                           "clip.vision.feed_forward_length")
               if not _int(m.get(k))]
    if missing:
        raise ModelFileError(f"{p} lacks {', '.join(missing)}: the mmproj is incomplete. Download it again.")
    if info.projector_type.startswith("qwen"):
        _check_qwen_vision(info)
    return info


_BROKEN_MMPROJ = " Use the mmproj file published with the model (download it again)."


def _check_qwen_vision(info: ModelInfo) -> None:
    """Checks for asserts in clip's Qwen graphs (they abort the process instead of failing)."""
    p, m = info.path, info.metadata
    n_head = _int(m.get("clip.vision.attention.head_count"))
    if info.n_embd % n_head or (info.n_embd // n_head) % 4:
        raise ModelFileError(f"{p}: vision width {info.n_embd} with {n_head} heads gives a head size that is "
                             f"not a "
                             "multiple of 4, which Qwen's vision M-RoPE needs." + _BROKEN_MMPROJ)
    required = ["v.patch_embd.weight", "v.position_embd.weight", "mm.0.weight", "mm.2.weight", "mm.2.bias"]
    if info.projector_type == "qwen3vl_merger":
        required.append("v.patch_embd.bias")
    missing = [n for n in required if info.tensor(n) is None]
    if missing:
        raise ModelFileError(f"{p} lacks tensors {', '.join(missing)} that a {info.projector_type} mmproj "
                             f"needs; "
                             "llama.cpp would abort. Use the mmproj that belongs to the model.")
    if info.tensor("v.class_embd") is not None and info.projector_type == "qwen3vl_merger":
        raise ModelFileError(f"{p} has a class embedding, which a qwen3vl_merger mmproj must not "
                             "have." + _BROKEN_MMPROJ)
    pos = info.tensor("v.position_embd.weight")
    if pos is not None and info.projector_type == "qwen3vl_merger":
        if pos.type != "F32":
            raise ModelFileError(f"{p}: v.position_embd.weight is {pos.type}; llama.cpp needs it in F32. Use "
                                 f"an "
                                 "mmproj converted with current llama.cpp (F16 or F32 mmproj files keep it "
                                 "F32).")
        n_pos = pos.shape[1] if len(pos.shape) > 1 else 0
        if n_pos <= 0 or math.isqrt(n_pos) ** 2 != n_pos:
            raise ModelFileError(f"{p}: v.position_embd.weight has {n_pos} positions, not a square grid. The "
                                 "mmproj is broken." + _BROKEN_MMPROJ)
    for blk in {t.name.split(".")[2] for t in info.tensors if t.name.startswith("v.deepstack.")}:
        for part in ("norm.weight", "fc1.weight", "fc2.weight"):
            if info.tensor(f"v.deepstack.{blk}.{part}") is None:
                raise ModelFileError(f"{p}: deepstack merger {blk} lacks {part}." + _BROKEN_MMPROJ)


def _size_hint(text: ModelInfo, mmproj: ModelInfo) -> str:
    if text.architecture.startswith("qwen3vl"):
        want, got = _QWEN3VL_SIZES.get(text.n_embd), _QWEN3VL_SIZES.get(mmproj.projection_dim)
        if want and got:
            return f" The text model is Qwen3-VL-{want} but the mmproj is for Qwen3-VL-{got}."
    return ""


def check_pair(text: ModelInfo, mmproj: ModelInfo) -> None:
    """Raise ModelFileError unless ``mmproj`` is a vision projector that fits ``text``.

    Covers what makes ``mtmd_init_from_file`` return NULL or abort: wrong file kinds, a projector for another
    architecture, and the width invariant n_embd * (1 + n_deepstack) == projection * (1 + vision deepstack).
    """
    validate_text_model(text, need_vision=True)
    validate_mmproj(mmproj)
    allowed = VISION_PROJECTORS[text.architecture]
    if mmproj.projector_type not in allowed:
        raise ModelFileError(
            f"{mmproj.path.name} is a '{mmproj.projector_type}' projector but {text.path.name} is a "
            f"'{text.architecture}' model, which needs {' or '.join(sorted(allowed))}. Use the mmproj file "
            f"published "
            "with the model.", title="mmproj does not fit the model")
    if mmproj.n_embd_out != text.n_embd_inp:
        detail = (f"the mmproj produces image embeddings {mmproj.n_embd_out} wide "
                  f"({mmproj.projection_dim} x (1 + {mmproj.vision_deepstack} deepstack)) but the model "
                  f"reads {text.n_embd_inp} ({text.n_embd} x (1 + {text.n_deepstack} deepstack))")
        raise ModelFileError(
            f"{mmproj.path.name} does not fit {text.path.name}: {detail}.{_size_hint(text, mmproj)} Use the "
            f"mmproj "
            "from the same model repository and size as the model.", title="mmproj does not fit the model")
    if text.architecture.startswith("qwen3vl") and mmproj.projection_dim != text.n_embd:
        raise ModelFileError(
            f"{mmproj.path.name} projects to width {mmproj.projection_dim} but {text.path.name} has n_embd "
            f"{text.n_embd}.{_size_hint(text, mmproj)} Use the mmproj from the same model repository.",
            title="mmproj does not fit the model")


def check_same_tokenizer(a: ModelInfo, b: ModelInfo, *, max_listed: int = 5) -> None:
    """Raise ModelFileError unless ``a`` and ``b`` have identical token lists (SeProD compares token ids)."""
    for info in (a, b):
        if info.kind != "text" or not info.n_vocab:
            raise ModelFileError(f"{info.path} is not a text model with a tokenizer; SeProD needs two text "
                                 f"models. "
                                 "Pass the agent's text GGUF and its base model's text GGUF (not an mmproj).")
    if a.vocab_hash == b.vocab_hash:
        if a.eos_token_id != b.eos_token_id:
            raise ModelFileError(
                f"{a.path.name} and {b.path.name} have the same tokens but different end-of-sequence tokens "
                f"({a.eos_token_id} vs {b.eos_token_id}). Use the base model of the same family as the "
                f"prophet.",
                title="Tokenizers differ")
        return
    ta, tb = read_tokens(a.path), read_tokens(b.path)
    diffs: list[str] = []
    for i, (x, y) in enumerate(zip(ta, tb, strict=False)):
        if x != y:
            diffs.append(f"id {i}: {x!r} vs {y!r}")
            if len(diffs) >= max_listed:
                break
    n_diff = sum(1 for x, y in zip(ta, tb, strict=False) if x != y)
    parts = []
    if len(ta) != len(tb):
        parts.append(f"{len(ta)} vs {len(tb)} tokens")
    if n_diff:
        parts.append(f"{n_diff} differing ids (first: {'; '.join(diffs)})")
    raise ModelFileError(
        f"The prophet must share the agent model's tokenizer, but {a.path.name} and {b.path.name} differ: "
        f"{', '.join(parts)}. Use the base (un-finetuned) model of the same family and size as the prophet, "
        f"or "
        "turn SeProD off.", title="Tokenizers differ")


# ----------------------------------------------------------------------------------------------
# images and context size
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ImageTokens:
    """How an image of a given size enters the context: nx*ny tokens; M-RoPE advances positions by max(nx,
    ny)."""

    nx: int
    ny: int

    @property
    def n_tokens(self) -> int:
        return self.nx * self.ny

    @property
    def n_pos(self) -> int:
        return max(self.nx, self.ny)


def estimate_image_tokens(
    mmproj: ModelInfo, width: int, height: int, *, min_tokens: int = 0, max_tokens: int = 0
) -> ImageTokens:
    """Image tokens for a ``width`` x ``height`` image, following clip's Qwen resize rule ("smart resize").

    Qwen mergers: the image is scaled (aspect kept) to multiples of patch*merge px (32 for Qwen3-VL) holding
    between 8 and 4096 tokens (mtmd's image_min_tokens / image_max_tokens override those). Gemma3: always
    16x16. Exact for clip in llama.cpp 0.3.36 up to float rounding at exact .5 boundaries.
    """
    if width <= 0 or height <= 0:
        raise ConfigError(f"Image size {width}x{height} is not valid.", title="Image problem")
    if mmproj.projector_type == "gemma3":
        return ImageTokens(16, 16)
    if not mmproj.projector_type.startswith("qwen"):
        raise ConfigError(f"Cannot estimate image tokens for projector '{mmproj.projector_type}'.")
    merge = mmproj.spatial_merge_size or 2
    align = mmproj.patch_size * merge
    area = align * align
    min_px = (min_tokens or 8) * area
    max_px = (max_tokens or 4096) * area

    def rnd(x: float) -> int:  # std::round: half away from zero
        return int(math.floor(x / align + 0.5)) * align

    w_bar, h_bar = max(align, rnd(width)), max(align, rnd(height))
    if w_bar * h_bar > max_px:
        beta = math.sqrt(height * width / max_px)
        h_bar = max(align, math.floor(height / beta / align) * align)
        w_bar = max(align, math.floor(width / beta / align) * align)
    elif w_bar * h_bar < min_px:
        beta = math.sqrt(min_px / (height * width))
        h_bar = math.ceil(height * beta / align) * align
        w_bar = math.ceil(width * beta / align) * align
    return ImageTokens(w_bar // align, h_bar // align)


def check_context(
    n_ctx: int,
    *,
    prompt_tokens: int = 0,
    image_tokens: int = 0,
    reserve_tokens: int = 0,
    n_ctx_train: int = 0,
) -> int:
    """Raise ConfigError if ``n_ctx`` cannot hold the prompt, the images and ``reserve_tokens`` (answer,
    scored candidates); return the tokens left over. ``image_tokens`` is the sum of
    :func:`estimate_image_tokens` ``.n_tokens`` over the images (KV cells, not positions)."""
    if n_ctx <= 0:
        raise ConfigError(f"n_ctx = {n_ctx}: the context length must be positive. Set n_ctx (e.g. 8192) in "
                          f"the "
                          "settings or with EDGE_AGENT_N_CTX.")
    need = prompt_tokens + image_tokens + reserve_tokens
    if need > n_ctx:
        suggestion = 1 << max(need - 1, 1).bit_length()
        if n_ctx_train and suggestion > n_ctx_train >= need:
            suggestion = n_ctx_train
        limit = f" (the model was trained on up to {n_ctx_train})" if n_ctx_train else ""
        raise ConfigError(
            f"The context of {n_ctx} tokens is too small: the prompt needs {prompt_tokens}, the image(s) "
            f"{image_tokens} and the answer/scoring {reserve_tokens}, {need} in all. Set n_ctx to at least "
            f"{suggestion}{limit} (settings, or EDGE_AGENT_N_CTX={suggestion}), or use a smaller image.",
            title="Context too small")
    return n_ctx - need


def iter_arrays(path: str | os.PathLike[str]) -> Iterator[tuple[str, ArrayRef]]:
    """(key, ArrayRef) for every large metadata array of a GGUF (diagnostics)."""
    meta, _, _ = _parse(Path(path))
    for k, v in meta.items():
        if isinstance(v, ArrayRef):
            yield k, v


def main(argv: list[str] | None = None) -> int:
    """``python -m edge_agent.modelfiles.checks FILE...``: print what each header says and how long reading it
    took."""
    import time

    for arg in argv if argv is not None else sys.argv[1:]:
        t0 = time.perf_counter()
        try:
            info = inspect(arg)
        except ModelFileError as e:
            print(f"{arg}: {e}")
            continue
        dt = time.perf_counter() - t0
        print(f"{info.summary()}  [{dt * 1000:.1f} ms]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
