"""The chat screen's slash commands, as a table: each command's names, the arguments it takes, and what
it does on the screen (``SlashTarget``, what the table uses of ``ChatScreen``).

``/image PATH`` attaches, ``/image 2`` attaches the chat's 2nd image again, ``/image none`` detaches all;
``/detach``, ``/retry`` (``/regenerate``), ``/edit``, ``/new``, ``/chats``, ``/export [DIR]``,
``/settings``, ``/mode ssr|freeform|direct``, ``/offline [on|off]``, ``/help`` (``prompt.SLASH_HELP`` is
the text people read). A name with an argument no row accepts is an unknown command.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from edge_agent.ui.messages import SettingsRequested
from edge_agent.ui.widgets.statusbar import MODE_LABEL


class SlashTarget(Protocol):
    """What the commands use of the chat screen (``ChatScreen``)."""

    images: list[str]
    chat_id: int | None

    def attach(self, path: str) -> bool: ...
    def detach_all(self) -> None: ...
    def action_detach_image(self) -> None: ...
    def action_pick_image(self) -> None: ...
    async def action_retry(self) -> None: ...
    def action_edit_last(self) -> None: ...
    async def new_chat(self) -> None: ...
    def action_chats(self) -> None: ...
    def export(self, chat_id: int | None, directory: str | None = None) -> None: ...
    async def run_action(self, action: str) -> None: ...
    def post_message(self, message: Any) -> bool: ...
    async def show_help(self) -> None: ...


Run = Callable[[SlashTarget, str], Awaitable[None] | None]


@dataclass(frozen=True)
class SlashCommand:
    names: tuple[str, ...]
    run: Run
    takes: Callable[[str], bool] = lambda arg: True  # the arguments this row accepts
    busy_refused: bool = False  # refused while an answer runs (it would start another)


def _image(screen: SlashTarget, arg: str) -> None:
    if not arg:
        screen.action_pick_image()
    elif arg.isdigit() and 1 <= int(arg) <= len(screen.images):
        screen.attach(screen.images[int(arg) - 1])  # back to an earlier image of this chat
    else:
        screen.attach(arg)


def _mode(arg: str) -> str:
    return arg.replace("-", "")


COMMANDS: tuple[SlashCommand, ...] = (
    SlashCommand(("image",), lambda s, arg: s.detach_all(), takes=lambda arg: arg.lower() == "none"),
    SlashCommand(("image",), _image),
    SlashCommand(("detach",), lambda s, arg: s.action_detach_image()),
    SlashCommand(("retry", "regenerate"), lambda s, arg: s.action_retry(), busy_refused=True),
    SlashCommand(("edit",), lambda s, arg: s.action_edit_last(), busy_refused=True),
    SlashCommand(("new",), lambda s, arg: s.new_chat()),
    SlashCommand(("chats",), lambda s, arg: s.action_chats()),
    SlashCommand(("export",), lambda s, arg: s.export(s.chat_id, arg or None)),
    SlashCommand(("settings",), lambda s, arg: s.run_action("app.settings")),
    SlashCommand(("mode",), lambda s, arg: _post(s, {"mode": _mode(arg)}),
                 takes=lambda arg: _mode(arg) in MODE_LABEL),
    SlashCommand(("offline",), lambda s, arg: _post(s, {"offline": arg != "off"}),
                 takes=lambda arg: arg in ("on", "off", "")),
    SlashCommand(("help",), lambda s, arg: s.show_help()),
)


def _post(screen: SlashTarget, changes: dict[str, Any]) -> None:
    screen.post_message(SettingsRequested(changes))


def find(name: str, arg: str) -> SlashCommand | None:
    """The first row named ``name`` that takes ``arg`` (None: an unknown command)."""
    return next((c for c in COMMANDS if name in c.names and c.takes(arg)), None)
