#!/usr/bin/env python3
"""The one-shot baseline: llama.cpp alone answering a photo question, as ``llama-mtmd-cli`` or LM Studio do.

No agent, no tools, no app code: llama-cpp-python's bindings of llama.cpp and mtmd at llama.cpp's own
defaults for what the app chooses differently (an f16 KV cache without flash attention: the
``Llama`` class's defaults; batch and ubatch 512; the weights mapped and repacked), on every physical
core (what ``llama-mtmd-cli`` uses). One request: the chat turn ``<|im_start|>user\\n<image>QUESTION
<|im_end|>\\n<|im_start|>assistant\\n``, the image through mtmd's helper (``mtmd_helper_eval_chunk_single``:
the vision encode, then its embeddings decoded), then a fixed number of greedy answer tokens, each
decoded (end-of-generation tokens do not stop it: random weights would end at random lengths).

It runs in a process of its own (``OneShot`` starts it): the benchmark's process holds the app's model,
and one process with two models' OpenMP thread teams makes every pass slower (``runtime.cores``).
Requests come as JSON lines on stdin, answers go as JSON lines on stdout::

    python scripts/oneshot.py MODEL MMPROJ [--n-ctx 4096] [--threads N]
    {"cmd": "ask", "image": "photo.jpg", "question": "...", "answer_tokens": 32}
    {"cmd": "set_depth", "tokens": [...]}        # prefill them once, keep that context's state
    {"cmd": "decode", "tokens": [...]}           # ms per token, each decoded after the kept context
    {"cmd": "prefill", "tokens": [...]}          # seconds to prefill them into an empty context
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
N_BATCH = 512  # llama-cpp-python's Llama() default (n_batch = n_ubatch = 512)


class Worker:
    """llama.cpp + mtmd loaded once; each request starts from an empty KV cache."""

    def __init__(self, model: Path, mmproj: Path, *, n_ctx: int, threads: int) -> None:
        import llama_cpp.llama_cpp as C
        import llama_cpp.mtmd_cpp as M

        self.C, self.M = C, M
        C.llama_backend_init()
        self._log = C.llama_log_callback(lambda level, text, data: None)  # quiet, like the app
        C.llama_log_set(self._log, ctypes.c_void_p(0))
        M.mtmd_helper_log_set(self._log, ctypes.c_void_p(0))
        self.model = C.llama_model_load_from_file(str(model).encode(), C.llama_model_default_params())
        if not self.model:
            raise SystemExit(f"llama.cpp could not load {model}")
        cp = C.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, N_BATCH, N_BATCH
        cp.n_threads = cp.n_threads_batch = threads
        cp.flash_attn_type = 0  # off: llama-cpp-python's default (flash_attn=False); KV f16: llama.cpp's
        self.ctx = C.llama_init_from_model(self.model, cp)
        self.vocab = C.llama_model_get_vocab(self.model)
        self.n_vocab = C.llama_vocab_n_tokens(self.vocab)
        mp = M.mtmd_context_params_default()
        mp.use_gpu, mp.print_timings, mp.n_threads = False, False, threads
        self.mtmd = M.mtmd_init_from_file(str(mmproj).encode(), self.model, mp) if mmproj else None
        self.sampler = C.llama_sampler_init_greedy()
        self.threads = threads

    def _clear(self) -> None:
        self.C.llama_memory_clear(self.C.llama_get_memory(self.ctx), True)

    def _decode(self, tokens: list[int]) -> None:
        C = self.C
        for i in range(0, len(tokens), N_BATCH):
            part = tokens[i : i + N_BATCH]
            arr = (C.llama_token * len(part))(*part)
            rc = C.llama_decode(self.ctx, C.llama_batch_get_one(arr, len(part)))
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")

    def _finite(self) -> bool:
        row = self.C.llama_get_logits_ith(self.ctx, -1)
        return all(math.isfinite(row[j]) for j in range(0, self.n_vocab, 97))

    def ask(self, image: str, question: str, answer_tokens: int) -> dict[str, Any]:
        """One question in one shot: seconds of the photo (encode + decode), the text around it, the
        answer."""
        C, M = self.C, self.M
        if self.mtmd is None:
            raise SystemExit("the one-shot baseline needs an mmproj")
        self._clear()
        C.llama_sampler_reset(self.sampler)
        prompt = (f"<|im_start|>user\n{M.mtmd_default_marker().decode()}{question}<|im_end|>\n"
                  "<|im_start|>assistant\n")
        t0 = time.perf_counter()
        data = Path(image).read_bytes()
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        bitmap = M.mtmd_helper_bitmap_init_from_buf(self.mtmd, buf, len(data), False)
        chunks = M.mtmd_input_chunks_init()
        raw = prompt.encode()
        text = M.mtmd_input_text(text=raw, text_len=len(raw), add_special=False, parse_special=True)
        bitmaps = (M.mtmd_bitmap_p_ctypes * 1)(bitmap)
        if M.mtmd_tokenize(self.mtmd, chunks, ctypes.byref(text), bitmaps, 1) != 0:
            raise RuntimeError("mtmd_tokenize failed")
        n_past, image_s, text_s, prompt_tokens = 0, 0.0, 0.0, 0
        n = M.mtmd_input_chunks_size(chunks)
        for i in range(n):
            chunk = M.mtmd_input_chunks_get(chunks, i)
            new_past = C.llama_pos(0)
            t = time.perf_counter()
            rc = M.mtmd_helper_eval_chunk_single(self.mtmd, self.ctx, chunk, n_past, 0, N_BATCH, i == n - 1,
                                                 ctypes.byref(new_past))
            if rc != 0:
                raise RuntimeError(f"mtmd_helper_eval_chunk_single returned {rc}")
            dt = time.perf_counter() - t
            is_image = M.mtmd_input_chunk_get_type(chunk) == M.MTMD_INPUT_CHUNK_TYPE_IMAGE
            image_s, text_s = (image_s + dt, text_s) if is_image else (image_s, text_s + dt)
            prompt_tokens += int(M.mtmd_input_chunk_get_n_tokens(chunk))
            n_past = int(new_past.value)
        M.mtmd_input_chunks_free(chunks)
        M.mtmd_bitmap_free(bitmap)
        finite = self._finite()
        t = time.perf_counter()
        for _ in range(answer_tokens):
            tok = C.llama_sampler_sample(self.sampler, self.ctx, -1)
            C.llama_sampler_accept(self.sampler, tok)
            self._decode([tok])
        answer_s = time.perf_counter() - t
        finite = finite and self._finite()
        return {"oneshot_s": time.perf_counter() - t0, "image_s": image_s, "text_s": text_s,
                "answer_s": answer_s,
                "prompt_tokens": prompt_tokens, "answer_tokens": answer_tokens, "logits_finite": finite}

    def set_depth(self, tokens: list[int]) -> dict[str, Any]:
        """Prefill ``tokens`` once and keep the context's state (in memory) for :meth:`decode_ms`."""
        C = self.C
        self._clear()
        self._decode(tokens)
        size = int(C.llama_state_seq_get_size(self.ctx, 0))
        self._deep = (ctypes.c_uint8 * size)()
        C.llama_state_seq_get_data(self.ctx, self._deep, size, 0)
        self._depth = len(tokens)
        return {"cells": len(tokens), "state_bytes": size}

    def decode_ms(self, tokens: list[int]) -> dict[str, Any]:
        """Median ms of one-token decodes of ``tokens`` after the kept deep context (``set_depth``)."""
        self._clear()
        self.C.llama_state_seq_set_data(self.ctx, self._deep, len(self._deep), 0)
        times = []
        for tok in tokens:  # llama_batch_get_one: positions continue after the restored cells
            t = time.perf_counter()
            self._decode([tok])
            times.append(time.perf_counter() - t)
        return {"decode_ms": 1000 * statistics.median(times), "cells": self._depth}

    def prefill_s(self, tokens: list[int]) -> dict[str, Any]:
        self._clear()
        t = time.perf_counter()
        self._decode(tokens)
        return {"prefill_s": time.perf_counter() - t, "tokens": len(tokens)}


def serve(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("mmproj", type=Path, nargs="?")
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    w = Worker(args.model, args.mmproj, n_ctx=args.n_ctx, threads=args.threads)
    print(json.dumps({"ready": True, "threads": w.threads}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if req["cmd"] == "ask":
            out = w.ask(req["image"], req["question"], int(req.get("answer_tokens", 32)))
        elif req["cmd"] == "set_depth":
            out = w.set_depth(req["tokens"])
        elif req["cmd"] == "decode":
            out = w.decode_ms(req["tokens"])
        elif req["cmd"] == "prefill":
            out = w.prefill_s(req["tokens"])
        else:
            break
        print(json.dumps(out), flush=True)
    return 0


class OneShot:
    """The baseline in a process of its own (started here, stopped by :meth:`close`)."""

    def __init__(self, model: Path, mmproj: Path | None, *, n_ctx: int, threads: int) -> None:
        cmd = [sys.executable, str(Path(__file__).resolve()), str(model), *([str(mmproj)] if mmproj else []),
               "--n-ctx", str(n_ctx), "--threads", str(threads)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        self.ready = self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the one-shot worker ended (exit code {self.proc.wait()})")
        return dict(json.loads(line))

    def call(self, **req: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


if __name__ == "__main__":
    sys.exit(serve())
