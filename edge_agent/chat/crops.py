"""Zoom crops on disk: one folder per agent run under ``Settings.crops_dir``.

Knows: which folders a run wrote (from its ToolFinished events), which ones saved chats still show,
and how old a folder is. Deletes a finished run's folder (``edge-agent ask``: the crops were for that
run) and folders untouched for a week that no saved chat refers to (``ask --json`` runs, deleted
chats), so crops never pile up. Never deletes anything outside ``crops_dir``. Does not know models
or the UI.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from edge_agent.agent import events as ev

CROPS_MAX_AGE_DAYS = 7


def remove_run_crops(events: list[ev.Event], crops_dir: Path) -> None:
    """Delete the crop folders this run wrote (never anything outside ``crops_dir``)."""
    root = crops_dir.resolve()
    for folder in {Path(e.image_path).parent for e in events if isinstance(e,
                                                                           ev.ToolFinished) and e.image_path}:
        folder = folder.resolve()
        if folder.parent == root:
            shutil.rmtree(folder, ignore_errors=True)


def prune_crops(crops_dir: Path, max_age_days: float = CROPS_MAX_AGE_DAYS, *,
                chats_path: Path | None = None) -> int:
    """Delete run folders under ``crops_dir`` untouched for ``max_age_days`` (left by `ask --json`, or by
    app chats since deleted); a folder a saved chat still shows is kept. Returns how many were deleted."""
    if not crops_dir.is_dir():
        return 0
    cutoff = time.time() - max_age_days * 86400
    old = [f for f in crops_dir.iterdir() if f.is_dir() and not f.is_symlink() and f.stat().st_mtime < cutoff]
    if not old:
        return 0
    kept = _crop_folders_in_chats(chats_path) if chats_path is not None else set()
    n = 0
    for folder in old:
        if folder.name not in kept:
            shutil.rmtree(folder, ignore_errors=True)
            n += 1
    return n


def _crop_folders_in_chats(chats_path: Path) -> set[str]:
    """Names of the crop folders that saved chats refer to (their zoom results)."""
    if not chats_path.exists():
        return set()
    from edge_agent.chat.store import ChatStore

    store = ChatStore(chats_path)
    try:
        return {Path(e.image_path).parent.name for c in store.list_chats() for m in store.load(c.id).messages
                for e in m.events if isinstance(e, ev.ToolFinished) and e.image_path}
    finally:
        store.close()
