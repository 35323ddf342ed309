"""The tiny Qwen3-VL GGUFs: deterministic, small, well formed, and loadable by the real llama.cpp.

llama.cpp runs in a child process (tests/llama_probe.py): a bad file can abort the process.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edge_agent.modelfiles import checks as modelfile
from edge_agent.modelfiles import image_tokens
from scripts import make_tiny_models as mtm
from tests.conftest import TINY_SEED
from tests.llama_probe import run_probe as probe


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- the files ----------------------------------------------------------------------------------
def test_same_seed_gives_byte_identical_files(tiny_models, tmp_path):
    """A second run with the same seed writes the same bytes; another seed changes the weights."""
    again = mtm.make_tiny_models(tmp_path / "again", seed=TINY_SEED)
    assert set(again) == set(tiny_models) == set(mtm.FILES)
    for key in tiny_models:
        assert sha(again[key]) == sha(tiny_models[key]), key
    other = mtm.make_tiny_models(tmp_path / "other", seed=TINY_SEED + 1)
    for key in tiny_models:
        assert sha(other[key]) != sha(tiny_models[key]), key
    # ... but not the tokenizer: every seed yields the same vocabulary
    assert modelfile.inspect(other["text"]).vocab_hash == modelfile.inspect(tiny_models["text"]).vocab_hash


def test_files_are_small(tiny_models):
    """Each file is well under a few MB (a test fixture, never committed)."""
    for key, path in tiny_models.items():
        assert 10_000 < path.stat().st_size < 2_000_000, key
    assert tiny_models["text_q8_0"].stat().st_size < tiny_models["text"].stat().st_size / 2


def test_cli_writes_the_files(tmp_path):
    """`python scripts/make_tiny_models.py OUT --seed N` writes the same files as the function."""
    out = tmp_path / "cli"
    proc = subprocess.run([sys.executable, str(mtm.__file__), str(out), "--seed", "3"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    direct = mtm.make_tiny_models(tmp_path / "direct", seed=3)
    for key, fname in mtm.FILES.items():
        assert sha(out / fname) == sha(direct[key])


def test_headers_describe_a_matching_qwen3vl_pair(tiny_models):
    """Text model, prophet and mmproj carry the documented dimensions and fit together."""
    text = modelfile.inspect(tiny_models["text"])
    assert (text.kind, text.architecture, text.file_type) == ("text", "qwen3vl", "F32")
    assert (text.n_embd, text.n_layer, text.n_deepstack, text.n_ctx_train) == (64, 2, 1, 32768)
    assert text.n_deepstack < text.n_layer  # equal aborts llama.cpp on the first decode
    assert text.has_chat_template and text.tokenizer_model == "gpt2"
    assert text.metadata["qwen3vl.rope.dimension_sections"] == [3, 3, 2, 0]
    assert sum(text.metadata["qwen3vl.rope.dimension_sections"]) == 16 // 2
    q8 = modelfile.inspect(tiny_models["text_q8_0"])
    assert (q8.file_type, q8.quantization, q8.vocab_hash) == ("Q8_0", "Q8_0", text.vocab_hash)
    mm = modelfile.inspect(tiny_models["mmproj"])
    assert (mm.kind, mm.projector_type, mm.projection_dim,
            mm.vision_deepstack) == ("mmproj", "qwen3vl_merger", 64, 1)
    assert mm.n_embd_out == text.n_embd_inp == 128
    pos = mm.tensor("v.position_embd.weight")
    assert pos is not None and pos.type == "F32" and pos.shape == (32, 16)
    modelfile.check_pair(text, mm)
    bad = modelfile.inspect(tiny_models["mmproj_mismatch"])
    assert bad.n_embd_out != text.n_embd_inp


def test_prophet_shares_the_tokenizer_but_not_the_weights(tiny_models):
    """The prophet has the agent's exact token list and different, correlated weights."""
    a, b = modelfile.inspect(tiny_models["text"]), modelfile.inspect(tiny_models["prophet"])
    modelfile.check_same_tokenizer(a, b)
    assert a.tensor("blk.0.attn_q.weight").shape == b.tensor("blk.0.attn_q.weight").shape
    import gguf

    wa = {t.name: np.array(t.data) for t in gguf.GGUFReader(a.path).tensors}
    wb = {t.name: np.array(t.data) for t in gguf.GGUFReader(b.path).tensors}
    assert wa.keys() == wb.keys()
    x, y = wa["token_embd.weight"].ravel(), wb["token_embd.weight"].ravel()
    assert not np.allclose(x, y)
    assert 0.5 < np.corrcoef(x, y)[0, 1] < 0.99


def test_vocabulary_holds_qwen_special_tokens_with_qwen_types(tiny_models):
    """Control tokens are CONTROL, the tool/think tags USER_DEFINED, in Qwen's order; <answer> is not one
    token."""
    import gguf

    r = gguf.GGUFReader(tiny_models["text"])
    tokens = modelfile.read_tokens(tiny_models["text"])
    types = list(r.fields["tokenizer.ggml.token_type"].contents())
    index = {t: i for i, t in enumerate(tokens)}
    names = [name for name, _ in mtm.QWEN_ADDED_TOKENS]
    assert [index[n]
            for n in names] == list(range(index["<|endoftext|>"], index["<|endoftext|>"] + len(names)))
    for name, control in mtm.QWEN_ADDED_TOKENS:
        want = gguf.TokenType.CONTROL if control else gguf.TokenType.USER_DEFINED
        assert types[index[name]] == want, name
    assert "<answer>" not in index
    assert len(tokens) == len(set(tokens))
    assert r.fields["tokenizer.ggml.eos_token_id"].contents() == index["<|im_end|>"]
    assert len(r.fields["tokenizer.ggml.merges"].contents()) >= 300


def test_bpe_training_is_deterministic_and_learns_words():
    """Merges are a pure function of the corpus; frequent words become single tokens."""
    m1, m2 = mtm.train_bpe(mtm.CORPUS, 200), mtm.train_bpe(mtm.CORPUS, 200)
    assert m1 == m2 and len(m1) == 200
    tokens = {a + b for a, b in mtm.train_bpe(mtm.CORPUS, mtm.N_MERGES)}
    for word in ("Ġthe", "Ġimage", "Ġsearch", "Ġanswer", '":', "name", "arguments"):
        assert word in tokens, word


# --- in llama.cpp -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def f32_probe(tiny_models):
    rc, out = probe(tiny_models["text"], "--mmproj", str(tiny_models["mmproj"]),
                    "--image", "64x64", "--image", "96x96", "--image", "256x256", "--image", "300x100",
                    "--image", "32x2000", "--image", "1000x750")
    assert rc == 0 and out.get("loaded"), out
    return out


def test_llama_cpp_loads_and_generates(f32_probe, tiny_models):
    """The F32 text model loads, prefill logits are finite and peaky enough, greedy decoding runs."""
    out = f32_probe
    assert (out["n_embd"], out["n_layer"]) == (64, 2)
    assert out["n_vocab"] == modelfile.inspect(tiny_models["text"]).n_vocab
    assert out["logits_finite"] and 1.0 < out["logits_std"] < 6.0
    assert len(out["generated"]) == 8 and all(0 <= t < out["n_vocab"] for t in out["generated"])


def test_llama_cpp_tokenizes_specials_and_text_sensibly(f32_probe):
    """Special tokens are single ids; CONTROL tokens are not parsed from untrusted text, USER_DEFINED are."""
    out = f32_probe
    for text, ids in out["special_tokens"].items():
        assert len(ids) == 1, text
    assert out["eos"] == out["special_tokens"]["<|im_end|>"][0]
    assert len(out["special_unparsed"]["<|im_end|>"]) > 1
    # Same as the real Qwen3-VL GGUFs: llama.cpp matches USER_DEFINED tokens whatever parse_special says.
    assert out["special_unparsed"]["<tool_call>"] == out["special_tokens"]["<tool_call>"]
    # Ordinary English and JSON take well under one token per two characters; text round-trips.
    for key, n in out["sample_tokens"].items():
        assert n < out["sample_chars"][key] / 2, key
    assert out["roundtrip"]


def test_chat_template_renders_qwen3vl_prompt(f32_probe):
    """The GGUF's chat template renders the Qwen3-VL format with the image placeholder."""
    assert f32_probe["chat_rendered"] == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is this?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_chat_template_renders_tools_and_tool_responses():
    """Tools go into <tools> in the system turn, tool calls are JSON in <tool_call>, results are user
    turns."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    fmt = Jinja2ChatFormatter(template=mtm.CHAT_TEMPLATE, eos_token="<|im_end|>", bos_token="<|endoftext|>")
    tool = {"type": "function", "function": {"name": "text_search", "parameters": {"type": "object"}}}
    call = {"type": "function", "function": {"name": "text_search", "arguments": {"query": "museum"}}}
    rendered = fmt(
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Where is this?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "Result: a museum."},
        ],
        tools=[tool],
    ).prompt
    assert rendered.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert '<tools>\n{"type": "function"' in rendered
    assert ('<tool_call>\n{"name": "text_search", "arguments": {"query": '
            '"museum"}}\n</tool_call><|im_end|>') in rendered
    assert rendered.endswith(
        "<|im_start|>user\n<tool_response>\nResult: a "
        "museum.\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_images_evaluate_through_mtmd_with_mrope_positions(f32_probe, tiny_models):
    """Images become nx*ny tokens and advance the position by max(nx, ny); estimate_image_tokens agrees."""
    out = f32_probe
    assert out["mtmd_init"] and out["mtmd_use_mrope"]
    mm = modelfile.inspect(tiny_models["mmproj"])
    by_size = {(im["w"], im["h"]): im for im in out["images"]}
    for (w, h), im in by_size.items():
        assert im["tokenize_rc"] == 0 and im["eval_rc"] == 0 and im["logits_finite"], (w, h)
        text1, image, text2 = im["chunks"]
        assert (text1["type"], image["type"], text2["type"]) == (0, 1, 0)
        est = image_tokens.estimate_image_tokens(mm, w, h)
        assert (image["nx"], image["ny"]) == (est.nx, est.ny), (w, h)
        assert image["n_tokens"] == est.n_tokens and image["n_pos"] == est.n_pos == max(est.nx, est.ny)
        assert im["n_past"] == text1["n_tokens"] + est.n_pos + text2["n_tokens"]
    assert by_size[(64, 64)]["chunks"][1]["n_tokens"] == 9  # upscaled to the 8-token minimum: 3x3
    assert by_size[(256, 256)]["chunks"][1]["n_tokens"] == 64
    # Same token layout, different pixels -> different next-token logits: the model sees the image.
    a, b = by_size[(64, 64)], by_size[(96, 96)]
    assert [c["n_tokens"] for c in a["chunks"]] == [c["n_tokens"] for c in b["chunks"]]
    assert not np.allclose(a["logits_head"], b["logits_head"], atol=1e-4)


def test_quantized_model_loads_and_tracks_f32(f32_probe, tiny_models):
    """The Q8_0 file loads, generates, works with the mmproj, and its logits stay close to F32's."""
    rc, out = probe(tiny_models["text_q8_0"], "--mmproj", str(tiny_models["mmproj"]), "--image", "64x64")
    assert rc == 0 and out["loaded"] and out["mtmd_init"], out
    assert out["images"][0]["eval_rc"] == 0
    assert out["logits_finite"] and abs(out["logits_std"] - f32_probe["logits_std"]) < 0.1
    assert len(out["generated"]) == 8


def test_prophet_loads_and_predicts_differently(f32_probe, tiny_models):
    """The prophet runs with the same mmproj and gives other next-token logits than the agent model."""
    rc, out = probe(tiny_models["prophet"], "--mmproj", str(tiny_models["mmproj"]), "--image", "64x64")
    assert rc == 0 and out["loaded"] and out["mtmd_init"], out
    assert out["special_tokens"] == f32_probe["special_tokens"]
    assert not np.allclose(out["images"][0]["logits_head"], f32_probe["images"][0]["logits_head"], atol=1e-3)


def test_mismatched_mmproj_is_refused_by_mtmd(tiny_models):
    """llama.cpp itself refuses the mismatched mmproj (mtmd_init_from_file returns NULL); the text model is
    fine."""
    rc, out = probe(tiny_models["text"], "--mmproj", str(tiny_models["mmproj_mismatch"]), "--image", "64x64")
    assert rc == 0 and out["loaded"], out
    assert out["mtmd_init"] is False
