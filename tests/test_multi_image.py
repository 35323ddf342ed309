"""Several images in one question (issue 30 item 6), on the real llama.cpp with the tiny Qwen3-VL models.

`edge-agent ask` takes several images (``IMAGE... QUESTION``, or ``--image`` repeated), in a subprocess
as a person runs it: each image is read with its number, the chat records them all, a follow-up keeps
them in the context without reading them again, and a missing one among several is a one-line error
that names it and saves nothing. In the engine: two images read ahead while the question is typed give
exactly what reading everything at Enter gives (scores, choices, answers, the context token for token,
question after question), and a zoom into the second image is cut from the second image.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from edge_agent.agent.loop import AgentOptions
from edge_agent.core.config import Settings
from edge_agent.engine.engine import Engine
from edge_agent.engine.face import AskRequest
from tests.test_read_ahead import assert_same, load, opened, type_slowly


def edge(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edge_agent.commands.cli", *args], capture_output=True,
                          text=True,
                          timeout=timeout, env=dict(os.environ))


@pytest.fixture
def env(edge_home, monkeypatch):
    for k, v in {"N_THREADS": "1", "N_THREADS_BATCH": "1", "N_CTX": "8192", "ANSWER_MAX_TOKENS": "5",
                 "MAX_TURNS": "1", "IMAGE_MAX_TOKENS": "64"}.items():
        monkeypatch.setenv(f"EDGE_AGENT_{k}", v)
    return edge_home


def two_photos(tmp_path: Path) -> tuple[Path, Path]:
    Image.new("RGB", (96, 64), (200, 40, 40)).save(red := tmp_path / "photo.jpg")
    Image.new("RGB", (80, 80), (30, 160, 60)).save(green := tmp_path / "screenshot.png")
    return red, green


def rows(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


def test_ask_takes_several_images(env, tiny_models, tmp_path):
    red, green = two_photos(tmp_path)
    model = ["--model", str(tiny_models["text"]), "--mmproj", str(tiny_models["mmproj"]), "--offline"]
    helped = edge("ask", "--help")
    assert helped.returncode == 0 and "[IMAGE]... QUESTION" in helped.stdout and "--image" in helped.stdout
    r = edge("ask", str(red), str(green), "Which one is green?", *model, "--json", "--seed", "3")
    assert r.returncode == 0, r.stderr
    got = rows(r.stdout)
    assert got[0]["event"] == "run_started" and got[0]["image"] == f"{red}, {green}"
    images = [e for e in got if e["event"] == "image_evaluated" and e["source"] == "image"]
    assert [e["index"] for e in images] == [0, 1] and all(e["tokens"] > 0 for e in images)
    assert got[-1]["event"] == "final_answer"
    shown = edge("chats", "show", "1")
    assert f"image: {red.resolve()}\n  image: {green.resolve()}" in shown.stdout, shown.stdout
    # a follow-up keeps both images in the context: neither is read again
    follow = edge("ask", "--continue", "And the other one?", *model, "--json")
    assert follow.returncode == 0, follow.stderr
    got = rows(follow.stdout)
    assert next(e for e in got if e["event"] == "context_opened")["source"] == "restored"
    assert not [e for e in got if e["event"] == "image_evaluated" and e["source"] == "image"]
    # the flag, repeated: the same question
    flags = edge("ask", "--image", str(red), "-i", str(green), "Which one is red?", *model, "--json",
                 "--no-save")
    assert flags.returncode == 0, flags.stderr
    assert rows(flags.stdout)[0]["image"] == f"{red}, {green}"


def test_a_missing_image_among_several_says_which_and_saves_nothing(env, tiny_models, tmp_path):
    red, green = two_photos(tmp_path)
    model = ["--model", str(tiny_models["text"]), "--mmproj", str(tiny_models["mmproj"]), "--offline"]
    gone = tmp_path / "gone.png"
    r = edge("ask", str(red), str(gone), str(green), "Compare them.", *model)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "gone.png" in r.stderr and "image 2 of 3" in r.stderr, r.stderr
    assert f'edge-agent ask {red} {green} "Compare them."' in r.stderr, r.stderr  # how to ask without it
    assert "no chats yet" in edge("chats").stdout.lower()


@pytest.fixture
def settings(edge_home: Path) -> Settings:
    return Settings.load({"offline": True, "n_threads": 1, "n_threads_batch": 1, "answer_max_tokens": 6,
                          "max_turns": 1, "image_max_tokens": 64})


def test_two_images_read_ahead_answer_as_reading_everything_at_enter(tiny_models, settings, photo, tmp_path):
    """Engine A reads both photos on attach and the words as they are typed; engine B reads everything
    at Enter. Same scores (<= 1e-5), choices and answers, and the same context token for token, for the
    question and for a follow-up about both (neither image read again)."""
    _, green = two_photos(tmp_path)
    a, b = load("tiny", tiny_models), load("tiny", tiny_models)
    ea, eb = Engine(a, settings), Engine(b, settings)
    opts = AgentOptions.from_settings(settings)
    both = [str(photo), str(green)]
    try:
        q1 = "Which of the two photos is green?"
        type_slowly(ea, "Which of", [str(photo)], "")  # one photo attached, then the other
        assert ea.ahead is not None and len(ea.ahead.images) == 1
        first = ea.ahead.images[0]
        type_slowly(ea, q1, both, "", start="Which of")
        assert ea.ahead is not None and len(ea.ahead.images) == 2
        assert ea.ahead.images[0] is first  # kept: the first photo is not read again when the second comes
        ra = list(ea.ask(AskRequest(q1, both, options=opts)))
        rb = list(eb.ask(AskRequest(q1, both, options=opts)))
        assert_same(ra, rb)
        seen = [(e.index, e.read_ahead) for e in ra if e.kind == "image_evaluated" and e.turn == 0]
        assert seen == [(0, True), (1, True)]
        assert [e.index for e in rb if e.kind == "image_evaluated" and e.turn == 0] == [0, 1]
        assert a.active_session.history == b.active_session.history
        q2 = "And which one is larger?"
        type_slowly(ea, q2, both, ra[-1].context)
        ra2 = list(ea.ask(AskRequest(q2, both, options=opts, context=ra[-1].context)))
        rb2 = list(eb.ask(AskRequest(q2, both, options=opts, context=rb[-1].context)))
        assert_same(ra2, rb2)
        assert opened(ra2).source == opened(rb2).source == "live"
        assert not [e for e in ra2 + rb2 if e.kind == "image_evaluated" and e.source == "image"]
        assert a.active_session.history == b.active_session.history
    finally:
        ea.close()
        eb.close()
        a.close()
        b.close()


def test_a_zoom_into_the_second_image_is_cut_from_it():
    from edge_agent.tools.zoom import ImageStore, ZoomError

    red, green = Image.new("RGB", (200, 100), (200, 0, 0)), Image.new("RGB", (100, 200), (0, 200, 0))
    store = ImageStore(red, more=[(green, None)])
    assert len(store) == 2 and store.n_originals == 2
    crop = store.zoom([0, 0, 500, 500], img_idx=1, label="top left")
    assert crop.image.index == 2 and crop.image.root == 1 and crop.image.image.size == (50, 100)
    assert crop.image.image.getpixel((10, 10)) == (0, 200, 0)
    again = store.zoom([0, 0, 1000, 500], img_idx=2)  # a crop of that crop: still the green original's pixels
    assert again.image.root == 1 and again.image.image.getpixel((5, 5)) == (0, 200, 0)
    with pytest.raises(ZoomError, match="0-1 are the originals"):
        store.zoom([0, 0, 10, 10], img_idx=7)
