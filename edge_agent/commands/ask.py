"""`edge-agent ask [IMAGE]... QUESTION`: answer one question and print the answer and a compact trace.

Parses flags into settings, builds the engine (edge_agent.engine.engine), and renders the agent's events:
for people, the answer alone on stdout and, on stderr, progress and one trace line per turn (the
rationale chosen and its probability, or the reasoning's length; the tool call; timings); with
``--json``, one JSON object per event per line on stdout, the last the final answer with totals.
Exit status: 0 answered, 1 no answer found (the model only repeated its instructions), 130
cancelled (Ctrl-C), 2 with a one-line error otherwise (EdgeAgentError is printed by cli.py, no
traceback).
"""

from __future__ import annotations

import json
import shlex
import sys
import threading
from pathlib import Path
from typing import Any

import click

from edge_agent.agent import events as ev
from edge_agent.agent.answer_check import ONLY_MOVE_LEFT, agreed_note, said
from edge_agent.chat.crops import prune_crops, remove_run_crops
from edge_agent.chat.recorder import AnswerStatus, ExchangeRecorder
from edge_agent.core.config import CHOICES, Settings
from edge_agent.core.errors import EdgeAgentError
from edge_agent.engine.face import AskRequest
from edge_agent.tools import observations
from edge_agent.tools.images import SUFFIXES as IMAGE_SUFFIXES


def _is_file(arg: str) -> bool:
    """An existing file; False for any text that cannot be one (longer than a file name may be, a NUL)."""
    try:
        return Path(arg).expanduser().is_file()
    except (OSError, ValueError):  # ENAMETOOLONG: a question of a few hundred words
        return False


@click.command("ask")
@click.argument("args", nargs=-1, required=True, metavar="[IMAGE]... QUESTION")
@click.option("--image", "-i", "image_flags", multiple=True, metavar="FILE",
              help="An image to ask about (repeat for several; the same as IMAGE before the question).")
@click.option("--model", default=None, help="Agent model: catalog name or GGUF path.")
@click.option("--mmproj", default=None, help="Vision projector (mmproj) GGUF for the model.")
@click.option("--mode", type=click.Choice(["ssr", "freeform", "direct"]), default=None,
              help="ssr: score pre-written rationales (fast); freeform: the model writes its reasoning; "
                   "direct: the model alone in a plain chat (no tools, no agent).")
@click.option("--max-turns", type=click.IntRange(min=1), default=None,
              help="Most tool calls per question; then one more turn must answer.")
@click.option("--seed", type=int, default=None, help="Random seed (sampling, SSR sampling).")
@click.option("--offline", is_flag=True, default=None, help="Serve searches from the cache only.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event per line.")
@click.option("--prophet", default=None,
              help="SeProD prophet (base) model: catalog name or GGUF path (same tokenizer).")
@click.option("--prophet-mmproj", default=None, help="Vision projector (mmproj) GGUF for the prophet.")
@click.option("-c", "--continue", "continue_", is_flag=True,
              help="Continue the most recent chat (the app's chats too): its images and answers stay in the "
                   "model's context.")
@click.option("--chat", "chat_id", type=int, default=None,
              help="Continue the chat with this id (see `edge-agent chats`).")
@click.option("--no-save", is_flag=True,
              help="Do not save this question and answer as a chat (a follow-up still reads the chat it "
                   "continues).")
def command(args: tuple[str, ...], model: str | None, mmproj: str | None, mode: str | None,
            max_turns: int | None, seed: int | None, offline: bool | None, as_json: bool,
            prophet: str | None = None, prophet_mmproj: str | None = None, continue_: bool = False,
            chat_id: int | None = None, no_save: bool = False, image_flags: tuple[str, ...] = ()) -> None:
    """Ask one question about an image or several (without IMAGE, a text-only question); print the answer.

    \b
    Examples:
      edge-agent ask photo.jpg "What does the small sign say?"
      edge-agent ask photo.jpg screenshot.png "Is this the same shop?"   two images (or -i A -i B)
      edge-agent ask photo.jpg "Where is this?" --mode freeform --max-turns 3
      edge-agent ask photo.jpg "Who made this?" --offline --json
      edge-agent ask "What is the capital of Peru?" --model smollm2-135m-demo
      edge-agent ask photo.jpg "What is this?" --model agent.gguf --mmproj mm.gguf \\
          --prophet base.gguf --prophet-mmproj mm.gguf
      edge-agent ask --continue "And what colour is the door?"     a follow-up about the same photo
      edge-agent ask --chat 12 other.jpg "Is this the same shop?"   a new photo in chat 12
      edge-agent ask photo.jpg "What is this?" --no-save           not added to the chats

    Every question is saved as a chat (the app's chat list) unless --no-save. A follow-up continues
    the chat's saved context: the image and earlier answers are not read again.
    """
    images, question = _images_and_question(args, image_flags)

    if not question.strip():  # before any model loads
        raise EdgeAgentError('The question is empty. Give one in quotes: edge-agent ask "What is the capital '
                             'of '
                             'Peru?" (about a photo: edge-agent ask photo.jpg "What is this?")',
                             title="Empty question")
    flags = {"model": model, "mmproj": mmproj, "prophet": prophet, "prophet_mmproj": prophet_mmproj}
    settings = Settings.load({**flags, "mode": mode, "max_turns": max_turns, "seed": seed,
                              "offline": True if offline else None})
    from edge_agent.chat.store import ChatStore

    store = ChatStore(settings.chats_path, secrets=settings.secrets())
    follow_up, lock = continue_ or chat_id is not None, None
    try:
        if follow_up and not no_save:  # one writer per chat: from reading its context to saving the answer
            lock = _lock_chat(settings, store, chat_id)
            chat_id = lock.chat_id if lock is not None else chat_id
        chat, images = _chat_for(store, follow_up, chat_id, images)
        settings = _chat_models(settings, chat, flags, say=None if as_json else _note)
        unsaved = "not saved as a chat (--no-save)"
        if store.read_only and not no_save:  # a read-only home, a full disk: the answer still comes, unsaved
            unsaved = f"Not saved as a chat: {store.read_only} (--no-save asks without saving.)"
            if as_json:
                _note(unsaved)
        saving = not no_save and not store.read_only
        _ask(settings, store if saving else None, chat, question, images, as_json=as_json, mode=mode,
             unsaved=unsaved)
    finally:
        if lock is not None:
            lock.release()
        store.close()


def _images_and_question(args: tuple[str, ...], flags: tuple[str, ...]) -> tuple[list[str], str]:
    """The images (``IMAGE...`` before the question, then each ``--image``) and the question. Several
    images must all exist: a missing one is named, with the command that asks without it."""
    images, question = [*args[:-1], *flags], args[-1]
    if _is_file(question) and (not images or question.lower().endswith(IMAGE_SUFFIXES)):  # else a question
        shown = " ".join(shlex.quote(p) for p in [*images, question])
        raise click.UsageError(f"{question} is a file: give a question too, e.g. edge-agent ask {shown} "
                               '"What is this?"')
    if len(args) > 2 and not any(_is_file(a) or a.lower().endswith(IMAGE_SUFFIXES) for a in args[:-1]):
        raise click.UsageError("Give the IMAGE files, then one QUESTION (quote the question).")
    missing = [i for i, p in enumerate(images) if not _is_file(p)]
    if len(images) > 1 and missing:
        i = missing[0]
        rest = " ".join(shlex.quote(p) for k, p in enumerate(images) if k not in missing)
        without = f"edge-agent ask {rest} {json.dumps(question, ensure_ascii=False)}"
        raise EdgeAgentError(f"Image file not found: {images[i]} (image {i + 1} of {len(images)}). Check the "
                             f"path, or ask without it: {without}", title="Image problem")
    return images, question


def _lock_chat(settings: Settings, store: Any, chat_id: int | None) -> Any:
    """The lock of the chat this follow-up goes to (None: there is no chat yet), waiting, with a line on
    stderr, while another question (another `ask`, the app) is answering in it."""
    from edge_agent.chat.lock import ChatLock

    cid = chat_id if chat_id is not None else store.latest_chat()
    if cid is None:
        return None
    lock = ChatLock(settings.home, cid, "edge-agent ask")
    lock.acquire(on_wait=lambda who: _note(f"chat {cid} is being answered by {who}; waiting for it to finish "
                                           "(Ctrl-C stops waiting) ..."))
    return lock


def _note(text: str) -> None:
    click.echo(text, err=True)


def _chat_for(store: Any, follow_up: bool, chat_id: int | None, images: list[str]) -> tuple[Any, list[str]]:
    """(Continuation of the chat to ask in, the images to ask about): the chat's own images (its last
    question's) for a follow-up without any; for a new question an empty chat id 0 (the chat is created
    only once the question reaches the model: see ``chat.recorder``)."""
    from edge_agent.chat.store import Continuation

    if not follow_up:
        return Continuation(0), images
    if chat_id is None:
        chat_id = store.latest_chat()
        if chat_id is None:
            raise click.UsageError("There is no chat to continue yet: ask a first question without "
                                   "--continue.")
    cont = store.continuation(chat_id)
    if not images and cont.last_images:
        for gone in (p for p in cont.last_images if not Path(p).is_file()):
            raise EdgeAgentError(
                f"Chat {chat_id}'s image {gone} is gone. Attach it again: "
                f'edge-agent ask --chat {chat_id} IMAGE "question"', title="Image not found")
        images = list(cont.last_images)
    return cont, images


def _chat_models(settings: Settings, chat: Any, flags: dict[str, str | None], say: Any) -> Settings:
    """The settings a follow-up runs with: a chat continues with the model files it was made with
    (``Continuation.models``) unless --model (agent, mmproj) or --prophet (prophet, its mmproj) says
    otherwise; ``say`` (None: quiet) is told when that differs from the current setting, and how to
    choose. Raises when the chat's model file is gone (and names the flag that picks another)."""
    from edge_agent.engine.engine import model_files
    from edge_agent.modelfiles.resolution import resolve

    files = chat.models
    if not files.get("model"):
        return settings  # a new chat, or one saved before chats recorded their models
    use: dict[str, str] = {}
    if flags["model"] is None and flags["mmproj"] is None:
        if not Path(files["model"]).is_file() or (files.get("mmproj")
                                                  and not Path(files["mmproj"]).is_file()):
            gone = files["model"] if not Path(files["model"]).is_file() else files["mmproj"]
            raise EdgeAgentError(
                f"Chat {chat.chat_id} was made with {files['model']}, but {gone} is gone. Continue it with "
                "another "
                f'model: edge-agent ask --chat {chat.chat_id} --model NAME_OR_PATH "question" (see '
                '`edge-agent '
                "models list`).", title="Chat's model not found")
        use |= {"model": files["model"], "mmproj": files.get("mmproj", "")}
    if flags["prophet"] is None and flags["prophet_mmproj"] is None and files.get("prophet") \
            and Path(files["prophet"]).is_file():
        use |= {"prophet": files["prophet"], "prophet_mmproj": files.get("prophet_mmproj", "")}
    if not use:
        return settings
    try:
        current = model_files(resolve(settings))
    except EdgeAgentError:
        current = {}
    differ = [k for k in ("model", "prophet") if k in use and use[k] != current.get(k, "")]
    if differ and say is not None:
        say(f"chat {chat.chat_id} continues with the model{'s' if len(differ) > 1 else ''} it was made with: "
            + ", ".join(f"{k} {Path(use[k]).name}" for k in differ)
            + f" (the current setting is {', '.join(Path(current.get(k) or 'none').name for k in differ)}; "
            "pass --model / --prophet to choose)")
    return settings.updated(use, source=f"chat {chat.chat_id}")


def _say_why_cut(last: Any, settings: Settings, mode: str) -> None:
    """Right under the answer, on stderr: it does not look finished because it is not."""
    if last.stop_reason == "length":
        n = int(last.totals.get("answer_tokens", settings.answer_max_tokens))
        click.echo(f"The answer was cut off at {n} tokens (answer_max_tokens). For longer answers: "
                   f"edge-agent config set answer_max_tokens {min(2 * settings.answer_max_tokens, 8192)}",
                   err=True)
    if last.stop_reason == "repetition":
        others = [m for m in CHOICES["mode"] if m != mode]
        click.echo("The answer was stopped where it began repeating itself (the model does not know the "
                   f"rest, or lost its way): ask again in other words, or try --mode {' or '.join(others)}.",
                   err=True)


def _ask(settings: Settings, store: Any | None, chat: Any, question: str, images: list[str], *, as_json: bool,
         mode: str | None, unsaved: str = "not saved as a chat (--no-save)") -> None:
    """Run the question; ``store`` None: nothing is saved as a chat (--no-save)."""
    from edge_agent.engine.engine import Engine  # heavy: llama.cpp
    from edge_agent.modelfiles.resolution import resolve

    if images:  # before the model loads (the 1.5B: 8-18 s) only to refuse the image
        resolve(settings).require_vision()

    def progress(msg: str, frac: float) -> None:
        if not as_json and sys.stderr.isatty():
            click.echo(f"{msg} ...", err=True)

    # the system prompt's saved state and the photo are read while the prophet loads
    image = images[0] if len(images) == 1 else (images or None)  # what Engine.ask takes: one file, or a list
    engine = Engine.from_settings(settings, progress=progress, ahead=(question, image, chat.context))
    memory = getattr(engine, "memory", None)
    # like the progress lines, for people only: --json's output holds events only, and a piped
    # stderr gets nothing but a one-line error
    if memory is not None and not as_json and sys.stderr.isatty():
        click.echo("memory: " + "; ".join(
            f"{who} {sum(m.values()) / 2**20:.0f} MB" for who, m in memory().items()), err=True)
    prune_crops(settings.crops_dir, chats_path=settings.chats_path)  # old runs no chat shows
    cancel = threading.Event()
    events: list[ev.Event] = []
    live = not as_json and sys.stderr.isatty()
    shown = [str(Path(p).expanduser().resolve()) for p in images]
    writer = ExchangeRecorder(store, chat.chat_id, question, shown, engine.files)
    status = AnswerStatus()
    try:
        for e in engine.ask(AskRequest(question, image, context=chat.context,
                                       history=chat.turns), cancel=cancel):
            events.append(e)
            writer.add(e)
            status.see(e)
            _show(e, as_json=as_json, live=live, chat_id=chat.chat_id)
        status.end(cancelled=cancel.is_set())
    except KeyboardInterrupt as e:
        cancel.set()
        status.failed(e)
        click.echo("Cancelled.", err=True)
        sys.exit(130)
    except BaseException as e:
        status.failed(e)
        raise
    finally:
        writer.finish(status.status or "error")
        engine.close()
        if not as_json:  # the crops were for this run only; --json prints their paths, so they stay (a while)
            remove_run_crops(events, settings.crops_dir)

    last = events[-1] if events else None
    if isinstance(last, ev.AgentError) and last.fatal:
        raise EdgeAgentError(last.message, title=last.title)
    if not isinstance(last, ev.FinalAnswer):
        raise EdgeAgentError("The agent stopped without an answer.", title="No answer")
    if not as_json:
        # the answer alone on stdout (`$(edge-agent ask ...)` captures just it); the trace on stderr
        if last.answer:
            click.echo(last.answer)
        if last.answer and (without := ev.searches_without(events)):  # stderr, right under it
            click.echo(f"Note: {observations.answered_without(without)}.", err=True)
        _say_why_cut(last, settings, mode or settings.mode)
        click.echo(render_trace(events, settings.mode if mode is None else mode), err=True)
        if store is not None:
            click.echo(f"chat {writer.chat_id}: ask a follow-up with `edge-agent ask --continue QUESTION`",
                       err=True)
        else:
            click.echo(unsaved, err=True)
    if last.stop_reason == "cancelled":
        sys.exit(130)
    if last.stop_reason == "no_answer" or not last.answer:
        if not as_json:
            why = next((e.message for e in events if isinstance(e, ev.AgentError)
                        and e.title == "No answer found"), "")
            click.echo(f"No answer found. {why}".strip(), err=True)
        sys.exit(1)


def _show(e: ev.Event, *, as_json: bool, live: bool, chat_id: int | None) -> None:
    """One event as it comes: a JSON line with --json, else a progress line on a terminal's stderr."""
    if as_json:
        click.echo(json.dumps(e.to_json(), ensure_ascii=False, default=_jsonable))
    elif live and isinstance(e, ev.ContextOpened) and e.source in ("live", "restored"):
        click.echo(f"  chat {chat_id}: context restored ({e.tokens_reused:,} tokens not read again)",
                   err=True)
    elif live and isinstance(e, ev.TurnFinished):
        click.echo(f"  turn {e.turn}: {e.action}", err=True)


def _jsonable(v: Any) -> Any:
    if hasattr(v, "tolist"):
        return v.tolist()
    return str(v)


def _short(text: str, n: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def render_trace(events: list[ev.Event], mode: str) -> str:
    """A compact per-turn trace: what was chosen, which tool ran, how long each part took."""
    lines = ["", "trace:"]
    per_turn: dict[int, list[str]] = {}
    for e in events:
        if isinstance(e, ev.RationaleScored):
            c = e.candidates[e.chosen]
            per_turn.setdefault(e.turn, []).append(
                f'rationale "{_short(c.text)}", not scored: {e.why or ONLY_MOVE_LEFT}' if not e.scored
                else f'rationale "{_short(c.text)}" first: {e.why}' if e.why
                else f'rationale "{_short(c.text)}" p={c.prob:.2f} ({e.seconds * 1000:.0f} ms)')
        elif isinstance(e, ev.ReasoningDone):
            per_turn.setdefault(e.turn, []).append(f'reasoning {e.n_tokens} tokens "{_short(e.text, 50)}"')
        elif isinstance(e, ev.DraftVerified):
            per_turn.setdefault(e.turn,
                                []).append(f"prophet {e.mode}: {e.accepted}/{e.drafted} tokens accepted")
        elif isinstance(e, ev.ToolCalled):
            per_turn.setdefault(e.turn, []).append(f"{e.name} {json.dumps(e.arguments, ensure_ascii=False)}")
        elif isinstance(e, ev.AnswerChecked) and e.sure:  # an unsure one shows as the answer taken back
            per_turn.setdefault(e.turn, []).append(
                f"answer check: sure ({_short(said(e), 40)!r}: {e.score:.2f} >= {e.threshold:g}"
                f"{agreed_note(e)})")
        elif isinstance(e, ev.MoveWithdrawn):
            args = f" {json.dumps(e.arguments, ensure_ascii=False)}" if e.arguments else ""
            why = " ".join(e.reason.split())  # whole: it ends with what comes instead ("it zooms in first")
            per_turn.setdefault(e.turn, []).append(f"{e.action}{args} taken back: {why}")
        elif isinstance(e, ev.ToolFinished):
            where = f" -> image {e.image_index}" if e.image_index is not None else ""
            told = f": {_short(e.observation, 70)}" if e.observation else ""  # a crop alone says nothing
            ok = "ok" if e.ok else "failed"
            per_turn.setdefault(e.turn, []).append(f"  {ok} ({e.status}){where}{told}")
        elif isinstance(e, ev.AgentError) and not e.fatal:
            per_turn.setdefault(e.turn, []).append(f"  {e.title}: {_short(e.message, 70)}")
        elif isinstance(e, ev.TurnFinished):
            per_turn.setdefault(e.turn, []).append(
                f"{e.action}: reasoning {e.reasoning_seconds:.2f}s, action {e.action_seconds:.2f}s, "
                f"tool {e.tool_seconds:.2f}s, observe {e.observe_seconds:.2f}s")
    for turn in sorted(per_turn):
        items = per_turn[turn]
        lines.append(f"turn {turn}: " + items[-1])
        lines += [f"  {x}" for x in items[:-1]]
    opened = next((e for e in events if isinstance(e, ev.ContextOpened)), None)
    if opened is not None:
        lines.append(f"context: {opened.source}" + (f" ({opened.reason})" if opened.reason else "")
                     + f", {opened.tokens_reused:,} tokens kept, {opened.tokens_evaluated:,} read"
                     + (f" ({opened.tokens_read_ahead:,} ahead)" if opened.tokens_read_ahead else "")
                     + (", system prompt restored" if opened.system_restored else ""))
    final = next((e for e in reversed(events) if isinstance(e, ev.FinalAnswer)), None)
    if final is not None:
        t = final.totals
        lines.append(
            f"{final.stop_reason} in {final.turns} turn(s), {t.get('total', 0):.2f}s "
            f"(prompt {t.get('prompt', 0):.2f}s, reasoning {t.get('reasoning', 0):.2f}s, "
            f"action {t.get('action', 0):.2f}s, tool {t.get('tool', 0):.2f}s, observe "
            f"{t.get('observe', 0):.2f}s), mode {mode}")
    return "\n".join(lines)
