"""Damaged files are set aside, never deleted, and what can still be read of them is salvaged.

Knows: how to tell an SQLite file that is damaged (``SQLITE_CORRUPT``/``SQLITE_NOTADB``, or a failing
``PRAGMA quick_check``) from one that is only busy or unreadable, how to move a file (and its WAL)
aside under a ``.damaged-<time>`` name, and how to read every row still readable out of a damaged
copy: a zeroed header is rebuilt (the page size found by trying), and rows are read in rowid order,
stepping over the rowids a damaged page hides. The user is told once, through :func:`notice`: the
CLI prints the notices when its command ends, the app shows them as notifications.

Does not know: which tables a file has or what they mean (the chat store and the search cache say),
widgets, the terminal. Python's sqlite3 does not expose SQLite's recovery extension (the shell's
``.recover``), so the salvage here is row by row through ordinary queries.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import struct
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

_SQLITE_CORRUPT, _SQLITE_NOTADB = 11, 26
_HEADER = b"SQLite format 3\x00"
_PAGE_SIZES = (4096, 1024, 2048, 8192, 16384, 32768, 65536, 512)

_notices: list[str] = []
_lock = threading.Lock()


def notice(message: str) -> None:
    """Say ``message`` to the person once (the CLI prints it to stderr, the app as a notification)."""
    with _lock:
        _notices.append(message)


def take_notices() -> list[str]:
    """The notices not yet shown, oldest first; taking them empties the list."""
    with _lock:
        out = list(_notices)
        _notices.clear()
        return out


class Damaged(sqlite3.DatabaseError):
    """The file is damaged; ``reason``: SQLite's words, on one line."""

    def __init__(self, reason: str) -> None:
        self.reason = " ".join(reason.replace("*** in database main ***", "").split())[:200]
        super().__init__(self.reason)


def is_damage(e: BaseException) -> bool:
    """An SQLite error that means the file is damaged (not busy, locked, read-only or missing)."""
    return isinstance(e, Damaged) or (isinstance(e, sqlite3.DatabaseError) and getattr(
        e, "sqlite_errorcode", None) in (_SQLITE_CORRUPT, _SQLITE_NOTADB))


def check(conn: sqlite3.Connection) -> None:
    """Raise :class:`Damaged` unless ``PRAGMA quick_check`` finds the file sound (``O(file size)``: about
    0.1 s for 100 MB); a file too damaged for the check raises SQLite's own error (see :func:`is_damage`)."""
    row = conn.execute("PRAGMA quick_check(1)").fetchone()
    if row is not None and row[0] != "ok":
        raise Damaged(str(row[0]))


def set_aside(path: Path) -> Path:
    """Move ``path`` (and its ``-wal``/``-shm``) to ``<name>.damaged-<YYYYmmdd-HHMMSS>`` beside it and
    return the new path. Nothing is deleted."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = path.with_name(f"{path.name}.damaged-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
    os.replace(path, aside)
    for suffix in ("-wal", "-shm"):
        side = Path(f"{path}{suffix}")
        if side.exists():
            os.replace(side, Path(f"{aside}{suffix}"))
    return aside


def salvage(damaged: Path, into: sqlite3.Connection, tables: Sequence[str]) -> dict[str, int]:
    """Copy every readable row of ``tables`` from the file ``damaged`` (never written: a copy is read)
    into the same tables of ``into`` (created already; rows whose key is there are skipped). Returns
    rows copied per table. Columns are those both sides have, so an older schema salvages too."""
    with tempfile.TemporaryDirectory(prefix="edge-agent-salvage-") as tmp:
        copy = Path(tmp) / "damaged.sqlite3"
        shutil.copyfile(damaged, copy)
        if Path(f"{damaged}-wal").exists():  # committed answers may still be in the WAL only
            shutil.copyfile(f"{damaged}-wal", f"{copy}-wal")
        src = _open_readable(copy)
        if src is None:
            return {t: 0 for t in tables}
        try:
            return {t: _copy_table(src, into, t) for t in tables}
        finally:
            src.close()


def _open_readable(copy: Path) -> sqlite3.Connection | None:
    """A connection to ``copy`` that can read its schema; None when nothing makes it readable. A header
    whose page count says more than the file holds (a truncated file) gets the count the file has; a
    zeroed or garbled header is rebuilt, each page size tried."""
    conn = _try_open(copy)
    if conn is not None:
        return conn
    data = bytearray(copy.read_bytes())
    if len(data) < 512 or data[100] not in (0x05, 0x0D):  # page 1 must hold sqlite_master's b-tree
        return None
    wal = Path(f"{copy}-wal").exists()
    if data[:16] == _HEADER:
        size = struct.unpack(">H", data[16:18])[0]
        size = 65536 if size == 1 else size
        if size in _PAGE_SIZES:
            del data[len(data) // size * size:]  # a torn last page
            data[28:32] = struct.pack(">I", len(data) // size)
            copy.write_bytes(bytes(data))
            return _try_open(copy)
    for size in _PAGE_SIZES:
        if len(data) % size and not wal:
            continue
        data[:100] = _header(size, max(1, len(data) // size), wal)
        copy.write_bytes(bytes(data))
        conn = _try_open(copy)
        if conn is not None:
            return conn
    return None


def _try_open(path: Path) -> sqlite3.Connection | None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("SELECT name FROM sqlite_master").fetchall()
        return conn
    except sqlite3.DatabaseError:
        conn.close()
        return None


def _header(page_size: int, n_pages: int, wal: bool) -> bytes:
    """A plain 100-byte SQLite header (format 4, UTF-8, no freelist) for a file whose own was lost."""
    version = 2 if wal else 1
    return (_HEADER + struct.pack(">HBBBBBB", page_size if page_size < 65536 else 1, version, version, 0, 64,
                                  32, 32)
            + struct.pack(">IIIIIIIIIIII", 1, n_pages, 0, 0, 1, 4, 0, 0, 1, 0, 0, 0)
            + bytes(20) + struct.pack(">II", 1, sqlite3.sqlite_version_info[0] * 1_000_000
                                      + sqlite3.sqlite_version_info[
                                          1] * 1000 + sqlite3.sqlite_version_info[2]))


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    try:
        return [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
    except sqlite3.DatabaseError:
        return []


def _copy_table(src: sqlite3.Connection, dst: sqlite3.Connection, table: str) -> int:
    want = _columns(dst, table)
    have = _columns(src, table) or want
    cols = [c for c in want if c in have]
    if not cols:
        return 0
    names = ", ".join(cols)
    insert = f"INSERT OR IGNORE INTO {table}({names}) VALUES ({', '.join('?' * len(cols))})"
    n = 0
    dst.execute("BEGIN IMMEDIATE")
    try:
        for row in _rows(src, table, names):
            n += dst.execute(insert, row).rowcount
        dst.execute("COMMIT")
    except BaseException:
        dst.execute("ROLLBACK")
        raise
    return n


def _rows(src: sqlite3.Connection, table: str, names: str) -> Iterator[tuple]:
    """Every readable row: read in rowid order up to the first damage and past it, then from the end
    down (what a damaged page cuts off from the first pass); each row once."""
    seen: set[int] = set()
    for descending in (False, True):
        for rowid, row in _scan(src, table, names, descending):
            if rowid not in seen:
                seen.add(rowid)
                yield row


def _scan(src: sqlite3.Connection, table: str, names: str, descending: bool,
          batch: int = 256) -> Iterator[tuple[int, tuple]]:
    """(rowid, row) in rowid order (or reversed). A read that fails (a damaged page) is retried one row at
    a time; past a row that cannot be read, rowids are tried at growing strides (up to the largest rowid)."""
    op, order, sign = ("<", "DESC", -1) if descending else (">", "ASC", 1)
    last = sign * -(1 << 62)
    stride = 1
    while True:
        try:
            rows = src.execute(f"SELECT rowid, {names} FROM {table} WHERE rowid {op} ? ORDER BY rowid "
                               f"{order} "
                               "LIMIT ?", (last, batch)).fetchall()
        except sqlite3.DatabaseError:
            rows = None
        if rows is None and batch > 1:
            batch = 1  # find the exact row the damage starts at
            continue
        if rows is None:  # the row after `last` cannot be read: jump past it
            last += sign * stride
            stride *= 2
            if abs(last) > 1 << 62:
                return
            continue
        if not rows:
            return
        for row in rows:
            yield row[0], tuple(row[1:])
        last = rows[-1][0]
        stride, batch = 1, 256
