"""The GGUF container, read safely: a bounds-checked parser of a GGUF file's header (metadata and
tensor table) over an mmap, never touching tensor data.

Knows: the GGUF binary layout (magic, version, typed key-value pairs, tensor infos) and how to fail on
a truncated or foreign file without crashing. Does not know what any key means for llama.cpp or
which models fit together: ``edge_agent.modelfiles.checks`` builds on this.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf

from edge_agent.core.errors import ModelFileError

GGUF_MAGIC = b"GGUF"

_SCALAR_FMT = {  # GGUFValueType -> struct format
    gguf.GGUFValueType.UINT8: "B", gguf.GGUFValueType.INT8: "b",
    gguf.GGUFValueType.UINT16: "H", gguf.GGUFValueType.INT16: "h",
    gguf.GGUFValueType.UINT32: "I", gguf.GGUFValueType.INT32: "i",
    gguf.GGUFValueType.FLOAT32: "f", gguf.GGUFValueType.BOOL: "?",
    gguf.GGUFValueType.UINT64: "Q", gguf.GGUFValueType.INT64: "q",
    gguf.GGUFValueType.FLOAT64: "d",
}
_SMALL_ARRAY = 64  # arrays up to this many elements are decoded; longer ones are only located


@dataclass(frozen=True)
class ArrayRef:
    """A large metadata array left in the file: element type, count and byte range [start, end)."""

    type: int
    count: int
    start: int
    end: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order (ne[0] first): a linear layer is (n_in, n_out)
    type: str  # ggml type name, e.g. "F32", "Q4_K"
    offset: int  # absolute byte offset in the file
    nbytes: int


# ----------------------------------------------------------------------------------------------
# header parser
# ----------------------------------------------------------------------------------------------
class _Corrupt(Exception):
    """Raised inside the parser; turned into ModelFileError with the path and a fix."""


class _Header:
    """Parse a GGUF header from a buffer with bounds checks on every read (truncated files must not crash)."""

    def __init__(self, buf: Any, size: int) -> None:
        self.buf = buf
        self.size = size
        self.off = 0

    def _need(self, n: int) -> None:
        if n < 0 or self.off + n > self.size:
            raise _Corrupt(f"the file ends at byte {self.size} inside the header (needed {n} bytes at "
                           f"{self.off})")

    def unpack(self, fmt: str) -> Any:
        n = struct.calcsize("<" + fmt)
        self._need(n)
        v = struct.unpack_from("<" + fmt, self.buf, self.off)
        self.off += n
        return v[0] if len(v) == 1 else v

    def string(self) -> str:
        n = self.unpack("Q")
        self._need(n)
        raw = bytes(self.buf[self.off : self.off + n])
        self.off += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype == gguf.GGUFValueType.STRING:
            return self.string()
        if vtype == gguf.GGUFValueType.ARRAY:
            etype = self.unpack("I")
            count = self.unpack("Q")
            start = self.off
            if etype == gguf.GGUFValueType.STRING:
                if count > (self.size - self.off) // 8:
                    raise _Corrupt(f"a string array claims {count} elements, more than the file can hold")
                if count <= _SMALL_ARRAY:
                    return [self.string() for _ in range(count)]
                unpack_from, buf, off, size = struct.unpack_from, self.buf, self.off, self.size
                for _ in range(count):  # walk the lengths; ~50 ms for Qwen's 151k tokens
                    if off + 8 > size:
                        raise _Corrupt(f"the file ends at byte {size} inside a string array")
                    off += 8 + unpack_from("<Q", buf, off)[0]
                if off > size:
                    raise _Corrupt(f"the file ends at byte {size} inside a string array")
                self.off = off
                return ArrayRef(etype, count, start, off)
            if etype not in _SCALAR_FMT:
                raise _Corrupt(f"unknown metadata array element type {etype}")
            fmt = _SCALAR_FMT[gguf.GGUFValueType(etype)]
            nbytes = count * struct.calcsize("<" + fmt)
            self._need(nbytes)
            if count <= _SMALL_ARRAY:
                vals = list(struct.unpack_from(f"<{count}{fmt}", self.buf, self.off))
                self.off += nbytes
                return vals
            self.off += nbytes
            return ArrayRef(etype, count, start, self.off)
        if vtype not in _SCALAR_FMT:
            raise _Corrupt(f"unknown metadata value type {vtype}")
        return self.unpack(_SCALAR_FMT[gguf.GGUFValueType(vtype)])


def _parse(path: Path) -> tuple[dict[str, Any], list[TensorInfo], int]:
    """(metadata, tensors, file size) of a GGUF file; ModelFileError on anything that is not a sound GGUF."""
    _check_path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if head[:4] != GGUF_MAGIC:
            raise _not_gguf(path, head)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            try:
                return _parse_buffer(path, mm, size)
            except _Corrupt as e:
                raise ModelFileError(
                    f"{path} is truncated or corrupt: {e}. The download was probably interrupted: "
                    "delete the file and download it again.", title="Damaged model file") from None


def _parse_buffer(path: Path, mm: Any, size: int) -> tuple[dict[str, Any], list[TensorInfo], int]:
    h = _Header(mm, size)
    h.off = 4
    version = h.unpack("I")
    if version & 0xFFFF == 0:
        raise ModelFileError(f"{path} is a big-endian GGUF; llama.cpp on this machine needs a little-endian "
                             f"one.")
    if version not in (2, 3):
        raise ModelFileError(f"{path} is GGUF version {version}; llama.cpp 0.3.36 reads versions 2 and 3. "
                             "Download a current conversion of the model.")
    n_tensors = h.unpack("Q")
    n_kv = h.unpack("Q")
    # Each tensor info is at least 8+1 + 4 + 8 + 4 + 8 bytes, each kv at least 8+1 + 4 + 1.
    if n_tensors > size // 33 or n_kv > size // 14:
        raise _Corrupt(f"it claims {n_tensors} tensors and {n_kv} metadata keys, more than its {size} bytes "
                       f"can hold")
    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = h.string()
        meta[key] = h.value(h.unpack("I"))
    raw_tensors = []
    for _ in range(n_tensors):
        name = h.string()
        n_dims = h.unpack("I")
        if n_dims > 8:
            raise _Corrupt(f"tensor {name!r} claims {n_dims} dimensions")
        shape = tuple(h.unpack("Q") for _ in range(n_dims))
        ttype = h.unpack("I")
        offset = h.unpack("Q")
        raw_tensors.append((name, shape, ttype, offset))
    align = meta.get("general.alignment", 32)
    if not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise _Corrupt(f"general.alignment {align!r} is not a power of two")
    data_start = h.off + (-h.off) % align
    tensors: list[TensorInfo] = []
    for name, shape, ttype, offset in raw_tensors:
        try:
            qtype = gguf.GGMLQuantizationType(ttype)
            block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise ModelFileError(
                f"{path}: tensor {name!r} has tensor type {ttype}, unknown to this version of edge-agent's "
                "llama.cpp (0.3.36). Use a quantization such as Q4_K_M, Q8_0 or F16.") from None
        n = math.prod(shape)
        if n % block:
            raise _Corrupt(f"tensor {name!r} has {n} elements, not a multiple of its {qtype.name} block of "
                           f"{block}")
        nbytes = n // block * type_size
        start = data_start + offset
        if start + nbytes > size:
            raise _Corrupt(f"tensor {name!r} needs bytes up to {start + nbytes} but the file has {size} "
                           f"({(start + nbytes - size) / 2**20:.1f} MiB missing)")
        tensors.append(TensorInfo(name, shape, qtype.name, start, nbytes))
    return meta, tensors, size


def _check_path(path: Path) -> None:
    if not path.exists():
        raise ModelFileError(
            f"Model file not found: {path}. Check the path, or run `edge-agent models` to see installed "
            f"models.",
            title="Model file not found")
    if path.is_dir():
        ggufs = sorted(p.name for p in path.glob("*.gguf"))[:5]
        hint = f" It holds: {', '.join(ggufs)}." if ggufs else " It holds no .gguf files."
        raise ModelFileError(f"{path} is a directory, not a GGUF file.{hint} Pass the path of the .gguf file "
                             f"itself.")
    if not os.access(path, os.R_OK):
        raise ModelFileError(f"{path} is not readable. Fix its permissions (chmod +r).")
    if path.stat().st_size == 0:
        raise ModelFileError(f"{path} is empty (0 bytes): the download or copy failed. Delete it and "
                             f"download "
                             "the model again.", title="Damaged model file")
    if path.stat().st_size < 24:
        with open(path, "rb") as f:
            head = f.read(8)
        if head[:4] != GGUF_MAGIC:  # a text file, a note: not a model at all (nothing is damaged)
            raise _not_gguf(path, head)
        raise ModelFileError(f"{path} is only {path.stat().st_size} bytes: too short for a GGUF header. "
                             f"Delete it "
                             "and download the model again.", title="Damaged model file")


def _not_gguf(path: Path, head: bytes) -> ModelFileError:
    return ModelFileError(f"{path} is not a GGUF model file (it starts with {head[:4]!r}, not b'GGUF'). "
                          f"{_not_gguf_hint(path, head)}", title="Not a GGUF model")


def _not_gguf_hint(path: Path, head: bytes) -> str:
    if head.startswith(b"PK"):
        return "It looks like a zip archive: unpack it and pass the .gguf inside."
    if head[:2] == b"\x1f\x8b":
        return "It looks gzip-compressed: decompress it first."
    if head.startswith((b"<!DO", b"<htm", b"<HTM", b"{")):
        return ("It looks like a web page or JSON, not a model: the download probably saved an error page. "
                "Download the .gguf file itself.")
    if path.suffix in (".safetensors", ".bin", ".pt", ".pth"):
        return ("It looks like a PyTorch/safetensors checkpoint: use a GGUF conversion (e.g. from a -GGUF "
                "repo).")
    return "Pass a .gguf model file (e.g. Qwen3-VL-2B-Instruct-Q4_K_M.gguf)."
