"""The first run saves exactly the model pair that loaded, and a default model never takes another model's
mmproj (issue 30 item 3). The app on the real llama.cpp with the tiny Qwen3-VL files."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from edge_agent.core.config import Settings
from edge_agent.modelfiles.resolution import resolve
from edge_agent.ui.app import EdgeAgentApp
from edge_agent.ui.screens.first_run import FirstRunScreen
from tests.pilot import settle

SIZE = (120, 40)


def saved(home: Path) -> dict:
    return tomllib.loads((home / "config.toml").read_text())


@pytest.mark.asyncio
async def test_fixing_only_the_mmproj_saves_the_whole_pair_that_loaded(edge_home: Path, tiny_models):
    """A mismatched mmproj is refused; fixing just the mmproj loads, and config.toml then holds that model
    and that mmproj (it kept the old missing model before: the next launch failed again)."""
    (edge_home / "config.toml").write_text('model = "/nowhere/missing.gguf"\n')
    settings = Settings.load({"n_threads": 1, "n_threads_batch": 1, "n_ctx": 2048, "offline": True})
    app = EdgeAgentApp(settings)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, FirstRunScreen)
        app.screen.query_one("#model-path").value = str(tiny_models["text"])
        app.screen.query_one("#mmproj-path").value = str(tiny_models["mmproj_mismatch"])
        await pilot.click("#use-files")
        await settle(pilot)
        assert isinstance(app.screen, FirstRunScreen) and app.host.state == "no model"
        assert saved(edge_home)["model"] == "/nowhere/missing.gguf"  # nothing of the rejected pair
        app.screen.query_one("#mmproj-path").value = str(tiny_models["mmproj"])  # the model field as it was
        await pilot.click("#use-files")
        await settle(pilot)
        assert app.host.state == "ready" and app.host.sees_images
    assert saved(edge_home) == {"model": str(tiny_models["text"]), "mmproj": str(tiny_models["mmproj"])}
    again = Settings.load()
    assert (again.model, again.mmproj) == (str(tiny_models["text"]), str(tiny_models["mmproj"]))


def test_a_default_model_never_takes_the_mmproj_setting_of_another(edge_home: Path, tiny_models):
    """No model set (or the demo): the mmproj setting left from another model is not paired with it."""
    s = Settings.load({"mmproj": str(tiny_models["mmproj"])})
    got = resolve(s)
    if got.source != "demo":
        pytest.skip("the demo model is not the default here")
    assert got.mmproj_path is None
    assert resolve(s.updated({"model": "smollm2-135m-demo"})).mmproj_path is None
