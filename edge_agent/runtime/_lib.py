"""Process-wide llama.cpp set-up: import, backend init, quiet logs, CPU facts, the abort flag.

The only place that imports ``llama_cpp`` at module level (everything else in the runtime gets it
from here, lazily, so ``import edge_agent.runtime`` stays cheap). Knows nothing of models or
sessions. llama.cpp and mtmd log heavily to stderr; we route their logs into a small ring buffer
(so errors can quote llama.cpp's last words) and print nothing, unless ``EDGE_AGENT_LLAMA_LOG=1``.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from functools import lru_cache

import llama_cpp  # the binding; import cost ~0.1 s
import llama_cpp.llama_cpp as C
import llama_cpp.mtmd_cpp as M

_init_lock = threading.Lock()
_initialized = False
# Keep the ctypes callback objects alive for the life of the process: llama.cpp holds raw pointers.
_callbacks: list[object] = []
_recent: collections.deque[str] = collections.deque(maxlen=40)
_partial: list[str] = []

GGML_LOG_LEVEL_WARN = 3
GGML_LOG_LEVEL_ERROR = 4
GGML_LOG_LEVEL_CONT = 5


def _log(level: int, text: bytes | None, _user: object) -> None:
    try:
        s = text.decode("utf-8", "replace") if text else ""
    except Exception:  # noqa: BLE001 - a log callback must never raise into C
        return
    if os.environ.get("EDGE_AGENT_LLAMA_LOG") == "1":
        sys.stderr.write(s)
    if level in (GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR) or (level == GGML_LOG_LEVEL_CONT and _partial):
        _partial.append(s)
        if s.endswith("\n"):
            _recent.append("".join(_partial).strip())
            _partial.clear()


def ensure_init() -> None:
    """Initialise the backend once and silence llama.cpp / ggml / mtmd logging."""
    global _initialized
    with _init_lock:
        if _initialized:
            return
        C.llama_backend_init()
        cb = C.llama_log_callback(_log)
        _callbacks.append(cb)
        C.llama_log_set(cb, ctypes.c_void_p(0))
        mcb = C.llama_log_callback(_log)
        _callbacks.append(mcb)
        M.mtmd_helper_log_set(mcb, ctypes.c_void_p(0))
        _initialized = True


def recent_errors(n: int = 3) -> str:
    """The last few warning/error lines llama.cpp logged (for error messages), '' if none."""
    lines = [line for line in list(_recent)[-n:] if line]
    return " | ".join(lines)


def clear_errors() -> None:
    _recent.clear()
    _partial.clear()


@contextlib.contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """Capture what C code writes to file descriptor 2 during the block (llama.cpp's GBNF parser
    prints its errors with fprintf, bypassing the log callback). Yields a list that holds the text
    afterwards. Other threads' stderr output in that window (milliseconds) lands there too."""
    out: list[str] = []
    try:
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed/replaced sys.stderr must not break model calls
        pass
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield out
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            out.append(tmp.read().decode("utf-8", "replace"))


@lru_cache(maxsize=1)
def system_info() -> str:
    return C.llama_print_system_info().decode("utf-8", "replace")


@lru_cache(maxsize=1)
def library_identity() -> str:
    """The binding's version and the compiled library's features: saved KV states from another build
    may hold other numbers, so they are keyed by this."""
    return f"llama-cpp-python {llama_cpp.__version__}; {system_info().strip()}"


def built_with_amx() -> bool:
    """True when the library has AMX kernels compiled in (they SIGILL on VMs that advertise AMX)."""
    info = system_info().upper()
    return any(part.strip().startswith("AMX") and part.strip().endswith("= 1") for part in info.split("|"))


def extra_buffers_enabled(setting: str) -> bool:
    """Map the ``extra_buffers`` setting (auto|on|off) to llama.cpp's ``use_extra_bufts``.

    auto: off when the build has AMX (quantized decodes crash with SIGILL inside
    ggml_backend_amx_mul_mat on these VMs), on otherwise (repacked weights prefill 10-40% faster).
    """
    if setting == "on":
        return True
    if setting == "off":
        return False
    return not built_with_amx()


class AbortFlag:
    """A one-byte flag that llama.cpp's compute loop polls between graph nodes, with no Python involved.

    llama.cpp calls ``bool abort_callback(void *data)`` before every node (~1000 per decode). A Python
    callback there would take the GIL each time (and wait up to the 5 ms switch interval whenever the UI
    thread is busy); instead the callback is libc's ``strlen`` on a 2-byte buffer: "" -> 0 -> false,
    "x" -> 1 -> true (the bool return is read from the low byte of the integer return register on
    x86-64 and arm64). ``available`` is False where libc cannot be found; then nothing is interruptible.
    """

    def __init__(self) -> None:
        self.buf = ctypes.create_string_buffer(2)
        self.callback = None
        self._cond = threading.Condition()
        self._watched: threading.Event | None = None  # the cancel event of the call running now
        self._watcher: threading.Thread | None = None
        try:
            libc = ctypes.CDLL(None) if sys.platform != "win32" else ctypes.cdll.msvcrt
            addr = ctypes.cast(libc.strlen, ctypes.c_void_p).value
            self.callback = C.ggml_abort_callback(addr) if addr else None
        except (OSError, AttributeError, TypeError):
            self.callback = None

    @property
    def available(self) -> bool:
        return self.callback is not None

    def set(self) -> None:
        self.buf[0] = b"x"

    def clear(self) -> None:
        self.buf[0] = b"\0"

    def is_set(self) -> bool:
        return self.buf[0] != b"\0"

    def cancel_requested(self) -> bool:
        """Whether the cancel event of the call running now is set (the flag can also be set by
        ``runtime.cores`` preempting a background step, which is not a cancel)."""
        ev = self._watched
        return ev is not None and ev.is_set()

    @contextlib.contextmanager
    def watching(self, cancel: threading.Event) -> Iterator[None]:
        """While the block runs, a set ``cancel`` sets this flag (within ~20 ms).

        One watcher thread per flag, started once and parked on a condition when nothing is watched:
        entering and leaving cost microseconds (a thread per call cost a ~20 ms join on every call).
        The flag is only ever set while the block runs (checked under the lock), so a cancel that
        arrives as one call ends never aborts the next.
        """
        with self._cond:
            self._watched = cancel
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name="edge-agent-cancel-watch",
                                                 daemon=True)
                self._watcher.start()
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._watched = None
                self._cond.notify_all()

    def _watch(self) -> None:
        while True:
            with self._cond:
                while self._watched is None:
                    self._cond.wait()
                ev = self._watched
            if ev.wait(0.02):
                with self._cond:
                    if self._watched is ev:
                        self.set()
                    while self._watched is ev:  # park until this call ends
                        self._cond.wait()

    def install(self, ctx: object) -> None:
        if self.callback is not None:
            C.llama_set_abort_callback(ctx, self.callback, ctypes.cast(self.buf, ctypes.c_void_p))


# KV cache element types by name (ggml_type enum values).
KV_TYPES = {"f32": 0, "f16": 1, "q8_0": 8}
