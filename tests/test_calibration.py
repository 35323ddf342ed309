"""The neutral scores' table (engine.calibration.NeutralScores), pure logic: rows keyed by the model and the
system prompt, the key worked out once per system prompt, kept on disk under the same key."""

from __future__ import annotations

from edge_agent.engine import calibration
from edge_agent.engine.calibration import NeutralScores, neutral_key


def test_rows_are_keyed_by_system_prompt_and_the_key_is_worked_out_once(tmp_path, monkeypatch):
    made: list[str] = []

    def counting(identity, system):
        made.append(system)
        return neutral_key(identity, system)

    monkeypatch.setattr(calibration, "neutral_key", counting)
    path = tmp_path / "neutral-scores.json"
    table = NeutralScores({"model": "m.gguf"}, path)
    table.add("SYSTEM A", ["I should search"], [-1.5])
    assert table.row("SYSTEM A") is table.row("SYSTEM A") and table.row("SYSTEM B") == {}
    assert table.missing("SYSTEM A", ["I should search", "I know this"]) == ["I know this"]
    assert table.get("SYSTEM A", ["I should search"], score=lambda s, t: [0.0] * len(t)) == {
        "I should search": -1.5}
    assert made == ["SYSTEM A", "SYSTEM B"]  # ~0.1 ms each (a JSON dump and a hash): once per prompt
    again = NeutralScores({"model": "m.gguf"}, path)  # from the file: the same key finds the row
    assert again.row("SYSTEM A") == {"I should search": -1.5}
    assert NeutralScores({"model": "other.gguf"}, path).row("SYSTEM A") == {}
