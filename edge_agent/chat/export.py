"""A chat exported for people and other tools: Markdown (its images copied beside it) and JSON.

Knows: the export formats (tool calls, crops, rationale scores included; API keys redacted) and writing them
whole (``files.atomic_write``: a full disk leaves the old file or none, never half of one). Reads the chat
through :class:`edge_agent.chat.store.ChatStore`; used by the app's export and ``edge-agent chats export``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import quote

from edge_agent.agent import events as ev
from edge_agent.agent.answer_check import ONLY_MOVE_LEFT, agreed_note, said
from edge_agent.chat.schema import SCHEMA_VERSION
from edge_agent.chat.store import ChatStore, ChatStoreError
from edge_agent.core.errors import EdgeAgentError
from edge_agent.core.files import atomic_write
from edge_agent.core.redaction import redact_tree
from edge_agent.tools import observations


def export_json(store: ChatStore, chat_id: int) -> dict[str, Any]:
    """The chat as JSON: every message with its events (secrets redacted)."""
    chat = store.load(chat_id)
    return {
        "format": "edge-agent-chat",
        "version": SCHEMA_VERSION,
        "id": chat.id,
        "title": chat.title,
        "created": chat.created,
        "updated": chat.updated,
        "models": chat.models,
        "messages": [
            {
                "role": m.role,
                "text": m.text,
                "image": m.image,
                "images": m.images,
                "status": m.status,
                "replaced": m.replaced,
                "created": m.created,
                "events": [redact_tree(e.to_json(), store.secrets) for e in m.events],
            }
            for m in chat.messages
        ],
    }


def export_markdown(store: ChatStore, chat_id: int, *, image_ref=None) -> str:
    """The chat as Markdown. ``image_ref(path) -> str`` maps an image path to the link to write."""
    chat = store.load(chat_id)
    given = image_ref or (lambda p: p)

    def ref(path: str) -> str:  # a link target Markdown reads whole: spaces, parentheses, é encoded
        return quote(given(path), safe="/:~._-")

    lines = [f"# {chat.title}", ""]
    for m in chat.messages:
        if m.role == "user":
            lines += ["## You", ""]
            for path in m.images:
                lines += [f"![attached image]({ref(path)})", ""]
            lines += [m.text, ""]
            continue
        lines += ["## edge-agent", ""]
        lines += _events_markdown(m.events, ref)
        status = "" if m.status in ("answered", "done") else m.status
        status = ", ".join(s for s in (status, "replaced by a later answer" if m.replaced else "") if s)
        lines += ["**Answer**" + (f" ({status})" if status else ""), ""]
        lines += [redact_tree(m.text, store.secrets) or "_(no answer)_", ""]
        if m.text and (without := ev.searches_without(m.events)):
            lines += [f"_Note: {observations.answered_without(without)}._", ""]
    return "\n".join(lines).rstrip() + "\n"


def export(store: ChatStore, chat_id: int, directory: Path | str) -> tuple[Path, Path]:
    """Write ``<slug>.md``, ``<slug>.json`` and the chat's images (attached + crops) under ``directory``."""
    directory = Path(directory)
    title = store.load_title(chat_id)
    slug = "".join(c if c.isalnum() else "-" for c in title.lower()).strip("-")[:40] or "chat"
    md_path, json_path = directory / f"{chat_id:04d}-{slug}.md", directory / f"{chat_id:04d}-{slug}.json"
    export_to(store, chat_id, md=md_path, json_path=json_path)
    return md_path, json_path


def export_to(store: ChatStore, chat_id: int, *, md: Path | None = None,
              json_path: Path | None = None) -> None:
    """Write the chat as Markdown to ``md`` (its images, attached and crops, copied into
    ``<md stem>_files`` beside it, linked relatively) and/or as JSON to ``json_path`` (``files``: the
    copies made for the Markdown). Used by the app's export and ``edge-agent chats export``."""
    store.load(chat_id)  # no such chat: the error, before any folder is made
    copied: dict[str, str] = {}
    files = md.with_name(f"{md.stem}_files") if md is not None else None

    def image_ref(path: str) -> str:
        if path in copied:
            return copied[path]
        src = Path(path)
        if files is None or not src.is_file():
            copied[path] = path  # gone since: keep the original path as a reference
            return path
        files.mkdir(parents=True, exist_ok=True)
        dst = files / f"{len(copied):02d}-{src.name}"
        dst = _export_copy(src, dst)
        copied[path] = f"{files.name}/{dst.name}"
        return copied[path]

    target = md or json_path
    try:
        if md is not None:
            atomic_write(md, export_markdown(store, chat_id, image_ref=image_ref))
        if json_path is not None:
            target = json_path
            data = export_json(store, chat_id)
            data["files"] = copied
            atomic_write(json_path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    except OSError as e:
        raise ChatStoreError(f"Cannot write the export to {target} ({e}). Pick a writable folder.",
                             title="Export failed") from e


_NOT_VIEWABLE = (".heic", ".heif", ".avif")  # formats few Markdown viewers and browsers show


def _export_copy(src: Path, dst: Path) -> Path:
    """Copy ``src`` to ``dst``; a HEIC/HEIF/AVIF photo becomes a JPEG instead (``dst`` with .jpg: Markdown
    viewers show JPEG, not HEIC). Returns the file written."""
    if src.suffix.lower() in _NOT_VIEWABLE:
        from edge_agent.tools.images import jpeg_bytes, load_image

        try:
            jpeg = dst.with_suffix(".jpg")
            jpeg.write_bytes(jpeg_bytes(load_image(src).image))
            return jpeg
        except EdgeAgentError:
            pass  # it cannot be decoded here: the file as it is
    shutil.copyfile(src, dst)
    return dst


def _events_markdown(events: list[ev.Event], ref) -> list[str]:
    lines: list[str] = []
    for e in events:
        if isinstance(e, ev.TurnStarted):
            lines += [f"### Turn {e.turn}", ""]
        elif isinstance(e, ev.RationaleScored) and not e.scored:
            c = e.candidates[e.chosen]
            lines += [f"Rationale (not scored: {e.why or ONLY_MOVE_LEFT}): {c.text} ({c.action})", ""]
        elif isinstance(e, ev.RationaleScored):
            lines += ["| | rationale | action | score | p |", "|---|---|---|---|---|"]
            for i, c in enumerate(e.candidates):
                mark = "**>**" if i == e.chosen else ""
                text = c.text.replace("|", "\\|").replace("\n", " ")
                lines.append(f"| {mark} | {text} | {c.action} | {c.score:.3f} | {c.prob:.2f} |")
            lines.append("")
        elif isinstance(e, ev.ReasoningDone):
            lines += ["> " + line for line in (e.text or "").splitlines()] + [""]
        elif isinstance(e, ev.DraftVerified):
            lines += [f"Prophet ({e.mode}): accepted {e.accepted}/{e.drafted} tokens: `{e.accepted_text}`",
                      ""]
        elif isinstance(e, ev.ToolCalled):
            lines += [f"Tool call: `{e.name}` `{json.dumps(e.arguments, ensure_ascii=False)}`", ""]
        elif isinstance(e, ev.ToolFinished):
            badge = f"[{e.status}]" if e.status else ""
            lines += [f"Tool result {badge}: {'ok' if e.ok else 'failed'}", ""]
            if e.image_path:
                lines += [f"![crop]({ref(e.image_path)})", ""]
            for r in e.results:
                title = r.get("title", "")
                url = r.get("url", "")
                lines.append(f"- [{title}]({url}) {r.get('snippet', '')}".rstrip())
            if e.results:
                lines.append("")
            elif e.observation and not e.image_path:
                lines += ["```", e.observation, "```", ""]
        elif isinstance(e, ev.AnswerChecked) and e.sure:  # an unsure one shows as the answer taken back
            lines += [f"Answer check: sure ({said(e)!r}: mean log-prob {e.score:.2f} of what it adds to the "
                      f"question, at least {e.threshold:g}{agreed_note(e)})", ""]
        elif isinstance(e, ev.MoveWithdrawn):  # why the next choice differs, as the app and `ask` say
            args = f" `{json.dumps(e.arguments, ensure_ascii=False)}`" if e.arguments else ""
            lines += [f"Taken back: `{e.action}`{args}: {e.reason}", ""]
        elif isinstance(e, ev.AgentError):
            lines += [f"**{e.title}**: {e.message}", ""]
    return lines
