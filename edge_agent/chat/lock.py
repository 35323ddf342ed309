"""One writer per chat: a question to a chat holds the chat's lock from reading its context to saving its
answer.

Knows: an advisory lock per chat (``fcntl.flock`` on ``home/locks/chat-<id>.lock``; the kernel drops it
when its process dies, so a killed ``ask`` never leaves a chat locked), who holds it (the holder writes
its name and pid into the file), waiting for it or refusing. So two questions to one chat (two ``ask
--chat N``, or the app and ``ask``) never both continue the same saved context: the second reads the
chat after the first's answer is saved, and the saved context and the visible transcript agree. Does not
know chats, models or the UI. Where no lock can be taken (a read-only home, a system without ``fcntl``)
nothing can be written either, and the lock is a no-op.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from edge_agent.core.errors import EdgeAgentError

try:
    import fcntl
except ImportError:  # not POSIX: no lock (one writer is then the person's to keep)
    fcntl = None  # type: ignore[assignment]


class ChatBusy(EdgeAgentError):
    title = "Chat busy"


class ChatLock:
    """The lock of chat ``chat_id`` under ``home``; ``who`` names this holder for the other side's message."""

    def __init__(self, home: Path, chat_id: int, who: str) -> None:
        self.path = Path(home) / "locks" / f"chat-{chat_id}.lock"
        self.chat_id, self.who = chat_id, who
        self._fd: int | None = None
        self._mutex = threading.Lock()  # one holder per process too (the app's UI and its worker threads)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def _open(self) -> int | None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:  # a read-only home: nothing can be saved there either
            return None

    def try_acquire(self) -> bool:
        """Take the lock if it is free (True); False when another question holds it."""
        with self._mutex:
            if self._fd is not None:
                return True
            fd = self._open()
            if fd is None or fcntl is None:
                self._fd = -1 if fd is None else fd  # no lock to be had: held as far as this process knows
                return True
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{self.who} (pid {os.getpid()})\n".encode(), 0)
            self._fd = fd
            return True

    def holder(self) -> str:
        """Who holds the lock now, as it wrote itself ("edge-agent ask (pid 1234)"); "another question" if
        unknown."""
        try:
            text = self.path.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            text = ""
        return text or "another question"

    def acquire(self, *, on_wait: Callable[[str], None] | None = None, poll: float = 0.1,
                timeout: float | None = None) -> None:
        """Take the lock, waiting for the holder to finish; ``on_wait(holder)`` is called once if it must
        wait. Raises :class:`ChatBusy` after ``timeout`` seconds (None: wait as long as it takes)."""
        if self.try_acquire():
            return
        if on_wait is not None:
            on_wait(self.holder())
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.try_acquire():
            if deadline is not None and time.monotonic() > deadline:
                raise ChatBusy(f"Chat {self.chat_id} is being answered by {self.holder()}: try again when it "
                               "is done, or ask in a new chat.")
            time.sleep(poll)

    def release(self) -> None:
        with self._mutex:
            fd, self._fd = self._fd, None
            if fd is None or fd < 0:
                return
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            if fcntl is not None:
                with contextlib.suppress(OSError):
                    fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    @contextlib.contextmanager
    def holding(self, *, on_wait: Callable[[str], None] | None = None,
                timeout: float | None = None) -> Iterator[ChatLock]:
        """The lock held for the block (:meth:`acquire`: ``timeout`` 0 raises :class:`ChatBusy` at once when
        another question holds it, as `chats delete` and the app's chat list want)."""
        self.acquire(on_wait=on_wait, timeout=timeout)
        try:
            yield self
        finally:
            self.release()
