"""The chat screen's slash commands are one table (edge_agent/ui/screens/slash_commands.py): which row a
command and its argument reach, which are refused while an answer runs, and what each row does on a screen."""

from __future__ import annotations

import asyncio
from typing import Any

from edge_agent.ui.messages import SettingsRequested
from edge_agent.ui.screens import slash_commands
from edge_agent.ui.widgets.prompt import SLASH_HELP


class Screen:
    """A stand-in for ChatScreen that records what a command did."""

    def __init__(self) -> None:
        self.images = ["/a.png", "/b.png"]
        self.chat_id: int | None = 7
        self.did: list[Any] = []

    def attach(self, path: str) -> bool:
        self.did.append(("attach", path))
        return True

    def detach_all(self) -> None:
        self.did.append("detach_all")

    def action_detach_image(self) -> None:
        self.did.append("detach")

    def action_pick_image(self) -> None:
        self.did.append("pick")

    async def action_retry(self) -> None:
        self.did.append("retry")

    def action_edit_last(self) -> None:
        self.did.append("edit")

    async def new_chat(self) -> None:
        self.did.append("new")

    def action_chats(self) -> None:
        self.did.append("chats")

    def export(self, chat_id: int | None, directory: str | None = None) -> None:
        self.did.append(("export", chat_id, directory))

    async def run_action(self, action: str) -> None:
        self.did.append(("action", action))

    def post_message(self, message: Any) -> bool:
        assert isinstance(message, SettingsRequested)
        self.did.append(("settings", message.changes))
        return True

    async def show_help(self) -> None:
        self.did.append("help")


def run(name: str, arg: str = "") -> list[Any]:
    screen = Screen()
    command = slash_commands.find(name, arg)
    assert command is not None, name
    done = command.run(screen, arg)
    if done is not None:
        asyncio.run(done)  # type: ignore[arg-type]
    return screen.did


def test_each_command_reaches_its_row():
    assert run("image", "none") == run("image", "NONE") == ["detach_all"]
    assert run("image") == ["pick"]
    assert run("image", "2") == [("attach", "/b.png")]  # the chat's 2nd image again
    assert run("image", "3") == [("attach", "3")] and run("image", "~/c.png") == [("attach", "~/c.png")]
    assert run("detach") == ["detach"] and run("retry") == run("regenerate") == ["retry"]
    assert run("edit") == ["edit"] and run("new") == ["new"] and run("chats") == ["chats"]
    assert run("export") == [("export", 7, None)] and run("export", "~/out") == [("export", 7, "~/out")]
    assert run("settings") == [("action", "app.settings")] and run("help") == ["help"]
    assert run("mode", "free-form") == [("settings", {"mode": "freeform"})]
    assert run("offline") == run("offline", "on") == [("settings", {"offline": True})]
    assert run("offline", "off") == [("settings", {"offline": False})]


def test_an_argument_no_row_takes_is_an_unknown_command():
    assert slash_commands.find("mode", "fast") is None and slash_commands.find("offline", "maybe") is None
    assert slash_commands.find("quit", "") is None


def test_only_the_commands_that_ask_again_wait_for_an_answer():
    refused = sorted(n for c in slash_commands.COMMANDS if c.busy_refused for n in c.names)
    assert refused == ["edit", "regenerate", "retry"]


def test_the_help_names_every_command():
    for command in slash_commands.COMMANDS:
        assert any(f"/{n}" in SLASH_HELP for n in command.names), command.names
