"""SQLite, the one way the app uses it (the search cache and the chat history).

Knows: how to open a file (autocommit, so writes say ``BEGIN IMMEDIATE``; a busy timeout; the WAL
journal, so readers never wait for a writer and several processes can share a file;
``synchronous=NORMAL``, so a committed write survives the app being killed, not a power cut;
foreign keys on), and the schema version convention: ``PRAGMA user_version``, 0 for a new file.
Does not know: any table, or how to word an error for the user (callers catch ``sqlite3.Error``
and say what to do about their file).
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path


class ForeignDatabase(sqlite3.DatabaseError):
    """The file is an SQLite database, but holds tables that are not ours: never write into it."""


def connect(path: Path | str, *, busy_timeout: float = 15.0,
            check_same_thread: bool = True) -> sqlite3.Connection:
    """An open connection to ``path`` (created if missing) with the pragmas above. Raises
    ``sqlite3.Error``."""
    conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None,
                           check_same_thread=check_same_thread)
    try:
        conn.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        _wal(conn)
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
    except BaseException:
        conn.close()
        raise
    return conn


def _wal(conn: sqlite3.Connection) -> None:
    # Switching to WAL takes an exclusive lock; another process doing the same at the same moment can
    # answer SQLITE_BUSY without the busy handler, so retry briefly. (WAL is unavailable on some network
    # file systems: the file then keeps its rollback journal and still works, just less concurrently.)
    for i in range(50):
        try:
            conn.execute("PRAGMA journal_mode=WAL").fetchone()
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) and "busy" not in str(e):
                raise
            time.sleep(0.02 * (i + 1))
    raise sqlite3.OperationalError("database is locked (another process holds it)")


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` (the write lock, taken up front) ... ``COMMIT``, or ``ROLLBACK`` on any
    exception."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def ensure_schema(conn: sqlite3.Connection, version: int, statements: Iterable[str], *,
                  tables: Collection[str]) -> int:
    """Create the schema in a new file; return the version the file had.

    0: the file was new (or empty), and ``statements`` (``CREATE ... IF NOT EXISTS``) ran and the version
    was set, in one transaction. ``version``: nothing to do (a read only, no write lock). Any other
    number: nothing was changed; the caller migrates an older file or refuses a newer one. Raises
    :class:`ForeignDatabase` when a version-0 file holds a table that is not one of ``tables``.
    """
    found = user_version(conn)
    if found != 0:
        return found
    with transaction(conn):
        found = user_version(conn)  # another process may have created it since
        if found == 0:
            present = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if present - set(tables) - {"sqlite_sequence"}:
                raise ForeignDatabase(f"unexpected tables: {', '.join(sorted(present - set(tables)))}")
            for sql in statements:
                conn.execute(sql)
            conn.execute(f"PRAGMA user_version={int(version)}")
    return found
