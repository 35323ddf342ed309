"""One definition per tool (``edge_agent.tools.specs``): every move is one module defining ``SPEC``, and
everything that names a tool reads the registry. A fifth tool is one new module: dropped onto the package's
path in a test, it is listed in the system prompt, chosen under the name grammar, parsed, run by the
toolbox, stated by a reasoning, accepted in a rationale library, and taken by the loop end to end."""

from __future__ import annotations

import importlib
import pkgutil
import textwrap

import pytest

from edge_agent.agent.actions import HEADS, TAIL_REST, TAIL_STOP, name_grammar, parse_action, tail_grammar
from edge_agent.agent.intent import stated_action
from edge_agent.agent.loop import AgentOptions, run_agent, system_for
from edge_agent.agent.prompts import system_prompt
from edge_agent.agent.rationales import library_actions, parse_library
from edge_agent.agent.toolbox import Toolbox
from edge_agent.tools import specs
from tests.fakes.sessions import EOS
from tests.fakes.sessions import LoopSession as FakeSession
from tests.fakes.tools import FakeSearch

WEATHER = '''
"""weather: the forecast for a city (a test's fifth tool: this module is all of it)."""

from edge_agent.tools.specs.base import STR_CHAR, ActionError, ToolSpec, call_head


def _check(args):
    city = args.get("city")
    if not isinstance(city, str) or not city.strip():
        raise ActionError("weather needs a city.")
    return {"city": city.strip()}


SPEC = ToolSpec(
    action="weather",
    name="weather_forecast",
    schema={"type": "function", "function": {
        "name": "weather_forecast", "description": "The forecast for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    head=call_head("weather_forecast", '"city": "'),
    tail_stop='"',
    tail_rest="}}\\n</tool_call>",
    tail_grammar=lambda n_images: f'root ::= city "\\\\""\\ncity ::= {STR_CHAR}{{1,30}}',
    check=_check,
    plan_verbs=r"(?:check the (?:weather|forecast))",
    can_do="ask for the weather",
    prompt_rank=40,
    library_rank=40,
    run=lambda args: f"Sunny in {args['city']}.",
)
'''


@pytest.fixture
def fifth_tool(tmp_path, monkeypatch):
    """``weather.py`` on the specs package's path: nothing else of the code is touched."""
    (tmp_path / "weather.py").write_text(textwrap.dedent(WEATHER), encoding="utf-8")
    monkeypatch.setattr(specs, "__path__", [*specs.__path__, str(tmp_path)])
    specs.refresh()
    yield specs.by_action("weather")
    specs.refresh()


def test_every_module_of_the_package_defines_one_move():
    names = sorted(m.name for m in pkgutil.iter_modules(specs.__path__) if m.name != "base")
    assert names == ["answer", "image_search", "text_search", "zoom"]
    for name in names:
        assert isinstance(importlib.import_module(f"edge_agent.tools.specs.{name}").SPEC, specs.ToolSpec)
    assert [s.action for s in specs.all_specs()] == ["zoom", "text_search", "image_search", "answer"]
    assert library_actions() == ("image_search", "text_search", "zoom", "answer")
    assert [s.cache_kind for s in specs.searches()] == ["text_search", "image_search"]
    assert specs.is_search("text_search") and not specs.is_search("image_zoom_in_tool")


def test_a_fifth_tool_is_one_module(fifth_tool):
    assert (fifth_tool.head in HEADS.values() and TAIL_STOP["weather"] == '"'
            and TAIL_REST["weather"] == "}}\n</tool_call>")
    prompt = system_prompt(["zoom", "text_search", "weather", "answer"])
    assert prompt.index('"name": "text_search"') < prompt.index('"name": "weather_forecast"')
    assert '"weather_forecast"' in name_grammar(["text_search", "weather"])
    assert tail_grammar("weather").startswith("root ::= city")
    call = parse_action(HEADS["weather"] + ' Oslo"}}\n</tool_call>')
    assert call.type == "weather" and call.call is not None and call.call.arguments == {"city": "Oslo"}
    assert call.call.action == "weather"
    assert stated_action("Let me check the weather in Oslo.") == "weather"
    assert parse_library({"rationales": [{"id": "w", "action": "weather",
                                          "text": "I should check the weather"},
                                         {"id": "a", "action": "answer", "text": "I know"}]}, source="x")
    box = Toolbox(None, FakeSearch())
    assert "weather" in box.offered_actions() and "weather" in box.available_actions()
    assert box.still_possible() == "You can still search by text, ask for the weather or answer."
    out = box.run(call.call)
    assert out.ok and out.observation == "Sunny in Oslo."
    assert '"weather_forecast"' in system_for(box, AgentOptions())


def test_the_loop_takes_a_fifth_tool_end_to_end(fifth_tool):
    """Free-form: the model names the tool under the name grammar, its tail is decoded under its grammar,
    it runs, and its observation comes back before the answer."""
    s = FakeSession(outputs=["Hmm.</think>", "<tool_call>", 'weather_forecast"', 'Oslo"', "Done." + EOS,
                             "<answer>", "Sunny</answer>"])
    box = Toolbox(None, FakeSearch())
    events = list(run_agent(s, "Weather in Oslo?", tools=box, options=AgentOptions(mode="freeform")))
    called = [e for e in events if e.kind == "tool_called"]
    assert [(e.name, e.arguments) for e in called] == [("weather_forecast", {"city": "Oslo"})]
    assert [e.action for e in events if e.kind == "turn_finished"] == ["weather", "answer"]
    assert "Sunny in Oslo." in s.text and events[-1].answer == "Sunny"
    assert '"weather_forecast"' in s.grammars[2]
