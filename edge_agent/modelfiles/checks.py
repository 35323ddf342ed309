"""Inspect and validate GGUF model files in Python, before llama.cpp sees them (the bytes: ``gguf_header``).

llama.cpp aborts the whole process (GGML_ASSERT) on several files that do not fit together: an mmproj
whose projection width does not match the text model, Qwen3-VL with as many deepstack layers as blocks,
a vision tower without a patch bias... This module turns every such problem, read from the GGUF *header* only
(``gguf_info.inspect``: metadata and tensor table; never tensor data), into a :class:`ModelFileError` whose
message says how to fix it.

What it knows: which files llama.cpp 0.3.36 (vendored llama.cpp 0c1e570) can load alone and together
(architectures, a vision tower's shapes, an mmproj's width against the text model's, one tokenizer for
the agent and the prophet), and how to say what to do. ``inspect``, ``ModelInfo`` and ``read_tokens``
come from ``gguf_info`` (callers may use them from here); images and context sizes are ``image_tokens``.
What it does not know: whether llama.cpp will really load a file (weights can still be garbage), and
nothing of llama_cpp itself (this module never imports it; the runtime calls these checks first).

``python -m edge_agent.modelfiles.checks FILE`` prints what each header says and how long reading it took.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

from edge_agent.core.errors import ModelFileError
from edge_agent.modelfiles.gguf_info import (  # noqa: F401  (read_tokens: its API)
    MROPE_ARCHS,
    SUPPORTED_TEXT_ARCHS,
    TEXT_ONLY_ARCHS,
    VISION_PROJECTORS,
    ModelInfo,
    _int,
    inspect,
    read_tokens,
)

# Qwen3-VL text widths -> the size users know (a wrong-size mmproj is the usual mistake).
_QWEN3VL_SIZES = {2048: "2B", 2560: "4B", 4096: "8B", 5120: "32B"}


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
