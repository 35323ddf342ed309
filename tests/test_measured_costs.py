"""Issue 19 item 3: SeProD's measured costs persist per model files and machine, so a new process (a
one-shot `edge-agent ask`) prices its first draft instead of skipping it as "cannot be priced yet".

Real parts: two Engine loads of the tiny Qwen3-VL agent and prophet (real llama.cpp) sharing a home;
the file logic on its own for damaged and foreign entries.
"""

from __future__ import annotations

import json

from PIL import Image

from edge_agent.agent.seprod_policy import Costs
from edge_agent.core.config import Settings
from edge_agent.engine.face import AskRequest
from edge_agent.engine.measured import FILE_NAME, MeasuredCosts, costs_key


def test_costs_round_trip_and_a_damaged_or_foreign_file_is_ignored(tmp_path):
    """What one process measured is read back by the next under the same key only; a damaged file or
    nonsense values are ignored, never raised."""
    c = Costs(agent_token=0.02, verify_token=0.004, lead={"answering": 0.3})
    MeasuredCosts(tmp_path / FILE_NAME, "k1", c).save()
    back = Costs()
    assert MeasuredCosts.open(tmp_path, "k1", back).loaded == 2
    assert (back.agent_token, back.verify_token, back.lead) == (0.02, 0.004, {"answering": 0.3})
    other = Costs()
    assert MeasuredCosts.open(tmp_path, "k2", other).loaded == 0 and other.agent_token is None
    (tmp_path / FILE_NAME).write_text('{"k1": {"agent_token": "fast", "prophet_token": -1, "verify_token": '
                                      'true}}')
    assert MeasuredCosts.open(tmp_path, "k1", Costs()).loaded == 0
    (tmp_path / FILE_NAME).write_bytes(b"\x00\xffnot json")
    fresh = Costs(agent_token=0.5)
    m = MeasuredCosts.open(tmp_path, "k1", fresh)
    assert m.loaded == 0 and fresh.agent_token == 0.5
    m.save()  # a damaged file is replaced
    assert json.loads((tmp_path / FILE_NAME).read_text())["k1"]["agent_token"] == 0.5


def test_the_key_names_both_model_files_and_the_threads():
    a, b = {"model": "aaa", "kv_type": "f16"}, {"model": "bbb", "kv_type": "f16"}
    k = costs_key(a, b, (1, 1, 0))
    assert k == costs_key(dict(a), dict(b), (1, 1, 0))
    assert len({k, costs_key(b, a, (1, 1, 0)), costs_key(a, b, (2, 1, 0)),
                costs_key({**a, "model": "x"}, b, (1, 1, 0))}) == 4


def test_a_new_process_prices_its_first_draft(tiny_models, edge_home, tmp_path):
    """Engine 1 answers with SeProD and saves what it measured; engine 2 (a new process's engine, same
    files and machine) starts with those costs: its first question's draft is never skipped as
    "cannot be priced yet"."""
    from edge_agent.engine.engine import Engine

    settings = Settings.load({"model": str(tiny_models["text"]), "mmproj": str(tiny_models["mmproj"]),
                              "prophet": str(tiny_models["prophet"]),
                              "prophet_mmproj": str(tiny_models["mmproj"]),
                              "n_threads": 1, "n_threads_batch": 1, "n_ctx": 4096, "offline": True,
                              "max_turns": 1, "answer_max_tokens": 6})
    photo = tmp_path / "p.png"
    Image.new("RGB", (96, 64), (120, 40, 40)).save(photo)
    first = Engine.from_settings(settings)
    try:
        assert first.measured is not None and first.measured.loaded == 0
        for q in ("What colour is it?", "Is it red?"):
            events = list(first.ask(AskRequest(q, photo)))
            assert events[-1].kind == "final_answer", events[-1]
        measured = first.measured.costs.agent_token
        assert measured is not None
    finally:
        first.close()
    assert (edge_home / FILE_NAME).exists()
    second = Engine.from_settings(settings)
    try:
        assert second.measured is not None and second.measured.loaded >= 1
        assert second.drafter is not None and second.measured.costs.agent_token == measured
        events = list(second.ask(AskRequest("What colour is it?", photo)))
        assert events[-1].kind == "final_answer", events[-1]
        skipped = [e for e in events if e.kind == "draft_skipped"]
        assert not [e for e in skipped if "cannot be priced" in e.detail], skipped
    finally:
        second.close()
