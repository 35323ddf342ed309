"""Chat continuity and saved context states, on the real llama.cpp with the tiny F32 Qwen3-VL.

Every reuse of evaluated state is compared with evaluating from scratch: a follow-up answered in the
live KV cache gives the same greedy tokens as the whole transcript evaluated anew; a restored state
(system prompt; a chat holding an image and a crop) gives the same next-token logits; damaged,
truncated and foreign state files are ignored, and a process killed while saving leaves nothing
that is later used.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edge_agent.agent.context import Opened, append_segments
from edge_agent.agent.loop import AgentOptions
from edge_agent.agent.prompts import question_segments
from edge_agent.core.config import Settings
from edge_agent.engine.engine import Engine
from edge_agent.engine.face import AskRequest
from edge_agent.runtime import Model
from edge_agent.runtime.state import IMAGE, KeyHasher, SessionState, StateStore, dumps, sequence_key
from edge_agent.runtime.types import ImageChunk
from tests.fakes.spies import SpyModel

ROOT = Path(__file__).resolve().parents[1]


def load(tiny_models, **kw):
    kw = {"n_ctx": 8192, "n_threads": 1, "n_threads_batch": 1, "kv_type": "f32", **kw}
    return Model.load(tiny_models["text"], tiny_models["mmproj"], **kw)


@pytest.fixture
def model(tiny_models):
    m = load(tiny_models)
    yield m
    m.close()


@pytest.fixture
def settings(edge_home: Path) -> Settings:
    return Settings.load({"offline": True, "n_threads": 1, "n_threads_batch": 1, "answer_max_tokens": 6,
                          "max_turns": 2})


@pytest.fixture
def photo(tmp_path: Path) -> Path:
    """768x768 (576 image tokens), a sign and a door: the photo of scripts/bench_chat.py."""
    from scripts.bench_chat import photo as bench_photo

    return bench_photo(tmp_path / "photo.png")


def answer_only(turn, allowed):
    return {"answer"}


def zoom_then_answer(turn, allowed):
    return {"zoom"} if turn == 1 else {"answer"}


def replay(model: Model, history: list[int], pngs: list[bytes]):
    """A fresh session holding ``history`` evaluated from scratch (images through append_image)."""
    s = model.session()
    vs, ve = (model.tokenize(t, special=True) for t in ("<|vision_start|>", "<|vision_end|>"))
    run: list[int] = []
    it = iter(pngs)
    i = 0
    while i < len(history):
        t = history[i]
        if t == IMAGE:
            assert run[-len(vs):] == vs and history[i + 1 : i + 1 + len(ve)] == ve
            s.append_tokens(run[: -len(vs)])
            s.append_image(next(it))
            run = []
            i += 1 + len(ve)
            continue
        run.append(t)
        i += 1
    s.append_tokens(run)
    return s


def opened(events):
    return next(e for e in events if e.kind == "context_opened")


def user_turn_tokens(model: Model, question: str) -> int:
    return sum(len(model.tokenize(seg.text, special=seg.special))
               for seg in question_segments(question, None))


def test_followup_is_appended_to_the_live_context_and_evaluates_only_its_turn(model, settings, photo):
    """Three questions in one chat: the follow-ups open 'live', evaluate exactly their user turn
    (tokens evaluated / floor = 1) and report the rest as reused."""
    engine = Engine(model, settings)
    opts = AgentOptions.from_settings(settings, policy=answer_only)
    first = list(engine.ask(AskRequest("What is it?", photo, options=opts)))
    assert opened(first).source == "new" and first[-1].context
    key, cells = first[-1].context, model.active_session.n_cells
    for q in ("And the colour?", "Where is the sign?"):
        events = list(engine.ask(AskRequest(q, photo, options=opts, context=key)))
        o, fin = opened(events), events[-1]
        assert o.source == "live" and o.tokens_reused == cells
        assert o.tokens_evaluated == user_turn_tokens(model, q)  # the image is not read again
        assert not [e for e in events if e.kind == "image_evaluated"]
        assert fin.totals["tokens_reused"] == cells and fin.totals["tokens_evaluated"] >= o.tokens_evaluated
        key, cells = fin.context, model.active_session.n_cells
    engine.close()


def test_settle_waits_for_the_answers_state_save(model, settings, photo, monkeypatch):
    """Engine.settle (the eval calls it between records, so that no question pays for the previous one's
    save) returns only once the answer's state, written in the background, is in the store."""
    import edge_agent.runtime.state as state_mod

    writing, release = threading.Event(), threading.Event()
    real_dumps = state_mod.dumps

    def slow_dumps(state):
        writing.set()
        release.wait(30)
        return real_dumps(state)

    monkeypatch.setattr(state_mod, "dumps", slow_dumps)
    engine = Engine(model, settings)
    opts = AgentOptions.from_settings(settings, policy=answer_only)
    key = list(engine.ask(AskRequest("What is it?", photo, options=opts)))[-1].context
    assert writing.wait(30) and not engine.contexts.store.has(key)  # the answer is back; its save is not
    settled = threading.Event()
    waiter = threading.Thread(target=lambda: (engine.settle(), settled.set()))
    waiter.start()
    assert not settled.wait(0.3)  # still writing: settle waits
    release.set()
    assert settled.wait(30) and engine.contexts.store.has(key)
    waiter.join()
    engine.close()


def test_detach_and_reattach_keep_the_context(model, settings, photo):
    """Issue 23 item 13: a question about the photo, one with the photo detached, one with it attached
    again: both follow-ups continue the live context and evaluate exactly their new user turn."""
    engine = Engine(model, settings)
    opts = AgentOptions.from_settings(settings, policy=answer_only)
    first = list(engine.ask(AskRequest("What is it?", photo, options=opts)))
    key = first[-1].context
    for q, image in (("Is it old?", None), ("And the colour?", photo)):
        cells = model.active_session.n_cells
        events = list(engine.ask(AskRequest(q, image, options=opts, context=key)))
        o = opened(events)
        assert (o.source, o.reason, o.tokens_reused) == ("live", "", cells)
        assert o.tokens_evaluated == user_turn_tokens(model, q)
        key = events[-1].context
    engine.close()


def test_followup_with_continuity_gives_the_same_tokens_as_from_scratch(tiny_models, settings, photo):
    """Greedy: the follow-up answered in the kept KV cache == the whole transcript evaluated anew."""
    m = SpyModel(load(tiny_models))  # records every image appended, for the replay
    engine = Engine(m, settings)
    # as run_agent gets below
    opts = AgentOptions.from_settings(settings, policy=zoom_then_answer, ssr_score="raw")
    first = list(engine.ask(AskRequest("What does the sign say?", photo, options=opts)))
    transcript, pngs = list(m.inner.active_session.history), list(m.pngs)
    assert len(pngs) == 2  # the photo and a crop
    cont = list(engine.ask(AskRequest("And the colour?", photo, options=opts, context=first[-1].context)))
    assert opened(cont).source == "live"
    live = list(m.inner.active_session.history)

    class Scratch:
        """A context that evaluates the first question's whole transcript anew, then the follow-up."""

        def open(self, system, question, image, *, cancel=None):
            s = replay(m.inner, transcript, pngs)
            append_segments(s, question_segments(question, None))
            return Opened(s, "rebuilt")

        def answered(self, session):
            return ""

        def abandon(self):
            pass

    from edge_agent.agent.loop import run_agent
    from edge_agent.agent.toolbox import Toolbox
    from edge_agent.tools.images import load_image
    from edge_agent.tools.zoom import ImageStore

    tb = Toolbox(ImageStore(load_image(photo).image, max_pixels=settings.image_max_tokens * 1024,
                            crop_max_pixels=settings.crop_max_tokens * 1024))
    scratch = list(run_agent(None, "And the colour?", tools=tb, image=tb.image_png(0), options=opts,
                             context=Scratch()))
    pick = lambda evs: [(e.kind, getattr(e, "text", None), getattr(e, "arguments", None))  # noqa: E731
                        for e in evs
                        if e.kind in ("answer_token", "tool_called", "rationale_scored")]
    assert pick(scratch) == pick(cont) and scratch[-1].answer == cont[-1].answer
    assert m.inner.active_session.history == live  # token for token the same context
    engine.close()
    m.inner.close()


def test_restored_system_prompt_and_chat_give_the_logits_of_evaluating(tiny_models, photo):
    """A state saved after the system prompt, and one after an image, text and a crop, set into a
    second load of the model: next-token logits within 1e-5 of the original and of a re-evaluation."""
    from edge_agent.tools.images import load_image
    from edge_agent.tools.zoom import ImageStore

    a, b = load(tiny_models), load(tiny_models)
    store = ImageStore(load_image(photo).image)
    crop = store.zoom([500, 0, 1000, 400], 0, "sign").image.index
    s = a.session()
    s.append_text("<|im_start|>system\nYou look at images.<|im_end|>\n")
    states = [s.save_state("system prompt")]
    s.append_text("<|im_start|>user\n")
    s.append_image(store.model_png(0))
    s.append_text("What is it?<|im_end|>\n<|im_start|>assistant\n<think>\nI should zoom\n</think>\n\n")
    s.append_image(store.model_png(crop))
    s.append_text("a white sign")
    states.append(s.save_state("chat"))
    for st in states:
        r = b.restore(st)
        assert r.n_pos == st.n_pos and r.n_cells == st.n_cells and r.key() == st.key
        np.testing.assert_allclose(r.next_logprobs(),
                                   st.logits - np.log(np.exp(st.logits.astype(np.float64)).sum()),
                                   atol=1e-5)
        fresh = replay(b, st.history, [store.model_png(0), store.model_png(crop)][: len(st.images)])
        expect = fresh.next_logprobs()
        got = b.restore(st).next_logprobs()
        np.testing.assert_allclose(got, expect, atol=1e-5)
        # and generation continues the same way
        g1 = b.restore(st).generate(max_tokens=5).tokens
        g2 = replay(b, st.history, [store.model_png(0),
                                    store.model_png(crop)][: len(st.images)]).generate(max_tokens=5).tokens
        assert g1 == g2
    a.close()
    b.close()


def test_reopened_chat_is_restored_from_disk_after_a_restart(tiny_models, settings, photo):
    """A second engine (a new process would be the same: nothing is shared but the files) continues
    the chat from its saved state: no image or history is evaluated again."""
    m1 = load(tiny_models)
    e1 = Engine(m1, settings)
    opts = AgentOptions.from_settings(settings, policy=answer_only)
    first = list(e1.ask(AskRequest("What is it?", photo, options=opts)))
    cells = m1.active_session.n_cells
    e1.close()
    m2 = load(tiny_models)
    e2 = Engine(m2, settings)
    events = list(e2.ask(AskRequest("And now?", photo, options=opts, context=first[-1].context,
                                    history=[("What is it?", first[-1].answer)])))
    o = opened(events)
    assert o.source == "restored" and o.tokens_reused == cells
    assert o.tokens_evaluated == user_turn_tokens(m2, "And now?")
    # a new chat on this machine restores the system prompt instead of evaluating it
    fresh = opened(list(e2.ask(AskRequest("Other?", photo, options=opts))))
    assert fresh.source == "new" and fresh.system_restored and fresh.tokens_reused > 0
    e2.close()


def test_damaged_truncated_and_foreign_state_files_are_ignored(tiny_models, settings, photo):
    """Each damaged file: not used (the chat is rebuilt from its text and answered), and removed."""
    opts = AgentOptions.from_settings(settings, policy=answer_only)
    m = load(tiny_models)
    e = Engine(m, settings)
    first = list(e.ask(AskRequest("What is it?", photo, options=opts)))
    e.close()
    key = first[-1].context
    path = settings.states_dir / f"{key}.kvstate"
    good = path.read_bytes()
    other = load(tiny_models, n_ctx=4096)  # another context size: another identity
    foreign = other.session()
    foreign.append_text("<|im_start|>system\nhello<|im_end|>\n")
    foreign_bytes = b"".join(bytes(p) for p in dumps(
        foreign.save_state()))
    other.close()
    flipped = bytearray(good)
    flipped[-100] ^= 0xFF
    for name, data in [("flipped byte", bytes(flipped)), ("truncated", good[: len(good) // 2]),
                       ("foreign", foreign_bytes), ("garbage", b"not a state at all"), ("empty", b"")]:
        path.write_bytes(data)
        e = Engine(load(tiny_models), settings)
        events = list(e.ask(AskRequest("And now?", photo, options=opts, context=key,
                                       history=[("What is it?", first[-1].answer)])))
        o = opened(events)
        assert o.source == "rebuilt" and o.reason == "no saved state", name
        assert events[-1].kind == "final_answer", name
        assert not path.exists(), name  # a damaged file is removed, not tried again
        e.close()


def test_a_process_killed_while_saving_leaves_no_broken_state(tmp_path):
    """SIGKILL in the middle of writing states: every .kvstate file left loads whole; temp files
    are never read as states (and `clear` removes them)."""
    d = tmp_path / "states"
    script = textwrap.dedent(f"""
        import sys, numpy as np
        sys.path.insert(0, {str(ROOT)!r})
        from edge_agent.runtime.state import SessionState, StateStore, sequence_key
        store = StateStore({str(d)!r}, 1 << 40)
        rng = np.random.default_rng(0)
        i = 0
        while True:
            hist = [1, 2, 3, i]
            st = SessionState(identity={{"m": 1}}, key=sequence_key({{"m": 1}}, hist, []), history=hist,
                              images=[],
                              n_pos=4, n_cells=4, logits=np.zeros(16, np.float32),
                              kv=rng.integers(0, 255, 8 << 20, dtype=np.uint8))
            store.put(st, wait=True)
            print(i, flush=True)
            i += 1
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    for _ in range(3):  # a few complete writes, then kill it while it writes the next
        assert p.stdout.readline()
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    store = StateStore(d, 1 << 40)
    files = store.files()
    assert len(files) >= 3
    for f in files:
        st = store.get(f.stem, {"m": 1})
        assert st is not None, f.name  # whole, or it would not carry the .kvstate name
        assert st.key == f.stem and st.history[:3] == [1, 2, 3]
    store.clear()
    assert not list(d.iterdir())


def test_store_budget_evicts_least_recently_used(tmp_path):
    ident = {"m": 1}

    def state(i: int) -> SessionState:
        hist = [i]
        return SessionState(identity=ident, key=sequence_key(ident, hist, []), history=hist, images=[],
                            n_pos=1,
                            n_cells=1, logits=np.zeros(4, np.float32), kv=np.full(1000, i, np.uint8))

    size = sum(len(bytes(p)) for p in dumps(state(0)))
    store = StateStore(tmp_path, 3 * size + size // 2)  # room for three files
    keys = []
    for i in range(3):
        st = state(i)
        store.put(st, wait=True)
        keys.append(st.key)
        os.utime(store.path(st.key), (1000 + i, 1000 + i))
    assert store.get(keys[0], ident) is not None  # used: now the most recent
    store.put(state(3), wait=True)
    assert store.has(keys[0]) and not store.has(keys[1]) and store.has(keys[2])
    assert store.stats()["files"] == 3 and store.stats()["bytes"] <= store.budget


def test_keys_do_not_depend_on_how_a_sequence_was_split():
    ident = {"m": 1}
    img = ImageChunk(n_tokens=4, n_pos=2, nx=2, ny=2, width=64, height=64, digest="ab" * 32)
    whole = sequence_key(ident, [5, 6, IMAGE, 7], [img])
    parts = KeyHasher(ident).tokens([5]).tokens([6]).image(img.digest).tokens([7]).key()
    assert whole == parts
    assert sequence_key(ident, [5, 6, IMAGE, 8], [img]) != whole
    assert sequence_key({"m": 2}, [5, 6, IMAGE, 7], [img]) != whole


def test_cancelled_followup_rolls_back_to_the_last_answer(model, settings, photo):
    """Cancel a follow-up mid-answer: the context goes back to the end of the previous answer, and
    the next follow-up continues live from there as if the cancelled one never happened."""
    engine = Engine(model, settings)
    opts = AgentOptions.from_settings(settings, policy=answer_only)
    first = list(engine.ask(AskRequest("What is it?", photo, options=opts)))
    key, cells = first[-1].context, model.active_session.n_cells
    cancel = threading.Event()
    events = []
    for e in engine.ask(AskRequest("Tell me more?", photo, options=opts, context=key), cancel=cancel):
        events.append(e)
        if e.kind == "turn_started":
            cancel.set()
    assert (events[-1].kind == "final_answer" and events[-1].stop_reason == "cancelled"
            and not events[-1].context)
    assert model.active_session.n_cells == cells  # rolled back to the clean boundary
    again = list(engine.ask(AskRequest("And the colour?", photo, options=opts, context=key)))
    assert opened(again).source == "live" and opened(again).tokens_reused == cells
    engine.close()


def test_a_full_context_is_rebuilt_compactly_and_still_answers(tiny_models, edge_home, photo):
    """A chat that would overflow the context is rebuilt as earlier answers in text + the current
    image; the user is told why, and the question is answered."""
    settings = Settings.load({"offline": True, "n_threads": 1, "answer_max_tokens": 6, "max_turns": 1,
                              "n_ctx": 1536})
    m = load(tiny_models, n_ctx=1536)
    engine = Engine(m, settings)
    opts = AgentOptions.from_settings(settings, policy=answer_only)
    key, history, seen = "", [], []
    for q in ["What is it?", "And then?", "Why?", "Where?", "When?"]:
        events = list(engine.ask(AskRequest(q, photo, options=opts, context=key, history=history)))
        assert events[-1].kind == "final_answer" and events[-1].stop_reason in ("answered", "length")
        seen.append((opened(events).source, opened(events).reason))
        key = events[-1].context
        history.append((q, events[-1].answer))
    assert ("rebuilt", "the context is full: earlier answers kept as text") in seen
    engine.close()
    m.close()


def test_a_new_image_mid_chat_is_a_new_user_turn(model, settings, photo, tmp_path):
    engine = Engine(model, settings)
    opts = AgentOptions.from_settings(settings, policy=answer_only)
    first = list(engine.ask(AskRequest("What is it?", photo, options=opts)))
    other = tmp_path / "other.png"
    Image.new("RGB", (320, 320), (200, 30, 30)).save(other)
    events = list(engine.ask(AskRequest("And this one?", other, options=opts, context=first[-1].context)))
    o = opened(events)
    images = [e for e in events if e.kind == "image_evaluated"]
    assert o.source == "live" and len(images) == 1 and images[0].source == "image"
    assert len(model.active_session.images) == 2
    engine.close()


def test_a_reused_image_embedding_gives_the_logits_of_a_fresh_encode(tiny_models, photo):
    """The embedding cache (one vision encode per image): an image decoded from the cached embedding
    gives exactly the next-token logits of encoding it afresh, in another model load too."""
    from edge_agent.runtime import vision
    from edge_agent.tools.images import load_image
    from edge_agent.tools.zoom import ImageStore

    png = ImageStore(load_image(photo).image).model_png(0)

    def read(m: Model) -> tuple[ImageChunk, np.ndarray]:
        s = m.session()
        s.append_text("<|im_start|>user\n")
        chunk = s.append_image(png)
        s.append_text("What is on the sign?<|im_end|>\n<|im_start|>assistant\n")
        return chunk, s.next_logprobs()

    a, b = load(tiny_models), load(tiny_models)
    vision.clear_cache()
    n0 = vision.vision_encodes()
    fresh, expect = read(a)
    reused, got = read(a)
    other, got_b = read(b)  # another load of the same files: the same mmproj bytes
    assert not fresh.reused and reused.reused and other.reused and vision.vision_encodes() == n0 + 1
    np.testing.assert_array_equal(got, expect)
    np.testing.assert_array_equal(got_b, expect)
    vision.clear_cache()
    again, fresh_again = read(b)  # encoded afresh after the cache is cleared: the same numbers
    assert not again.reused
    np.testing.assert_array_equal(fresh_again, expect)
    a.close()
    b.close()


def test_an_image_read_ahead_is_not_encoded_again_and_answers_the_same(tiny_models, settings, photo,
                                                                       tmp_path):
    """Engine.prepare_image (the app calls it on attach, while the person types) encodes the photo as
    ask will fit it; the question then decodes that embedding (no encode on its path) and gives the
    same answer and rationale scores as a question that encoded the photo itself."""
    from edge_agent.agent.events import FinalAnswer, ImageEvaluated, RationaleScored
    from edge_agent.runtime import vision

    def ask(engine):
        opts = AgentOptions.from_settings(settings, policy=answer_only)
        events = list(engine.ask(AskRequest("What is on the sign?", photo, options=opts)))
        img = next(e for e in events if isinstance(e, ImageEvaluated))
        scores = [c.score for e in events if isinstance(e, RationaleScored) for c in e.candidates]
        fin = events[-1]
        assert isinstance(fin, FinalAnswer)
        return img, scores, fin.answer

    m = load(tiny_models)
    try:
        vision.clear_cache()
        plain = ask(Engine(m, settings))
        assert not plain[0].reused and plain[0].encode_seconds > 0
        vision.clear_cache()
        engine = Engine(m, settings)
        n0 = m.vision_encodes
        assert engine.prepare_image(photo) is True
        assert m.vision_encodes == n0 + 1
        assert engine.prepare_image(photo) is False  # cached: nothing to do
        img, scores, answer = ask(engine)
        assert img.reused and img.encode_seconds == 0 and m.vision_encodes == n0 + 1
        assert img.tokens == plain[0].tokens
        assert scores == plain[1] and answer == plain[2]
        # nothing to read ahead: a file that is not an image (ask reports it), a text-only model
        bad = tmp_path / "not-an-image.png"
        bad.write_bytes(b"no image here")
        assert engine.prepare_image(bad) is False
    finally:
        m.close()
    text_only = Model.load(tiny_models["text"], n_ctx=2048, n_threads=1, n_threads_batch=1)
    try:
        assert Engine(text_only, settings).prepare_image(photo) is False
    finally:
        text_only.close()
