"""Measured SeProD costs kept on disk per model files and machine, so a new process prices its first draft.

Knows: a small JSON file (``home/measured-costs.json``) mapping a key to the last running estimates of
:class:`edge_agent.agent.seprod_policy.Costs` (the agent's decode time per token, the prophet's draft
time per token and its prompt times with and without a new image, verification per token, the lead
each mode gets). The key is everything that changes those numbers: both model files' identities and
the context settings that change speed (KV type, flash attention, thread counts), the llama.cpp build,
and the machine (host name, CPU model, core count). A one-shot ``edge-agent ask`` process would
otherwise start with nothing measured and skip its first draft as "cannot be priced yet".
Does not know models, sessions or the drafter: the engine hands it identities and the ``Costs`` object
the drafter updates in place. A damaged or foreign file is ignored (and rewritten on the next save).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path
from typing import Any

from edge_agent.agent.seprod_policy import Costs
from edge_agent.core.files import atomic_write

FILE_NAME = "measured-costs.json"
MAX_ENTRIES = 32  # model pairs x machines x settings: the oldest are dropped beyond this
FIELDS = ("agent_token", "prophet_token", "verify_token", "prefill_new_image", "prefill_same_image")


def machine() -> str:
    """What identifies this machine's speed: host name, architecture, CPU model and core count."""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{platform.node()}|{platform.machine()}|{cpu}|{os.cpu_count()}"


def costs_key(agent: dict[str, Any], prophet: dict[str, Any], threads: tuple[int, ...]) -> str:
    """The key of a pair of loaded models (``Model.identity`` dicts) with these thread counts on this
    machine."""
    what = {"agent": agent, "prophet": prophet, "threads": list(threads), "machine": machine()}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:32]


def to_json(costs: Costs) -> dict[str, Any]:
    out: dict[str, Any] = {f: getattr(costs, f) for f in FIELDS if getattr(costs, f) is not None}
    if costs.lead:
        out["lead"] = dict(costs.lead)
    return out


def fill(costs: Costs, data: dict[str, Any]) -> int:
    """Set the measured fields of ``costs`` found in ``data`` (positive numbers only); returns how many."""
    n = 0
    for f in FIELDS:
        v = data.get(f)
        if isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < 3600:
            setattr(costs, f, float(v))
            n += 1
    lead = data.get("lead")
    if isinstance(lead, dict):
        costs.lead.update({str(k): float(v) for k, v in lead.items()
                           if isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < 3600})
    return n


class MeasuredCosts:
    """The persisted costs of one model pair on this machine, bound to the drafter's ``Costs`` object."""

    def __init__(self, path: Path, key: str, costs: Costs) -> None:
        self.path, self.key, self.costs = path, key, costs
        self.loaded = 0  # fields read from disk at construction (0: nothing was measured before)

    @classmethod
    def open(cls, home: Path, key: str, costs: Costs) -> MeasuredCosts:
        """Bind ``costs`` to its entry under ``home``, filling it with what an earlier process measured."""
        m = cls(home / FILE_NAME, key, costs)
        entry = m._read().get(key)
        if isinstance(entry, dict):
            m.loaded = fill(costs, entry)
        return m

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            return {}  # absent or damaged: nothing measured
        return data if isinstance(data, dict) else {}

    def save(self) -> None:
        """Write the current estimates (nothing measured yet: nothing written)."""
        entry = to_json(self.costs)
        if not entry:
            return
        data = {k: v for k, v in self._read().items() if k != self.key and isinstance(v, dict)}
        data[self.key] = entry  # newest last: the oldest entries are dropped first
        data = dict(list(data.items())[-MAX_ENTRIES:])
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path, json.dumps(data, indent=1), fsync=False)
        except OSError:
            pass  # a read-only home costs the next process one unpriced draft, nothing else
