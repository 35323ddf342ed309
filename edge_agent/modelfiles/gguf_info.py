"""What a GGUF header says, read in Python before llama.cpp sees the file (the bytes: ``gguf_header``).

Knows: the metadata keys and tensor names llama.cpp 0.3.36 (vendored llama.cpp 0c1e570) reads for the
architectures we support, which architectures those are (vision needs a projector), and a header turned
into a :class:`ModelInfo` (``inspect``), a tokenizer's token list (``read_tokens``), the large arrays
(``iter_arrays``). Does not know: whether files fit together or what to tell the person about it (``checks``),
images and context sizes (``image_tokens``), llama_cpp (never imported).

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
import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import gguf

from edge_agent.core.errors import ModelFileError
from edge_agent.modelfiles.gguf_header import ArrayRef, TensorInfo, _parse

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



def iter_arrays(path: str | os.PathLike[str]) -> Iterator[tuple[str, ArrayRef]]:
    """(key, ArrayRef) for every large metadata array of a GGUF (diagnostics)."""
    meta, _, _ = _parse(Path(path))
    for k, v in meta.items():
        if isinstance(v, ArrayRef):
            yield k, v
