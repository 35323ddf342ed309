"""GGUF inspection and validation (edge_agent/modelfiles/checks.py): every bad file is a ModelFileError that
says how to fix it, the process lives, and the checks guard against real llama.cpp aborts (shown in a child).
"""

from __future__ import annotations

import time
from pathlib import Path

import gguf
import numpy as np
import pytest

from edge_agent.core.errors import ConfigError, ModelFileError
from edge_agent.modelfiles import checks as modelfile
from edge_agent.modelfiles import image_tokens
from scripts import make_tiny_models as mtm
from tests.llama_probe import run_probe


# --- helpers that write deliberately broken tiny files ------------------------------------------
def write_text(path: Path, *, overrides=None, vocab=None, seed: int = 0) -> Path:
    vocab = vocab or mtm.build_vocab()
    weights = mtm.text_weights(np.random.default_rng(seed), len(vocab[0]))
    mtm.write_text_model(path, weights, vocab, name=path.stem, overrides=overrides)
    return path


def write_mmproj(path: Path, *, overrides=None, edit=None, proj_dim: int = mtm.N_EMBD) -> Path:
    weights = mtm.vision_weights(np.random.default_rng(1), proj_dim)
    if edit:
        edit(weights)
    mtm.write_mmproj(path, weights, proj_dim=proj_dim, name=path.stem, overrides=overrides)
    return path


def raises_fix(fn, *args, match: str, **kw) -> ModelFileError:
    """Call fn; it must raise ModelFileError matching ``match`` whose message points to a fix."""
    with pytest.raises(ModelFileError, match=match) as ei:
        fn(*args, **kw)
    msg = ei.value.message.lower()
    assert any(w in msg
               for w in ("use ", "pass ", "download", "check ", "delete", "run ", "decompress", "unpack",
                                  "fix ", "turn ")), ei.value.message
    return ei.value


# --- inspect ------------------------------------------------------------------------------------
def test_inspect_tiny_text_and_mmproj(tiny_models):
    """inspect() reports kind, architecture, sizes and the widths check_pair compares."""
    t = modelfile.inspect(tiny_models["text"])
    assert (t.kind, t.architecture, t.name, t.file_type,
            t.quantization) == ("text", "qwen3vl", "tiny-qwen3vl", "F32", "F32")
    assert (t.n_embd, t.n_layer, t.n_vocab, t.n_deepstack, t.n_embd_inp) == (64, 2, 636, 1, 128)
    assert t.uses_mrope and t.supports_vision and t.has_chat_template
    assert t.size_bytes == tiny_models["text"].stat().st_size and t.n_tensors == 2 + 11 * 2
    assert len(t.vocab_hash) == 64 and t.eos_token_id == 612
    assert "qwen3vl" in t.summary() and "n_embd 64" in t.summary()
    m = modelfile.inspect(str(tiny_models["mmproj"]))
    assert (m.kind, m.architecture, m.projector_type, m.has_vision) == ("mmproj", "clip", "qwen3vl_merger",
                                                                        True)
    assert (m.projection_dim, m.vision_deepstack, m.n_embd_out) == (64, 1, 128)
    assert (m.image_size, m.patch_size, m.spatial_merge_size, m.n_embd, m.n_layer) == (64, 16, 2, 32, 2)
    assert not m.supports_vision and "mmproj qwen3vl_merger" in m.summary()


def test_parser_agrees_with_gguf_reader(tiny_models):
    """Every scalar key, tensor and the token list match gguf.GGUFReader (the reference parser).

    (Not on SmolLM2: GGUFReader needs 4-20 s for its 49k tokens and merges; see the llama.cpp test below.)
    """
    for path in (tiny_models["text"], tiny_models["text_q8_0"], tiny_models["mmproj"]):
        ref = gguf.GGUFReader(path)
        info = modelfile.inspect(path)
        for key, field in ref.fields.items():
            if key.startswith("GGUF.") or key == "tokenizer.chat_template":
                continue
            if field.types[0] == gguf.GGUFValueType.ARRAY:
                continue
            want = field.contents()
            got = info.metadata[key]
            assert got == pytest.approx(want) if isinstance(want, float) else got == want, key
        assert [t.name for t in info.tensors] == [t.name for t in ref.tensors]
        for mine, theirs in zip(info.tensors, ref.tensors, strict=True):
            assert mine.shape == tuple(int(x) for x in theirs.shape), mine.name
            assert mine.type == theirs.tensor_type.name and mine.nbytes == theirs.n_bytes, mine.name
            assert mine.offset == theirs.data_offset, mine.name
        if "tokenizer.ggml.tokens" in ref.fields:
            assert modelfile.read_tokens(path) == list(ref.fields["tokenizer.ggml.tokens"].contents())


def test_token_lists_match_llama_cpp(tiny_models, smollm2_gguf):
    """read_tokens() returns exactly the vocabulary llama.cpp loads (vocab-only load, in-process: valid
    files)."""

    import llama_cpp

    for path in (tiny_models["text"], smollm2_gguf):
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        assert model
        try:
            vocab = llama_cpp.llama_model_get_vocab(model)
            theirs = [llama_cpp.llama_vocab_get_text(vocab, i).decode("utf-8", "replace")
                      for i in range(llama_cpp.llama_vocab_n_tokens(vocab))]
        finally:
            llama_cpp.llama_model_free(model)
        assert modelfile.read_tokens(path) == theirs
        assert modelfile.inspect(path).n_vocab == len(theirs)


def test_inspect_smollm2(smollm2_gguf):
    """The real SmolLM2-135M-Instruct Q4_1 GGUF: a supported text-only llama model."""
    t0 = time.perf_counter()
    info = modelfile.inspect(smollm2_gguf)
    dt = time.perf_counter() - t0
    assert (info.kind, info.architecture, info.file_type,
            info.quantization) == ("text", "llama", "Q4_1", "Q4_1")
    assert (info.n_embd, info.n_layer, info.n_vocab, info.n_ctx_train) == (576, 30, 49152, 8192)
    assert info.has_chat_template and info.tokenizer_model == "gpt2" and info.n_deepstack == 0
    assert not info.uses_mrope and not info.supports_vision
    assert modelfile.validate_text_model(smollm2_gguf).architecture == "llama"
    assert modelfile.inspect(smollm2_gguf).vocab_hash == info.vocab_hash
    print(f"inspect(SmolLM2 {info.size_bytes / 2**20:.0f} MiB): {dt * 1000:.1f} ms")


# --- unreadable files ---------------------------------------------------------------------------
def test_missing_file(tmp_path):
    e = raises_fix(modelfile.inspect, tmp_path / "nope.gguf", match="not found")
    assert e.title == "Model file not found"


def test_directory_lists_its_gguf_files(tmp_path):
    (tmp_path / "Qwen3-VL-2B-Instruct-Q4_K_M.gguf").write_bytes(b"GGUF")
    e = raises_fix(modelfile.inspect, tmp_path, match="is a directory")
    assert "Qwen3-VL-2B-Instruct-Q4_K_M.gguf" in e.message


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"", "empty"),
        (b"GGUF\x03\x00", "too short"),
        (b"hello, this is a text file and not a model at all\n" * 3, "not a GGUF"),
        (b"<!DOCTYPE html><html><body>404 Not Found</body></html>", "web page"),
        (b"PK\x03\x04" + b"\x00" * 64, "zip"),
        (b"\x1f\x8b\x08\x00" + b"\x00" * 64, "gzip"),
        (b"GGUF" + (99).to_bytes(4, "little") + b"\x00" * 64, "version 99"),
        (b"GGUF" + (3).to_bytes(4, "little") + (2**40).to_bytes(8, "little") * 2 + b"\x00" * 64,
         "truncated or corrupt"),
    ],
    ids=["empty", "tiny", "text", "html", "zip", "gzip", "version", "huge-counts"],
)
def test_not_a_usable_gguf(tmp_path, content, match):
    """Each kind of non-GGUF or damaged file gets its own explanation."""
    p = tmp_path / "model.gguf"
    p.write_bytes(content)
    raises_fix(modelfile.inspect, p, match=match)
    raises_fix(modelfile.validate_text_model, p, match=match)


@pytest.mark.parametrize("seed", range(6))
def test_random_bytes(tmp_path, seed):
    """Random bytes, with and without the GGUF magic in front, never crash the parser."""
    rng = np.random.default_rng(seed)
    p = tmp_path / "random.gguf"
    body = rng.integers(0, 256, size=int(rng.integers(30, 5000)), dtype=np.uint8).tobytes()
    p.write_bytes(body)
    raises_fix(modelfile.inspect, p, match="not a GGUF model file")
    p.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + body)
    raises_fix(modelfile.inspect, p, match="truncated or corrupt|tensor type|no general.architecture")


def test_truncated_at_many_offsets(tiny_models, tmp_path):
    """A tiny model cut anywhere (header, metadata, tensor table, tensor data) is reported as truncated."""
    src = tiny_models["text"].read_bytes()
    info = modelfile.inspect(tiny_models["text"])
    data_start = min(t.offset for t in info.tensors)
    cuts = [24, 40, 100, 1000, 5000, 12000, data_start - 1, data_start + 100, len(src) // 2, len(src) - 1]
    p = tmp_path / "cut.gguf"
    for cut in sorted(set(cuts)):
        p.write_bytes(src[:cut])
        e = raises_fix(modelfile.inspect, p, match="truncated or corrupt")
        assert e.title == "Damaged model file", cut
    # the mmproj too: truncation inside the tensor data names the tensor and the missing amount
    src = tiny_models["mmproj"].read_bytes()
    p.write_bytes(src[: len(src) - 4096])
    e = raises_fix(modelfile.validate_mmproj, p, match="MiB missing")
    assert "mm.2.bias" in e.message or "tensor" in e.message


def test_truncated_file_is_caught_before_llama_cpp(tiny_models, tmp_path):
    """Validation names the problem; llama.cpp on the same file only returns NULL (its reason goes to the
    log)."""
    p = tmp_path / "cut.gguf"
    p.write_bytes(tiny_models["text"].read_bytes()[:200_000])
    raises_fix(modelfile.validate_text_model, p, match="truncated")
    rc, out = run_probe(p)
    assert (rc, out) == (3, {"loaded": False})  # llama.cpp refuses it too, but only says so in its log


# --- wrong kinds and unsupported models ----------------------------------------------------------
def test_mmproj_given_as_text_model_and_vice_versa(tiny_models):
    e = raises_fix(modelfile.validate_text_model, tiny_models["mmproj"], match="vision projector")
    assert e.title == "mmproj given as the model" and "--mmproj" in e.message
    e = raises_fix(modelfile.validate_mmproj, tiny_models["text"], match="not a vision projector")
    assert e.title == "Model given as the mmproj"
    text, mm = modelfile.inspect(tiny_models["text"]), modelfile.inspect(tiny_models["mmproj"])
    raises_fix(modelfile.check_pair, mm, text, match="vision projector")


def test_unknown_architecture_lists_supported_ones(tmp_path):
    p = write_text(tmp_path / "bert.gguf", overrides={"general.architecture": "bert"})
    e = raises_fix(modelfile.validate_text_model, p, match="'bert' model")
    assert e.title == "Unsupported model"
    for arch in ("qwen3vl", "qwen2vl", "llama", "qwen3"):
        assert arch in e.message


def test_file_without_architecture(tmp_path):
    p = write_text(tmp_path / "noarch.gguf", overrides={"general.architecture": None})
    raises_fix(modelfile.inspect, p, match="no general.architecture")


def test_lora_adapter(tmp_path):
    p = write_text(tmp_path / "lora.gguf", overrides={"general.type": "adapter"})
    raises_fix(modelfile.inspect, p, match="LoRA adapter")


def test_text_only_model_cannot_take_images(smollm2_gguf, tiny_models):
    """SmolLM2 works for text, but pairing it with an mmproj says it cannot see images."""
    s, mm = modelfile.inspect(smollm2_gguf), modelfile.inspect(tiny_models["mmproj"])
    raises_fix(modelfile.validate_text_model, s, match="cannot look at images", need_vision=True)
    e = raises_fix(modelfile.check_pair, s, mm, match="without vision support")
    assert "qwen3vl" in e.message


def test_text_model_without_tokenizer(tmp_path):
    p = write_text(tmp_path / "notok.gguf", overrides={"tokenizer.ggml.model": None})
    raises_fix(modelfile.validate_text_model, p, match="no tokenizer")


# --- what would abort llama.cpp: caught here, and shown to abort in a child process ---------------
def _text_deepstack_equal(tmp_path: Path, tiny_models) -> tuple[Path, list[str]]:
    return write_text(tmp_path / "ds2.gguf", overrides={"qwen3vl.n_deepstack_layers": 2}), []


def _mmproj_no_patch_bias(tmp_path: Path, tiny_models) -> tuple[Path, list[str]]:
    p = write_mmproj(tmp_path / "nobias.gguf", edit=lambda w: w.pop("v.patch_embd.bias"))
    return tiny_models["text"], ["--mmproj", str(p), "--image", "64x64"]


def _mmproj_f16_positions(tmp_path: Path, tiny_models) -> tuple[Path, list[str]]:
    def edit(w):
        w["v.position_embd.weight"] = w["v.position_embd.weight"].astype(np.float16)

    p = write_mmproj(tmp_path / "pos16.gguf", edit=edit)
    return tiny_models["text"], ["--mmproj", str(p), "--image", "64x64"]


def _mmproj_bad_head_size(tmp_path: Path, tiny_models) -> tuple[Path, list[str]]:
    p = write_mmproj(tmp_path / "heads.gguf", overrides={"clip.vision.attention.head_count": 16})
    return tiny_models["text"], ["--mmproj", str(p), "--image", "64x64"]


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (_text_deepstack_equal, "n_deepstack_layers = 2 is not less than its 2 blocks"),
        (_mmproj_no_patch_bias, "v.patch_embd.bias"),
        (_mmproj_f16_positions, "needs it in F32"),
        (_mmproj_bad_head_size, "multiple of 4"),
    ],
    ids=["deepstack==blocks", "no-patch-bias", "f16-position-embd", "head-size"],
)
def test_files_that_abort_llama_cpp_are_caught_first(tmp_path, tiny_models, make, match):
    """Validation rejects the file; the same files really abort llama.cpp (checked in a child process)."""
    model, args = make(tmp_path, tiny_models)
    mmproj = Path(args[1]) if args else None
    text = modelfile.inspect(model)
    if mmproj is None:
        raises_fix(modelfile.validate_text_model, text, match=match)
    else:
        raises_fix(modelfile.check_pair, text, modelfile.inspect(mmproj), match=match)
    rc, out = run_probe(model, *args)
    assert rc in (-6, 134), (rc, out)  # SIGABRT from GGML_ASSERT: the app would have died with it


def test_missing_rope_sections(tmp_path):
    p = write_text(tmp_path / "norope.gguf", overrides={"qwen3vl.rope.dimension_sections": None})
    raises_fix(modelfile.validate_text_model, p, match="dimension_sections")


def test_unequal_head_sizes(tmp_path):
    p = write_text(tmp_path / "heads.gguf", overrides={"qwen3vl.attention.value_length": 32})
    raises_fix(modelfile.validate_text_model, p, match="must be equal")


# --- pairs ---------------------------------------------------------------------------------------
def test_matching_pair_passes(tiny_models):
    text, mm = modelfile.inspect(tiny_models["text"]), modelfile.inspect(tiny_models["mmproj"])
    modelfile.check_pair(text, mm)
    modelfile.check_pair(modelfile.inspect(tiny_models["text_q8_0"]), mm)
    modelfile.check_pair(modelfile.inspect(tiny_models["prophet"]), mm)


def test_mismatched_mmproj_width(tiny_models):
    """The width invariant n_embd*(1+deepstack) == proj*(1+vision deepstack) is checked with numbers."""
    text, bad = modelfile.inspect(tiny_models["text"]), modelfile.inspect(tiny_models["mmproj_mismatch"])
    e = raises_fix(modelfile.check_pair, text, bad, match="does not fit")
    assert "192" in e.message and "128" in e.message and e.title == "mmproj does not fit the model"


def test_mmproj_size_hint_for_qwen3vl(tmp_path, tiny_models):
    """A 4B mmproj with a 2B model says so in the sizes users know."""
    text = write_text(tmp_path / "t2b.gguf", overrides={"qwen3vl.embedding_length": 2048})
    mm = write_mmproj(tmp_path / "m4b.gguf", proj_dim=2560)
    e = raises_fix(modelfile.check_pair, modelfile.inspect(text), modelfile.inspect(mm), match="does not fit")
    assert "Qwen3-VL-2B" in e.message and "Qwen3-VL-4B" in e.message


def test_projector_for_another_architecture(tmp_path, tiny_models):
    mm = write_mmproj(tmp_path / "q2.gguf", overrides={"clip.projector_type": "qwen2vl_merger"})
    e = raises_fix(modelfile.check_pair, modelfile.inspect(tiny_models["text"]), modelfile.inspect(mm),
                   match="'qwen2vl_merger' projector")
    assert "needs qwen3vl_merger" in e.message


def test_unsupported_projector(tmp_path):
    mm = write_mmproj(tmp_path / "llava.gguf", overrides={"clip.projector_type": "mlp"})
    e = raises_fix(modelfile.validate_mmproj, mm, match="'mlp' projector")
    assert e.title == "Unsupported mmproj"


def test_mmproj_without_vision_encoder(tmp_path):
    mm = write_mmproj(tmp_path / "audio.gguf", overrides={"clip.has_vision_encoder": False})
    raises_fix(modelfile.validate_mmproj, mm, match="without a vision encoder")


# --- tokenizers (SeProD: agent and prophet must share token ids) ----------------------------------
def test_same_tokenizer(tiny_models):
    modelfile.check_same_tokenizer(modelfile.inspect(tiny_models["text"]),
                                   modelfile.inspect(tiny_models["prophet"]))
    modelfile.check_same_tokenizer(modelfile.inspect(tiny_models["text"]),
                                   modelfile.inspect(tiny_models["text_q8_0"]))


def test_one_changed_token_is_named(tmp_path, tiny_models):
    tokens, types, merges = mtm.build_vocab()
    tokens = list(tokens)
    tokens[300] = "Ġchanged"
    p = write_text(tmp_path / "other.gguf", vocab=(tokens, types, merges))
    e = raises_fix(modelfile.check_same_tokenizer, modelfile.inspect(tiny_models["text"]),
                   modelfile.inspect(p),
                   match="differ")
    assert "1 differing ids" in e.message and "id 300" in e.message and "Ġchanged" in e.message
    assert e.title == "Tokenizers differ"


def test_different_vocabulary_sizes(tiny_models, smollm2_gguf):
    e = raises_fix(modelfile.check_same_tokenizer, modelfile.inspect(tiny_models["text"]),
                   modelfile.inspect(smollm2_gguf), match="636 vs 49152 tokens")
    assert "SeProD" in e.message


def test_different_eos(tmp_path, tiny_models):
    p = write_text(tmp_path / "eos.gguf", overrides={"tokenizer.ggml.eos_token_id": 610})
    raises_fix(modelfile.check_same_tokenizer, modelfile.inspect(tiny_models["text"]), modelfile.inspect(p),
               match="end-of-sequence")


def test_tokenizer_check_needs_text_models(tiny_models):
    raises_fix(modelfile.check_same_tokenizer, modelfile.inspect(tiny_models["text"]),
               modelfile.inspect(tiny_models["mmproj"]), match="not a text model")


# --- image tokens and context size ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("w", "h", "nx", "ny"),
    [(64, 64, 3, 3), (256, 256, 8, 8), (300, 100, 9, 3), (1000, 750, 31, 23), (4000, 3000, 73, 55),
     (10, 10, 3, 3), (32, 2000, 1, 63)],
)
def test_estimate_image_tokens(tiny_models, w, h, nx, ny):
    """Qwen smart resize: multiples of 32 px, 8..4096 tokens, aspect kept (checked against mtmd in
    test_tiny_models)."""
    est = image_tokens.estimate_image_tokens(modelfile.inspect(tiny_models["mmproj"]), w, h)
    assert (est.nx, est.ny) == (nx, ny)
    assert 8 <= est.n_tokens <= 4096 and est.n_pos == max(nx, ny)


def test_estimate_image_tokens_limits(tiny_models):
    mm = modelfile.inspect(tiny_models["mmproj"])
    assert image_tokens.estimate_image_tokens(mm, 4000, 3000, max_tokens=256).n_tokens <= 256
    assert image_tokens.estimate_image_tokens(mm, 64, 64, min_tokens=64).n_tokens >= 64
    with pytest.raises(ConfigError):
        image_tokens.estimate_image_tokens(mm, 0, 10)


def test_check_context():
    assert image_tokens.check_context(4096, prompt_tokens=600, image_tokens=713,
                                   reserve_tokens=256) == 4096 - 1569
    with pytest.raises(ConfigError, match="at least 2048") as ei:
        image_tokens.check_context(1024, prompt_tokens=600, image_tokens=713, reserve_tokens=256)
    assert ei.value.title == "Context too small" and "EDGE_AGENT_N_CTX" in ei.value.message
    with pytest.raises(ConfigError, match="at least 5000"):  # capped at what the model was trained on
        image_tokens.check_context(4096, prompt_tokens=4500, reserve_tokens=400, n_ctx_train=5000)
    with pytest.raises(ConfigError, match="positive"):
        image_tokens.check_context(0)
