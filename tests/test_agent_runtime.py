"""The agent loop on the real runtime: tiny random-weight Qwen3-VL (vision, M-RoPE) and SmolLM2.

Random weights give gibberish, so these tests check structure: the complete, ordered event stream,
that a zoom's crop really enters the context as a new image (positions advance by max(nx, ny)),
that the action always has the type the chosen rationale implies, text-only episodes, the turn
limit, cancellation, and clear errors. A ``policy`` forces the path where a test needs one (the
real batched scoring still runs; only the allowed action types are restricted).
"""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from edge_agent.agent.loop import AgentOptions
from edge_agent.agent.rationales import builtin_library
from edge_agent.core.config import Settings
from edge_agent.engine.engine import Engine
from edge_agent.engine.face import AskRequest
from edge_agent.runtime import Model
from edge_agent.tools.search import SearchTools
from tests.fakes.spies import SpyModel


@pytest.fixture(scope="module")
def tiny_vl(tiny_models):
    m = Model.load(tiny_models["text"], tiny_models["mmproj"], n_ctx=4096, n_threads=1, n_threads_batch=1)
    yield m
    m.close()


@pytest.fixture
def settings(edge_home: Path) -> Settings:
    # offline: the real search tools answer from an (empty) cache; nothing touches the network
    return Settings.load({"offline": True, "n_threads": 1, "n_threads_batch": 1, "answer_max_tokens": 6,
                          "freeform_max_tokens": 8, "max_turns": 3})


@pytest.fixture
def photo(tmp_path: Path) -> Path:
    im = Image.new("RGB", (96, 64), (30, 90, 200))
    ImageDraw.Draw(im).rectangle([60, 8, 90, 24], fill=(250, 250, 250))
    p = tmp_path / "photo.png"
    im.save(p)
    return p


def zoom_then_answer(turn: int, allowed):
    return {"zoom"} if turn == 1 else {"answer"}


@pytest.mark.parametrize("mode", ["ssr", "freeform"])
def test_zoom_then_answer_episode_on_tiny_qwen3vl(tiny_vl, settings, photo, mode):
    """A full episode: the crop enters the context as an image, positions advance by max(nx, ny)."""
    spy = SpyModel(tiny_vl)
    engine = Engine(spy, settings, tools=SearchTools.from_settings(settings))
    opts = AgentOptions.from_settings(settings, mode=mode, policy=zoom_then_answer)
    events = list(engine.ask(AskRequest("What does the white sign say?", photo, options=opts)))
    kinds = [e.kind for e in events if e.kind not in ("context_opened", "image_evaluated")]
    assert [e.kind for e in events][1:3] == ["context_opened", "image_evaluated"]
    reasoning = ["rationale_scored"] if mode == "ssr" else None
    if mode == "ssr":
        assert kinds[:6] == ["run_started", "turn_started", *reasoning, "tool_called", "tool_finished",
                             "turn_finished"]
    else:
        r = kinds.index("reasoning_done")
        assert kinds[:2] == ["run_started", "turn_started"] and set(kinds[2:r]) <= {"reasoning_token"}
        assert kinds[r + 1 : r + 4] == ["tool_called", "tool_finished", "turn_finished"]
    assert kinds[-2:] == ["turn_finished", "final_answer"] and kinds.count("turn_started") == 2
    called = next(e for e in events if e.kind == "tool_called")
    done = next(e for e in events if e.kind == "tool_finished")
    assert called.name == "image_zoom_in_tool" and set(called.arguments) == {"bbox_2d", "label", "img_idx"}
    assert done.ok and done.image_index == 1 and Path(done.image_path).exists()
    # two images in the context: the question's and the crop; each advanced positions by max(nx, ny)
    s = spy.sessions[-1]
    assert len(s.appended) == 2
    for chunk, before, after in ((a.chunk, a.n_pos_before, a.n_pos_after) for a in s.appended):
        assert chunk.n_pos == max(chunk.nx, chunk.ny) and chunk.n_tokens == chunk.nx * chunk.ny
        assert after - before == chunk.n_pos + 2  # + <|vision_start|> and <|vision_end|>
    # the action in the context is the tool call the tool received: head, tail, fixed rest once
    # (the label is random bytes that text() renders per token, so it is left out of the comparison)
    a = called.arguments
    text = s.inner.text()
    assert (f'<tool_call>\n{{"name": "image_zoom_in_tool", "arguments": {{"bbox_2d": '
            f'{json.dumps(a["bbox_2d"])}, "label": "') in text
    assert ('", "img_idx": '
            f'{a["img_idx"]}}}}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n') in text
    assert text.count("</tool_call><|im_end|>") == 2  # the system prompt's format example + this call
    crop_chunk = s.appended[1].chunk  # each within its own token budget
    assert (s.appended[0].chunk.n_tokens <= settings.image_max_tokens
            and crop_chunk.n_tokens <= settings.crop_max_tokens)
    shown = [e for e in events if e.kind == "image_evaluated"]
    assert [(e.source, e.tokens) for e in shown] == [("image", s.appended[0].chunk.n_tokens),
                                                     ("crop", crop_chunk.n_tokens)]
    final = events[-1]
    assert final.stop_reason == "length" and final.turns == 2  # random weights: cut at answer_max_tokens
    assert final.totals["n_pos"] == s.n_pos and final.totals["tool"] > 0
    fins = [e for e in events if e.kind == "turn_finished"]
    assert [f.action for f in fins] == ["zoom", "answer"] and fins[0].observe_seconds > 0
    assert "".join(e.text for e in events if e.kind == "answer_token").strip() == final.answer


def test_ssr_action_always_matches_the_chosen_rationale(tiny_vl, settings, photo):
    """Unforced SSR with sampled rationales: every turn's action is the chosen rationale's action."""
    engine = Engine(tiny_vl, settings, tools=SearchTools.from_settings(settings))
    seen = set()
    for seed in range(4):
        opts = AgentOptions.from_settings(settings, sample=True, seed=seed, tau=5.0, max_turns=2)
        events = list(engine.ask(AskRequest("Where was this taken?", photo, options=opts)))
        assert events[-1].kind == "final_answer"
        chosen = {e.turn: e.candidates[e.chosen].action for e in events if e.kind == "rationale_scored"}
        for f in (e for e in events if e.kind == "turn_finished"):
            assert f.action in (chosen[f.turn], "invalid")  # invalid: a tail cut off by max tokens
            seen.add(f.action)
        scored = [e for e in events if e.kind == "rationale_scored"]
        assert all(abs(sum(c.prob for c in e.candidates) - 1) < 1e-9 for e in scored)
        # every rationale but the searches' (no image search backend is configured, and text search is
        # offline with nothing cached: neither can bring anything), the evidence's (no tool result yet) and
        # those for a kind of message (a request to write, a greeting)
        assert [c.id for c in scored[0].candidates] == [
            r.id for r in builtin_library() if "search" not in r.action and not r.needs_evidence
            and not r.for_kind]
    assert len(seen) >= 2  # sampling explored more than one move


def test_turn_limit_asks_for_an_answer(tiny_vl, settings, photo):
    engine = Engine(tiny_vl, settings, tools=SearchTools.from_settings(settings))
    opts = AgentOptions.from_settings(settings, max_turns=1, policy=lambda t, a: a - {"answer"})
    events = list(engine.ask(AskRequest("Where?", photo, options=opts)))
    final = events[-1]
    assert final.stop_reason in ("turn_limit", "length") and final.turns == 2  # length: the answer was cut
    last = [e for e in events if e.kind == "rationale_scored"][-1]
    assert {c.action for c in last.candidates} == {"answer"}


def test_system_prompt_kv_is_reused_across_questions(tiny_vl, settings, photo):
    spy = SpyModel(tiny_vl)
    engine = Engine(spy, settings, tools=SearchTools.from_settings(settings))
    opts = AgentOptions.from_settings(settings, policy=lambda t, a: {"answer"})
    a = list(engine.ask(AskRequest("What colour?", photo, options=opts)))
    b = list(engine.ask(AskRequest("What colour?", photo, options=opts)))
    assert len(spy.sessions) == 1  # the second question rolled back to the system prompt
    assert a[-1].totals["n_pos"] == b[-1].totals["n_pos"] and a[-1].answer == b[-1].answer  # same state
    c = list(engine.ask(AskRequest("Follow-up?", photo, options=opts,
                                   history=[("What colour?", a[-1].answer)])))
    assert c[-1].kind == "final_answer" and c[-1].totals["n_pos"] > a[-1].totals["n_pos"]


def test_cancel_stops_a_free_form_turn_quickly(tiny_vl, settings, photo):
    engine = Engine(tiny_vl, settings.updated({"freeform_max_tokens": 4000}), tools=None)
    cancel = threading.Event()
    out = []
    for e in engine.ask(AskRequest("Q?", photo, mode="freeform"), cancel=cancel):
        out.append(e)
        if e.kind == "reasoning_token":
            cancel.set()
    assert out[-1].kind == "final_answer" and out[-1].stop_reason == "cancelled"
    assert sum(e.kind == "reasoning_token" for e in out) < 50


def test_user_errors_end_the_stream_with_a_fatal_error(tiny_models, settings, tmp_path):
    text_only = Model.load(tiny_models["text"], n_ctx=1024, n_threads=1, n_threads_batch=1)
    try:
        engine = Engine(text_only, settings)
        Image.new("RGB", (32, 32), "green").save(tmp_path / "a.png")  # a real image the model cannot see
        out = list(engine.ask(AskRequest("What is this?", tmp_path / "a.png")))
        assert out[-1].kind == "error" and out[-1].fatal and "cannot look at images" in out[-1].message
    finally:
        text_only.close()


def test_bad_image_is_a_fatal_error_event(tiny_vl, settings, tmp_path):
    engine = Engine(tiny_vl, settings)
    (tmp_path / "a.png").write_bytes(b"not an image at all")
    out = list(engine.ask(AskRequest("What is this?", tmp_path / "a.png")))
    assert [e.kind for e in out] == ["run_started", "error"] and out[-1].title == "Image problem"


@pytest.fixture(scope="module")
def smol_engine(smollm2_gguf, tmp_path_factory):
    """SmolLM2 behind one engine for the module (the system prompt's KV is evaluated once), searching a
    Wikipedia-shaped server on 127.0.0.1."""
    from tests.fakes.search_servers import FakeBackend

    wiki = FakeBackend("wikipedia").start()
    home = tmp_path_factory.mktemp("smol-home")
    st = Settings.load({"wikipedia_url": wiki.url, "n_threads": 1, "n_threads_batch": 1,
                        "answer_max_tokens": 6,
                        "freeform_max_tokens": 8, "max_turns": 3}, env={"EDGE_AGENT_HOME": str(home)})
    m = Model.load(smollm2_gguf, n_ctx=2048, n_threads=1, n_threads_batch=1, n_seq_max=8)
    engine = Engine(m, st, tools=SearchTools.from_settings(st))
    yield engine
    engine.close()
    wiki.stop()


@pytest.mark.smollm2
@pytest.mark.parametrize("mode", ["ssr", "freeform"])
def test_smollm2_text_only_episode(smol_engine, mode):
    """No image: only text_search and answer exist; a search turn (live, on loopback) then an answer;
    unforced, no image tool is ever called."""
    engine, settings = smol_engine, smol_engine.settings
    opts = AgentOptions.from_settings(settings, mode=mode,
                                      policy=lambda t, a: {"text_search"} if t == 1 else {"answer"})
    events = list(engine.ask(AskRequest("What is the capital of Peru?", None, options=opts)))
    kinds = [e.kind for e in events]
    assert kinds[0] == "run_started" and kinds[-1] == "final_answer", kinds
    done = next(e for e in events if e.kind == "tool_finished")
    assert done.name == "text_search" and done.status in ("live", "cached") and done.ok
    if mode == "ssr":
        scored = [e for e in events if e.kind == "rationale_scored"]
        assert {c.action for c in scored[0].candidates} == {"text_search"}
        assert {c.action for c in scored[1].candidates} == {"answer"}
    else:
        assert [e.n_tokens <= 8 for e in events if e.kind == "reasoning_done"] == [True, True]
    fins = [e.action for e in events if e.kind == "turn_finished"]
    assert fins == ["text_search", "answer"] and events[-1].stop_reason in ("answered", "length")
    opts = AgentOptions.from_settings(settings, mode=mode, max_turns=1, action_max_tokens=48)
    events = list(engine.ask(AskRequest("What is the capital of Peru?", None, options=opts)))
    assert events[-1].kind == "final_answer"
    assert all(e.name == "text_search" for e in events if e.kind == "tool_called")
    scored = [e for e in events if e.kind == "rationale_scored"]
    assert all(c.action in ("text_search", "answer") for e in scored for c in e.candidates)


def test_index_only_ablation_runs_on_the_real_runtime(tiny_vl, settings, photo):
    """Index-only SSR scores the answer rationales' "[k]" (one batch) and still pastes the chosen one's
    text."""
    spy = SpyModel(tiny_vl)
    engine = Engine(spy, settings, tools=SearchTools.from_settings(settings))
    opts = AgentOptions.from_settings(settings, index_only=True, policy=lambda t, a: {"answer"})
    events = list(engine.ask(AskRequest("What colour?", photo, options=opts)))
    scored = next(e for e in events if e.kind == "rationale_scored")
    # answer from the image / from knowledge (from the evidence: no tool result yet)
    assert [c.count for c in scored.candidates] == [len(tiny_vl.tokenize("[1]", special=False))] * 2
    chosen = scored.candidates[scored.chosen].text
    text = spy.sessions[-1].inner.text()
    assert "[1] I should search the web with the image" in text  # the numbered plans in the system prompt
    assert f"<think>\n{chosen}\n</think>\n\n<answer>" in text and events[-1].kind == "final_answer"


def test_taking_back_an_end_of_turn_token_keeps_the_session_consistent(tiny_vl):
    """Free-form reasoning that ends with an end-of-generation token: the loop takes the (pending)
    token back with Session.drop_last_token; positions, history and later decoding stay right."""
    s = tiny_vl.session()
    s.append_text("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n")
    before = s.n_pos
    g = s.generate(max_tokens=3)
    assert s.n_pos == before + len(g.tokens)
    assert s.drop_last_token()
    assert s.n_pos == before + len(g.tokens) - 1 and len(s.history) == s.n_pos
    ref = tiny_vl.session()  # the same text evaluated directly gives the same next-token distribution
    ref.append_text("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n")
    ref.append_tokens(g.tokens[:-1])
    a = ref.next_logprobs()
    s2 = tiny_vl.session()
    s2.append_text("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n")
    s2.generate(max_tokens=3)
    assert s2.drop_last_token() and s2.n_pending == 1  # the token before it is evaluated again, lazily
    np.testing.assert_allclose(s2.next_logprobs(), a, atol=1e-4)


def test_a_crop_stays_within_its_token_budget(tiny_models, tmp_path):
    """mtmd rounds each side of an image to its grid of pixels a token, against its own budget (the larger
    of the image's and the crop's): a crop fitted to 256 tokens' pixels, 756x346, came out 24x11 = 264
    tokens (the 2B stand-in in the app, a box the width of the photo). The store snaps crops to the grid
    (``snap_to_grid``) so that mtmd leaves them as they are: within ``crop_max_tokens``."""
    from PIL import Image

    from edge_agent.tools.zoom import ImageStore
    from scripts.bench_chat import photo as bench_photo

    photo = bench_photo(tmp_path / "photo.png")  # 768x768

    # mtmd's budget as the app loads it: the larger of the image's (576 tokens) and the crop's
    m = Model.load(tiny_models["text"], tiny_models["mmproj"], n_ctx=4096, n_threads=1, n_threads_batch=1,
                   image_max_tokens=576)
    px = m.image_px_per_token
    assert px > 1
    budget = 256

    def crop_tokens(grid: int) -> tuple[int, tuple[int, int]]:
        store = ImageStore(Image.open(photo), max_pixels=576 * px * px, crop_max_pixels=budget * px * px,
                           grid=grid)
        r = store.zoom([0, 0, 1000, 458], 0)  # 768x352 of the 768x768 photo: 270,336 px, over 256 x 32 x 32
        png = store.model_png(r.image.index)
        s = m.session()
        s.append_text("<|im_start|>user\n")
        return s.append_image(png).n_tokens, Image.open(io.BytesIO(png)).size

    try:
        unsnapped, _ = crop_tokens(1)
        tokens, (w, h) = crop_tokens(px)
    finally:
        m.close()
    assert unsnapped == 264 > budget  # what mtmd made of the crop before
    # Qwen's smart_resize of 756x346 within 256 x 32 x 32 px: 736x320, 23x10 tokens
    assert (w, h) == (736, 320) and tokens == (w // px) * (h // px) == 230 <= budget
