"""Bad model files end in a clear ModelFileError and a live process.

The cases run in a child process: if validation missed one, llama.cpp could abort (GGML_ASSERT) and a
crash there must fail this test, not kill the test runner. One child runs all cases (loading the
tiny models takes milliseconds; starting Python + llama_cpp is the cost).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CHILD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from edge_agent.core.errors import EdgeAgentError
    from edge_agent.runtime import Model

    tiny = {k: Path(v) for k, v in json.loads(sys.argv[1]).items()}
    tmp = Path(sys.argv[2])
    out = {}

    def case(name, fn):
        try:
            fn()
            out[name] = ["ok", "", ""]
        except EdgeAgentError as e:
            out[name] = [type(e).__name__, e.title, e.message]

    def load(*a, **kw):
        kw.setdefault("n_ctx", 512); kw.setdefault("n_threads", 1); kw.setdefault("n_threads_batch", 1)
        Model.load(*a, **kw).close()

    truncated = tmp / "truncated.gguf"
    data = tiny["text"].read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    notgguf = tmp / "notes.gguf"
    notgguf.write_text("<!DOCTYPE html><html>404 not found</html>")

    case("missing", lambda: load(tmp / "nope.gguf"))
    case("truncated", lambda: load(truncated))
    case("not_gguf", lambda: load(notgguf))
    case("mmproj_as_model", lambda: load(tiny["mmproj"]))
    case("model_as_mmproj", lambda: load(tiny["text"], tiny["prophet"]))
    case("mismatched_mmproj", lambda: load(tiny["text"], tiny["mmproj_mismatch"]))
    case("bad_kv_type", lambda: load(tiny["text"], kv_type="q3"))

    def image_without_mmproj():
        with Model.load(tiny["text"], n_ctx=512, n_threads=1, n_threads_batch=1) as m:
            s = m.session()
            s.append_text("<|im_start|>user\\n")
            s.append_image(b"\\x89PNG\\r\\n\\x1a\\n")
    case("image_without_mmproj", image_without_mmproj)

    # The runtime's own net under the Python checks: with validation bypassed, a mismatched
    # mmproj makes mtmd_init_from_file return NULL, which must still be a clean error.
    import edge_agent.modelfiles.checks as mf
    mf.check_pair = lambda text, mm: None
    case("mismatched_mmproj_unvalidated", lambda: load(tiny["text"], tiny["mmproj_mismatch"]))

    # After all that, the process still loads and runs a model.
    with Model.load(tiny["text"], tiny["mmproj"], n_ctx=512, n_threads=1, n_threads_batch=1) as m:
        s = m.session()
        s.append_text("hello")
        out["alive"] = ["ok", "", str(len(s.generate(max_tokens=3).tokens))]
    print("RESULT " + json.dumps(out))
    """
)


def test_bad_files_raise_clear_errors_and_the_process_lives(tiny_models, tmp_path: Path):
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps({k: str(v) for k, v in tiny_models.items()}), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"child died (rc={proc.returncode}): {proc.stderr[-2000:]}"
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    res = json.loads(line[len("RESULT "):])
    for name in ("missing", "truncated", "not_gguf", "mmproj_as_model", "model_as_mmproj",
                 "mismatched_mmproj",
                 "image_without_mmproj", "mismatched_mmproj_unvalidated"):
        kind, title, message = res[name]
        assert kind == "ModelFileError", (name, res[name])
        assert len(message) > 30, (name, message)
    assert res["bad_kv_type"][0] == "ModelRuntimeError"
    assert "not found" in res["missing"][2]
    assert "truncated" in res["truncated"][2] and "download" in res["truncated"][2].lower()
    assert "mmproj" in res["image_without_mmproj"][2]
    assert "does not fit" in res["mismatched_mmproj_unvalidated"][2]
    assert res["alive"] == ["ok", "", "3"]


@pytest.mark.parametrize("setting,amx,expected", [("on", True, True), ("off", False, False),
                                                   ("auto", True, False), ("auto", False, True)])
def test_extra_buffers_mapping(monkeypatch, setting, amx, expected):
    """auto turns llama.cpp's extra (repack/AMX) buffers off exactly when the build has AMX kernels."""
    from edge_agent.runtime import _lib

    monkeypatch.setattr(_lib, "built_with_amx", lambda: amx)
    assert _lib.extra_buffers_enabled(setting) is expected


def test_amx_detection_reads_system_info(monkeypatch):
    from edge_agent.runtime import _lib

    monkeypatch.setattr(_lib, "system_info",
                        lambda: "CPU : SSE3 = 1 | AVX512 = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 |")
    assert _lib.built_with_amx()
    monkeypatch.setattr(_lib, "system_info", lambda: "CPU : SSE3 = 1 | AVX2 = 1 | AMX_INT8 = 0 |")
    assert not _lib.built_with_amx()


def test_default_threads():
    from edge_agent.runtime import cores

    assert cores.default_threads(3) == 3
    assert 1 <= cores.default_threads(0) <= cores.MAX_DEFAULT_THREADS
