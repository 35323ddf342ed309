"""Add children to a widget whether or not it is mounted yet.

A live answer mounts each new piece as its event arrives; a resumed chat builds the whole answer
before it is mounted (one mount for the whole tree instead of one per piece: ~10x faster to open
a long chat).
"""

from __future__ import annotations

from textual.widget import Widget


async def put(parent: Widget, *widgets: Widget) -> None:
    if parent.is_mounted:
        await parent.mount_all(widgets)
    else:
        for w in widgets:
            parent.compose_add_child(w)  # composed with the parent when it mounts
