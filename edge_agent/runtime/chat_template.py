"""A model's own chat template, rendered as llama-cpp-python renders it for ``create_chat_completion``.

Knows: the template text a GGUF carries (``tokenizer.chat_template``) with the model's BOS and EOS
token texts, plain ChatML for a file that has none, and rendering a list of chat messages with
``llama_cpp.llama_chat_format.Jinja2ChatFormatter`` (the same sandboxed jinja2 environment, filters
and variables that ``Llama.create_chat_completion`` uses, so the text is the one it would tokenize).
Does not know sessions, tokens or which parts of the text are untrusted (the caller splits those out:
``edge_agent.agent.direct``). llama_cpp is imported only when something is rendered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from edge_agent.runtime.types import ChatTemplate

# ChatML, for a file without a template: what the Qwen and SmolLM2 families speak. Unlike llama-cpp-python's
# CHATML_CHAT_TEMPLATE it reads list contents too (text parts in order; an image part renders as nothing,
# so its image goes right before the text of its message).
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% "
    "endfor %}{% endif %}{{ '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def template_of(text: str, bos: str, eos: str) -> ChatTemplate:
    """The model's template (``text`` from its GGUF; ChatML when empty) with its BOS / EOS texts."""
    if text.strip():
        return ChatTemplate(text, bos=bos, eos=eos, source="gguf")
    return ChatTemplate(CHATML, bos=bos, eos=eos or "<|im_end|>", source="chatml")


@lru_cache(maxsize=8)
def _formatter(template: str, bos: str, eos: str, add_generation_prompt: bool) -> Any:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    return Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos,
                               add_generation_prompt=add_generation_prompt)


def render(template: ChatTemplate, messages: Sequence[Mapping[str, Any]], *,
           add_generation_prompt: bool = True) -> str:
    """The prompt text of ``messages`` ({"role", "content"}; content a string, or a list of
    {"type": "text", "text"} and {"type": "image"} parts) under ``template``. Raises
    ``ModelRuntimeError`` when the template fails on them (it says which part)."""
    from edge_agent.core.errors import ModelRuntimeError

    fmt = _formatter(template.template, template.bos, template.eos, add_generation_prompt)
    try:
        return str(fmt(messages=[dict(m) for m in messages]).prompt)
    except Exception as e:  # noqa: BLE001 - jinja2's errors, and the template's own raise_exception
        raise ModelRuntimeError(
            f"The model's chat template could not render this chat ({type(e).__name__}: {e}). "
            "Use another model file, or the ssr / freeform modes, which do not use it.",
            title="Chat template failed") from None
