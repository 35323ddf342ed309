"""Images into a llama context through mtmd: one vision encode per image, the embedding reused.

Knows: mtmd's tokenize / encode / decode-embedding calls, and a process-wide cache of image
embeddings keyed by what determines them (the mmproj file's identity, mtmd's image-token limits, the
image bytes). Two models loaded with mmproj files of identical bytes (agent and SeProD prophet)
therefore encode an image once: the second decodes the first one's embedding into its own context.
Loaded so (``Model.load(share_vision_with=...)``) they also hold one copy of the projector's weights
(:class:`~edge_agent.runtime.tower.VisionTower`), and its calls run one at a time under its lock.
A crop or image seen again is not encoded again either. Does not know sessions, positions of the
conversation or prompts: ``Session.append_image`` and ``Model.encode_image`` drive these functions,
with the model's :class:`~edge_agent.runtime.handle.Handle` (its mtmd context, lock and core share).

Cost (why this exists): the vision encoder is the most expensive step of reading an image on a CPU
(a ViT over every 16x16 patch); decoding its n_tokens embeddings into the LLM is a prefill of n_tokens.
Memory: an embedding is n_tokens x n_embd_inp float32 (Qwen3-VL-2B, 576 tokens: 576 x 8192 x 4 B
~ 19 MB), so the cache holds a bounded number of bytes (``CACHE_BYTES``), least recently used out.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from edge_agent.core.errors import ImageError, ModelRuntimeError
from edge_agent.runtime._lib import M, clear_errors, recent_errors
from edge_agent.runtime.handle import Handle
from edge_agent.runtime.types import ImageChunk

CACHE_BYTES = 256 * 2**20

_lock = threading.Lock()
_cache: OrderedDict[str, Embedding] = OrderedDict()
_cache_bytes = 0
_encodes = 0  # vision encodes run by this process (all models)
_inflight: dict[str, threading.Event] = {}  # key -> set when its encode ends (one encode per key)


@dataclass(frozen=True)
class Embedding:
    """One image's vision-encoder output: ``data`` (n_tokens, n_embd) float32, as mtmd produced it."""

    data: np.ndarray
    encode_seconds: float


def vision_encodes() -> int:
    """Vision encodes run by this process so far (every model): a counter tests and benchmarks read."""
    return _encodes


def clear_cache() -> None:
    """Forget every cached embedding (tests; frees memory)."""
    global _cache_bytes
    with _lock:
        _cache.clear()
        _cache_bytes = 0


@dataclass(frozen=True)
class ImagePart:
    chunk: object  # mtmd_input_chunk pointer, valid inside ``prepare``


@dataclass
class Prepared:
    """An image tokenized by mtmd: text chunks (the wrapper tokens) around one image chunk."""

    parts: list[list[int] | ImagePart]
    width: int  # pixels mtmd got (before its own resize)
    height: int


@contextlib.contextmanager
def prepare(h: Handle, image: bytes) -> Iterator[Prepared]:
    """Decode the image bytes and tokenize them with mtmd's marker; frees the chunks afterwards."""
    mt = h.mtmd
    buf = (ctypes.c_uint8 * len(image)).from_buffer_copy(image)
    bitmap = M.mtmd_helper_bitmap_init_from_buf(mt, buf, len(image), False)
    if not bitmap:
        raise ImageError("The image could not be decoded. Attach a PNG or JPEG file.")
    chunks = M.mtmd_input_chunks_init()
    try:
        marker = M.mtmd_default_marker()
        txt = M.mtmd_input_text(text=marker, text_len=len(marker), add_special=False, parse_special=True)
        bitmaps = (M.mtmd_bitmap_p_ctypes * 1)(bitmap)
        with _tower_lock(h):  # a tower shared by two models (agent and prophet): one call at a time
            rc = M.mtmd_tokenize(mt, chunks, ctypes.byref(txt), bitmaps, 1)
        if rc != 0:
            raise ImageError(f"The vision projector could not prepare this image (code {rc}). Try another "
                             f"image.")
        parts: list[list[int] | ImagePart] = []
        for i in range(M.mtmd_input_chunks_size(chunks)):
            chunk = M.mtmd_input_chunks_get(chunks, i)
            kind = M.mtmd_input_chunk_get_type(chunk)
            if kind == M.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t(0)
                ptr = M.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                parts.append([int(ptr[j]) for j in range(n.value)])
            elif kind == M.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                parts.append(ImagePart(chunk))
            else:
                raise ImageError("The projector produced a non-image chunk; this model cannot read images.")
        if not any(isinstance(p, ImagePart) for p in parts):
            raise ImageError("The projector produced no image tokens for this image.")
        yield Prepared(parts, int(M.mtmd_bitmap_get_nx(bitmap)), int(M.mtmd_bitmap_get_ny(bitmap)))
    finally:
        M.mtmd_input_chunks_free(chunks)
        M.mtmd_bitmap_free(bitmap)


def _tower_lock(h: Handle) -> contextlib.AbstractContextManager[object]:
    tower = h.vision
    return tower.lock if tower is not None else contextlib.nullcontext()


def chunk_shape(chunk: object) -> tuple[int, int, int, int]:
    """(nx, ny, n_tokens, n_pos) of an image chunk (M-RoPE: n_pos = max(nx, ny))."""
    img = M.mtmd_input_chunk_get_tokens_image(chunk)
    return (int(M.mtmd_image_tokens_get_nx(img)), int(M.mtmd_image_tokens_get_ny(img)),
            int(M.mtmd_input_chunk_get_n_tokens(chunk)), int(M.mtmd_input_chunk_get_n_pos(chunk)))


def embedding(h: Handle, chunk: object, digest: str, mmproj_identity: str) -> tuple[Embedding, bool]:
    """The chunk's embedding: from the cache (second value True) or encoded now (False).
    ``mmproj_identity``: the projector file's identity (``model.file_identity``), part of the key."""
    nx, ny, n_tok, _ = chunk_shape(chunk)
    # the mmproj's bytes, the image's bytes and the grid mtmd resized it to determine the embedding
    # (two models with other image-token limits share it whenever the image fits both the same way)
    key = f"{mmproj_identity}:{nx}x{ny}:{digest}"
    while True:  # one encode per key: a second model asking while it runs waits for it (no CPU spent)
        with _lock:
            hit = _cache.get(key)
            if hit is not None:
                _cache.move_to_end(key)
                return hit, True
            busy = _inflight.get(key)
            if busy is None:
                _inflight[key] = threading.Event()
                break
        busy.wait()  # then the cache has it (or the encode failed: this caller encodes)
    try:
        return _encode(h, chunk, key, n_tok), False
    finally:
        with _lock:
            _inflight.pop(key).set()


def _encode(h: Handle, chunk: object, key: str, n_tok: int) -> Embedding:
    global _cache_bytes, _encodes
    with h.lock:
        t0 = time.perf_counter()
        tower = h.vision
        if tower is None:
            raise ModelRuntimeError("This model has no vision projector.")
        with h.computing(n_tok, encode=True), tower.lock:  # the output buffer is the tower's
            clear_errors()
            rc = tower.encode(chunk)
            if rc != 0:
                raise ModelRuntimeError(f"Encoding the image failed (code {rc}; "
                                        f"{recent_errors() or 'no details'}).")
            ptr = M.mtmd_get_output_embd(tower.ptr)
            data = np.ctypeslib.as_array(ptr, shape=(n_tok, h.n_embd_inp)).copy()
        emb = Embedding(data=data, encode_seconds=time.perf_counter() - t0)
        h.count_encode()
    with _lock:
        _encodes += 1
        _cache[key] = emb
        _cache_bytes += data.nbytes
        while _cache_bytes > CACHE_BYTES and len(_cache) > 1:
            _, old = _cache.popitem(last=False)
            _cache_bytes -= old.data.nbytes
    return emb


def decode_chunk(h: Handle, chunk: object, prep: Prepared, digest: str, n_pos: int, mmproj_identity: str,
                 px_per_token: int) -> ImageChunk:
    """Decode an image chunk into seq 0 from position ``n_pos``: its embedding from the cache or encoded
    now (:func:`embedding`), then mtmd's decode of it. Returns what was evaluated (the session applies it)."""
    nx, ny, n_tok, n_positions = chunk_shape(chunk)
    emb, reused = embedding(h, chunk, digest, mmproj_identity)
    t0 = time.perf_counter()
    new_pos = h.decode_image(chunk, emb.data, n_pos, 0, n_tok)
    if new_pos != n_pos + n_positions:
        raise ModelRuntimeError(f"mtmd advanced the position by {new_pos - n_pos}, expected {n_positions}.")
    px = px_per_token
    at = next(i for i, p in enumerate(prep.parts) if isinstance(p, ImagePart))  # mtmd's markers around it
    wrap = [sum(len(p) for p in ps if not isinstance(p, ImagePart)) for ps in (prep.parts[:at],
                                                                               prep.parts[at + 1:])]
    return ImageChunk(n_tokens=n_tok, n_pos=n_positions, nx=nx, ny=ny, width=nx * px if px else prep.width,
                      height=ny * px if px else prep.height, digest=digest,
                      encode_seconds=0.0 if reused else emb.encode_seconds,
                      decode_seconds=time.perf_counter() - t0,
                      reused=reused, wrap_before=wrap[0], wrap_after=wrap[1])
