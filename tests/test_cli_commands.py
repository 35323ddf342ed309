"""The commands as a new user meets them: `config set` validation and the file's mode, `ask`'s
stdout/stderr split, eval's all-failed exit, one meaning of --max-turns, `models list/info/add`, crops
cleaned, a huge photo, the system prompt setting, an unreachable hub.

Real parts: click's runner over the real commands, a subprocess for `ask` on the real SmolLM2.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from edge_agent.commands.cli import cli
from edge_agent.core.config import Settings
from edge_agent.engine.face import AskRequest


def test_config_set_rejects_more_threads_than_the_machine_has(edge_home):
    """`config set n_threads 999` is refused with the machine's count and the fix; nothing is saved."""
    r = CliRunner().invoke(cli, ["config", "set", "n_threads", "999"])
    cpus = os.cpu_count()
    assert r.exit_code == 2, r.output
    assert f"between 0 and {cpus}" in r.output and "config set n_threads 0" in r.output
    assert not (edge_home / "config.toml").exists()
    r = CliRunner().invoke(cli, ["config", "set", "n_threads_batch", str(cpus)])
    assert r.exit_code == 0, r.output


def test_an_unknown_model_is_named_once_with_the_nearest_names(edge_home):
    """`ask --model` with a name that is almost a catalog name: one line that says it once ("Unknown model
    'x'", not "Unknown model: Unknown model 'x'"), the near names and where to look; exit 2."""
    r = CliRunner().invoke(cli, ["ask", "--model", "qwen3-vl-2b-instruc", "hi"])
    assert r.exit_code == 2, r.output
    line = next(x for x in r.output.splitlines() if x.startswith("Error:"))
    assert line.startswith("Error: Unknown model 'qwen3-vl-2b-instruc'.") and line.count("Unknown model") == 1
    assert "Did you mean: qwen3-vl-2b-instruct" in line and "edge-agent models list" in line


def test_config_set_fixes_a_file_that_holds_a_bad_value(edge_home):
    """A config file written elsewhere with too many threads can be fixed with `config set`."""
    (edge_home / "config.toml").write_text("n_threads = 100000\n")
    r = CliRunner().invoke(cli, ["config", "show"])
    assert r.exit_code == 2 and "n_threads" in r.output
    r = CliRunner().invoke(cli, ["config", "set", "n_threads", "0"])
    assert r.exit_code == 0, r.output
    assert Settings.load().n_threads == 0


def test_config_set_negative_value_reaches_the_validator(edge_home):
    """`config set ssr_tau -1` gets the validator's message, not click's "No such option"."""
    r = CliRunner().invoke(cli, ["config", "set", "ssr_tau", "-1"])
    assert r.exit_code == 2
    assert "No such option" not in r.output
    assert "ssr_tau must be greater than 0" in r.output
    r = CliRunner().invoke(cli, ["config", "set", "seed", "-3"])
    assert r.exit_code == 0, r.output
    assert Settings.load().seed == -3


def test_config_file_with_a_key_is_private(edge_home):
    """config.toml may hold API keys: it is created 0600, like gh's and aws's credential files."""
    old = os.umask(0o022)
    try:
        r = CliRunner().invoke(cli, ["config", "set", "brave_api_key", "sk-test-1"])
    finally:
        os.umask(old)
    assert r.exit_code == 0, r.output
    mode = stat.S_IMODE((edge_home / "config.toml").stat().st_mode)
    assert mode == 0o600, oct(mode)
    assert "sk-test-1" not in r.output


def test_theme_is_a_saved_setting(edge_home):
    """The app's theme persists like any other setting."""
    Settings.load({"theme": "dracula"}).save()
    assert Settings.load().theme == "dracula"


def test_max_turns_has_one_meaning_in_ask_eval_and_config(edge_home):
    """--max-turns says the same thing in `ask`, `eval` and the setting's own doc."""
    from dataclasses import fields

    doc = next(f.metadata["doc"] for f in fields(Settings) if f.name == "max_turns")
    for cmd in ("ask", "eval"):
        out = CliRunner().invoke(cli, [cmd, "--help"], terminal_width=400).output
        line = next(ln for ln in out.splitlines() if ln.strip().startswith("--max-turns"))
        assert doc in " ".join(line.split()), (cmd, line)


def test_ask_prints_only_the_answer_on_stdout(edge_home, smollm2_gguf):
    """`$(edge-agent ask ...)` captures the answer alone; the trace goes to stderr."""
    env = {**os.environ, "EDGE_AGENT_HOME": str(edge_home), "EDGE_AGENT_N_THREADS": "1",
           "EDGE_AGENT_N_THREADS_BATCH": "1", "EDGE_AGENT_OFFLINE": "true",
           "EDGE_AGENT_ANSWER_MAX_TOKENS": "12",
           "EDGE_AGENT_MAX_TURNS": "1"}
    p = subprocess.run([sys.executable, "-m", "edge_agent.commands.cli", "ask",
                        "What is the capital of Peru?",
                        "--model", str(smollm2_gguf)], capture_output=True, text=True, env=env, timeout=300)
    assert "trace:" in p.stderr and "trace:" not in p.stdout
    assert "turn 1" not in p.stdout
    if p.returncode == 0:
        assert p.stdout.strip() and len(p.stdout.strip().splitlines()) <= 3
    else:  # no answer found: nothing on stdout, the reason on stderr
        assert p.returncode == 1 and p.stdout == "" and "No answer found" in p.stderr
    pj = subprocess.run([sys.executable, "-m", "edge_agent.commands.cli", "ask",
                         "What is the capital of Peru?", "--json",
                         "--model", str(smollm2_gguf)], capture_output=True, text=True, env=env, timeout=300)
    kinds = [json.loads(line)["event"] for line in pj.stdout.splitlines()]  # every line is an event
    assert kinds[0] == "run_started" and kinds[-1] == "final_answer" and "trace:" not in pj.stdout


def test_eval_where_every_question_fails_alike_exits_non_zero(edge_home, smollm2_gguf, tmp_path):
    """Image questions on a text-only model: the one error is printed and the exit status is not 0;
    the plot line says why there is no plot (matplotlib is installed)."""
    from PIL import Image

    for name in ("a.png", "b.png"):
        Image.new("RGB", (32, 32), (9, 9, 9)).save(tmp_path / name)
    data = tmp_path / "DATA.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "image": name, "question": "What colour?",
                                        "answers": ["black"]})
                            + "\n" for i, name in enumerate(("a.png", "b.png"))))
    r = CliRunner().invoke(cli,
                           ["eval", str(data), "--modes", "ssr", "--out", str(tmp_path / "out"), "--offline",
                                 "--model", str(smollm2_gguf)], env={"EDGE_AGENT_N_THREADS": "1"})
    assert r.exit_code == 2, r.output
    assert "Every question failed with the same error" in r.output and "cannot look at images" in r.output
    assert "install the plot extra" not in r.output
    assert "Plot skipped: no question got an answer" in r.output
    assert (tmp_path / "out" / "report.md").exists()


# --- models: one size, no maintenance notes, the default is never silent ---------------------------
def models(*args: str):
    return CliRunner().invoke(cli, ["models", *args], catch_exceptions=False)


def test_models_list_with_only_the_demo_never_says_no_model_installed(edge_home, smollm2_gguf, tmp_path,
                                                                      monkeypatch):
    """The demo is installed: whether or not it is the default, the list does not claim there is no model."""
    monkeypatch.setenv("EDGE_AGENT_MODEL_CACHE", str(tmp_path / "no-wheel-models"))  # only the demo
    r = models("list")
    assert "No model installed" not in r.output and "* default model: smollm2-135m-demo" in r.output
    Settings.load({"model": "qwen3-vl-2b-instruct"}).save()  # chosen, not downloaded yet
    r = models("list")
    assert "No model installed" not in r.output
    assert "No default model" in r.output and "Installed: smollm2-135m-demo" in r.output


def test_models_list_names_an_installed_qwen_when_the_demo_is_the_default(edge_home, smollm2_gguf,
                                                                        qwen05_gguf):
    """The demo (SmolLM2-135M) is the default but a real Qwen is installed: the list says which one answers
    text questions better and how to make it the default; once it is the default, nothing more."""
    r = models("list")
    assert "* default model: smollm2-135m-demo" in r.output
    hint = next(line for line in r.output.splitlines() if "answers far better than the demo" in line)
    name = hint.split("For text questions ")[1].split(" ")[0]
    assert name.startswith("qwen2.5-coder-") and f"`edge-agent config set model {name}`" in hint
    Settings.load({"model": name}).save()
    r = models("list")
    assert f"* default model: {name}" in r.output and "than the demo" not in r.output


def test_one_size_from_the_catalog_and_no_catalog_notes_in_info(edge_home):
    from edge_agent.modelfiles.catalog import human_size, load_catalog
    from edge_agent.ui.screens.first_run import recommended_size

    entry = load_catalog().get("qwen3-vl-2b-instruct")
    size = human_size(entry.download_size)
    assert recommended_size() == size
    listed = next(ln for ln in models("list").output.splitlines()
                  if ln.split()[:1] == ["qwen3-vl-2b-instruct"]
                  or ln.split()[1:2] == ["qwen3-vl-2b-instruct"])
    assert size in listed
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert f"({size} together)" in readme
    info = models("info", "qwen3-vl-2b-instruct").output
    assert re.search(rf"download size\s+{re.escape(size)} \(model \+ mmproj\)", info), info
    assert "catalog data" not in info and (not entry.verified or entry.verified not in info)


def test_models_add_says_when_the_model_becomes_the_default(edge_home, tiny_models, monkeypatch):
    import edge_agent.modelfiles.catalog as cat

    monkeypatch.setattr(cat, "find_demo_gguf", lambda entry=None: None)
    r = models("add", str(tiny_models["text"]), "--mmproj", str(tiny_models["mmproj"]), "--name", "mine")
    assert r.exit_code == 0, r.output
    assert "mine is now the default model" in r.output
    r = models("add", str(tiny_models["text_q8_0"]), "--mmproj", str(tiny_models["mmproj"]), "--name",
               "other")
    assert r.exit_code == 0, r.output
    assert "The default model stays mine" in r.output and "config set model other" in r.output


# --- crops do not pile up ------------------------------------------------------------------------
def test_ask_cleans_its_crops_and_old_ones_that_no_chat_shows(edge_home, tmp_path):
    from edge_agent.agent import events as ev
    from edge_agent.chat.crops import prune_crops, remove_run_crops
    from edge_agent.chat.store import ChatStore

    s = Settings.load()
    crops = s.crops_dir
    run, old, kept, fresh = (crops / n for n in ("run", "old", "in-a-chat", "fresh"))
    for d in (run, old, kept, fresh):
        d.mkdir(parents=True)
        (d / "crop-1.png").write_bytes(b"png")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "crop.png").write_bytes(b"png")
    events = [ev.ToolFinished(turn=1, name="image_zoom_in_tool", ok=True, observation="", seconds=0.0,
                              status="local", image_index=1, image_path=str(p / "crop.png"))
              for p in (run, outside)]
    remove_run_crops(events, crops)
    assert not run.exists() and outside.exists()  # this run's folder only, never outside crops_dir

    store = ChatStore(s.chats_path)
    mid = store.start_answer(store.new_chat())
    store.add_event(mid,
                    ev.ToolFinished(turn=1, name="image_zoom_in_tool", ok=True, observation="", seconds=0.0,
                                         status="local", image_index=1, image_path=str(kept / "crop-1.png")))
    store.close()
    week_ago = time.time() - 8 * 86400
    for d in (old, kept):
        os.utime(d, (week_ago, week_ago))
    assert prune_crops(crops, chats_path=s.chats_path) == 1
    assert not old.exists() and kept.exists() and fresh.exists()


# --- large photos just work ------------------------------------------------------------------------
def test_a_108_megapixel_photo_loads_downscaled_in_bounded_memory(tmp_path):
    """A phone's 108 MP JPEG loads (downscaled on load, decoded at a reduced DCT scale) in a child
    process whose peak memory stays far below the 324 MB of the full-size picture; true bombs are refused."""
    from PIL import Image

    from edge_agent.core.errors import ImageError
    from edge_agent.tools import images

    big = tmp_path / "phone.jpg"
    im = Image.new("RGB", (12000, 9000), (90, 120, 200))
    im.paste((250, 250, 250), (5000, 4000, 7000, 5000))
    im.save(big, quality=80)
    del im
    # VmHWM: this process's own peak (ru_maxrss would carry the parent's across fork + exec)
    code = ("import sys; from edge_agent.tools.images import load_image, LOAD_MAX_PIXELS; "
            "r = load_image(sys.argv[1]); w, h = r.size; "
            "hwm = next(ln for ln in open('/proc/self/status') if ln.startswith('VmHWM')).split()[1]; "
            "print(w, h, r.original_size, w * h <= LOAD_MAX_PIXELS, int(hwm) // 1024)")
    out = subprocess.run([sys.executable, "-c", code, str(big)], capture_output=True, text=True,
                         check=True).stdout
    w, h, *rest = out.split()
    assert abs(int(w) / int(h) - 12000 / 9000) < 0.01 and "(12000, 9000)" in out and "True" in rest
    peak_mb = int(rest[-1])
    assert peak_mb < 150, f"peak RSS {peak_mb} MB"
    # a picture over the bomb limit is still refused before decoding
    bomb = tmp_path / "bomb.png"
    Image.new("1", (12000, 12000)).save(bomb)  # 144 MP, tiny on disk
    with pytest.raises(ImageError, match="megapixels"):
        images.load_image(bomb)


# --- the system prompt is a setting ------------------------------------------------------------------
def test_system_prompt_setting_reaches_the_model(edge_home, tiny_models, monkeypatch):
    """`system_prompt` is added to the system turn the real model reads, and cannot open a chat token."""
    import edge_agent.agent.loop as loop
    from edge_agent.agent.loop import AgentOptions
    from edge_agent.agent.prompts import system_prompt
    from edge_agent.engine.engine import Engine
    from edge_agent.runtime import Model

    assert "< |im_end|>" in system_prompt(["answer"], extra="Be brief.<|im_end|>")
    r = CliRunner().invoke(cli, ["config", "set", "system_prompt", "Answer in one short sentence."])
    assert r.exit_code == 0, r.output
    settings = Settings.load({"n_threads": 1, "n_threads_batch": 1, "answer_max_tokens": 4, "offline": True})
    seen: list[str] = []
    real = loop.system_prompt
    monkeypatch.setattr(loop, "system_prompt", lambda *a, **kw: seen.append(real(*a, **kw)) or seen[-1])
    with Model.load(tiny_models["text"], n_ctx=2048, n_threads=1, n_threads_batch=1) as m:
        opts = AgentOptions.from_settings(settings, max_turns=1, policy=lambda t, a: {"answer"})
        events = list(Engine(m, settings).ask(AskRequest("Hi?", options=opts)))
    assert events[-1].kind == "final_answer", events[-1]
    assert seen and "Answer in one short sentence." in seen[0].split("# Tools")[0]


def test_unreachable_hub_offers_the_installed_demo_without_an_install_command(
    edge_home, smollm2_gguf, monkeypatch):
    """No network: the download error points at the demo, and does not ask to install it when it is."""
    import socket

    from edge_agent.core.errors import DownloadError
    from edge_agent.modelfiles import hub
    from edge_agent.modelfiles import pull as model_pull
    from edge_agent.modelfiles.catalog import load_catalog

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(DownloadError) as e:
        model_pull.pull(load_catalog().get("qwen3-vl-2b-instruct"), Settings.load(),
                        client=hub.HubClient(backoff=0.0))
    assert "smollm2-135m-demo" in e.value.message and "pip install" not in e.value.message
