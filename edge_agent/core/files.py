"""Writing files so that a crash never leaves half of one: the one atomic-write helper.

Knows: temp file in the same folder, fsync, ``os.replace`` (atomic on POSIX and Windows), private
(0600) files for secrets. Does not know what the bytes mean. Every file the app writes whole
(config, catalog, eval results, cache exports, saved context states) goes through here.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from edge_agent.core.errors import WriteError

READ_ONLY, FULL = (errno.EROFS,), (errno.ENOSPC, errno.EDQUOT)
NOT_ALLOWED = (errno.EACCES, errno.EPERM)


def write_error(path: str | os.PathLike[str], e: OSError, *, what: str = "") -> WriteError:
    """``e`` (writing ``path`` failed) as the error a person reads: which file, why, and how to fix it."""
    path = Path(path)
    folder = path.parent
    name = what or str(path)
    if e.errno in READ_ONLY:
        why = (f"{folder} is on a read-only file system. Make it writable, or point EDGE_AGENT_HOME at a "
               f"writable "
               "folder")
    elif e.errno in FULL:
        why = f"the disk holding {folder} is full. Free some space and try again"
    elif e.errno in NOT_ALLOWED:
        why = (f"permission denied in {folder}. Make it writable (chmod u+w), or point EDGE_AGENT_HOME at a "
               "writable folder")
    else:
        why = f"{e.strerror or e}"
    return WriteError(f"Could not write {name}: {why}. Nothing was changed.", errno=e.errno,
                      filename=str(path))


def atomic_write(path: str | os.PathLike[str], data: bytes | str | Iterable[bytes | memoryview], *,
                 private: bool = False, fsync: bool = True) -> Path:
    """Write ``data`` to ``path`` atomically: readers see the old file or the whole new one, never a part.

    ``private``: the file is created 0600 (it holds secrets), whatever the umask. ``str`` is written
    as UTF-8; an iterable of byte pieces is written piece by piece (no joined copy of a large file). The
    folder is created if missing. A temp file left by a crash (``.<name>.*.tmp``) is never read as the file
    itself.
    """
    path = Path(path)
    try:
        return _atomic_write(path, data, private=private, fsync=fsync)
    except WriteError:
        raise
    except OSError as e:  # a read-only home, a full disk: the old file (or none) is still there, whole
        raise write_error(path, e) from None


def _atomic_write(path: Path, data: bytes | str | Iterable[bytes | memoryview], *, private: bool,
                  fsync: bool) -> Path:
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
