"""Untrusted text from the web, made safe to store and show; and the one form of a search query.

Knows: the size limits of a stored search result's fields, how to turn any JSON value into one line of
printable text (HTML stripped, control and format characters dropped), what a usable URL is, and how a
text query is normalised, so that the cache's keys and the agent's "you already searched for that"
agree (:func:`query_key`). Does not know: HTTP, backends, the cache file, the model. Imports no network
library, so the agent (which must not) can use it.
"""

from __future__ import annotations

import html
import re
import unicodedata
from typing import Any
from urllib.parse import urlsplit

# Per-field limits for stored results (chars). The observation shortens snippets further.
TITLE_CHARS, URL_CHARS, SNIPPET_CHARS, SOURCE_CHARS = 200, 500, 600, 40
MAX_QUERY_CHARS = 300

_TAG = re.compile(r"<[^<>]{0,2000}>")


def clean_text(text: Any, limit: int, *, html_text: bool = False) -> str:
    """One line of printable text of at most ``limit`` chars (an ellipsis marks a cut).

    Drops control (Cc), format (Cf: bidi overrides, zero-width), surrogate and private-use
    characters; collapses whitespace. ``html_text``: strip tags and decode entities first.
    """
    if text is None:
        return ""
    if not isinstance(text, str):
        text = str(text) if isinstance(text, int | float) and not isinstance(text, bool) else ""
    text = text[: limit * 8]  # bound the work on a huge field before the per-char pass
    if html_text:
        text = html.unescape(_TAG.sub("", text))
    text = "".join(
        " " if c.isspace() else c for c in text if c.isspace() or unicodedata.category(c) not in ("Cc", "Cf",
                                                                                                  "Cs", "Co")
    )
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    return text


def clean_url(url: Any) -> str:
    """An http(s) URL without whitespace or control characters, or "" if it is anything else."""
    url = clean_text(url, 4 * URL_CHARS).replace(" ", "%20")
    if not url.lower().startswith(("http://", "https://")) or len(url) > URL_CHARS:
        return ""
    try:
        urlsplit(url)
    except ValueError:
        return ""
    return url


def normalise_query(query: str) -> str:
    """The form of a query used in keys: NFKC, case-folded, whitespace collapsed, trimmed.

    "  Eiffel   TOWER " and "eiffel tower" share one cache entry; the backend still receives the
    query as typed (stripped).
    """
    return " ".join(unicodedata.normalize("NFKC", query).casefold().split())


def query_key(query: str) -> str:
    """What identifies a text search: the query cleaned as it is sent (:func:`clean_text`), normalised.

    The search cache keys entries by it and the agent's toolbox spots a repeated search by it, so
    the two always agree on what "the same search" is.
    """
    return normalise_query(clean_text(query, MAX_QUERY_CHARS))
