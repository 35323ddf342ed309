"""The chat store's SQLite schema: its tables, the full-text search index, and the migrations of older files.

Knows: ``chats``, ``messages`` and ``events`` (see ``edge_agent.chat.store`` for what each holds), the
messages' external-content FTS5 index kept in step by triggers (when this Python's SQLite has FTS5), and the
statements that take a file of each earlier version to the next. Does not know: how the store reads or
writes them.
"""

from __future__ import annotations

import sqlite3

# 2: messages.context (the saved context state at the end of an answer); 3: chats.models (the model files);
# 4: messages.replaced (an exchange a /retry or /edit replaced); 5: messages_fts (full-text search of texts);
# 6: messages.images (a question's images when it has several: a JSON list; ``image`` holds the first)
SCHEMA_VERSION = 6

SCHEMA = """
CREATE TABLE IF NOT EXISTS chats (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    models TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
    text TEXT NOT NULL DEFAULT '',
    image TEXT,
    status TEXT NOT NULL DEFAULT 'done',
    created REAL NOT NULL,
    context TEXT NOT NULL DEFAULT '',
    replaced INTEGER NOT NULL DEFAULT 0,
    images TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS messages_chat ON messages(chat_id, id);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_message ON events(message_id, seq);
"""
TABLES = ("chats", "messages", "events")


def _fts5() -> bool:
    """This Python's SQLite has FTS5 (the usual builds do; without it the search reads titles and texts with
    LIKE)."""
    try:
        sqlite3.connect(":memory:").execute("CREATE VIRTUAL TABLE t USING fts5(x)")
    except sqlite3.Error:
        return False
    return True


HAS_FTS5 = _fts5()
# The messages' texts indexed for search, kept in step by triggers (an external-content FTS5 table).
FTS = (
    "CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(text, content='messages', "
    "content_rowid='id')",
    "CREATE TRIGGER IF NOT EXISTS messages_fts_ai AFTER INSERT ON messages BEGIN "
    "INSERT INTO messages_fts(rowid, text) VALUES (new.id, new.text); END",
    "CREATE TRIGGER IF NOT EXISTS messages_fts_ad AFTER DELETE ON messages BEGIN "
    "INSERT INTO messages_fts(messages_fts, rowid, text) VALUES ('delete', old.id, old.text); END",
    "CREATE TRIGGER IF NOT EXISTS messages_fts_au AFTER UPDATE OF text ON messages BEGIN "
    "INSERT INTO messages_fts(messages_fts, rowid, text) VALUES ('delete', old.id, old.text); "
    "INSERT INTO messages_fts(rowid, text) VALUES (new.id, new.text); END",
    "INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')",
) if HAS_FTS5 else ()
MIGRATIONS: tuple[tuple[str, ...], ...] = (  # MIGRATIONS[v - 1] takes a version-v file to v + 1
    ("ALTER TABLE messages ADD COLUMN context TEXT NOT NULL DEFAULT ''",),
    ("ALTER TABLE chats ADD COLUMN models TEXT NOT NULL DEFAULT ''",),
    ("ALTER TABLE messages ADD COLUMN replaced INTEGER NOT NULL DEFAULT 0",),
    FTS,
    ("ALTER TABLE messages ADD COLUMN images TEXT NOT NULL DEFAULT ''",),
)


def statements() -> list[str]:
    """A new file's schema: the tables, then the search index."""
    return [s for s in SCHEMA.split(";") if s.strip()] + list(FTS)
