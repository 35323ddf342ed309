"""The app's images under Pilot: the detach hint names the image's own number; a pasted path followed
by words attaches the image and asks the words; a question carries several attached images.

The scripted engine (tests/fakes/engines.py) records what each question was asked with; the real
engine's handling of several images is tests/test_multi_image.py.
"""

from __future__ import annotations

import pytest

from edge_agent.ui.widgets.prompt import PromptInput
from tests.files import make_image
from tests.pilot import scripted_app, settle, type_and_enter

SIZE = (130, 42)


def notes(app) -> list[tuple[str, str]]:
    return [(n.title, n.message) for n in app._notifications]


@pytest.mark.asyncio
async def test_the_detach_hint_names_the_images_own_number(settings, tmp_path):
    """Issue 30 item 6: photo.jpg then screenshot.png attached, Ctrl+D detaches screenshot.png and says
    `/image 2` attaches it again (it said /image 1, which is photo.jpg); `/image 2` does."""
    photo = make_image(tmp_path / "photo.jpg", (96, 64))
    shot = make_image(tmp_path / "screenshot.png", (80, 60), (30, 120, 200))
    app, _ = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await type_and_enter(pilot, str(photo))
        await type_and_enter(pilot, str(shot))
        before = len(app._notifications)
        await pilot.press("ctrl+d")
        await pilot.pause()
        detached = [m for t, m in notes(app)[before:] if t == "Image detached"]
        assert len(detached) == 1 and detached[0].startswith("screenshot.png detached"), detached
        assert "/image 2 attaches it again" in detached[0], detached[0]
        assert str(shot.resolve()) != app.chat_screen.image
        await type_and_enter(pilot, "/image 2")
        assert app.chat_screen.image == str(shot.resolve())
        assert app.screen.query_one(PromptInput).value == ""


@pytest.mark.asyncio
async def test_a_pasted_path_followed_by_words_attaches_the_image_and_asks_the_words(settings, tmp_path):
    """Issue 30 item 6: `/path/photo.jpg what is written here?` was sent as text with no image. Now the
    image is attached and the words asked; quoted and escaped paths (spaces) too; a path that is not there
    is reported and nothing is lost (the prompt keeps the text, nothing is asked)."""
    photo = make_image(tmp_path / "photo.jpg", (96, 64))
    spaced = make_image(tmp_path / "my shot.png", (80, 60), (30, 120, 200))
    app, engines = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await type_and_enter(pilot, f"{photo} what is written here?")
        await settle(pilot)
        assert engines[0].asked[-1][:2] == ("what is written here?", str(photo.resolve()))
        assert app.chat_screen.image == str(photo.resolve())
        assert app.screen.query_one(PromptInput).value == ""
        for typed in (f"'{spaced}' and this one?", str(spaced).replace(" ", "\\ ") + " and this one?",
                      f"{spaced} and this one?"):
            await type_and_enter(pilot, typed)
            await settle(pilot)
            assert engines[0].asked[-1][:2] == ("and this one?", str(spaced.resolve())), typed
        n = len(engines[0].asked)
        typed = f"{tmp_path / 'gone.jpg'} what is this?"
        await type_and_enter(pilot, typed)
        await settle(pilot)
        assert len(engines[0].asked) == n and ("Image problem", ) <= tuple(t for t, _ in notes(app)[-1:])
        assert app.screen.query_one(PromptInput).value == typed  # kept, to fix the path
        await type_and_enter(pilot, "What is the capital of Peru?")  # a question is still a question
        await settle(pilot)
        assert engines[0].asked[-1][0] == "What is the capital of Peru?"


@pytest.mark.asyncio
async def test_a_question_goes_with_every_image_attached_since_the_last_one(settings, tmp_path):
    """Issue 30 item 6: photo.jpg then screenshot.png attached, the question goes with both (in that order,
    each shown with its number); follow-ups keep both; the next image attached after a question starts a
    new set, and `/image 1` adds an earlier one to it; Ctrl+D takes the last one off; a retry asks with the
    images the question had; a reopened chat has them attached again."""
    photo = make_image(tmp_path / "photo.jpg", (96, 64))
    shot = make_image(tmp_path / "screenshot.png", (80, 60), (30, 120, 200))
    third = make_image(tmp_path / "third.png", (64, 64), (20, 200, 20))
    p, s, t = (str(x.resolve()) for x in (photo, shot, third))
    app, engines = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.chat_screen
        await type_and_enter(pilot, str(photo))
        await type_and_enter(pilot, str(shot))
        assert screen.attached == [p, s] and "2 images: photo.jpg, screenshot.png" in str(
            screen.query_one("#attachment").render())
        assert engines[0].read[-1][1] == (p, s)  # both read ahead
        await type_and_enter(pilot, "Which one is blue?")
        await settle(pilot)
        assert engines[0].asked[-1][:2] == ("Which one is blue?", (p, s))
        await type_and_enter(pilot, "And the other?")
        await settle(pilot)
        assert engines[0].asked[-1][:2] == ("And the other?", (p, s))  # a follow-up keeps them
        await type_and_enter(pilot, str(third))  # after a question: a new set
        await type_and_enter(pilot, "/image 1")
        assert screen.attached == [t, p]
        await pilot.press("ctrl+d")
        await pilot.pause()
        assert screen.attached == [t] and "/image 1 attaches it again" in notes(app)[-1][1]
        await type_and_enter(pilot, "/image 2")
        await type_and_enter(pilot, "Same shop?")
        await settle(pilot)
        assert engines[0].asked[-1][:2] == ("Same shop?", (t, s))
        await type_and_enter(pilot, "/retry")
        await settle(pilot)
        assert engines[0].asked[-1][:2] == ("Same shop?", (t, s))
        chat = app.store.load(screen.chat_id)
        assert [m.images for m in chat.messages if m.role == "user"][-1] == [t, s]
        assert chat.images == [p, s, p, s, t, s, t, s]
        await pilot.press("ctrl+n")
        await pilot.pause()
        await screen.open_chat(app.store.load(chat.id))
        await pilot.pause()
        assert screen.attached == [t, s] and screen.images == [p, s, t]


@pytest.mark.asyncio
async def test_a_pasted_path_and_the_words_typed_after_it_are_read_ahead(settings, tmp_path):
    """While `/path/photo.jpg what is written` is typed, the engine reads the photo and the words ahead (as
    it does for an attached photo), not the path as a question: Enter then only attaches and asks."""
    photo = make_image(tmp_path / "photo.jpg", (96, 64))
    app, engines = scripted_app(settings, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        prompt = app.screen.query_one(PromptInput)
        prompt.focus()
        prompt.value = f"{photo} what is written "
        await pilot.pause()
        assert engines[0].read[-1] == ("what is written ", str(photo.resolve()), "")
        assert app.chat_screen.attached == []  # attached only when it is sent
        await pilot.press("h", "e", "r", "e", "?", "enter")
        await settle(pilot)
        assert engines[0].asked[-1][:2] == ("what is written here?", str(photo.resolve()))
