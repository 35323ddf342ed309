"""The results folder: ``results.jsonl`` (one durable line per finished (question, mode)) and ``run.json``.

Knows: appending records durably (flush + fsync), cutting off the partial last line a killed run
leaves, and the fingerprint of settings in ``run.json`` that makes a rerun with other settings fail
instead of mixing two configurations. Does not know: what a record means or how it is scored.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from edge_agent.core.errors import ConfigError, EdgeAgentError
from edge_agent.core.files import atomic_write

RESULTS_FILE = "results.jsonl"
RUN_FILE = "run.json"


class ResultsStore:
    """``results.jsonl`` in ``out_dir``: one record per finished (question, mode), appended durably.

    A run killed mid-write leaves at most one partial last line; ``open`` cuts it off so the next
    append starts on a clean line. Records are keyed by (mode, id); the first one wins.
    """

    def __init__(self, out_dir: Path | str) -> None:
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / RESULTS_FILE
        self.records: dict[tuple[str, str], dict[str, Any]] = {}

    def open(self, fingerprint: dict[str, Any] | None = None) -> ResultsStore:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._check_fingerprint(fingerprint)
        if not self.path.exists():
            return self
        data = self.path.read_bytes()
        good = 0  # byte offset after the last complete, valid line
        pos = 0
        while pos < len(data):
            nl = data.find(b"\n", pos)
            if nl < 0:
                break  # a partial last line (killed mid-write)
            line = data[pos:nl]
            if line.strip():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    raise EdgeAgentError(
                        f"{self.path} has a corrupt line at byte {pos}. Delete that line (or the file, to "
                        f"start over) and rerun.",
                        title="Bad results file",
                    ) from None
                self.records.setdefault((rec["mode"], rec["id"]), rec)
            pos = good = nl + 1
        if good < len(data):
            with open(self.path, "r+b") as f:
                f.truncate(good)
        return self

    def _check_fingerprint(self, fingerprint: dict[str, Any] | None) -> None:
        if fingerprint is None:
            return
        run = self.out_dir / RUN_FILE
        fp = json.loads(json.dumps(fingerprint))  # normalise (tuples -> lists, paths -> str)
        data = self._run_json()
        if "fingerprint" in data:  # (a run.json without one holds only notes: nothing to compare)
            old = data["fingerprint"]
            if not isinstance(old, dict):
                raise EdgeAgentError(f"{run} is not valid JSON. Delete {self.out_dir} (or use another --out) "
                                     f"to start over.",
                                     title="Bad results folder")
            diff = sorted(k for k in set(old) | set(fp) if old.get(k) != fp.get(k))
            if diff and self.path.exists() and self.path.stat().st_size:
                changes = "; ".join(f"{k}: {old.get(k)!r} -> {fp.get(k)!r}" for k in diff)
                raise ConfigError(
                    f"{self.out_dir} holds results made with other settings ({changes}). "
                    "Rerun with the same settings to resume, or pass another --out to start a new run."
                )
        self._write_run({**self._run_json(), "fingerprint": fp})

    def _run_json(self) -> dict[str, Any]:
        """``run.json`` as a dict ({} when absent; {"fingerprint": None} when unreadable)."""
        run = self.out_dir / RUN_FILE
        if not run.exists():
            return {}
        try:
            data = json.loads(run.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return {"fingerprint": None}
        return data if isinstance(data, dict) else {"fingerprint": None}

    def _write_run(self, data: dict[str, Any]) -> None:
        atomic_write(self.out_dir / RUN_FILE, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")

    def note(self, key: str, value: Any) -> None:
        """Keep ``value`` in ``run.json`` beside the fingerprint (e.g. the model files a run loaded:
        a resumed run that loads nothing still reports them)."""
        self._write_run({**self._run_json(), key: value})

    def noted(self, key: str) -> Any:
        return self._run_json().get(key)

    def has(self, mode: str, qid: str) -> bool:
        return (mode, qid) in self.records

    def append(self, record: dict[str, Any]) -> None:
        key = (record["mode"], record["id"])
        if key in self.records:
            raise ValueError(f"duplicate result for {key}")  # a bug in the caller, not a user error
        line = json.dumps(record, ensure_ascii=False, default=str) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.records[key] = record

