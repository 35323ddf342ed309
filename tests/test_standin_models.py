"""The 2B/4B stand-in writer (scripts/make_standin_models.py): shapes from the cited config.json, the
catalog's tensor types, and a reduced-depth file that llama.cpp loads and decodes with finite logits."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.make_standin_models import SHAPES, expected_sizes, make_standin_models, mmproj_plan, text_plan

# The published config.json values (Qwen/Qwen3-VL-2B-Instruct), restated here so that a change to the
# script's table is a test failure, not a silent change of what "2B-shaped" means.
CONFIG_2B = {
    "hidden_size": 2048, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 128, "intermediate_size": 6144, "vocab_size": 151936, "mrope_section": [24, 20, 20],
    "vision_depth": 24, "vision_hidden": 1024, "vision_heads": 16, "vision_ffn": 4096,
    "out_hidden_size": 2048,
    "num_position_embeddings": 2304, "deepstack_visual_indexes": [5, 11, 17],
}


@pytest.mark.parametrize("size", ["2b", "4b"])
def test_tensor_bytes_match_the_published_files(size: str) -> None:
    """Shapes and the Q4_K_M / Q8_0 type mix give the catalog's file sizes up to the metadata: the real
    tokenizer's merges (~5.95 MB, absent here) and a few KB of keys and alignment."""
    from edge_agent.modelfiles.catalog import load_catalog

    shape = SHAPES[size]
    sizes = expected_sizes(shape)
    entry = load_catalog().get(f"qwen3-vl-{size}-instruct")
    assert entry is not None and entry.file is not None and entry.mmproj is not None
    assert entry.file.size == shape.catalog_text_bytes
    assert entry.mmproj.size == shape.catalog_mmproj_bytes
    assert 5_900_000 < shape.catalog_text_bytes - sizes["text"] < 6_000_000
    assert 0 < shape.catalog_mmproj_bytes - sizes["mmproj"] < 32_768


def test_shape_table_is_the_cited_config() -> None:
    s = SHAPES["2b"]
    got = {
        "hidden_size": s.hidden, "num_hidden_layers": s.layers, "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim, "intermediate_size": s.ffn,
        "vocab_size": s.vocab, "mrope_section": list(s.mrope), "vision_depth": s.v_depth,
        "vision_hidden": s.v_hidden, "vision_heads": s.v_heads, "vision_ffn": s.v_ffn,
        "out_hidden_size": s.v_out,
        "num_position_embeddings": s.v_positions, "deepstack_visual_indexes": list(s.deepstack),
    }
    assert got == CONFIG_2B
    assert sum(s.mrope) == s.head_dim // 2
    four = SHAPES["4b"]
    assert (four.hidden, four.layers, four.heads, four.ffn, four.v_out) == (2560, 36, 32, 9728, 2560)


@pytest.fixture(scope="module")
def reduced(tmp_path_factory: pytest.TempPathFactory, qwen05_gguf: Path) -> dict[str, Path]:
    """The 2B stand-in at 4 text / 4 vision blocks, full widths and vocabulary (~0.9 GB written, seconds),
    with Qwen3-VL's tokenizer taken from the real Qwen 0.5B GGUF."""
    out = tmp_path_factory.mktemp("standin")
    return make_standin_models(out, "2b", shape=SHAPES["2b"].reduced(4, 4), check=False,
                               progress=lambda m: None,
                               tokenizer=qwen05_gguf)


def test_reduced_depth_files_hold_the_config_shapes(reduced: dict[str, Path]) -> None:
    """Every tensor has the config's widths and the planned type; the keys llama.cpp reads say the same."""
    from edge_agent.modelfiles import checks as modelfile

    shape = SHAPES["2b"].reduced(4, 4)
    text = modelfile.inspect(reduced["text"])
    assert {k: v for k, v in text.metadata.items() if k.startswith("qwen3vl.")} == {
        "qwen3vl.context_length": 262144, "qwen3vl.embedding_length": 2048, "qwen3vl.block_count": 4,
        "qwen3vl.feed_forward_length": 6144, "qwen3vl.attention.head_count": 16,
        "qwen3vl.attention.head_count_kv": 8, "qwen3vl.attention.key_length": 128,
        "qwen3vl.attention.value_length": 128, "qwen3vl.rope.freq_base": 5e6,
        "qwen3vl.attention.layer_norm_rms_epsilon": pytest.approx(1e-6),
        "qwen3vl.rope.dimension_sections": [24, 20, 20, 0], "qwen3vl.n_deepstack_layers": 3,
    }
    assert text.file_type == "Q4_K_M"
    tokens = modelfile.read_tokens(reduced["text"])
    assert len(tokens) == 151936
    assert [tokens[i] for i in (151643, 151644, 151645, 151655, 151657)] == [
        "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|image_pad|>", "<tool_call>"]
    got = {t.name: (t.shape, t.type) for t in text.tensors}
    assert got == {t.name: (t.ne, t.qtype.name) for t in text_plan(shape)}
    assert "output.weight" not in got  # tied embeddings
    assert got["token_embd.weight"] == ((2048, 151936), "Q6_K")
    # use_more_bits at depth 4: layers 2 and 3 get Q6_K attn_v and ffn_down (at 28: 0-2, 5, 8, ... 23, 24-27)
    assert [got[f"blk.{i}.attn_v.weight"][1] for i in range(4)] == ["Q4_K", "Q4_K", "Q6_K", "Q6_K"]

    mm = modelfile.validate_mmproj(reduced["mmproj"])
    modelfile.check_pair(text, mm)
    assert (mm.projector_type, mm.projection_dim, mm.image_size, mm.patch_size, mm.spatial_merge_size) == (
        "qwen3vl_merger", 2048, 768, 16, 2)
    assert mm.metadata["clip.vision.embedding_length"] == 1024
    assert mm.metadata["clip.vision.attention.head_count"] == 16
    assert mm.metadata["clip.vision.feed_forward_length"] == 4096
    got_mm = {t.name: (t.shape, t.type) for t in mm.tensors}
    assert got_mm == {t.name: (t.ne, t.qtype.name) for t in mmproj_plan(shape)}
    assert got_mm["v.position_embd.weight"] == ((1024, 2304), "F32")
    assert got_mm["mm.2.weight"] == ((4096, 2048), "Q8_0")


def test_reduced_depth_model_decodes_text_and_image_with_finite_logits(reduced: dict[str, Path]) -> None:
    """llama.cpp loads the agent + mmproj (the project's own validation passes first) and the logits
    after text and after an image are finite and not degenerate; the prophet shares the tokenizer."""
    from edge_agent.modelfiles import checks as modelfile
    from scripts.make_standin_models import check_finite

    modelfile.check_same_tokenizer(modelfile.inspect(reduced["text"]), modelfile.inspect(reduced["prophet"]))
    info = check_finite(reduced["text"], reduced["mmproj"])
    assert info["tokens_evaluated"] > 16  # text + the image's embeddings
    assert 0.5 < info["logit_std"] < 10


def test_cached_files_are_reused_and_a_damaged_one_is_rewritten(reduced: dict[str, Path],
                                                                qwen05_gguf: Path) -> None:
    out, tok = reduced["text"].parent, qwen05_gguf
    before = {k: p.stat().st_mtime_ns for k, p in reduced.items()}
    again = make_standin_models(out, "2b", shape=SHAPES["2b"].reduced(4, 4), check=False,
                                progress=lambda m: None,
                                tokenizer=tok)
    assert {k: p.stat().st_mtime_ns for k, p in again.items()} == before
    size, head = reduced["mmproj"].stat().st_size, reduced["mmproj"].read_bytes()[-4096:]
    with open(reduced["mmproj"], "r+b") as f:  # truncated: the manifest's size no longer matches
        f.truncate(1000)
    make_standin_models(out, "2b", shape=SHAPES["2b"].reduced(4, 4), check=False, progress=lambda m: None,
                        tokenizer=tok)
    assert reduced["mmproj"].stat().st_size == size
    assert reduced["mmproj"].read_bytes()[-4096:] == head  # the same bytes again (its own seeded stream)
    assert reduced["text"].stat().st_mtime_ns == before["text"]  # the intact files were kept


# ----------------------------------------------------------------------------------------------
# the tokenizer: Qwen3-VL's (the real Qwen2.5 file's tokens, types and merges + Qwen3's four)
# ----------------------------------------------------------------------------------------------
QWEN3_ADDED = {"<tool_response>": 151665, "</tool_response>": 151666, "<think>": 151667, "</think>": 151668}


def _agent_texts() -> list[tuple[str, bool]]:
    """(text, special) of everything the agent evaluates as text, as it evaluates it: the system prompt
    (every tool, an image), the question's user turn, each rationale (scored as plain text), each action
    head with the think block's close before it and each action's fixed rest, and a search observation
    (untrusted: special tokens not parsed) in its tool-response turn."""
    from edge_agent.agent.actions import HEADS, TAIL_REST, TAIL_STOP
    from edge_agent.agent.prompts import (
        THINK_CLOSE,
        Text,
        observation_segments,
        question_segments,
        system_prompt,
    )
    from edge_agent.agent.rationales import load_library
    from edge_agent.tools.observations import results

    class R:
        def __init__(self, title: str, url: str, snippet: str) -> None:
            self.title, self.url, self.snippet = title, url, snippet

    found = [R("Lima - Wikipedia", "https://en.wikipedia.org/wiki/Lima",
               "Lima is the capital and largest city of Peru, with 10,151,200 inhabitants (2024); \"Ciudad "
               "de los Reyes\"."),
             R("Peru | Facts & History", "https://www.britannica.com/place/Peru",
               "Peru's capital: Lima. Area 1,285,216 km2.")]
    obs = results("text_search", '"capital of Peru"', "searxng", found)
    texts = [(system_prompt(("image_search", "text_search", "zoom"), has_image=True), True)]
    texts += [(seg.text, seg.special) for seg in question_segments("What does the small sign say?", None)
              if isinstance(seg, Text)]
    texts += [(r.text, False) for r in load_library().rationales]
    texts += [(THINK_CLOSE + head, True) for head in HEADS.values()]
    texts += [(TAIL_STOP[a] + TAIL_REST[a], True) for a in TAIL_REST]
    texts += [(seg.text, seg.special) for seg in observation_segments(obs) if isinstance(seg, Text)]
    return texts


def _qwen3_ids(real: object, text: str, special: bool) -> list[int]:
    """What Qwen3-VL's tokenizer gives: the real Qwen2.5 ids, but the four added tokens (parsed where
    special tokens are) as their own ids."""
    import re

    if not special:
        return real.tokenize(text, special=False)  # type: ignore[attr-defined]
    out: list[int] = []
    for part in re.split("(" + "|".join(map(re.escape, QWEN3_ADDED)) + ")", text):
        out += ([QWEN3_ADDED[part]] if part in QWEN3_ADDED
                else real.tokenize(part, special=True))  # type: ignore[attr-defined]
    return out


def test_standin_tokenizes_every_agent_text_as_the_real_qwen(reduced: dict[str, Path],
                                                             qwen05_gguf: Path) -> None:
    """The system prompt, the question turn, the rationales, each action head and a search observation
    take the same ids with the stand-in as with the real Qwen GGUF (Qwen2.5's, but for Qwen3's four added
    tokens, which the stand-in has at 151665-151668)."""
    from edge_agent.modelfiles import checks as modelfile
    from edge_agent.runtime import Model

    tokens = modelfile.read_tokens(reduced["text"])
    assert {t: tokens.index(t) for t in QWEN3_ADDED} == QWEN3_ADDED
    texts = _agent_texts()
    with Model.load(qwen05_gguf, n_ctx=256,
                    n_seq_max=1) as real, Model.load(reduced["text"], n_ctx=256, n_seq_max=1) as stand:
        for text, special in texts:
            assert stand.tokenize(text, special=special) == _qwen3_ids(real, text, special), text[:80]
        system = stand.tokenize(texts[0][0], special=True)
        # Qwen's merges: the system prompt takes ~3.5 characters a token (the tiny model's merges took 629
        # tokens)
        assert len(texts[0][0]) / len(system) > 3.2
        used = {t for text, special in texts for t in stand.tokenize(text, special=special)}
        # the four added tokens are where the agent writes them
        assert {151667, 151668, 151665, 151666} <= used


def test_missing_real_tokenizer_names_the_install_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from edge_agent.modelfiles import catalog
    from scripts import make_standin_models as msm

    monkeypatch.setattr(catalog, "find_wheel_gguf", lambda name: None)
    assert msm.main([str(tmp_path / "out"), "--size", "2b"]) == 1
    err = capsys.readouterr().err
    assert "scripts/install_qwen_models.py" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
