"""Prompts in Qwen3-VL's native chat format (ChatML + Qwen's tool-calling conventions).

Knows: the text of every piece of the conversation, as a list of segments the loop appends in
order: ``Text(text, special)`` (``special=False`` for anything a user or a web page wrote, so a
snippet holding ``<|im_end|>`` stays plain text) and ``Img(png)``. The layout::

    <|im_start|>system\\n{instructions}\\n\\n# Tools ... <tools>{schemas}</tools> ...<|im_end|>\\n
    <|im_start|>user\\n<|vision_start|>{image}<|vision_end|>{question}<|im_end|>\\n
    <|im_start|>assistant\\n<think>\\n{rationale}\\n</think>\\n\\n
        <tool_call>\\n{json}\\n</tool_call><|im_end|>\\n          (one line with the one above)
    <|im_start|>user\\n<tool_response>\\n{crop image}{observation}\\n</tool_response><|im_end|>\\n
    <|im_start|>assistant\\n<think>\\n ... <answer>{answer}</answer>

(the runtime's ``append_image`` adds the vision start/end tokens). SmolLM2 and other ChatML models
read the same layout as plain text. The tools' schemas and the answer's tags come from their specs
(``edge_agent.tools.specs``). Does not know: tokens, models, the loop's control flow.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edge_agent.agent.rationales import Library, index_label
from edge_agent.tools import specs
from edge_agent.tools.specs.answer import ANSWER_CLOSE, ANSWER_OPEN

if TYPE_CHECKING:
    from edge_agent.core.config import Settings

THINK_OPEN = "<|im_start|>assistant\n<think>\n"
THINK_CLOSE = "\n</think>\n\n"  # after the reasoning (pasted or generated)
TURN_END = "<|im_end|>\n"

SYSTEM = (
    "You are a visual assistant. Answer the user's question about the image in a few steps. "
    "In each step think briefly inside <think></think>, then either call one tool or give your "
    "final answer in a full sentence as <answer>...</answer>. Zoom in to read small details; search when "
    "the answer needs facts the image does not show. Tool results come back inside <tool_response>."
)
SYSTEM_TEXT_ONLY = (
    "You are a helpful assistant. Answer the user's question in a few steps. In each step think "
    "briefly inside <think></think>, then either call one tool or give your final answer in a full "
    "sentence as <answer>...</answer>. Search when you need facts you do not know."
)
TURN_LIMIT_NOTE = "You have no tool calls left. Give your final answer now."

@dataclass(frozen=True)
class Text:
    text: str
    special: bool = True  # parse <|im_start|> etc. as control tokens; False for untrusted text


@dataclass(frozen=True)
class Img:
    png: bytes


Segment = Text | Img


@functools.cache
def _schema_json(spec: specs.ToolSpec) -> str:
    """A tool's schema as the system prompt lists it (made once: every question builds its system prompt)."""
    return json.dumps(spec.schema, ensure_ascii=False)


def system_prompt(actions: Sequence[str], *, has_image: bool = True, library: Library | None = None,
                  extra: str = "") -> str:
    """The system turn: instructions, then the schemas of the tools for ``actions`` in <tools>.

    ``library`` (index-only ablation only): numbered plans the model picks from by index. ``extra``: the
    user's own instructions (the ``system_prompt`` setting), after ours; it cannot open a chat-format token.
    """
    head = SYSTEM if has_image else SYSTEM_TEXT_ONLY
    if extra.strip():
        head += "\n\n" + " ".join(extra.split()).replace("<|", "< |")
    if library is not None:
        # (none for a kind of message: the ablation scores the paper's plans, as it always has)
        plans = "\n".join(f"{index_label(k)} {r.text}" for k, r in enumerate(library) if not r.for_kind)
        head += f"\n\nBefore each step pick one of these plans by its number:\n{plans}"
    tools = [s for s in specs.tools() if s.action in actions]
    if not tools:
        return f"<|im_start|>system\n{head}<|im_end|>\n"
    schemas = "\n".join(_schema_json(s) for s in tools)
    return (
        f"<|im_start|>system\n{head}\n\n# Tools\n\nYou may call one or more functions to assist with the "
        f"user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{schemas}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    )


def history_segments(history: Sequence[tuple[str, str]]) -> list[Segment]:
    """Earlier questions and answers of the same chat, as plain user/assistant turns (text only)."""
    out: list[Segment] = []
    for q, a in history:
        out += [Text("<|im_start|>user\n"), Text(q, special=False),
                Text("<|im_end|>\n<|im_start|>assistant\n"),
                Text(ANSWER_OPEN), Text(a, special=False), Text(ANSWER_CLOSE + TURN_END)]
    return out


ImageArg = bytes | Sequence[bytes | None] | None  # one image, or several (None: one the chat holds already)


def question_images(image: ImageArg) -> list[bytes | None]:
    """A question's images as a list: one image (bytes), several (a sequence), none (None)."""
    if image is None:
        return []
    return [bytes(image)] if isinstance(image, bytes | bytearray) else list(image)


def question_segments(question: str, image: ImageArg, *, closed: bool = True) -> list[Segment]:
    """The user turn (the images first, then the question) and the opening of the first assistant turn.
    Several images are each followed by the caption ``Image i.`` (``i`` the ``img_idx`` the tools take;
    after the image, so a turn read ahead with the first image keeps it when a second is attached); an
    entry None is an image the chat's context holds already (not repeated, its number kept).
    ``closed=False``: only what the person has given so far (a read-ahead's pending turn: the images
    and the words typed), which the closed turn starts with."""
    out: list[Segment] = [Text("<|im_start|>user\n")]
    images = question_images(image)
    for i, png in enumerate(images):
        if png is not None:
            out += [Img(png), Text(f"Image {i}.\n")] if len(images) > 1 else [Img(png)]
    out.append(Text(question, special=False))
    if closed:
        out.append(Text(TURN_END + THINK_OPEN))
    return out


def _words(text: str) -> list[str]:
    return re.findall(r"[^\W_]+", text.casefold())


def _sentences(texts: Sequence[str]) -> list[list[str]]:
    out = []
    for text in texts:
        out += [_words(sentence) for sentence in re.split(r"(?<=[.!?:])\s+|\n+", text)]
    return [w for w in out if w]


@functools.cache
def _instruction_texts() -> tuple[tuple[str, ...], ...]:
    """The words of every instruction the model reads (system prompts, notes), one tuple per sentence."""
    return tuple(tuple(w) for w in _sentences((SYSTEM, SYSTEM_TEXT_ONLY, TURN_LIMIT_NOTE)))


def _schema_texts() -> list[list[str]]:
    """The words of every description in the tools' schemas (the system prompt lists them), per sentence."""
    found: list[str] = []

    def walk(v: object) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                if k == "description" and isinstance(x, str):
                    found.append(x)
                else:
                    walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    for spec in specs.tools():
        walk(spec.schema)
    return _sentences(found)


# an answer holding a whole sentence of our instructions this long, among its own words, copies them (the
# turn-limit note, "You have no tool calls left", is shorter: "Lima. You have no tool calls left." answers)
COPIED_SENTENCE_WORDS = 7


def echoes_instructions(answer: str, ours: Sequence[str] = ()) -> bool:
    """True when ``answer`` merely repeats text we wrote for the model: the instructions (e.g. SmolLM2
    answering "You have no tool calls left") or ``ours``, this question's tool messages ("No cached
    result for ... (offline)", a search failure): a run of 3+ words from one such sentence, or nothing
    but whole such sentences; or it copies a whole sentence of the system prompt or a tool's schema of
    :data:`COPIED_SENTENCE_WORDS` words or more among words of its own (the real 0.5B, offline: "Search the
    web for the capital of Peru. Returns the top results (title, url, snippet). ... Peru, Peru, Peru").
    Such an answer is not presented as one."""
    words = _words(answer)
    if len(words) < 3:
        return False
    prompt = [list(s) for s in _instruction_texts()] + _schema_texts()
    sentences = prompt + _sentences(ours)

    def inside(run: list[str], sentence: list[str]) -> bool:
        n = len(run)
        return any(sentence[i:i + n] == run for i in range(len(sentence) - n + 1))

    if any(inside(words, s) for s in sentences):
        return True
    if any(len(s) >= COPIED_SENTENCE_WORDS and inside(s, words) for s in prompt):
        return True
    rest = " ".join(words)
    for s in sorted(sentences, key=len, reverse=True):
        if len(s) >= 4:
            rest = re.sub(rf"(^| ){re.escape(' '.join(s))}( |$)", " ", rest)
    return not rest.split()


# a call as code: an optional code fence and language tag, then `name(` or a JSON object naming the tool
_CALL_AS_CODE = re.compile(r'\s*(?:`+\s*)?(?:(?:json|python|tool_call)\b\s*)?'
                           r'(?:(?P<f>[\w.]+)\s*\(|\{\s*"name"\s*:\s*"(?P<j>[^"]+)")', re.IGNORECASE)


def called_tool(answer: str) -> str | None:
    """The tool an answer merely calls, written as code: ``text_search({"query": "capital of Peru"})``, or
    ``json {"name": "text_search", "arguments": {"query": "Peru"}}`` (the real 0.5B's answers offline, with
    no search offered: an answer cannot begin with ``{``, so it wrote "json" first), by the name the model
    calls it or its move's name; None for an answer. Such an answer is not presented as one."""
    m = _CALL_AS_CODE.match(answer)
    name = (m.group("f") or m.group("j")) if m else None
    return next((s.name for s in specs.tools() if name in (s.name, s.action)), None)


def observation_segments(observation: str, image: bytes | None = None, *, note: str = "") -> list[Segment]:
    """A tool result as a user turn: ``<tool_response>`` (a crop as a new image), then the next think block.

    ``observation`` is untrusted (search snippets): appended with special tokens NOT parsed.
    """
    out: list[Segment] = [Text(TURN_END + "<|im_start|>user\n<tool_response>\n")]
    if image is not None:
        out.append(Img(image))
    out += [Text(observation, special=False), Text("\n</tool_response>")]
    if note:
        out.append(Text("\n" + note))
    out.append(Text(TURN_END + THINK_OPEN))
    return out


QUESTION_TOKENS = 128  # a short question and answer, beyond the system prompt (for min_n_ctx)


def min_n_ctx(settings: Settings) -> int:
    """The least ``n_ctx`` that can work with these settings: the longest system prompt they can make
    (every tool, an image, the user's instructions, the index-only plans) at 2.5 bytes per token (the
    densest of the tokenizers we ship: the tiny test models' 2.7; Qwen3's and SmolLM2's ~3.5), plus
    ``QUESTION_TOKENS`` for a question and a short answer."""
    from edge_agent.agent.rationales import load_library
    from edge_agent.core.errors import EdgeAgentError

    try:
        library = load_library(settings.rationales) if settings.ssr_index_only else None
    except EdgeAgentError:
        library = None  # a bad library is reported when it is loaded
    text = system_prompt([s.action for s in specs.tools()], has_image=True, library=library,
                         extra=settings.system_prompt)
    return -(-len(text.encode()) * 2 // 5) + QUESTION_TOKENS


def check_n_ctx(settings: Settings) -> None:
    """Raise ConfigError when ``n_ctx`` cannot hold the system prompt of these settings and a question
    (``Settings.validate`` checks every range; this needs the prompt, so the layers that know the agent
    call it: ``config set``, the settings screen, loading an engine)."""
    from edge_agent.core.errors import ConfigError

    if settings.n_ctx >= 4096:  # (checked only when small: building the prompt costs ~0.1 s)
        return
    need = min_n_ctx(settings)
    if settings.n_ctx < need:
        raise ConfigError(
            f"Setting n_ctx must be at least {need}, not {settings.n_ctx}: the system prompt of these "
            f"settings alone takes up to ~{need - QUESTION_TOKENS} tokens, and a question and its answer "
            f"need {QUESTION_TOKENS} more (8192 is the default): `edge-agent config set n_ctx "
            f"{max(need, 2048)}`.")
