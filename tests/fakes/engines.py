"""The one scripted engine of the tests: engine-shaped (what the app, ``ask``'s callers and the eval use of
``edge_agent.engine.engine.Engine``; mypy holds it to those protocols), for tests of pure rendering,
persistence and evaluation logic.

By default a question yields a fixed, realistic event stream (:func:`script`: an SSR turn with a zoom, a
search turn, a SeProD answer), so snapshots are deterministic; a test hands its own ``script`` (a
function of the question as asked) for other streams. Real-engine behaviour is covered by the tests
that use ``tiny_models``. The Pilot helpers are in tests/pilot.py, the files tests write in tests/files.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent.agent import events as ev
from edge_agent.core.config import Settings
from edge_agent.engine.face import AskRequest, EngineFace
from tests.files import make_image

if TYPE_CHECKING:
    from edge_agent.agent.rationales import Library

RATIONALES = [
    ("search_image", "I should look the whole image up to find where it comes from.", "image_search"),
    ("search_text", "I know what to look for; a text search will find the facts.", "text_search"),
    ("zoom", "The detail I need is small; I should zoom into that region.", "zoom"),
    ("answer_evidence", "The retrieved evidence answers the question.", "answer"),
    ("answer_image", "The image itself shows the answer.", "answer"),
    ("answer_knowledge", "I can answer from general knowledge.", "answer"),
]


def candidates(probs: list[float], chosen: int) -> tuple[ev.RationaleCandidate, ...]:
    return tuple(
        ev.RationaleCandidate(id=i, text=t, action=a, score=-1.0 - k * 0.25, sum=-10.0 - k, count=12, prob=p)
        for k, ((i, t, a), p) in enumerate(zip(RATIONALES, probs, strict=True))
    )


def script(question: str, image: str | None, crop_path: str | None) -> list[ev.Event]:
    """Two tool turns (zoom, text search) and an answer whose first tokens came from the prophet."""
    return [
        ev.RunStarted(question=question, image=image, mode="ssr", seprod=True, model="tiny-qwen3vl"),
        ev.TurnStarted(turn=1),
        ev.RationaleScored(turn=1, candidates=candidates([0.05, 0.10, 0.55, 0.05, 0.20, 0.05], 2), chosen=2,
                           seconds=0.061),
        ev.ToolCalled(turn=1, name="image_zoom_in_tool",
                      arguments={"bbox_2d": [500, 80, 940, 330], "label": "sign", "img_idx": 0},
                      action_seconds=0.12),
        ev.ToolFinished(turn=1, name="image_zoom_in_tool", ok=True, observation="<image 1>", seconds=0.01,
                        status="local", image_index=1, image_path=crop_path),
        ev.TurnFinished(turn=1, action="zoom", reasoning_seconds=0.061, action_seconds=0.12,
                        tool_seconds=0.01),
        ev.TurnStarted(turn=2),
        ev.DraftProposed(turn=2, mode="grounding", text="true, the sign says OPEN", tokens=(1, 2, 3, 4, 5, 6),
                         seconds=0.05),
        ev.DraftVerified(turn=2, mode="grounding", accepted=4, drafted=6, accepted_text="true, the sign",
                         scores=(0.9, 0.8, 0.7, 0.6, 0.05, 0.01), seconds=0.02),
        ev.RationaleScored(turn=2, candidates=candidates([0.05, 0.60, 0.05, 0.10, 0.15, 0.05], 1), chosen=1,
                           seconds=0.058),
        ev.ToolCalled(turn=2, name="text_search", arguments={"query": "red box white sign OPEN"},
                      action_seconds=0.1),
        ev.ToolFinished(turn=2, name="text_search", ok=True, observation="1. Open sign ...", seconds=0.2,
                        status="cached", results=(
                            {"title": "Open sign", "url": "https://en.wikipedia.org/wiki/Open_sign",
                             "snippet": "An open sign tells passers-by a shop is open.",
                             "source": "wikipedia"},
                            {"title": "Shop", "url": "https://en.wikipedia.org/wiki/Shop",
                             "snippet": "A shop sells goods.", "source": "wikipedia"},
                        )),
        ev.TurnFinished(turn=2, action="text_search", reasoning_seconds=0.058, action_seconds=0.1,
                        tool_seconds=0.2),
        ev.TurnStarted(turn=3),
        ev.RationaleScored(turn=3, candidates=candidates([0.02, 0.03, 0.05, 0.70, 0.15, 0.05], 3), chosen=3,
                           seconds=0.06),
        ev.DraftProposed(turn=3, mode="answering", text="The sign says OPEN.", tokens=(7, 8, 9, 10),
                         seconds=0.04),
        ev.DraftVerified(turn=3, mode="answering", accepted=3, drafted=4, accepted_text="The sign says",
                         scores=(0.9, 0.8, 0.7, 0.02), seconds=0.02),
        ev.AnswerToken(turn=3, text="The sign says", from_prophet=True),
        ev.AnswerToken(turn=3, text=" **OPEN**"),
        ev.AnswerToken(turn=3, text=": the shop is open."),
        ev.TurnFinished(turn=3, action="answer", reasoning_seconds=0.06, action_seconds=0.3,
                        tool_seconds=0.0),
        ev.FinalAnswer(answer="The sign says **OPEN**: the shop is open.", turns=3, stop_reason="answered",
                       context=f"ctx:{question}",
                       totals={"reasoning": 0.179, "action": 0.52, "tool": 0.21, "total": 1.0,
                               "answer_tokens": 9, "tokens_per_second": 30.0}),
    ]


@dataclass(frozen=True)
class Asked:
    """One question as the scripted engine got it (``crop``: where the default script's zoom crop was
    written)."""

    question: str
    image: str | tuple[str, ...] | None  # several: a tuple
    mode: str | None
    seprod: bool
    history: list[Any]
    context: str | None
    seed: int | None
    crop: str | None


Script = Callable[[Asked], Iterable[ev.Event]]


def app_script(asked: Asked) -> list[ev.Event]:
    """The default: :func:`script` for the question, its image and the crop written for it."""
    image = ", ".join(asked.image) if isinstance(asked.image, tuple) else asked.image
    return script(asked.question, image, asked.crop)


class _Vision:
    def __init__(self, has_vision: bool) -> None:
        self.has_vision = has_vision


class ScriptedEngine:
    """Engine-shaped: ``ask`` yields ``script(asked)``; ``hold`` makes it wait mid-answer until cancelled;
    ``contexts`` also yields ContextOpened / ImageEvaluated like the real engine; ``vision=False`` is a
    text-only model. Records every question (``requests``; ``asked``: question, image, mode)."""

    drafter: object | None = None
    library: Library | None = None

    def __init__(self, settings: Settings | None = None, crop_dir: Path | None = None, hold: bool = False,
                 contexts: bool = False, *, script: Script = app_script, vision: bool = True,
                 model_name: str = "tiny-qwen3vl") -> None:
        self.settings = settings
        self.script = script
        self.with_contexts = contexts
        self.crop_dir = crop_dir
        self.hold = hold
        self.model = _Vision(vision)
        self.requests: list[Asked] = []
        self.asked: list[tuple[str, str | tuple[str, ...] | None, str | None]] = []
        self.contexts: list[str | None] = []  # the context key each question continued from
        self.histories: list[list[Any]] = []  # the history each question was asked with
        self.closed = False
        self.model_name = model_name
        self.prepared: list[str] = []  # images read ahead on attach (Engine.prepare_image)
        self.settled = 0  # times the eval waited for its background work (Engine.settle)
        self.read: list[tuple[str, str | tuple[str, ...] | None, str]] = []  # read_ahead's (text, image, ctx)
        self.files: dict[str, str] = {}  # the model files a chat records (none: nothing loaded from disk)

    def model_files(self) -> dict[str, str]:
        return {role: path for role, path in self.files.items() if path}

    def ask(self, request: AskRequest, *, cancel: threading.Event | None = None) -> Iterator[ev.Event]:
        question, image, mode, context = request.question, request.image, request.mode, request.context
        assert image is None or isinstance(image, str | tuple), "the app, ask and the eval hand files"
        image = image if image is None or isinstance(image, str) else tuple(str(x) for x in image)
        seprod, history, seed = bool(request.seprod), request.history, request.seed
        crop = None
        if self.crop_dir is not None:
            crop = str(make_image(self.crop_dir / f"crop{len(self.asked) + 1}.png", (32, 24),
                                  (250, 250, 250)))
        asked = Asked(question, image, mode, seprod, list(history or []), context, seed, crop)
        self.requests.append(asked)
        self.asked.append((question, image, mode))
        self.contexts.append(context)
        self.histories.append(asked.history)
        for i, e in enumerate(self._with_contexts(self.script(asked), context)):
            if self.hold and i == 3:
                # Like the real engine: block in "compute" until the cancel event is set.
                while cancel is not None and not cancel.wait(0.02):
                    pass
                yield ev.FinalAnswer(answer="", turns=1, stop_reason="cancelled", totals={})
                return
            if cancel is not None and cancel.is_set():
                yield ev.FinalAnswer(answer="", turns=1, stop_reason="cancelled", totals={})
                return
            yield e

    def _with_contexts(self, events: Iterable[ev.Event], context: str | None) -> Iterator[ev.Event]:
        """``events``, with the real engine's ContextOpened (and, in a new context, ImageEvaluated) after
        the first one when ``contexts`` is on."""
        for i, e in enumerate(events):
            yield e
            if i == 0 and self.with_contexts:
                yield ev.ContextOpened(source="live" if context else "new", reason="",
                                       tokens_reused=1600 if context else 0, tokens_evaluated=24 if context
                                       else 1135,
                                       system_restored=not context, n_ctx_used=1700, seconds=0.2)
                if not context:
                    yield ev.ImageEvaluated(turn=0, source="image", tokens=576, positions=24, width=768,
                                            height=768,
                                            encode_seconds=0.8, decode_seconds=1.2, reused=False)

    def update_settings(self, new: Settings, changed: Collection[str]) -> bool:
        """Like ``Engine.update_settings``: model files and the llama context need a new engine."""
        from edge_agent.engine.engine import RELOAD_FIELDS

        if RELOAD_FIELDS.intersection(changed):
            return False
        self.settings = new
        return True

    def settle(self) -> None:
        self.settled += 1

    def prepare_image(self, image: str) -> bool:
        self.prepared.append(str(image))
        return True

    def read_ahead(self, text: str = "", image: str | Sequence[str] | None = None, *,
                   context: str = "") -> None:
        self.read.append((text, image if image is None or isinstance(image, str) else tuple(image), context))

    def close(self) -> None:
        self.closed = True


def _conforms(e: ScriptedEngine) -> EngineFace:
    """mypy holds the scripted engine to the engine's face (what the app, ask and the eval use)."""
    return e
