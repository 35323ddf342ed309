"""A read-only home and a full disk (issue 30 item 1): every command that only reads works; one that must
write says what it could not write and how to fix it, with no traceback, and nothing is lost or half
written; the app opens read-only with a banner.

The home is made read-only by a read-only bind mount, and the disk full by a small tmpfs, each inside a
private mount namespace (``unshare``) that only the command under test sees; where this machine allows
neither, the tests say so and skip.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"EDGE_AGENT_N_THREADS": "1", "EDGE_AGENT_N_THREADS_BATCH": "1", "EDGE_AGENT_N_CTX": "2048",
         "EDGE_AGENT_ANSWER_MAX_TOKENS": "6", "EDGE_AGENT_MAX_TURNS": "1", "EDGE_AGENT_OFFLINE": "true"}


def _unshare() -> list[str]:
    return ["unshare", "--mount"] + ([] if os.geteuid() == 0 else ["--map-root-user"])


def _can_confine() -> bool:
    if shutil.which("unshare") is None:
        return False
    r = subprocess.run([*_unshare(), "sh", "-c", "mount -t tmpfs tmpfs /mnt 2>/dev/null || "
                        "mount -t tmpfs tmpfs \"$TMPDIR\""], capture_output=True,
                       env={**os.environ, "TMPDIR": "/tmp"})
    return r.returncode == 0


needs_namespace = pytest.mark.skipif(not _can_confine(), reason="no private mount namespace (unshare) here")


def confined(home: Path, args: list[str], *, mount: str, timeout: float = 180,
             python: str | None = None) -> subprocess.CompletedProcess:
    """``edge-agent ARGS`` (or ``python -c PYTHON``) with ``home`` as EDGE_AGENT_HOME, inside a namespace
    where ``mount`` ("readonly": home bind-mounted read-only; "full": home on a tmpfs filled up) holds."""
    h = shlex.quote(str(home))
    if mount == "readonly":
        setup = f"mount --bind {h} {h} && mount -o remount,ro,bind {h} {h}"
    else:  # the home copied onto a small tmpfs, which is then filled to the last byte
        setup = (f"cp -a {h} {h}.src && mount -t tmpfs -o size=2m tmpfs {h} && cp -a {h}.src/. {h} && "
                 f"rm -rf {h}.src && (dd if=/dev/zero of={h}/.filler bs=4k 2>/dev/null; true)")
    cmd = [sys.executable, "-c", python] if python else [sys.executable, "-m", "edge_agent.commands.cli",
                                                         *args]
    script = f"{setup} && exec {' '.join(shlex.quote(c) for c in cmd)}"
    return subprocess.run([*_unshare(), "sh", "-c", script], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, **SMALL, "EDGE_AGENT_HOME": str(home)})


@pytest.fixture
def home(edge_home: Path, tiny_models, tmp_path: Path) -> Path:
    """A home with a config, a chat (asked on the tiny model) and saved context states."""
    env = {**os.environ, **SMALL}
    tiny = ["--model", str(tiny_models["text"]), "--mmproj", str(tiny_models["mmproj"])]
    for args in (["config", "set", "max_turns", "1"], ["ask", "What is red?", *tiny]):
        r = subprocess.run([sys.executable, "-m", "edge_agent.commands.cli", *args], capture_output=True,
                           text=True, env=env,
                           timeout=180)
        assert r.returncode in (0, 1), r.stderr
    return edge_home


def clean(r: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in r.stderr + r.stdout, r.stderr


@needs_namespace
@pytest.mark.parametrize("args",
                         [["chats"], ["chats", "show", "1"], ["models", "list"], ["config", "explain"],
                                  ["config", "show"], ["cache", "stats"]])
def test_reading_commands_work_on_a_read_only_home(home: Path, args: list[str]):
    r = confined(home, args, mount="readonly")
    clean(r)
    assert r.returncode == 0, r.stderr
    if args[0] == "chats":
        assert "What is red?" in r.stdout


@needs_namespace
def test_export_and_ask_no_save_work_on_a_read_only_home(home: Path, tiny_models, tmp_path: Path):
    out = tmp_path / "out" / "chat1.md"
    r = confined(home, ["chats", "export", "1", "-o", str(out)], mount="readonly")
    clean(r)
    assert r.returncode == 0 and "What is red?" in out.read_text()
    tiny = ["--model", str(tiny_models["text"]), "--mmproj", str(tiny_models["mmproj"])]
    r = confined(home, ["ask", "What is blue?", *tiny, "--no-save"], mount="readonly")
    clean(r)
    assert r.returncode in (0, 1), r.stderr
    r = confined(home, ["ask", "--continue", "And green?", "--no-save", "--json", *tiny], mount="readonly")
    clean(r)
    assert r.returncode in (0, 1) and '"event": "final_answer"' in r.stdout, r.stderr


@needs_namespace
def test_commands_that_must_write_say_what_and_how_to_fix_it(home: Path, tiny_models):
    before = (home / "config.toml").read_bytes()
    r = confined(home, ["config", "set", "max_turns", "3"], mount="readonly")
    clean(r)
    assert r.returncode == 2 and str(home / "config.toml") in r.stderr and "read-only" in r.stderr.lower()
    assert "EDGE_AGENT_HOME" in r.stderr  # how to fix it
    assert (home / "config.toml").read_bytes() == before
    tiny = ["--model", str(tiny_models["text"]), "--mmproj", str(tiny_models["mmproj"])]
    r = confined(home, ["ask", "What is blue?", *tiny], mount="readonly")
    clean(r)  # the answer is given; that it could not be saved is said, with the fix
    assert r.returncode in (0, 1) and "not saved" in r.stderr.lower() and "--no-save" in r.stderr, r.stderr


@needs_namespace
def test_a_full_disk_fails_writes_cleanly_and_half_writes_nothing(home: Path, tiny_models, tmp_path: Path):
    before = (home / "config.toml").read_bytes()
    r = confined(home, ["config", "set", "max_turns", "3"], mount="full")
    clean(r)
    assert r.returncode == 2 and "full" in r.stderr.lower() and str(home / "config.toml") in r.stderr
    assert (home / "config.toml").read_bytes() == before  # the tmpfs is gone: the home is as it was
    tiny = ["--model", str(tiny_models["text"]), "--mmproj", str(tiny_models["mmproj"])]
    out = tmp_path / "after"
    check = textwrap.dedent(f"""
        import glob, os, shutil, subprocess, sys
        home, out = {str(home)!r}, {str(out)!r}
        r = subprocess.run([sys.executable, "-m", "edge_agent.commands.cli", "ask", "--continue", "And blue?",
                            *{tiny!r}], capture_output=True, text=True)
        print("RC", r.returncode); print("ERR", r.stderr.replace(chr(10), " | "))
        os.makedirs(out)
        for f in glob.glob(os.path.join(home, "chats.sqlite3*")):  # the disk as the full run left it
            shutil.copy(f, out)
        """)
    r = confined(home, [], mount="full", python=check)
    clean(r)
    got = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
    assert "Traceback" not in got["ERR"] and ("full" in got["ERR"].lower() or got["RC"] == "0"), got
    with sqlite3.connect(out / "chats.sqlite3") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("SELECT COUNT(*) FROM messages WHERE status='running'").fetchone()[0] == 0
        users = db.execute("SELECT COUNT(*) FROM messages WHERE role='user'").fetchone()[0]
        answers = db.execute("SELECT COUNT(*) FROM messages WHERE role='assistant'").fetchone()[0]
        assert users == answers  # a question is saved with its answer, or neither is


@needs_namespace
def test_the_app_opens_read_only_with_a_banner(home: Path, tmp_path: Path):
    script = textwrap.dedent("""
        import asyncio
        from edge_agent.core.config import Settings
        from edge_agent.ui.app import EdgeAgentApp
        from tests.fakes.engines import ScriptedEngine
        from tests.pilot import settle, type_and_enter

        async def main():
            app = EdgeAgentApp(Settings.load(), engine_factory=lambda s, progress=None: ScriptedEngine(s))
            async with app.run_test(size=(120, 40)) as pilot:
                await settle(pilot)
                banner = app.chat_screen.query_one("#read-only")
                print("BANNER", banner.display, str(banner.render()).replace(chr(10), " "))
                await type_and_enter(pilot, "What does the sign say?")
                await settle(pilot)
                view = app.chat_screen.transcript.answers()[0]
                print("ANSWER", view.status, view.text)
        asyncio.run(main())
        """)
    r = confined(home, [], mount="readonly", python=script)
    clean(r)
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines()
                 if line.startswith(("BANNER", "ANSWER")))
    assert (lines["BANNER"].startswith("True")
            and "read-only file system" in lines["BANNER"]), r.stdout + r.stderr
    assert "EDGE_AGENT_HOME" in lines["BANNER"]
    assert lines["ANSWER"].startswith("answered") and "OPEN" in lines["ANSWER"]
    with sqlite3.connect(home / "chats.sqlite3") as db:  # nothing was written to the read-only home
        assert db.execute("SELECT COUNT(*) FROM messages WHERE role='user'").fetchone()[0] == 1


@needs_namespace
def test_searches_cached_in_a_read_only_home_are_served(home: Path, fake):
    """The search cache is read as it is (an offline question still finds what was cached); a new result is
    used, not stored; nothing fails."""
    from edge_agent.core.config import Settings
    from edge_agent.tools.search import SearchTools

    wiki = fake("wikipedia")
    live = SearchTools.from_settings(Settings.load({"wikipedia_url": wiki.url, "offline": False}))
    assert live.text_search("eiffel tower").status == "live"
    live.close()
    probe = textwrap.dedent(f"""
        from edge_agent.core.config import Settings
        from edge_agent.tools.search import SearchTools
        t = SearchTools.from_settings(Settings.load({{"wikipedia_url": {wiki.url!r}, "offline": True}}))
        print("OFFLINE", t.text_search("Eiffel tower").status)
        t = SearchTools.from_settings(Settings.load({{"wikipedia_url": {wiki.url!r}, "offline": False}}))
        print("LIVE", t.text_search("louvre").status)
        """)
    r = confined(home, [], mount="readonly", python=probe)
    clean(r)
    assert "OFFLINE cached" in r.stdout and "LIVE live" in r.stdout, r.stdout + r.stderr
