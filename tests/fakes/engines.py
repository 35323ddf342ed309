"""A scripted engine for UI and chat-store tests of pure rendering/persistence logic, and the Pilot
helpers every app test shares (``settle``, ``type_and_enter``; waiting on a condition: tests/waits.py).

The engine yields a fixed, realistic event stream (SSR turn with a zoom, a search turn, a SeProD answer)
so snapshots are deterministic. Real-engine behaviour is covered by the tests that use ``tiny_models``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

from PIL import Image, ImageDraw

from edge_agent.agent import events as ev

RATIONALES = [
    ("search_image", "I should look the whole image up to find where it comes from.", "image_search"),
    ("search_text", "I know what to look for; a text search will find the facts.", "text_search"),
    ("zoom", "The detail I need is small; I should zoom into that region.", "zoom"),
    ("answer_evidence", "The retrieved evidence answers the question.", "answer"),
    ("answer_image", "The image itself shows the answer.", "answer"),
    ("answer_knowledge", "I can answer from general knowledge.", "answer"),
]


def make_image(path: Path, size=(64, 48), color=(200, 60, 40)) -> Path:
    """A small deterministic PNG: a coloured box with a white 'sign' in one corner."""
    img = Image.new("RGB", size, color)
    d = ImageDraw.Draw(img)
    d.rectangle([size[0] // 2, 4, size[0] - 4, size[1] // 3], fill=(250, 250, 250))
    d.line([0, size[1] - 1, size[0], 0], fill=(20, 20, 120), width=3)
    img.save(path)
    return path


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
        ev.TurnFinished(turn=1, action="zoom", reasoning_seconds=0.061, action_seconds=0.12, tool_seconds=0.01),
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
                             "snippet": "An open sign tells passers-by a shop is open.", "source": "wikipedia"},
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
        ev.TurnFinished(turn=3, action="answer", reasoning_seconds=0.06, action_seconds=0.3, tool_seconds=0.0),
        ev.FinalAnswer(answer="The sign says **OPEN**: the shop is open.", turns=3, stop_reason="answered",
                       context=f"ctx:{question}",
                       totals={"reasoning": 0.179, "action": 0.52, "tool": 0.21, "total": 1.0,
                               "answer_tokens": 9, "tokens_per_second": 30.0}),
    ]


class _Vision:
    has_vision = True


class ScriptedEngine:
    """Engine-shaped (``ui.host.EngineLike``): ``ask`` yields the script; ``hold`` makes it wait
    mid-answer until cancelled."""

    model = _Vision()
    drafter: object | None = None

    def __init__(self, settings, crop_dir: Path | None = None, hold: bool = False, contexts: bool = False) -> None:
        self.settings = settings
        self.with_contexts = contexts  # also yield ContextOpened / ImageEvaluated like the real engine
        self.crop_dir = crop_dir
        self.hold = hold
        self.asked: list[tuple[str, str | None, str | None]] = []
        self.contexts: list[str | None] = []  # the context key each question continued from
        self.closed = False
        self.model_name = "tiny-qwen3vl"
        self.prepared: list[str] = []  # images read ahead on attach (Engine.prepare_image)
        self.read: list[tuple[str, str | None, str]] = []  # read_ahead calls: (text, image, context)
        self.files: dict[str, str] = {}  # the model files a chat records (none: nothing loaded from disk)

    def ask(self, question, image=None, *, cancel: threading.Event | None = None, mode=None, history=None,
            context=None) -> Iterator[ev.Event]:
        self.asked.append((question, image, mode))
        self.contexts.append(context)
        crop = None
        if self.crop_dir is not None:
            crop = str(make_image(self.crop_dir / f"crop{len(self.asked)}.png", (32, 24), (250, 250, 250)))
        events = script(question, image, crop)
        if self.with_contexts:
            opened = ev.ContextOpened(source="live" if context else "new", reason="", tokens_reused=1600 if context else 0,
                                      tokens_evaluated=24 if context else 1135, system_restored=not context,
                                      n_ctx_used=1700, seconds=0.2)
            shown = [opened] if context else [opened, ev.ImageEvaluated(
                turn=0, source="image", tokens=576, positions=24, width=768, height=768, encode_seconds=0.8,
                decode_seconds=1.2, reused=False)]
            events = events[:1] + shown + events[1:]
        for i, e in enumerate(events):
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

    def update_settings(self, new, changed) -> bool:
        """Like ``Engine.update_settings``: model files and the llama context need a new engine."""
        from edge_agent.engine import RELOAD_FIELDS

        if RELOAD_FIELDS.intersection(changed):
            return False
        self.settings = new
        return True

    def prepare_image(self, image) -> bool:
        self.prepared.append(str(image))
        return True

    def read_ahead(self, text: str = "", image: str | None = None, *, context: str = "") -> None:
        self.read.append((text, image, context))

    def close(self) -> None:
        self.closed = True


# --- Pilot helpers ----------------------------------------------------------------------------------

async def settle(pilot, timeout: float = 120) -> None:
    """Wait until the app's workers are done and the screen has caught up (twice: a finished worker's
    message can start another one)."""
    async def _wait() -> None:
        for _ in range(2):
            await pilot.app.workers.wait_for_complete()
            await pilot.pause()

    await asyncio.wait_for(_wait(), timeout)


async def type_and_enter(pilot, text: str) -> None:
    """Type ``text`` into the chat prompt and press Enter (a question, a /command or a pasted path)."""
    from edge_agent.ui.prompt import PromptInput

    prompt = pilot.app.screen.query_one(PromptInput)
    prompt.value = text
    prompt.focus()
    await pilot.press("enter")
    await pilot.pause()


# --- the app with a scripted engine ------------------------------------------------------------------
def scripted_app(settings, tmp_path: Path, *, engine_cls: type = ScriptedEngine, **kw):
    """(EdgeAgentApp whose engine factory makes ``engine_cls(settings, tmp_path, **kw)``, the engines made)."""
    from edge_agent.ui.app import EdgeAgentApp

    made: list = []

    def factory(s, *, progress=None):
        if progress:
            progress("loading scripted engine", 0.5)
        made.append(engine_cls(s, tmp_path, **kw))
        return made[-1]

    return EdgeAgentApp(settings, engine_factory=factory), made
