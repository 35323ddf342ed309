"""Issue 12's tool-availability policy: a tool that is unconfigured, or found unreachable in this
question, is withdrawn for the rest of it; a repeated identical call is refused and never offered
again; the observation says what failed and what is still possible; an answer that only repeats the
prompt's instructions is not presented as the answer.

Real parts: ``SearchTools`` over real HTTP to 127.0.0.1 (a port nobody listens on refuses the
connection, as a machine without network does), the SQLite cache, and the agent loop on the real
llama.cpp (SmolLM2-135M, the tiny Qwen3-VL). Random or tiny weights choose their own moves, so the
agent tests check what the policy guarantees whatever the model chooses.
"""

from __future__ import annotations

import socket

import pytest
from PIL import Image

from edge_agent.agent.actions import ToolCall
from edge_agent.agent.prompts import TURN_LIMIT_NOTE, echoes_instructions
from edge_agent.agent.toolbox import Toolbox
from edge_agent.core.config import Settings
from edge_agent.engine.face import AskRequest
from edge_agent.tools.http import HttpPolicy
from edge_agent.tools.search import SearchTools
from edge_agent.tools.zoom import ImageStore
from tests.fakes.search_servers import FakeBackend
from tests.fakes.tools import FakeSearch, outcome


def refused_url() -> str:
    """A loopback address where nothing listens: connecting is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/w/api.php"


def search_tools(edge_home, **overrides) -> SearchTools:
    settings = Settings.load({"wikipedia_url": refused_url(), **overrides})
    return SearchTools.from_settings(settings, policy=HttpPolicy(timeout=2, retries=0, backoff=0.0))


def image_store(tmp_path, n_crops: int = 0) -> ImageStore:
    store = ImageStore(Image.new("RGB", (200, 100), (200, 30, 30)), crops_dir=tmp_path / "crops")
    for _ in range(n_crops):
        store.zoom([0, 0, 500, 500], 0, "part")
    return store


def test_unreachable_search_is_withdrawn_for_the_rest_of_the_question(edge_home):
    """Connection refused: the outcome says so, the tool leaves the action set, a later call is not sent."""
    tools = search_tools(edge_home)
    tb = Toolbox(None, tools)
    assert tb.available_actions() == {"text_search", "answer"}
    first = tb.run(ToolCall("text_search", {"query": "capital of Peru"}))
    assert not first.ok and first.status == "unreachable"
    assert "cannot connect" in first.observation  # what failed
    assert "withdrawn for the rest of this question" in first.observation
    assert first.observation.rstrip().endswith("Give your final answer now.")  # what is still possible
    assert tb.available_actions() == {"answer"}
    again = tb.run(ToolCall("text_search", {"query": "Lima Peru"}))  # a model ignoring the grammar
    assert not again.ok and "not run" in again.observation and "cannot be reached" in again.observation
    assert "its results are above" not in first.observation + again.observation
    tools.close()


def test_with_an_image_the_observation_names_what_is_left(edge_home, tmp_path):
    tb = Toolbox(image_store(tmp_path), search_tools(edge_home))
    assert tb.available_actions() == {"zoom", "text_search", "answer"}  # image search: unconfigured
    out = tb.run(ToolCall("text_search", {"query": "red square"}))
    assert out.status == "unreachable"
    assert "You can still zoom into the image or answer." in out.observation
    assert tb.available_actions() == {"zoom", "answer"}


def test_a_refused_zoom_says_what_is_still_possible(edge_home, tmp_path):
    tb = Toolbox(image_store(tmp_path), search_tools(edge_home))
    out = tb.run(ToolCall("image_zoom_in_tool", {"bbox_2d": [0, 0, 500, 500], "label": "x", "img_idx": 7}))
    assert not out.ok and "img_idx 7 does not exist" in out.observation
    assert out.observation.endswith("You can still zoom into the image, search by text or answer.")


def test_unconfigured_tools_are_never_offered(edge_home, tmp_path):
    """image_search=none and a Brave backend without a key: neither is in the action set from the start."""
    tb = Toolbox(image_store(tmp_path), search_tools(edge_home, text_search="brave"))
    assert tb.available_actions() == {"zoom", "answer"}
    assert "image_search" in tb.withdrawn and "not configured" in tb.withdrawn["image_search"]
    out = tb.run(ToolCall("image_search", {"img_idx": 0}))
    assert not out.ok and out.status == "unconfigured" and "zoom into the image" in out.observation
    assert Toolbox(image_store(tmp_path), None).available_actions() == {"zoom", "answer"}


def test_a_repeated_search_brings_nothing_new_and_is_not_run(edge_home):
    """The same normalised query again is "nothing new" (the loop takes such a move back); run() refuses it
    without sending it; another query is still offered. The reason is true to what the first one gave."""
    wiki = FakeBackend("wikipedia").start()
    try:
        tools = search_tools(edge_home, wikipedia_url=wiki.url)
        tb = Toolbox(None, tools)
        wiki.fail_next("no_results")
        first = tb.run(ToolCall("text_search", {"query": "Pepón"}))
        assert first.ok and first.status == "live" and not first.results
        why = tb.nothing_new(ToolCall("text_search", {"query": "  pepón "}))
        assert why == 'this question already searched for "pepón" (it found nothing)'
        again = tb.run(ToolCall("text_search", {"query": "PEPÓN"}))
        assert wiki.count == 1 and not again.ok and again.status == "refused" and why in again.observation
        assert tb.nothing_new(ToolCall("text_search", {"query": "Pepón Peru"})) is None
        assert tb.available_actions() == {"text_search", "answer"}
        tools.close()
    finally:
        wiki.stop()


def test_offline_a_search_that_can_only_miss_is_not_offered(edge_home):
    """Offline with nothing cached for the backend: text_search is not offered at all. With one query
    cached: offered, that query may run (a cache hit), any other is nothing new."""
    wiki = FakeBackend("wikipedia").start()
    try:
        online = search_tools(edge_home, wikipedia_url=wiki.url)
        offline = search_tools(edge_home, wikipedia_url=wiki.url, offline=True)
        empty = Toolbox(None, offline)
        assert empty.available_actions() == {"answer"}
        assert empty.withdrawn["text_search"] == "it is offline and nothing is cached for text_search"
        assert online.text_search("Eiffel Tower").status == "live"
        tb = Toolbox(None, offline)
        assert tb.available_actions() == {"text_search", "answer"}
        assert tb.nothing_new(ToolCall("text_search", {"query": "eiffel  TOWER"})) is None
        assert tb.nothing_new(ToolCall("text_search", {"query": "Capital of Peru"})) == \
            'it is offline and "Capital of Peru" is not in the cache'
        hit = tb.run(ToolCall("text_search", {"query": "Eiffel Tower"}))
        assert hit.ok and hit.status == "cached" and wiki.count == 1
        online.close()
        offline.close()
    finally:
        wiki.stop()


def test_image_search_leaves_once_every_image_was_searched(edge_home, tmp_path):
    search = FakeSearch(image=lambda b, mime: outcome("image_search", "live", "none"))

    store = image_store(tmp_path, n_crops=1)
    tb = Toolbox(store, search)
    assert "image_search" in tb.available_actions()
    tb.run(ToolCall("image_search", {"img_idx": 0}))
    assert "image_search" in tb.available_actions()  # the crop is still unsearched
    tb.run(ToolCall("image_search", {"img_idx": 1}))
    assert "image_search" not in tb.available_actions() and len(search.images) == 2


def test_echoed_instructions_are_not_answers():
    assert echoes_instructions(TURN_LIMIT_NOTE)
    assert echoes_instructions("You have no tool calls left")
    assert echoes_instructions("give your final answer now.")
    assert not echoes_instructions("Lima")
    assert not echoes_instructions("The capital of Peru is Lima.")
    assert not echoes_instructions("Lima. You have no tool calls left.")  # an answer is there
    assert not echoes_instructions("red square")
    # a whole sentence of a tool's schema among words of its own (the real 0.5B, offline, asked to search)
    assert echoes_instructions('Search the web for the capital of Peru. Returns the top results (title, url, '
                               'snippet). The search query is "Peru". The top results are: Peru, Peru, Peru,')
    assert echoes_instructions("Sure. Answer the user's question in a few steps, then Lima.")  # the prompt's
    assert not echoes_instructions("I searched the web: the top results say Lima.")  # a few words, not one


# ---- the agent on the real runtime ----------------------------------------------------------------
@pytest.mark.parametrize("mode", ["freeform", "ssr"])
def test_agent_offline_by_accident_searches_once_then_answers(edge_home, smollm2_gguf, mode):
    """The demo with the network down: one search fails as unreachable, no other search is made, the
    rationales of searching leave the SSR candidates, and the run ends with an answer or no_answer,
    never with the prompt's own note as the answer."""
    from edge_agent.agent.loop import AgentOptions
    from edge_agent.engine.engine import Engine
    from edge_agent.runtime import Model

    settings = Settings.load({"wikipedia_url": refused_url(), "n_threads": 1, "n_threads_batch": 1,
                              "answer_max_tokens": 16, "freeform_max_tokens": 24})
    tools = SearchTools.from_settings(settings, policy=HttpPolicy(timeout=2, retries=0, backoff=0.0))
    # turn 1 must search (the model's own choice is not the point); later turns are the model's
    opts = AgentOptions.from_settings(settings, mode=mode, max_turns=4,
                                      policy=lambda t, a: {"text_search"} if t == 1 else a)
    with Model.load(smollm2_gguf, n_ctx=4096, n_threads=1, n_threads_batch=1) as m:
        events = list(Engine(m, settings, tools=tools).ask(AskRequest("What is the capital of Peru?",
                                                                      options=opts)))
    tools.close()
    finished = [e for e in events if e.kind == "tool_finished"]
    assert [(e.name, e.status) for e in finished][:1] == [("text_search", "unreachable")]
    assert [e.name for e in finished].count("text_search") == 1
    for e in events:
        if e.kind == "rationale_scored" and e.turn > 1:
            assert {c.action for c in e.candidates} <= {"answer"}
    final = events[-1]
    assert final.kind == "final_answer", final
    assert final.stop_reason in ("answered", "length", "turn_limit", "no_answer")
    assert not echoes_instructions(final.answer)


def test_unconfigured_image_search_never_reaches_the_model(edge_home, tiny_models, tmp_path, monkeypatch):
    """image_search=none with an image: its schema is not in the system prompt, its rationale is not
    scored, and free-form never calls it."""
    from edge_agent.agent.loop import AgentOptions
    from edge_agent.engine.engine import Engine
    from edge_agent.runtime import Model

    photo = tmp_path / "p.png"
    Image.new("RGB", (96, 64), (200, 40, 40)).save(photo)
    settings = Settings.load({"offline": True, "n_threads": 1, "n_threads_batch": 1, "answer_max_tokens": 4,
                              "freeform_max_tokens": 8})
    tools = SearchTools.from_settings(settings)
    seen_prompts: list[str] = []
    import edge_agent.agent.loop as loop

    real = loop.system_prompt

    def spy(*a, **kw):
        seen_prompts.append(real(*a, **kw))
        return seen_prompts[-1]

    monkeypatch.setattr(loop, "system_prompt", spy)
    with Model.load(tiny_models["text"], tiny_models["mmproj"], n_ctx=4096, n_threads=1,
                    n_threads_batch=1) as m:
        engine = Engine(m, settings, tools=tools)
        for mode in ("ssr", "freeform"):
            opts = AgentOptions.from_settings(settings, mode=mode, max_turns=2, action_max_tokens=96)
            events = list(engine.ask(AskRequest("What is this?", str(photo), options=opts)))
            assert events[-1].kind == "final_answer", events[-1]
            assert not [e for e in events if e.kind == "tool_called" and e.name == "image_search"]
            for e in events:
                if e.kind == "rationale_scored":
                    assert "image_search" not in {c.action for c in e.candidates}
    tools.close()
    assert seen_prompts and all('"image_search"' not in p for p in seen_prompts)
    assert all('"text_search"' in p for p in seen_prompts)


def test_the_system_prompt_does_not_depend_on_what_is_usable_now(edge_home, tmp_path):
    """Issue 23 item 13: an image attached or not, a search withdrawn as unreachable: the system prompt
    stays the same (the chat's KV cache stays valid); only the per-question actions change."""
    from edge_agent.agent.loop import AgentOptions, system_for

    opts = AgentOptions()
    tools = search_tools(edge_home)
    with_image, without = Toolbox(image_store(tmp_path), tools), Toolbox(None, tools, vision=True)
    assert with_image.available_actions() != without.available_actions()
    prompt = system_for(with_image, opts)
    assert system_for(without, opts) == prompt
    assert '"image_zoom_in_tool"' in prompt and '"image_search"' not in prompt  # image search: unconfigured
    without.run(ToolCall("text_search", {"query": "capital of Peru"}))  # refused: withdrawn
    assert "text_search" not in without.available_actions() and system_for(without, opts) == prompt
    text_model = system_for(Toolbox(None, tools, vision=False), opts)
    assert '"image_zoom_in_tool"' not in text_model and '"text_search"' in text_model


def test_a_search_whose_results_were_all_read_brings_nothing_new():
    """On the real 1.5B a search that found the fact was followed by the same query with a qualifier
    ("capital of Lebanon in 2023", "... in English"), up to the turn limit: results the question has read
    are nothing new. The query runs once to see (the backend is asked once); run() uses that outcome."""
    from tests.fakes.tools import result

    a, b, c = result("A", "http://a", "a"), result("B", "http://b", "b"), result("C", "http://c", "c")
    found = {"capital of Lebanon": [a, b], "capital of Lebanon in 2023": [b, a],
             "Lebanon population": [a, c], "Lebanon nothing": []}
    search = FakeSearch(text=lambda q: outcome(results=found[q], query=q, observation=q))
    tb = Toolbox(None, search)

    def call(q: str) -> ToolCall:
        return ToolCall("text_search", {"query": q})

    assert tb.nothing_new(call("capital of Lebanon")) is None
    assert search.queries == []  # nothing read yet: no look-ahead
    assert tb.run(call("capital of Lebanon")).ok
    why = tb.nothing_new(call("capital of Lebanon in 2023"))
    assert why is not None and "read already" in why and '"capital of lebanon"' in why
    assert tb.nothing_new(call("capital of Lebanon in 2023")) == why
    assert search.queries == ["capital of Lebanon", "capital of Lebanon in 2023"]  # looked ahead once
    assert tb.nothing_new(call("Lebanon population")) is None  # one result is new
    assert tb.nothing_new(call("Lebanon nothing")) is None  # found nothing: the model should hear it
    out = tb.run(call("Lebanon population"))
    assert out.ok and out.observation == "Lebanon population"
    assert search.queries.count("Lebanon population") == 1  # run() used the look-ahead's outcome
    assert "read already" in (tb.nothing_new(call("capital of Lebanon in 2023")) or "")
