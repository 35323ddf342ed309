"""What the command line says when something is wrong or removed: in a subprocess, as a person sees it
(issue 30 item 9: wording that fits, secrets shown as removed, `config unset`, a file that is no model)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def edge(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edge_agent.commands.cli", *args], capture_output=True,
                          text=True,
                          timeout=timeout, env=dict(os.environ))


def test_a_number_setting_says_it_wants_a_whole_number(edge_home):
    r = edge("config", "set", "max_turns", "three")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "max_turns" in r.stderr and "must be a whole number" in r.stderr and "a int" not in r.stderr
    r = edge("config", "set", "ssr_tau", "warm")
    assert "must be a number" in r.stderr
    r = edge("config", "set", "offline", "perhaps")
    assert "must be true or false" in r.stderr


def test_an_empty_question_is_an_empty_question_not_a_bad_setting(edge_home):
    r = edge("ask", "")
    assert r.returncode == 2 and "Bad setting" not in r.stderr and "Traceback" not in r.stderr
    assert "question is empty" in r.stderr.lower() and 'edge-agent ask "' in r.stderr


def test_a_removed_key_is_shown_removed_and_unset_returns_a_default(edge_home: Path):
    r = edge("config", "set", "brave_api_key", "sk-secret-123")
    assert r.returncode == 0 and "brave_api_key = ***" in r.stdout and "sk-secret" not in r.stdout
    r = edge("config", "set", "brave_api_key", "")
    assert r.returncode == 0 and "***" not in r.stdout and "brave_api_key removed" in r.stdout
    edge("config", "set", "max_turns", "3")
    r = edge("config", "unset", "max_turns")
    assert r.returncode == 0 and "max_turns = 5 (the default)" in r.stdout
    text = (edge_home / "config.toml").read_text()
    assert "max_turns" not in text and "brave_api_key" not in text
    r = edge("config", "unset", "colour")
    assert r.returncode == 2 and "Unknown setting 'colour'" in r.stderr


def test_a_file_that_is_no_model_is_not_called_damaged(edge_home: Path, tmp_path: Path):
    notes = tmp_path / "notes.txt"
    notes.write_text("shopping: milk, bread\n")
    r = edge("models", "add", str(notes))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "not a GGUF model file" in r.stderr and "notes.txt" in r.stderr
    assert "Damaged" not in r.stderr and "download the model again" not in r.stderr
