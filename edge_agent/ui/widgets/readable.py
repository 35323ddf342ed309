"""Model text as Markdown that stays readable: block syntax the model did not mean is shown as text.

A small model writes Markdown's block markers by accident: a line of ``>>>>`` (twenty nested quote
bars), ``# `` (a screen-wide heading), ``- - - -`` (lists nested in lists), a line of ``===`` under a
sentence (a heading again). :func:`readable_markdown` escapes those markers, so they read as the
characters they are; inline formatting (bold, italics, code, links), lists, tables and fenced code
stay Markdown. Control characters are removed first (``textclean.clean_model_text``). A line break the
model wrote stays one (a poem's or an address's lines; by CommonMark's rule a single newline is a space),
as in a chat app: each line ends in Markdown's hard break, two spaces, which the end of a block ignores.
"""

from __future__ import annotations

import re

from edge_agent.core.textclean import clean_model_text

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
# a block quote or an ATX heading at the start of a line (after at most three spaces)
_BLOCK_START = re.compile(r"^( {0,3})([>#])")
# a setext underline (or a thematic break): a line of only '=' or only '-'
_UNDERLINE = re.compile(r"^( {0,3})([=-])(?=[=-]*[ \t]*$)")
# a list item whose text starts with another block marker (a list, a quote, a heading): nesting
_NESTED = re.compile(r"^(\s*(?:[-*+]|\d{1,9}[.)])[ \t]+)([-*+>#]|\d{1,9}[.)])(?=[ \t]|$)")


def readable_markdown(text: str) -> str:
    """``text`` with accidental block markers escaped (fenced code left as it is)."""
    out: list[str] = []
    fence = ""  # the fence of the open code block ("" outside one)
    for line in clean_model_text(text).split("\n"):
        m = _FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = ""
            out.append(line)
            continue
        if m:
            fence = m.group(1)
            out.append(line)
            continue
        line = _BLOCK_START.sub(r"\1\\\2", line, count=1)
        line = _UNDERLINE.sub(r"\1\\\2", line, count=1)
        n = _NESTED.match(line)
        if n is not None:  # "- - x" -> "- \\- x", "1. 2. x" -> "1. 2\\. x": the second marker is text
            cut = n.end(2) - 1 if n.group(2)[0].isdigit() else n.start(2)
            line = f"{line[:cut]}\\{line[cut:]}"
        out.append(line + "  " if line.strip() else line)
    if out and out[-1].endswith("  ") and not fence:
        out[-1] = out[-1][:-2]  # the last line has no break after it (yet: a streamed answer's grows)
    return "\n".join(out)
