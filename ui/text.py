"""User text inside Streamlit Markdown (errors, warnings, captions) shown literally."""

from __future__ import annotations

import re

# Markdown-active characters: links, images, autolinks (the ':' of "http:"), emphasis, code,
# HTML-looking tags, LaTeX, Streamlit's :color[...] directives, tables. '-' and '.' stay: they
# only matter at the start of a line, and user values are always mid-sentence.
_ACTIVE = re.compile(r"([\\`*_{}\[\]()#+!<>$~|:])")


def md(text: object) -> str:
    """Backslash-escape Markdown in a user-provided string (a model name, a link value)."""
    return _ACTIVE.sub(r"\\\1", str(text))


def md_in(message: str, *user: str | None) -> str:
    """``message`` with every occurrence of the user-provided strings escaped."""
    for value in sorted({u for u in user if u}, key=len, reverse=True):
        message = message.replace(value, md(value))
    return message
