"""Files the tests write: small deterministic images, HEIC photos, a chat history, damaged files."""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw


def make_image(path: Path, size=(64, 48), color=(200, 60, 40)) -> Path:
    """A small deterministic PNG: a coloured box with a white 'sign' in one corner."""
    img = Image.new("RGB", size, color)
    d = ImageDraw.Draw(img)
    d.rectangle([size[0] // 2, 4, size[0] - 4, size[1] // 3], fill=(250, 250, 250))
    d.line([0, size[1] - 1, size[0], 0], fill=(20, 20, 120), width=3)
    img.save(path)
    return path


def write_heic(path, size=(96, 64), colour=(200, 30, 30)):
    """A HEIC photo written by pillow-heif itself (without registering it with Pillow)."""
    import pillow_heif

    pillow_heif.from_pillow(Image.new("RGB", size, colour)).save(str(path), quality=95)
    return path


def chats_file(home: Path, n: int = 40) -> Path:
    """A chat history of ``n`` chats (a question, an answer with ~2 kB of events each: ~40 pages)."""
    from edge_agent.agent import events as ev
    from edge_agent.chat.store import ChatStore

    store = ChatStore(home / "chats.sqlite3")
    for i in range(n):
        cid = store.new_chat()
        store.add_user_message(cid, f"Question {i}?")
        mid = store.start_answer(cid)
        store.add_event(mid, ev.ReasoningDone(turn=1, text=f"thinking {i} " * 150, n_tokens=300, seconds=0.1))
        store.add_event(mid, ev.FinalAnswer(answer=f"Answer {i}.", turns=1, stop_reason="answered"))
    store.close()  # the last connection: the WAL is checkpointed into the file
    return home / "chats.sqlite3"


def damage(path: Path, how: str) -> bytes:
    """Damage the file in place; returns the damaged bytes (what must be kept aside)."""
    data = bytearray(path.read_bytes())
    if how == "truncated":
        data = data[: len(data) * 6 // 10]
    elif how == "zeroed header":
        data[:100] = bytes(100)
    else:  # a damaged page in the middle
        page = len(data) // 4096 // 2
        data[page * 4096:(page + 1) * 4096] = bytes(range(256)) * 16
    path.write_bytes(bytes(data))
    return bytes(data)


def long_chat(store, n_questions: int) -> int:
    """A chat of ``n_questions`` scripted exchanges in ``store`` (tests/fakes/engines.py's script); its id."""
    from tests.fakes.engines import script

    cid = store.new_chat()
    for i in range(n_questions):
        store.add_user_message(cid, f"question {i}", None)
        mid = store.start_answer(cid)
        for e in script(f"question {i}", None, None):
            store.add_event(mid, e)
        store.finish_answer(mid, "answered", f"answer {i}")
    return cid
