"""Memory at the size we ship (issue 20): repacked weights are read, not mapped; the KV type, decode
threads and the prophet's context follow the model's size; the expected memory of a choice is shown
before it is loaded (``edge_agent.modelfiles.footprint``, ``models list``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from edge_agent.core.config import Settings
from edge_agent.modelfiles import footprint


def _mapped(path: Path) -> bool:
    return str(path.resolve()) in Path("/proc/self/maps").read_text()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_repacked_weights_are_read_and_not_kept_mapped(tiny_models) -> None:
    """With extra (repacked) buffers the file is read into memory and not mapped (a mapping kept the
    whole file resident beside the repacked copy: 1,765 vs 1,126 MB on the 2B stand-in); without them
    llama.cpp uses the weights in place from the mapping. Both decode the same tokens' logits shape."""
    from edge_agent.runtime import Model

    with Model.load(tiny_models["text_q8_0"], n_ctx=256, extra_buffers="on") as read:
        assert read.extra_buffers and not _mapped(tiny_models["text_q8_0"])
        s = read.session()
        s.append_text("<|im_start|>user\nhello<|im_end|>\n")
        assert s.next_logits().shape == (read.n_vocab,)
    with Model.load(tiny_models["text"], n_ctx=256, extra_buffers="off") as mapped:
        assert not mapped.extra_buffers and _mapped(tiny_models["text"])


def test_auto_kv_type_follows_the_cache_size(tiny_models) -> None:
    """f16 always; when an f16 cache of n_ctx would exceed 512 MiB (Qwen3-VL-2B at 8192: 896 MiB) the
    context starts at 2,048 cells (a photo question) and grows; the runtime's rule and footprint's agree."""
    from edge_agent.modelfiles import checks as modelfile
    from edge_agent.runtime.model import auto_kv_type

    tiny = modelfile.inspect(tiny_models["text"])
    assert auto_kv_type(tiny, 8192) == ("f16", 8192)
    big = modelfile.ModelInfo(path=Path("x.gguf"), kind="text", architecture="qwen3vl", name="2b",
                              file_type="Q4_K_M",
                              quantization="Q4_K", size_bytes=1 << 30, n_tensors=0, n_embd=2048, n_layer=28,
                              metadata={"qwen3vl.block_count": 28, "qwen3vl.attention.head_count": 16,
                                        "qwen3vl.attention.head_count_kv": 8,
                                        "qwen3vl.attention.key_length": 128,
                                        "qwen3vl.attention.value_length": 128})
    assert auto_kv_type(big, 8192) == ("f16", 2048) and auto_kv_type(big, 4096) == ("f16", 4096)
    shape = footprint.kv_shape_of_entry("qwen3-vl", "2B")
    assert shape is not None
    assert shape.bytes(8192, "f16") == 896 * 2**20
    assert shape.bytes(8192, "auto") == shape.bytes(2048, "f16") == 224 * 2**20  # q8_0 at 8192 took 476
    assert shape.bytes(8192, "q8_0") == 476 * 2**20


def test_auto_kv_type_loads_tiny_models_exactly_as_before(tiny_models) -> None:
    """The tests' models keep an f16 cache under kv_type=auto (and flash attention off on a CPU)."""
    from edge_agent.runtime import Model

    with Model.load(tiny_models["text"], n_ctx=512, kv_type="auto") as m:
        assert m.kv_type == "f16"
        assert m.memory_bytes["kv_cache"] == footprint.kv_shape_of_file(tiny_models["text"]).bytes(512, "f16")


def test_a_q8_0_cache_turns_flash_attention_on_and_decodes(smollm2_gguf) -> None:
    """llama.cpp refuses a quantized V cache without flash attention: auto turns it on."""
    from edge_agent.runtime import Model

    with Model.load(smollm2_gguf, n_ctx=512, kv_type="q8_0", n_threads=1, n_threads_batch=1) as m:
        assert m.flash_attn == "on"
        s = m.session()
        s.append_text("The capital of France is")
        assert s.generate(max_tokens=3).tokens


def test_decode_threads_use_every_core_for_a_large_model(monkeypatch: pytest.MonkeyPatch) -> None:
    from edge_agent.runtime import cores

    monkeypatch.setattr(cores, "physical_cores", lambda: 2)
    assert cores.default_threads(0, decode=True, model_bytes=94 * 2**20) == 1  # SmolLM2: leave a core free
    assert cores.default_threads(0, decode=True, model_bytes=1_050 * 2**20) == 2  # 2B Q4_K_M: every core
    assert cores.default_threads(0) == 2 and cores.default_threads(3, decode=True) == 3


def test_prophet_context_holds_one_image_and_a_draft() -> None:
    s = Settings()
    assert footprint.prophet_n_ctx(s) == 2048  # 576-token photo + 1,024
    assert footprint.prophet_n_ctx(Settings(image_max_tokens=1600)) == 3072
    assert footprint.prophet_n_ctx(Settings(n_ctx=1024)) == 1024


def test_footprint_adds_the_parts() -> None:
    """Alone: process + weights + KV + compute + mmproj + the vision activations of the largest image;
    a prophet adds its weights, its small context and compute (the tower is shared)."""
    s = Settings()
    kv = footprint.kv_shape_of_entry("qwen3-vl", "2B")
    fp = footprint.estimate(s, weights=1_107_409_952, mmproj=445_053_216, kv=kv)
    assert kv is not None and fp.with_prophet is not None
    parts = (footprint.PROCESS_BYTES + 1_107_409_952 + kv.bytes(8192, "auto") + footprint.COMPUTE_BYTES
             + 445_053_216 + 576 * footprint.VISION_BYTES_PER_IMAGE_TOKEN)
    assert fp.alone == parts
    # the prophet shares the agent's vision tower (same mmproj file): its weights are not counted again
    assert fp.with_prophet - fp.alone == 1_107_409_952 + kv.bytes(2048, "auto") + footprint.COMPUTE_BYTES
    assert footprint.estimate(s, weights=100, mmproj=0, kv=None).with_prophet is None


def test_models_list_shows_the_expected_memory_before_loading(edge_home) -> None:
    from edge_agent.commands.cli import cli

    out = CliRunner().invoke(cli, ["models", "list"], catch_exceptions=False).output
    assert "MEMORY (+prophet)" in out and "expected peak" in out
    line = next(x for x in out.splitlines() if " qwen3-vl-2b-instruct " in x)
    fp = footprint.estimate(Settings.load(), weights=1_107_409_952, mmproj=445_053_216,
                            kv=footprint.kv_shape_of_entry("qwen3-vl", "2B"))
    assert f"{fp.alone / 2**30:.1f} GB ({fp.with_prophet / 2**30:.1f})" in line
    rows = json.loads(CliRunner().invoke(cli, ["models", "list", "--json"], catch_exceptions=False).output)
    row = next(r for r in rows if r["name"] == "qwen3-vl-2b-instruct")
    assert (row["memory"], row["memory_with_prophet"]) == (fp.alone, fp.with_prophet)


def test_first_run_screen_quotes_the_same_memory_estimate(edge_home) -> None:
    from edge_agent.modelfiles.catalog import load_catalog
    from edge_agent.ui.screens.first_run import how_to, recommended_memory

    entry = load_catalog().get("qwen3-vl-2b-instruct")
    assert entry is not None and entry.file is not None and entry.mmproj is not None
    fp = footprint.estimate(Settings(), weights=entry.file.size or 0, mmproj=entry.mmproj.size or 0,
                            kv=footprint.kv_shape_of_entry("qwen3-vl", "2B"))
    assert recommended_memory() == fp.text() and fp.text() in how_to().replace("\n", " ")


def test_first_run_screen_quotes_the_recorded_speed_the_readme_shows(edge_home) -> None:
    """the speed the first-run screen quotes is the 2B stand-in run recorded by
    ``scripts/bench_question.py --record`` (edge_agent/data/question_costs.json), the README's table."""
    from edge_agent.ui.screens.first_run import how_to

    m = footprint.measured_question("2b")
    assert m is not None and m["cores"] >= 1 and m["ssr_question_s"] > m["read_ahead_question_s"] > 0
    text = footprint.speed_text("2b")
    assert text.startswith(f"a photo question about {m['ssr_question_s']:.0f} s on {m['cores']} cores")
    assert text in how_to().replace("\n", " ")
    readme = " ".join((Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8").split())
    assert text in readme
