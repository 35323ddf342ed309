"""Chat persistence: chats, their messages and every agent event of every answer, in embedded SQLite.

Knows: how to write an answer event by event (one small transaction each, WAL, so a chat survives
the app being killed mid-answer; ``events.event_from_json`` rebuilds the typed events) and how to keep
API keys out of what it stores (``edge_agent.core.redaction``). The schema and its migrations are
``chat.schema``'s; a chat's Markdown and JSON exports are ``chat.export``'s.
Does not know: models, widgets or the network. Thread-safe: the TUI writes from its engine worker
thread and reads from the UI thread through one connection guarded by a lock.

Layout: ``chats(id, title, created, updated, models)`` (models: JSON of the model files the chat's last
answer was made with, {"model", "mmproj", "prophet", "prophet_mmproj"}: paths, "" for none);
``messages(id, chat_id, role, text, image, status, created, context, replaced, images)``: role ``user`` or
``assistant``, an assistant status ``running`` until its run ends (``answered``, ``turn_limit``,
``cancelled``, ``error``), ``replaced`` 1: a /retry or /edit took this exchange's place (shown, not
continued: never in the model's context again), ``images`` a question's several images (JSON); ``events(
message_id, seq, kind, data)``: ``Event.to_json()`` of each event of an answer. A ``running`` answer found
on open was cut off by a crash and reads as ``interrupted``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_agent.agent import events as ev
from edge_agent.agent.events import event_from_json
from edge_agent.chat.schema import HAS_FTS5, MIGRATIONS, SCHEMA_VERSION, TABLES, statements
from edge_agent.core import recovery, sqlitedb
from edge_agent.core.errors import EdgeAgentError
from edge_agent.core.redaction import redact_tree
from edge_agent.core.textclean import clean_event, clean_model_text


@dataclass(frozen=True)
class ChatSummary:
    """One row of the chats list (Ctrl+O): no messages loaded."""

    id: int
    title: str
    created: float
    updated: float
    n_messages: int


@dataclass
class Message:
    """One message. ``events`` (assistant only) are the typed agent events in the order they came."""

    id: int
    role: str
    text: str
    image: str | None
    status: str
    created: float
    events: list[ev.Event] = field(default_factory=list)
    replaced: bool = False  # a /retry or /edit took this exchange's place
    more_images: tuple[str, ...] = ()  # a question with several images: those after ``image``

    @property
    def images(self) -> list[str]:
        """The question's images, in order (``image`` and ``more_images``)."""
        return ([self.image] if self.image else []) + list(self.more_images)


@dataclass
class Chat:
    id: int
    title: str
    created: float
    updated: float
    messages: list[Message] = field(default_factory=list)
    models: dict[str, str] = field(default_factory=dict)  # the model files of its last answer ({}: unknown)

    @property
    def images(self) -> list[str]:
        """Every image attached in this chat, in order (a chat, and a question, can hold several)."""
        return [p for m in self.messages if m.role == "user" for p in m.images]


@dataclass
class Continuation:
    """A chat as the engine continues it: the saved context key of its last kept answer, its
    finished (question, answer) pairs (for a rebuild) and its current image(s)."""

    chat_id: int
    exchanges: list[tuple[str, str, str]] = field(default_factory=list)  # (question, answer, context key)
    image: str | None = None  # the last image asked about (the first of the last question's several)
    images: list[str | tuple[str, ...] | None] = field(default_factory=list)  # per exchange (a tuple: more)
    last_images: tuple[str, ...] = ()  # the images of the last question that had any
    models: dict[str, str] = field(default_factory=dict)  # the files of its last answer ({}: not recorded)

    @property
    def context(self) -> str:
        """The key of the last answer that was kept in the model's context ('' for none: a new context).
        A cancelled or failed answer has none: the model's context was rolled back before it."""
        return next((c for _, _, c in reversed(self.exchanges) if c), "")

    @property
    def history(self) -> list[tuple[str, str]]:
        return [(q, a) for q, a, _ in self.exchanges if a]

    @property
    def turns(self) -> list[tuple[str, str, str | tuple[str, ...] | None]]:
        """The answered exchanges with the image each question was asked with: (question, answer, image)."""
        images = self.images + [None] * (len(self.exchanges) - len(self.images))
        return [(q, a, img) for (q, a, _), img in zip(self.exchanges, images, strict=True) if a]


class ChatStoreError(EdgeAgentError):
    title = "Chat history problem"


class ChatStore:
    """All chats in one SQLite file (``Settings.chats_path``). Open once per process; close at exit."""

    def __init__(self, path: Path | str, *, secrets: Iterable[str] = ()) -> None:
        self.path = Path(path)
        self._secrets = [s for s in secrets if s]
        self._lock = threading.RLock()
        # why this store cannot be saved ('' when it can): then it is a copy in memory of the file (or an
        # empty one), read and written as usual, and nothing reaches the disk (a read-only home)
        self.read_only = ""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                self._db = self._open()
            except sqlite3.DatabaseError as e:
                if not recovery.is_damage(e):
                    raise
                self._db = self._recover(recovery.Damaged(str(e)).reason)  # set aside, salvaged, said once
            # Answers still 'running' were cut off when the app last died.
            self._db.execute("UPDATE messages SET status='interrupted' WHERE status='running'")
        except (sqlite3.DatabaseError, OSError) as e:
            why = self._unwritable(e)
            if not why:
                raise ChatStoreError(
                    f"Cannot open the chat history {self.path} ({e}). It may be damaged: move it away (it is "
                    f"kept) "
                    "to start a fresh one.") from e
            self._db = self._in_memory(why)

    def _unwritable(self, e: BaseException) -> int:
        """Why the open failed when it is that the file or its folder cannot be written: EROFS (read-only,
        also a folder root cannot write to), ENOSPC (the disk is full), EACCES; 0 for anything else."""
        folder = self.path.parent
        try:
            if shutil.disk_usage(folder).free < 64 * 1024 or "disk is full" in str(e):
                return errno.ENOSPC
        except OSError:
            pass
        if isinstance(e, OSError) and e.errno in (errno.EROFS, errno.ENOSPC, errno.EACCES, errno.EPERM):
            return e.errno
        probe = _probe(folder)  # the folder's own answer: read-only, not allowed, or writable (0)
        if probe:
            return probe
        if self.path.exists() and not os.access(self.path, os.W_OK):
            return errno.EACCES
        return errno.EROFS if "readonly" in str(e) else 0

    def _in_memory(self, why: int) -> sqlite3.Connection:
        """A read-only view: the file copied into memory (read without locks: nothing else can write to a
        read-only folder), or an empty store when there is no file. Raises ChatStoreError when even reading
        fails."""
        from edge_agent.core.files import write_error

        err = OSError(why, os.strerror(why))
        self.read_only = write_error(self.path, err, what=f"the chat history {self.path}").message
        mem = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        mem.row_factory = sqlite3.Row
        try:
            if self.path.exists():
                src = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
                try:
                    src.backup(mem)
                finally:
                    src.close()
            version = sqlitedb.ensure_schema(mem, SCHEMA_VERSION, statements(), tables=TABLES)
            if 0 < version < SCHEMA_VERSION:
                for step in MIGRATIONS[version - 1:SCHEMA_VERSION - 1]:
                    for sql in step:
                        mem.execute(sql)
            mem.execute("PRAGMA foreign_keys=ON")
        except sqlite3.DatabaseError as e2:
            mem.close()
            raise ChatStoreError(f"Cannot read the chat history {self.path} ({e2}).") from e2
        return mem

    def _open(self) -> sqlite3.Connection:
        """The file opened, created or migrated to this schema, and checked (``PRAGMA quick_check``).
        Raises sqlite3.DatabaseError (``recovery.is_damage``: a damaged file), ChatStoreError for a newer
        one."""
        db = sqlitedb.connect(self.path, check_same_thread=False)
        try:
            db.row_factory = sqlite3.Row
            version = sqlitedb.ensure_schema(db, SCHEMA_VERSION, statements(), tables=TABLES)
            if 0 < version < SCHEMA_VERSION:  # older files: add the columns (and the search index)
                with sqlitedb.transaction(db):
                    version = sqlitedb.user_version(db)  # another process may have migrated it since
                    for step in MIGRATIONS[version - 1:SCHEMA_VERSION - 1]:
                        for sql in step:
                            db.execute(sql)
                    db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                version = SCHEMA_VERSION
            if version > SCHEMA_VERSION:
                raise ChatStoreError(
                    f"{self.path} was written by a newer edge-agent (schema {version}). "
                    "Upgrade edge-agent, or move the file away to start a fresh history."
                )
            recovery.check(db)
        except BaseException:
            db.close()
            raise
        return db

    def _recover(self, reason: str) -> sqlite3.Connection:
        """Move the damaged file aside, open a new one and copy into it every chat, message and event
        still readable; messages whose chat was lost get a chat of their own ("Recovered chat")."""
        try:
            aside: Path | None = recovery.set_aside(self.path)
        except FileNotFoundError:  # another process set it aside first (and salvages it)
            aside = None
        db = self._open()
        if aside is None:
            return db
        db.execute("PRAGMA foreign_keys=OFF")  # rows arrive table by table; orphans are mended below
        counts = recovery.salvage(aside, db, TABLES)
        with sqlitedb.transaction(db):
            db.execute("INSERT INTO chats(id, title, created, updated) SELECT chat_id, 'Recovered chat', "
                       "MIN(created), MAX(created) FROM messages WHERE chat_id NOT IN (SELECT id FROM chats) "
                       "GROUP BY chat_id")
            db.execute("DELETE FROM events WHERE message_id NOT IN (SELECT id FROM messages)")
        db.execute("PRAGMA foreign_keys=ON")
        n_chats = db.execute("SELECT COUNT(*) FROM chats").fetchone()[0]
        recovery.notice(
            f"The chat history {self.path} was damaged ({reason}). Recovered {n_chats} chats, "
            f"{counts['messages']} messages and {counts['events']} answer events into a new file; the "
            f"damaged file is kept as {aside}.")
        return db

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _exec(self, sql: str, args: tuple = ()) -> sqlite3.Cursor:
        with self._lock:
            return self._db.execute(sql, args)

    # --- chats ---
    def new_chat(self, title: str = "New chat") -> int:
        now = time.time()
        return int(self._exec("INSERT INTO chats(title, created, updated) VALUES (?, ?, ?)", (title, now,
                                                                                              now)).lastrowid)

    def load_title(self, chat_id: int) -> str:
        row = self._exec("SELECT title FROM chats WHERE id=?", (chat_id,)).fetchone()
        return row[0] if row else ""

    def recent_questions(self, limit: int = 200) -> list[str]:
        """The last ``limit`` questions over all chats, oldest first (the prompt's Up-arrow history)."""
        rows = self._exec("SELECT text FROM messages WHERE role='user' ORDER BY id DESC LIMIT ?",
                          (limit,)).fetchall()
        return [r[0] for r in reversed(rows)]

    def list_chats(self) -> list[ChatSummary]:
        """Newest activity first."""
        rows = self._exec(
            "SELECT c.id, c.title, c.created, c.updated, COUNT(m.id) AS n FROM chats c "
            "LEFT JOIN messages m ON m.chat_id = c.id GROUP BY c.id ORDER BY c.updated DESC, c.id DESC"
        ).fetchall()
        return [ChatSummary(r["id"], r["title"], r["created"], r["updated"], r["n"]) for r in rows]

    def search(self, text: str, limit: int = 200) -> dict[int, str]:
        """Chats whose messages hold every word of ``text`` (as prefixes: "derail" finds "derailleur"), best
        match first: {chat id: a snippet of the message, the words in [brackets]}. Full-text search (FTS5)."""
        words = [w.replace('"', '""') for w in text.split()]
        if not words:
            return {}
        if not HAS_FTS5:
            where = " AND ".join(["text LIKE ?"] * len(words))
            rows = self._exec("SELECT chat_id, text FROM messages WHERE " + where
                              + " ORDER BY id DESC LIMIT ?", (*[f"%{w}%" for w in words], limit)).fetchall()
            return {r[0]: r[1][:80] for r in reversed(rows)}
        query = " ".join(f'"{w}"*' for w in words)
        try:
            rows = self._exec(
                "SELECT m.chat_id, snippet(messages_fts, 0, '[', ']', '…', 10) FROM messages_fts "
                "JOIN messages m ON m.id = messages_fts.rowid WHERE messages_fts MATCH ? "
                "ORDER BY bm25(messages_fts) LIMIT ?", (query, limit)).fetchall()
        except sqlite3.OperationalError:  # a query FTS5 cannot parse: nothing found, never an error
            return {}
        out: dict[int, str] = {}
        for chat_id, snip in rows:
            out.setdefault(chat_id, " ".join(str(snip).split()))
        return out

    def rename(self, chat_id: int, title: str) -> None:
        title = " ".join(title.split())
        if not title:
            raise ChatStoreError("A chat title cannot be empty.", title="Cannot rename")
        self._exec("UPDATE chats SET title=? WHERE id=?", (title, chat_id))

    def delete(self, chat_id: int) -> None:
        self._exec("DELETE FROM chats WHERE id=?", (chat_id,))

    def set_models(self, chat_id: int, files: dict[str, str]) -> None:
        """Record the model files a chat's answer is made with (``Engine.files``); ``continuation`` reads
        them."""
        self._exec("UPDATE chats SET models=? WHERE id=?", (json.dumps(files, sort_keys=True), chat_id))

    def _touch(self, chat_id: int) -> None:
        self._exec("UPDATE chats SET updated=? WHERE id=?", (time.time(), chat_id))

    # --- messages ---
    def add_user_message(self, chat_id: int, text: str, image: str | Sequence[str] | None = None, *,
                         replace_last: bool = False) -> int:
        """A question of the chat (``image``: its file, or a list of several). ``replace_last`` (a /retry or
        an edited question): it takes the place of the chat's last exchange, which stays in the chat, marked
        replaced, but is no longer continued."""
        paths = [image] if isinstance(image, str) else [p for p in image or () if p]
        image, more = (paths[0] if paths else None), (json.dumps(paths) if len(paths) > 1 else "")
        with self._lock:
            if replace_last:
                self._exec("UPDATE messages SET replaced=1 WHERE chat_id=? AND id >= (SELECT MAX(id) FROM "
                           "messages WHERE chat_id=? AND role='user' AND replaced=0)", (chat_id, chat_id))
            cur = self._exec(
                "INSERT INTO messages(chat_id, role, text, image, images, status, created) "
                "VALUES (?, 'user', ?, ?, ?, 'done', ?)", (chat_id, text, image, more, time.time()),
            )
            # The first question names the chat until the user renames it.
            n = self._exec("SELECT COUNT(*) FROM messages WHERE chat_id=? AND role='user'", (chat_id,
                                                                                             )).fetchone()[0]
            if n == 1:
                title = " ".join(text.split())[:60] or (Path(image).name if image else "New chat")
                self._exec("UPDATE chats SET title=? WHERE id=? AND title='New chat'", (title, chat_id))
            self._touch(chat_id)
            return int(cur.lastrowid)

    def start_answer(self, chat_id: int, models: dict[str, str] | None = None) -> int:
        """A new (running) answer in the chat; ``models``: the files it is made with (``Engine.files``),
        recorded as the chat's models (what ``ask --continue`` continues with)."""
        if models:
            self.set_models(chat_id, models)
        cur = self._exec(
            "INSERT INTO messages(chat_id, role, text, status, created) VALUES (?, 'assistant', '', "
            "'running', ?)",
            (chat_id, time.time()),
        )
        return int(cur.lastrowid)

    def add_event(self, message_id: int, event: ev.Event) -> None:
        """Store one event now (its own transaction): nothing is lost if the app dies after this."""
        event = clean_event(event)
        data = redact_tree(event.to_json(), self._secrets)
        with self._lock:
            seq = self._exec("SELECT COALESCE(MAX(seq), -1) + 1 FROM events WHERE message_id=?",
                             (message_id,)).fetchone()[0]
            self._exec(
                "INSERT INTO events(message_id, seq, kind, data) VALUES (?, ?, ?, ?)",
                (message_id, seq, event.kind, json.dumps(data, ensure_ascii=False)),
            )
            if isinstance(event, ev.FinalAnswer):
                self._exec(
                    "UPDATE messages SET text=?, status=?, context=? WHERE id=?",
                    (redact_tree(event.answer, self._secrets), event.stop_reason, event.context, message_id),
                )

    def finish_answer(self, message_id: int, status: str, text: str | None = None) -> None:
        """Close an answer that ended without a FinalAnswer (cancelled, error); keeps the streamed text."""
        with self._lock:
            if text is None:
                text = answer_text(self.message_events(message_id))
            text = clean_model_text(text)
            self._exec(
                "UPDATE messages SET status=?, text=CASE WHEN text='' THEN ? ELSE text END WHERE id=? AND "
                "status='running'",
                (status, redact_tree(text, self._secrets), message_id),
            )
            row = self._exec("SELECT chat_id FROM messages WHERE id=?", (message_id,)).fetchone()
            if row:
                self._touch(row[0])

    def message_events(self, message_id: int) -> list[ev.Event]:
        rows = self._exec("SELECT data FROM events WHERE message_id=? ORDER BY seq", (message_id,)).fetchall()
        out = []
        for r in rows:
            e = event_from_json(json.loads(r[0]))
            if e is not None:
                out.append(clean_event(e))  # written before cleaning existed, or by another tool
        return out

    def load(self, chat_id: int) -> Chat:
        row = self._exec("SELECT * FROM chats WHERE id=?", (chat_id,)).fetchone()
        if row is None:
            raise _no_chat(chat_id)
        chat = Chat(row["id"], row["title"], row["created"], row["updated"], models=_models(row["models"]))
        for m in self._exec("SELECT * FROM messages WHERE chat_id=? ORDER BY id", (chat_id,)).fetchall():
            msg = Message(m["id"], m["role"], clean_model_text(m["text"]), m["image"], m["status"],
                          m["created"],
                          replaced=bool(m["replaced"]), more_images=tuple(_images(m["images"])[1:]))
            if msg.role == "assistant":
                msg.events = self.message_events(msg.id)
                if not msg.text:
                    msg.text = answer_text(msg.events)
            chat.messages.append(msg)
        return chat

    def history(self, chat_id: int) -> list[dict[str, Any]]:
        """Earlier finished exchanges of a chat: [{question, image, answer}], oldest first."""
        out: list[dict[str, Any]] = []
        pending: dict[str, Any] | None = None
        for m in self.load(chat_id).messages:
            if m.replaced:
                continue
            if m.role == "user":
                image = m.image if len(m.images) < 2 else m.images
                pending = {"question": m.text, "image": image, "answer": ""}
            elif pending is not None:
                pending["answer"] = m.text
                if m.text:
                    out.append(pending)
                pending = None
        return out

    def continuation(self, chat_id: int, *, replace_last: bool = False) -> Continuation:
        """What a follow-up question in this chat needs (messages only, no events: cheap for long chats).
        ``replace_last``: for a question that will replace the last exchange (a /retry, an edited question),
        the chat without it; read only, nothing is marked (``add_user_message`` does that)."""
        rows = self._exec("SELECT role, text, image, images, context FROM messages WHERE chat_id=? "
                          "AND replaced=0 ORDER BY id", (chat_id,)).fetchall()
        if replace_last:
            starts = [i for i, r in enumerate(rows) if r["role"] == "user"]
            rows = rows[:starts[-1]] if starts else rows
        if not rows and self._exec("SELECT 1 FROM chats WHERE id=?", (chat_id,)).fetchone() is None:
            raise _no_chat(chat_id)
        row = self._exec("SELECT models FROM chats WHERE id=?", (chat_id,)).fetchone()
        out = Continuation(chat_id, models=_models(row[0] if row else ""))
        question: str | None = None
        image: str | tuple[str, ...] | None = None
        for r in rows:
            if r["role"] == "user":
                several = tuple(_images(r["images"]))
                question, image = r["text"], several or r["image"]
                out.image = r["image"] or out.image
                out.last_images = several or ((r["image"],) if r["image"] else out.last_images)
            elif question is not None:
                out.exchanges.append((question, r["text"], r["context"]))
                out.images.append(image)
                question = None
        return out

    def last_question(self, chat_id: int) -> tuple[str, list[str]] | None:
        """The chat's last question that was not replaced, and its images (what /retry asks again)."""
        row = self._exec("SELECT text, image, images FROM messages WHERE chat_id=? AND role='user' "
                         "AND replaced=0 ORDER BY id DESC LIMIT 1", (chat_id,)).fetchone()
        return (row[0], _images(row[2]) or ([row[1]] if row[1] else [])) if row else None

    def latest_chat(self) -> int | None:
        """The chat with the most recent activity (``ask --continue``), or None when there is none."""
        row = self._exec("SELECT id FROM chats ORDER BY updated DESC, id DESC LIMIT 1").fetchone()
        return int(row[0]) if row else None

    @property
    def secrets(self) -> list[str]:
        """The secret values kept out of what this store writes and exports."""
        return list(self._secrets)


def _probe(folder: Path) -> int:
    """0 when a file can be created in ``folder``, else why not (an errno: a read-only mount denies it even to
    root, whatever the mode bits)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".edge-agent-probe-", dir=folder)
    except OSError as e:
        return e.errno or errno.EACCES
    os.close(fd)
    os.unlink(name)
    return 0


def _no_chat(chat_id: int) -> ChatStoreError:
    return ChatStoreError(f"There is no chat {chat_id}. List them with `edge-agent chats` (or Ctrl+O in the "
                          f"app).",
                          title="No such chat")


def _models(text: str) -> dict[str, str]:
    """The stored ``chats.models`` JSON as a dict ({} when not recorded or unreadable)."""
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _images(text: str) -> list[str]:
    """The stored ``messages.images`` JSON as a list of paths ([] when not several, or unreadable)."""
    with contextlib.suppress(ValueError):
        data = json.loads(text) if text else []
        return [str(p) for p in data if p] if isinstance(data, list) else []
    return []


def answer_text(events: Iterable[ev.Event]) -> str:
    """The answer as far as it streamed (the final answer when there is one)."""
    parts: list[str] = []
    for e in events:
        if isinstance(e, ev.FinalAnswer):
            return e.answer
        if isinstance(e, ev.AnswerToken):
            parts.append(e.text)
        elif isinstance(e, ev.MoveWithdrawn) and e.action == "answer":
            parts = []  # an answer taken back after it streamed (it looped): not the answer
    return "".join(parts)
