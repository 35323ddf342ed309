"""Saved context states: seq 0 of a session (KV bytes and what llama.cpp does not keep), keyed, on disk.

Knows: what a state holds (the KV bytes of seq 0 from ``llama_state_seq_get_data``, plus the token
history with image digests, the image records, the M-RoPE position counter, the cell count and the
next-token logits, none of which llama.cpp keeps for us), the key of a context (the model's identity
and the exact token and image sequence), a file format that is checked before any byte reaches
llama.cpp, and a store with a disk budget and least-recently-used eviction. Does not import llama_cpp
(``Session.save_state`` / ``Model.restore`` move the bytes in and out of a context) and does not know
chats or prompts. The value itself, :class:`~edge_agent.runtime.types.SessionState`, is one of the
runtime's plain values (``types``), as is :class:`~edge_agent.runtime.types.StateError`.

File: ``EDGEKV01`` | u32 header length | header JSON | payload (history int32, logits float32, KV bytes).
The header carries the model identity, the key and the payload's SHA-256. A file is used only if all of
them match the model and the key asked for and the payload hashes right; a truncated, corrupted or
foreign file is ignored (and removed), never handed to llama.cpp. Files are written atomically
(temp file + rename), so a process killed while saving leaves the old file or none.

Sizes: a state is ~ n_cells x (per-token KV bytes): Qwen3-VL-2B with an F16 KV cache is ~112 KB a
token, 45 MB for a 400-token system prompt, 225 MB for a 2000-token chat; the tiny test model's are
kilobytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.core.files import atomic_write
from edge_agent.runtime.types import ImageChunk, SessionState, StateError

MAGIC = b"EDGEKV01"
FORMAT_VERSION = 1
SUFFIX = ".kvstate"
IMAGE = -1  # the history placeholder of an image (session.IMAGE)


_DIGESTS: dict[bytes, str] = {}  # the latest images' digests (a photo is matched at every question)
_DIGESTS_LOCK = threading.Lock()


def image_digest(image: bytes) -> str:
    """SHA-256 of an image's bytes: its identity in saved-state keys and in the embedding cache."""
    # immutable: a dict key (a bytes object hashes once; the same object is found at once)
    image = bytes(image)
    with _DIGESTS_LOCK:
        got = _DIGESTS.get(image)
    if got is None:
        got = hashlib.sha256(image).hexdigest()
        with _DIGESTS_LOCK:
            _DIGESTS[image] = got
            while len(_DIGESTS) > 4:
                del _DIGESTS[next(iter(_DIGESTS))]
    return got


def identity_digest(identity: dict[str, Any]) -> str:
    """A short digest of a model identity (``Model.identity``): the first input of every key."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]


class KeyHasher:
    """The key of a context, built incrementally: the same sequence gives the same key however it is
    split into runs (tokens are hashed as int32, an image as -1 followed by its SHA-256)."""

    def __init__(self, identity: dict[str, Any]) -> None:
        self._h = hashlib.sha256(identity_digest(identity).encode())

    def tokens(self, toks: Sequence[int]) -> KeyHasher:
        if toks:
            self._h.update(np.asarray(toks, dtype="<i4").tobytes())
        return self

    def image(self, digest: str) -> KeyHasher:
        self._h.update(struct.pack("<i", IMAGE) + bytes.fromhex(digest))
        return self

    def key(self) -> str:
        return self._h.copy().hexdigest()

    def copy(self) -> KeyHasher:
        c = KeyHasher.__new__(KeyHasher)
        c._h = self._h.copy()
        return c


def sequence_key(identity: dict[str, Any], history: Sequence[int], images: Sequence[ImageChunk]) -> str:
    """The key of a session's content: ``history`` with each IMAGE placeholder standing for the next image."""
    h = KeyHasher(identity)
    run: list[int] = []
    it = iter(images)
    for t in history:
        if t == IMAGE:
            h.tokens(run)
            run = []
            h.image(next(it).digest)
        else:
            run.append(t)
    return h.tokens(run).key()


def dumps(state: SessionState) -> list[bytes | memoryview]:
    """The file's bytes, as pieces (the KV part is not copied)."""
    hist = np.asarray(state.history, dtype="<i4").tobytes()
    logits = np.ascontiguousarray(state.logits, dtype="<f4").tobytes()
    kv = memoryview(np.ascontiguousarray(state.kv, dtype=np.uint8).data)
    h = hashlib.sha256(hist)
    h.update(logits)
    h.update(kv)
    header = {
        "version": FORMAT_VERSION, "identity": state.identity, "key": state.key, "label": state.label,
        "n_pos": state.n_pos, "n_cells": state.n_cells, "n_history": len(state.history),
        "n_vocab": int(state.logits.shape[0]), "kv_bytes": int(kv.nbytes), "sha256": h.hexdigest(),
        "images": [dataclasses.asdict(i) for i in state.images], "created": time.time(),
        "extra": state.extra,
    }
    head = json.dumps(header, sort_keys=True).encode()
    return [MAGIC, struct.pack("<I", len(head)), head, hist, logits, kv]


def loads(data: bytes | memoryview, *, identity: dict[str, Any], key: str) -> SessionState:
    """Parse and check a state file's bytes; raises StateError for anything but a perfect match."""
    view = memoryview(data)
    if len(view) < 12 or bytes(view[:8]) != MAGIC:
        raise StateError("not an edge-agent state file")
    (n_head,) = struct.unpack("<I", view[8:12])
    if 12 + n_head > len(view):
        raise StateError("truncated header")
    try:
        h = json.loads(bytes(view[12 : 12 + n_head]))
    except ValueError as e:
        raise StateError(f"bad header ({e})") from None
    if not isinstance(h, dict) or h.get("version") != FORMAT_VERSION:
        raise StateError("another format version")
    if h.get("identity") != identity:
        raise StateError("saved by another model, build or context setting")
    if h.get("key") != key:
        raise StateError("holds another context")
    try:
        n_hist, n_vocab, n_kv = int(h["n_history"]), int(h["n_vocab"]), int(h["kv_bytes"])
        images = [ImageChunk(**i) for i in h["images"]]
        n_pos, n_cells = int(h["n_pos"]), int(h["n_cells"])
    except (KeyError, TypeError, ValueError) as e:
        raise StateError(f"bad header ({e})") from None
    body = view[12 + n_head :]
    if len(body) != 4 * n_hist + 4 * n_vocab + n_kv:
        raise StateError("truncated or padded payload")
    digest = hashlib.sha256(body).hexdigest()
    if digest != h.get("sha256"):
        raise StateError("payload checksum mismatch (corrupted)")
    history = np.frombuffer(body[: 4 * n_hist], dtype="<i4").astype(np.int64).tolist()
    logits = np.frombuffer(body[4 * n_hist : 4 * (n_hist + n_vocab)], dtype="<f4").copy()
    kv = np.frombuffer(body[4 * (n_hist + n_vocab) :], dtype=np.uint8).copy()
    if sum(1 for t in history if t == IMAGE) != len(images):
        raise StateError("image records do not match the history")
    if sequence_key(identity, history, images) != key:
        raise StateError("the history does not hash to its key")
    return SessionState(identity=identity, key=key, history=history, images=images, n_pos=n_pos,
                        n_cells=n_cells, logits=logits, kv=kv, label=str(h.get("label", "")),
                        extra=dict(h.get("extra") or {}))


class StateStore:
    """Saved states in one folder, at most ``budget_bytes`` in all (least recently used out).

    ``put`` writes in a background thread (a real model's state is tens to hundreds of MB; the
    answer should not wait for the disk); ``flush`` waits for pending writes (call before exit).
    Thread-safe.
    """

    def __init__(self, directory: Path | str, budget_bytes: int) -> None:
        self.dir = Path(directory)
        self.budget = int(budget_bytes)
        self._lock = threading.Lock()
        self._writers: list[threading.Thread] = []
        self.errors: list[str] = []  # write failures (disk full...): states are an optimisation

    def path(self, key: str) -> Path:
        return self.dir / f"{key}{SUFFIX}"

    def has(self, key: str) -> bool:
        return self.path(key).is_file()

    def get(self, key: str, identity: dict[str, Any]) -> SessionState | None:
        """The state saved under ``key`` if it is whole and matches ``identity``; else None (a damaged
        file is removed). Reading marks it recently used."""
        p = self.path(key)
        try:
            data = p.read_bytes()
        except OSError:
            return None
        try:
            state = loads(data, identity=identity, key=key)
        except StateError:
            self.discard(key)
            return None
        try:
            os.utime(p)
        except OSError:
            pass
        return state

    def put(self, state: SessionState, *, wait: bool = False) -> None:
        """Save ``state`` under its key (atomically), then evict down to the budget."""
        if self.budget <= 0 or state.nbytes > self.budget:
            return

        def write() -> None:  # hashing and writing hundreds of MB happen off the answer's path
            try:
                atomic_write(self.path(state.key), dumps(state), private=True, fsync=False)  # chat content
                self.evict(keep=state.key)
            except OSError as e:
                self.errors.append(f"{self.path(state.key).name}: {e}")

        if wait:
            write()
            return
        th = threading.Thread(target=write, name="edge-agent-state-write", daemon=True)
        with self._lock:
            self._writers = [w for w in self._writers if w.is_alive()] + [th]
        th.start()

    def flush(self) -> None:
        """Wait for background writes."""
        with self._lock:
            writers = list(self._writers)
        for w in writers:
            w.join()

    def discard(self, key: str) -> None:
        try:
            self.path(key).unlink()
        except OSError:
            pass

    def files(self) -> list[Path]:
        try:
            return [p for p in self.dir.iterdir() if p.suffix == SUFFIX and p.is_file()]
        except OSError:
            return []

    def stats(self) -> dict[str, int]:
        """{"files": n, "bytes": total, "budget": budget_bytes}."""
        files = self.files()
        total = 0
        for p in files:
            try:
                total += p.stat().st_size
            except OSError:
                pass
        return {"files": len(files), "bytes": total, "budget": self.budget}

    def evict(self, keep: str = "") -> int:
        """Remove least recently used states until the folder fits the budget; returns files removed."""
        with self._lock:
            entries = []
            for p in self.files():
                try:
                    st = p.stat()
                except OSError:
                    continue
                entries.append((st.st_mtime, st.st_size, p))
            entries.sort()
            total = sum(e[1] for e in entries)
            removed = 0
            for _, size, p in entries:
                if total <= self.budget:
                    break
                if p.stem == keep:
                    continue
                try:
                    p.unlink()
                except OSError:
                    continue
                total -= size
                removed += 1
            return removed

    def clear(self) -> int:
        """Remove every saved state (and temp files left by a crash); returns files removed."""
        self.flush()
        n = 0
        try:
            paths = list(self.dir.iterdir())
        except OSError:
            return 0
        for p in paths:
            if p.suffix == SUFFIX or (p.name.startswith(".") and p.name.endswith(".tmp")):
                try:
                    p.unlink()
                    n += p.suffix == SUFFIX
                except OSError:
                    pass
        return n
