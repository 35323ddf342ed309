"""The engine's face: what every user of an engine may rely on, and one question as one typed request.

Knows: :class:`AskRequest` (a question, its image, how to answer it and which chat context it continues)
and :class:`EngineFace`, the one protocol the app (``ui.host``), ``edge-agent ask``, the evaluation's
runner and the cluster's workers use of an engine. ``edge_agent.engine.engine.Engine`` implements it (mypy
checks that there) and so do the tests' scripted engines. Imports nothing heavy (no llama.cpp, numpy or
network), so a front end can name the face without loading an engine.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from edge_agent.agent.events import Event
    from edge_agent.agent.options import AgentOptions
    from edge_agent.agent.rationales import Library
    from edge_agent.core.config import Settings

# An earlier exchange of the chat: (question, answer), (question, answer, image file, a tuple of files
# for several, or None), or a mapping with those keys ("image" optional), as the chat store and an
# export hold them.
Exchange = tuple[str, str] | tuple[str, str, str | tuple[str, ...] | None] | Mapping[str, Any]
ImageSource = str | Path | bytes
Images = ImageSource | Sequence[ImageSource] | None  # a question's images: one, several (in order), or none


@dataclass(frozen=True)
class AskRequest:
    """One question for :meth:`EngineFace.ask`.

    ``image``: a file (a path; "" is none) or image bytes; a list or tuple of them: several images.
    ``mode``: ssr | freeform | direct (None: the settings'). ``history``: the chat's earlier exchanges,
    read only when its context has to be rebuilt (and by a plain chat's prompt). ``context``: the key the
    chat's last answer was saved under (``FinalAnswer.context``): the question continues that context and
    evaluates only its own turn.
    ``seprod``: None: on when a prophet is loaded and the setting is on. ``options`` (the eval's ablations,
    tests, benchmarks): replaces the options built from the settings. ``seed``: this question's random seed
    (the eval derives one per question id); None: the options'.
    """

    question: str
    image: Images = None
    mode: str | None = None
    history: Sequence[Exchange] = ()
    context: str | None = None
    seprod: bool | None = None
    options: AgentOptions | None = None
    seed: int | None = None


class SeesImages(Protocol):
    @property
    def has_vision(self) -> bool: ...


class EngineFace(Protocol):
    """What the app, ``ask``, the eval and the cluster use of an engine."""

    @property
    def model_name(self) -> str: ...

    @property
    def model(self) -> SeesImages: ...

    @property
    def settings(self) -> Settings | None:
        """The settings the engine answers with (None: a scripted engine without any)."""

    @property
    def library(self) -> Library | None:
        """The rationale library of the settings (None: a scripted engine without one)."""

    @property
    def files(self) -> dict[str, str]:
        """The model files loaded (model, mmproj, prophet, prophet_mmproj: paths, "" for none), which a chat
        records."""

    @property
    def drafter(self) -> object | None:
        """The SeProD drafter when a prophet is loaded, else None."""

    def model_files(self) -> dict[str, str]:
        """The files loaded, by role, roles without a file left out (what an eval report names)."""

    def ask(self, request: AskRequest, *, cancel: threading.Event | None = None) -> Iterator[Event]:
        """Answer ``request``: the agent's events, ending with FinalAnswer, or AgentError(fatal=True) for a
        problem the user can fix. ``cancel`` set: the answer stops as soon as it can."""

    def settle(self) -> None:
        """Wait for the background work the last answer left (its context's state still being written), so
        that the next question's time is its own (the eval calls this between records)."""

    def prepare_image(self, image: str) -> bool:
        """Read an attached image ahead (decode, resize); False when it cannot be read."""

    def read_ahead(self, text: str = "", image: str | Sequence[str] | None = None, *,
                   context: str = "") -> None:
        """What the person has given so far for the next question: read in the background; returns at once."""

    def update_settings(self, new: Settings, changed: Collection[str]) -> bool:
        """Take new settings without loading anything; False when ``changed`` needs a new engine."""

    def close(self) -> None: ...
