"""User-facing errors.

Every error a user can cause (a missing file, a bad model, an offline cache miss, a server that is
down) is raised as an :class:`EdgeAgentError` with a short title and a message that says how to fix
it. The CLI and the TUI translate these at the boundary (one line on stderr / a titled
notification); anything else is a bug and propagates with its traceback.
"""

from __future__ import annotations


class EdgeAgentError(Exception):
    """An error the user can fix. ``title`` is a few words; ``message`` says what to do."""

    title: str = "Error"

    def __init__(self, message: str, title: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if title is not None:
            self.title = title

    def __str__(self) -> str:  # one line, for the CLI (the title once: "Unknown model 'x'", not twice)
        if self.message.casefold().startswith(self.title.casefold()):
            return self.message
        return f"{self.title}: {self.message}"


class ConfigError(EdgeAgentError):
    title = "Bad setting"


class ModelFileError(EdgeAgentError):
    """A model or mmproj file is missing, corrupt, of the wrong kind, or does not fit its pair."""

    title = "Model file problem"


class DownloadError(EdgeAgentError):
    """A model download failed (network, hub refused, checksum mismatch, disk full); the message says what to
    do."""

    title = "Download failed"


class ModelRuntimeError(EdgeAgentError):
    """llama.cpp refused an operation (context full, decode failed, ...)."""

    title = "Model error"


class ImageError(EdgeAgentError):
    title = "Image problem"


class SearchError(EdgeAgentError):
    title = "Search failed"


class CacheError(EdgeAgentError):
    title = "Cache problem"


class WriteError(EdgeAgentError, OSError):
    """A file could not be written (a read-only home, a full disk, no permission): says which file and how to
    fix it. Also an ``OSError``, so code that tolerates failed writes (saved states) still catches it."""

    title = "Not saved"

    def __init__(self, message: str, *, errno: int | None = None, filename: str | None = None) -> None:
        EdgeAgentError.__init__(self, message)
        self.errno, self.filename = errno, filename


class Cancelled(Exception):
    """Raised inside the engine when the user cancels; not an error, never shown as one."""
