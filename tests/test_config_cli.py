"""Settings precedence, validation, persistence; the CLI shell; the import boundaries."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest
from click.testing import CliRunner

from edge_agent.commands.cli import cli
from edge_agent.core.config import Settings, _dump_toml
from edge_agent.core.errors import ConfigError


def test_precedence_defaults_file_env_overrides(tmp_path):
    """file beats defaults, env beats file, explicit overrides beat env."""
    (tmp_path / "config.toml").write_text('mode = "freeform"\nmax_turns = 3\nssr_tau = 0.5\n')
    env = {"EDGE_AGENT_HOME": str(tmp_path), "EDGE_AGENT_MAX_TURNS": "7"}
    s = Settings.load({"ssr_tau": 2.0, "seed": None}, env=env)
    assert (s.mode, s.max_turns, s.ssr_tau, s.seed) == ("freeform", 7, 2.0, 0)
    assert s.home == tmp_path and s.cache_path.parent == tmp_path


def test_bad_values_are_clear_errors(tmp_path):
    env = {"EDGE_AGENT_HOME": str(tmp_path)}
    with pytest.raises(ConfigError, match="mode must be one of ssr, freeform"):
        Settings.load({"mode": "telepathy"}, env=env)
    with pytest.raises(ConfigError, match="max_turns .* must be a whole number"):
        Settings.load(env={**env, "EDGE_AGENT_MAX_TURNS": "many"})
    with pytest.raises(ConfigError, match="Unknown setting 'colour'"):
        Settings.load({"colour": "red"}, env=env)
    (tmp_path / "config.toml").write_text("mode = [")  # not TOML: set aside, the defaults used (issue 23)
    assert Settings.load(env=env).mode == "ssr" and list(tmp_path.glob("config.toml.damaged-*"))
    from edge_agent.core.recovery import take_notices

    assert any("could not be read" in n for n in take_notices())


def test_save_roundtrip_and_secret_masking(tmp_path):
    s = Settings.load({"mode": "freeform", "brave_api_key": "sk-secret-123", "offline": True},
                      env={"EDGE_AGENT_HOME": str(tmp_path)})
    s.save()
    again = Settings.load(env={"EDGE_AGENT_HOME": str(tmp_path)})
    assert (again.mode, again.offline, again.brave_api_key) == ("freeform", True, "sk-secret-123")
    assert "sk-secret-123" not in str(again.public_dict())


def test_saved_strings_with_newlines_quotes_and_unicode_load_back(edge_home):
    """Any string a setting holds is written as TOML that loads back to the same value."""
    odd = 'line one\nline "two"\t\\ back\\slash, café ✓ 漢字 \x7f'
    s = Settings.load({"model": odd, "rationales": "C:\\libs\\my \"own\".json", "ssr_tau": 0.25})
    s.save()
    again = Settings.load()
    assert (again.model, again.rationales, again.ssr_tau) == (odd, s.rationales, 0.25)
    assert tomllib.loads(_dump_toml({"x": odd,
                                     "p": edge_home / "a\nb"})) == {"x": odd, "p": str(edge_home / "a\nb")}


def test_config_cli_set_and_show(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGE_AGENT_HOME", str(tmp_path))
    r = CliRunner().invoke(cli, ["config", "set", "max_turns", "2"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["config", "show"])
    assert "max_turns" in r.output and " 2" in r.output
    r = CliRunner().invoke(cli, ["config", "set", "mode", "nonsense"])
    assert r.exit_code == 2 and r.output.startswith("Error: Bad setting: Setting mode must be one of")


def test_help_is_fast_and_light():
    """`edge-agent --help` lists the commands without importing llama_cpp or textual."""
    code = (
        "import sys; from click.testing import CliRunner; from edge_agent.commands.cli import cli; "
        "r = CliRunner().invoke(cli, ['--help']); print(r.output); "
        "print('HEAVY', [m for m in ('llama_cpp', 'textual') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    for name in ("ask", "models", "cache", "config", "eval", "tui"):
        assert f"  {name}" in out
    assert "HEAVY []" in out


@pytest.mark.parametrize(
    "module, forbidden",
    [
        ("edge_agent.agent.loop", ("llama_cpp", "textual", "requests")),
        ("edge_agent.runtime", ("textual",)),
        ("edge_agent.tools.search", ("llama_cpp", "textual")),
        ("edge_agent.tools.zoom", ("llama_cpp", "textual")),
        ("edge_agent.engine.engine", ("textual",)),
    ],
)
def test_import_boundaries(module, forbidden):
    """The layers stay apart: importing a layer never drags in what it must not know."""
    code = f"import sys, {module}; print([m for m in {forbidden!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_setting_takes_a_new_engine_only_where_the_loaded_one_cannot_follow(edge_home):
    """A smaller crop is taken at the next zoom; a bound past what the vision tower was loaded with (mtmd
    caps every image at the larger of image_max_tokens and crop_max_tokens) loads a new engine, as new
    model files, context or tools do, and SeProD switched on with no prophet loaded."""
    from edge_agent.engine.engine import needs_new_engine

    old = Settings.load()
    assert (old.image_max_tokens, old.crop_max_tokens) == (576, 256)

    def new(**kw: object) -> bool:
        return needs_new_engine(old, old.updated(kw), set(kw), drafter_loaded=False)

    assert not new(crop_max_tokens=128) and not new(crop_max_tokens=576) and not new(max_turns=3)
    assert new(crop_max_tokens=1024) and new(image_max_tokens=1024) and new(image_max_tokens=256)
    assert new(n_ctx=4096) and new(model="other.gguf")
    assert not new(seprod=True)  # no prophet named: nothing to load
    named = old.updated({"prophet": "base.gguf", "seprod": False})
    on = named.updated({"seprod": True})
    assert needs_new_engine(named, on, {"seprod"}, drafter_loaded=False)
    assert not needs_new_engine(named, on, {"seprod"}, drafter_loaded=True)


def test_a_smaller_crop_set_between_questions_is_the_next_zooms(tiny_models, edge_home, tmp_path):
    """The real llama.cpp on the tiny Qwen3-VL models: crop_max_tokens lowered on a loaded engine (as the
    settings screen does) is taken, and the next question's zoom reads a crop within it."""
    from PIL import Image

    from edge_agent.agent.loop import AgentOptions
    from edge_agent.engine.engine import Engine
    from edge_agent.engine.face import AskRequest

    Image.new("RGB", (320, 320), (200, 120, 40)).save(photo := tmp_path / "p.png")
    settings = Settings.load({"model": str(tiny_models["text"]), "mmproj": str(tiny_models["mmproj"]),
                              "n_threads": 1, "n_threads_batch": 1, "offline": True, "max_turns": 1,
                              "answer_max_tokens": 3})
    engine = Engine.from_settings(settings)

    def crop_tokens() -> int:
        opts = AgentOptions.from_settings(engine.settings, policy=lambda turn, allowed: (
            {"zoom"} if turn == 1 else {"answer"}), library=engine.library)
        events = list(engine.ask(AskRequest("What is in the corner?", photo, options=opts)))
        assert events[-1].kind == "final_answer", events[-1]
        return next(e.tokens for e in events if e.kind == "image_evaluated" and e.source == "crop")

    try:
        assert crop_tokens() > 64  # the default, 256
        assert engine.update_settings(settings.updated({"crop_max_tokens": 64}), {"crop_max_tokens"})
        assert crop_tokens() <= 64
    finally:
        engine.close()
