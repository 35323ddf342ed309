"""A rationale library built from a real free-form `eval` of SmolLM2-135M on the synthetic set, then
loaded by the app's loader, inspected with `library show` and compared with the built-in one by
`eval --rationales`. SmolLM2 is text only: with the synthetic set's images every question fails (the
all-failed source), so the build runs on the same questions without their images.

Small on purpose (3 questions, at most 2 turns, short reasoning): these tests check the pipeline
and its invariants, not the quality of a 135M model's moves.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from edge_agent.agent.rationales import load_library
from edge_agent.commands.cli import cli
from scripts.make_synthetic_vqa import make_dataset

ROOT = Path(__file__).resolve().parents[1]
ENV = {"EDGE_AGENT_N_THREADS": "1", "EDGE_AGENT_N_THREADS_BATCH": "1", "EDGE_AGENT_N_CTX": "2048",
       "EDGE_AGENT_FREEFORM_MAX_TOKENS": "32", "EDGE_AGENT_ANSWER_MAX_TOKENS": "12"}


def _synthetic(out: Path, n: int) -> Path:
    return make_dataset(out, n=n, seed=0, size=(320, 240))


def _text_only(data: Path, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(x) for x in data.read_text().splitlines() if x.strip()]
    out.write_text("".join(json.dumps({**r, "image": None}) + "\n" for r in rows))
    return out


def _run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture
def env(edge_home, monkeypatch):
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    return edge_home


@pytest.mark.slow
def test_library_from_a_real_smollm2_freeform_eval(smollm2_gguf, env, tmp_path):
    model = str(smollm2_gguf)
    data = _synthetic(tmp_path / "svqa", n=3)

    # The synthetic set's images: a text-only model fails every question -> a clear message.
    res = _run("eval", str(data), "--modes", "freeform", "--out", str(tmp_path / "img"), "--offline",
               "--max-turns", "2", "--model", model, "--no-plot")
    # the eval itself may exit 2: all failed
    assert (tmp_path / "img" / "results.jsonl").is_file(), res.output
    res = CliRunner().invoke(cli, ["library", "build", str(tmp_path / "img"), "-o", str(tmp_path / "x.json")])
    assert res.exit_code == 2 and "no free-form turns" in res.output and "cannot look at images" in res.output

    # The same questions without images: real free-form traces.
    text = _text_only(data, tmp_path / "text" / "DATA.jsonl")
    ff = tmp_path / "ff"
    res = _run("eval", str(text), "--modes", "freeform", "--out", str(ff), "--offline", "--max-turns", "2",
               "--model", model, "--no-plot")
    assert res.exit_code == 0, res.output
    records = [json.loads(x) for x in (ff / "results.jsonl").read_text().splitlines()]
    turns = [t for r in records for t in r["turn_log"]]
    # the eval keeps what the model wrote
    assert turns and all(isinstance(t["reasoning"], str) for t in turns)

    lib_path = tmp_path / "built.json"
    res = _run("library", "build", str(ff), "-o", str(lib_path), "--all", "--min-support", "1")
    assert res.exit_code == 0, res.output
    lib = load_library(lib_path)  # what the app does with the `rationales` setting
    assert 1 <= len(lib) <= 15 and any(r.action == "answer" for r in lib)
    data_json = json.loads(lib_path.read_text())
    used = data_json["built"]["turns"]
    assert sum(r["provenance"]["cluster_size"] for r in data_json["rationales"]) <= used
    for r in data_json["rationales"]:
        assert all(ex.startswith("ff:svqa-") for ex in r["provenance"]["examples"])

    # Embeddings of the agent model itself (mean-pooled hidden states) instead of TF-IDF.
    res = _run("library", "build", str(ff), "-o", str(tmp_path / "emb.json"), "--all", "--min-support", "1",
               "--model", model)
    assert res.exit_code == 0, res.output
    assert "embeddings" in json.loads((tmp_path / "emb.json").read_text())["built"]["method"]
    load_library(tmp_path / "emb.json")

    res = _run("library", "show", str(lib_path), "--model", model, "--reps", "1", "--json")
    assert res.exit_code == 0, res.output
    shown = json.loads(res.output)
    assert shown["rationales"] == len(lib) and shown["trie_nodes"] <= shown["tokens"]
    assert shown["break_even_tokens"] > 0 and all(e["tokens"] > 0 for e in shown["entries"])

    # Both libraries side by side, one column each, on the same questions.
    cmp_dir = tmp_path / "cmp"
    res = _run("eval", str(text), "--modes", "ssr", "--rationales", f"builtin,{lib_path}", "--out",
               str(cmp_dir),
               "--offline", "--max-turns", "2", "--model", model, "--limit", "2", "--no-plot")
    assert res.exit_code == 0, res.output
    metrics = json.loads((cmp_dir / "results.json").read_text())["metrics"]
    assert list(metrics) == ["ssr[builtin]", "ssr[built]"]
    for m in metrics.values():
        assert m["questions"] == 2 and m["action_consistency"] == 1.0
    built_ids = {r.id for r in lib}
    assert set(metrics["ssr[built]"]["rationale_mix"]) <= built_ids
    assert set(metrics["ssr[builtin]"]["rationale_mix"]) <= {r.id for r in load_library(None)}
    report = (cmp_dir / "report.md").read_text()
    assert "| ssr[builtin] | ssr[built] |" in report
