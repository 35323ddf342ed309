"""Writing files so that a crash never leaves half of one: the one atomic-write helper.

Knows: temp file in the same folder, fsync, ``os.replace`` (atomic on POSIX and Windows), private
(0600) files for secrets. Does not know what the bytes mean. Every file the app writes whole
(config, catalog, eval results, cache exports, saved context states) goes through here.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path


def atomic_write(path: str | os.PathLike[str], data: bytes | str | Iterable[bytes | memoryview], *,
                 private: bool = False, fsync: bool = True) -> Path:
    """Write ``data`` to ``path`` atomically: readers see the old file or the whole new one, never a part.

    ``private``: the file is created 0600 (it holds secrets), whatever the umask. ``str`` is written
    as UTF-8; an iterable of byte pieces is written piece by piece (no joined copy of a large file). The folder is created if missing. A temp file left by a crash (``.<name>.*.tmp``) is
    never read as the file itself.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        pieces: Iterable[bytes | memoryview] = [data.encode("utf-8")]
    elif isinstance(data, bytes | bytearray | memoryview):
        pieces = [data]
    else:
        pieces = data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            if private:
                os.fchmod(f.fileno(), 0o600) if hasattr(os, "fchmod") else None
            elif hasattr(os, "fchmod"):
                umask = os.umask(0)
                os.umask(umask)
                os.fchmod(f.fileno(), 0o666 & ~umask)
            for piece in pieces:
                f.write(piece)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path
