"""Load GGUFs in real llama.cpp and report what happened as one JSON line: run as a subprocess.

    python tests/llama_probe.py MODEL [--mmproj MMPROJ] [--image WxH ...] [--prompt TEXT] [--n-gen N]

llama.cpp aborts the process on some bad files, so tests run this script in a child process and read
its JSON (or its exit status). It uses llama_cpp's low-level API directly (the app's runtime is tested
elsewhere): load with extra buffers off (AMX repack kernels crash quantized models on some VMs),
1 thread, tokenize, decode, greedy-generate a few tokens, render the GGUF chat template with jinja2,
and with --mmproj evaluate images through mtmd, reporting image token counts and positions.
From a test, call :func:`run_probe`; it sets GGML_NO_BACKTRACE=1 so an abort ends the child at once
(otherwise ggml attaches gdb to print a backtrace, which takes seconds).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def run_probe(model: str | os.PathLike[str], *args: str, timeout: float = 120) -> tuple[int, dict]:
    """Run this script on ``model`` in a child process: (exit status, its JSON report or {}).

    A negative status (or 134) means llama.cpp aborted the child: what would have killed the app.
    """
    env = dict(os.environ, GGML_NO_BACKTRACE="1")
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), str(model), *args],
                          capture_output=True,
                          text=True, timeout=timeout, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return proc.returncode, (json.loads(lines[-1]) if lines else {})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--mmproj")
    ap.add_argument("--image", action="append", default=[], help="WxH of a generated test image")
    ap.add_argument("--prompt",
                    default="<|im_start|>user\nWhat is in the image?<|im_end|>\n<|im_start|>assistant\n")
    ap.add_argument("--n-gen", type=int, default=8)
    ap.add_argument("--n-ctx", type=int, default=2048)
    args = ap.parse_args()

    import llama_cpp
    import llama_cpp.mtmd_cpp as mtmd

    out: dict = {}

    @llama_cpp.llama_log_callback
    def _quiet(level, text, user_data):  # keep stderr small; errors still surface via return codes
        pass

    llama_cpp.llama_log_set(_quiet, ctypes.c_void_p(0))
    mtmd.mtmd_helper_log_set(_quiet, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()

    t0 = time.perf_counter()
    mparams = llama_cpp.llama_model_default_params()
    mparams.use_extra_bufts = False
    model = llama_cpp.llama_model_load_from_file(args.model.encode(), mparams)
    if not model:
        print(json.dumps({"loaded": False}))
        return 3
    out["loaded"] = True
    out["load_s"] = time.perf_counter() - t0
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    out["n_vocab"] = n_vocab
    out["n_embd"] = llama_cpp.llama_model_n_embd(model)
    out["n_layer"] = llama_cpp.llama_model_n_layer(model)
    out["eos"] = llama_cpp.llama_vocab_eos(vocab)

    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = args.n_ctx
    cparams.n_batch = 512
    cparams.n_ubatch = 512
    cparams.n_threads = 1
    cparams.n_threads_batch = 1
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    if not ctx:
        print(json.dumps(out | {"context": False}))
        return 4

    def tokenize(text: str, parse_special: bool = True) -> list[int]:
        raw = text.encode()
        buf = (llama_cpp.llama_token * (len(raw) + 16))()
        n = llama_cpp.llama_tokenize(vocab, raw, len(raw), buf, len(buf), False, parse_special)
        assert n >= 0, n
        return list(buf[:n])

    def piece(tok: int) -> str:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(vocab, tok, buf, len(buf), 0, True)
        return buf.raw[:n].decode("utf-8", errors="replace")

    def last_logits() -> np.ndarray:
        ptr = llama_cpp.llama_get_logits_ith(ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy()

    def decode(tokens: list[int], pos0: int) -> None:
        batch = llama_cpp.llama_batch_init(len(tokens), 0, 1)
        try:
            for i, t in enumerate(tokens):
                batch.token[i] = t
                batch.pos[i] = pos0 + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = i == len(tokens) - 1
            batch.n_tokens = len(tokens)
            rc = llama_cpp.llama_decode(ctx, batch)
            assert rc == 0, f"llama_decode returned {rc}"
        finally:
            llama_cpp.llama_batch_free(batch)

    # tokenizer
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|vision_start|>", "<|vision_end|>",
                "<|image_pad|>",
                "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
    out["special_tokens"] = {s: tokenize(s) for s in specials}
    out["special_unparsed"] = {s: tokenize(s, parse_special=False) for s in ["<|im_end|>", "<tool_call>"]}
    samples = {
        "english": "The quick brown fox jumps over the lazy dog. What building is this?",
        "json": '{"name": "text_search", "arguments": {"query": "city museum"}}',
    }
    out["sample_tokens"] = {k: len(tokenize(v)) for k, v in samples.items()}
    out["sample_chars"] = {k: len(v) for k, v in samples.items()}
    out["roundtrip"] = "".join(piece(t) for t in tokenize(samples["json"])) == samples["json"]

    # text completion: prefill + greedy decode
    mem = llama_cpp.llama_get_memory(ctx)
    prompt = tokenize(args.prompt)
    t0 = time.perf_counter()
    decode(prompt, 0)
    out["prefill_ms"] = (time.perf_counter() - t0) * 1e3
    logits_text = last_logits()
    out["logits_finite"] = bool(np.isfinite(logits_text).all())
    out["logits_std"] = float(logits_text.std())
    gen, pos = [], len(prompt)
    t0 = time.perf_counter()
    for _ in range(args.n_gen):
        tok = int(np.argmax(last_logits()))
        gen.append(tok)
        decode([tok], pos)
        pos += 1
    out["decode_ms_per_token"] = (time.perf_counter() - t0) * 1e3 / max(args.n_gen, 1)
    out["generated"] = gen
    out["generated_text"] = "".join(piece(t) for t in gen)

    # chat template (jinja2, as llama-cpp-python renders it)
    tmpl_ptr = llama_cpp.llama_model_chat_template(model, None)
    template = tmpl_ptr.decode() if tmpl_ptr else ""
    out["has_chat_template"] = bool(template)
    if template:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        fmt = Jinja2ChatFormatter(template=template, eos_token="<|im_end|>", bos_token="<|endoftext|>")
        rendered = fmt(messages=[
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]},
        ]).prompt
        out["chat_rendered"] = rendered

    # images through mtmd
    if args.mmproj:
        llama_cpp.llama_memory_clear(mem, True)
        mp = mtmd.mtmd_context_params_default()
        mp.use_gpu = False
        mp.n_threads = 1
        mp.warmup = False
        t0 = time.perf_counter()
        mctx = mtmd.mtmd_init_from_file(args.mmproj.encode(), model, mp)
        out["mtmd_init"] = bool(mctx)
        out["mtmd_init_ms"] = (time.perf_counter() - t0) * 1e3
        if mctx:
            out["mtmd_use_mrope"] = bool(mtmd.mtmd_decode_use_mrope(mctx))
            marker = mtmd.mtmd_default_marker().decode()
            images = []
            for spec in args.image:
                w, h = (int(v) for v in spec.lower().split("x"))
                rng = np.random.default_rng(w * 1000 + h)
                pix = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
                images.append(_eval_image(llama_cpp, mtmd, mctx, ctx, mem, pix, marker, last_logits))
            out["images"] = images
            mtmd.mtmd_free(mctx)

    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    print(json.dumps(out))
    return 0


def _eval_image(llama_cpp, mtmd, mctx, ctx, mem, pix: np.ndarray, marker: str, last_logits) -> dict:
    """Evaluate 'prefix <image> suffix' from an empty cache; report chunks, positions and logits."""
    import ctypes

    llama_cpp.llama_memory_clear(mem, True)
    h, w, _ = pix.shape
    data = (ctypes.c_uint8 * pix.size).from_buffer_copy(pix.tobytes())
    bmp = mtmd.mtmd_bitmap_init(w, h, data)
    text = (f"<|im_start|>user\n<|vision_start|>{marker}<|vision_end|>What is "
            "this?<|im_end|>\n<|im_start|>assistant\n")
    itext = mtmd.mtmd_input_text(text.encode(), len(text.encode()), False, True)
    chunks = mtmd.mtmd_input_chunks_init()
    bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bmp)
    res: dict = {"w": w, "h": h}
    rc = mtmd.mtmd_tokenize(mctx, chunks, ctypes.byref(itext), bitmaps, 1)
    res["tokenize_rc"] = rc
    if rc == 0:
        kinds = []
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            ch = mtmd.mtmd_input_chunks_get(chunks, i)
            kind = mtmd.mtmd_input_chunk_get_type(ch)
            item = {"type": int(kind), "n_tokens": mtmd.mtmd_input_chunk_get_n_tokens(ch),
                    "n_pos": mtmd.mtmd_input_chunk_get_n_pos(ch)}
            if kind == mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                it = mtmd.mtmd_input_chunk_get_tokens_image(ch)
                item["nx"] = mtmd.mtmd_image_tokens_get_nx(it)
                item["ny"] = mtmd.mtmd_image_tokens_get_ny(it)
            kinds.append(item)
        res["chunks"] = kinds
        new_n_past = llama_cpp.llama_pos(0)
        t0 = time.perf_counter()
        rc = mtmd.mtmd_helper_eval_chunks(mctx, ctx, chunks, 0, 0, 512, True, ctypes.byref(new_n_past))
        res["eval_ms"] = (time.perf_counter() - t0) * 1e3
        res["eval_rc"] = rc
        res["n_past"] = new_n_past.value
        logits = last_logits()
        res["logits_finite"] = bool(np.isfinite(logits).all())
        res["logits_head"] = [float(x) for x in logits[:8]]
    mtmd.mtmd_input_chunks_free(chunks)
    mtmd.mtmd_bitmap_free(bmp)
    return res


if __name__ == "__main__":
    sys.exit(main())
