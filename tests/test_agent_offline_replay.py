"""Issue 4's "done when": the agent calls the search tools by name against a real (loopback) server,
and the same question asked again with --offline is answered from the cache with the same results.

Real parts throughout: the tiny Qwen3-VL model in llama.cpp, SearchTools over HTTP to a
Wikipedia-shaped server on 127.0.0.1, the SQLite cache. A policy forces the path (search, then
answer): the random-weight model's own choices are not the point here.
"""

from __future__ import annotations

import pytest
from PIL import Image

from edge_agent.agent.loop import AgentOptions
from edge_agent.core.config import Settings
from edge_agent.engine.engine import Engine
from edge_agent.engine.face import AskRequest
from edge_agent.runtime import Model
from edge_agent.tools.search import SearchTools
from tests.fakes.search_servers import FakeBackend


@pytest.fixture
def wiki():
    srv = FakeBackend("wikipedia").start()
    yield srv
    srv.stop()


def run(model, settings, photo, mode):
    tools = SearchTools.from_settings(settings)
    engine = Engine(model, settings, tools=tools)
    opts = AgentOptions.from_settings(settings, mode=mode, max_turns=2, action_max_tokens=96,
                                      policy=lambda t, a: {"text_search"} if t == 1 else {"answer"})
    events = list(engine.ask(AskRequest("What does the sign say?", str(photo), options=opts)))
    tools.close()
    return events


@pytest.mark.parametrize("mode", ["ssr", "freeform"])
def test_online_answer_replays_offline_from_the_cache(tiny_models, edge_home, wiki, tmp_path, mode):
    photo = tmp_path / "p.png"
    Image.new("RGB", (96, 64), (200, 40, 40)).save(photo)
    base = {"n_threads": 1, "n_threads_batch": 1, "answer_max_tokens": 6, "freeform_max_tokens": 8,
            "wikipedia_url": wiki.url}
    with Model.load(tiny_models["text"], tiny_models["mmproj"], n_ctx=4096, n_threads=1,
                    n_threads_batch=1) as m:
        online = run(m, Settings.load({**base, "offline": False}), photo, mode)
        n_requests = len(wiki.requests)
        offline = run(m, Settings.load({**base, "offline": True}), photo, mode)

    calls = [e for e in online if e.kind == "tool_called"]
    assert [c.name for c in calls] == ["text_search"]  # the agent called the tool by its name
    live = [e for e in online if e.kind == "tool_finished"]
    again = [e for e in offline if e.kind == "tool_finished"]
    assert [e.status for e in live] == ["live"] and n_requests >= 1
    assert [e.status for e in again] == ["cached"]
    assert len(wiki.requests) == n_requests  # offline: not one more request reached the server
    assert again[0].results == live[0].results and len(live[0].results) > 0
    assert again[0].observation == live[0].observation
    assert online[-1].kind == offline[-1].kind == "final_answer"
    assert offline[-1].answer == online[-1].answer  # same model, same context, greedy: same answer
