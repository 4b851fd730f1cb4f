"""User text inside Streamlit Markdown (errors, warnings, captions, labels) shown literally.

Streamlit renders every message as GitHub Markdown, and GFM turns a bare ``http://…``,
``www.…`` or ``name@host.tld`` into a link *after* parsing, so backslash escapes alone do not
stop it. The tools:

- `literal` for a value quoted in a message (a link parameter, a model name): plain text as it
  is (``'gpt2'`` with ``quote=True``), anything Markdown-active in an inline code span, which
  shows it exactly as typed (the page's text holds it character for character) and never as a
  link, emphasis, LaTeX or a directive. `code` makes the span.
- `md` backslash-escapes Markdown and breaks autolinks with an invisible U+2060 WORD JOINER, for
  user text that runs inside prose (a model name in a caption, a prompt).
- `md_in` makes the user values inside one of our messages literal.
- `continuation`: a prompt and its generated tokens as Markdown, every piece literal.
- `guarded`: a block whose error is shown as one message (user values literal, the token
  scrubbed) while the page goes on.
"""

from __future__ import annotations

import contextlib
import logging
import re
import traceback
from collections.abc import Iterator

import streamlit as st

from attnviz import AttnvizError

log = logging.getLogger("attnviz.ui")

# Markdown-active characters: links, images, autolinks (the ':' of "http:"), emphasis, code,
# HTML-looking tags, LaTeX, Streamlit's :color[...] directives, tables. '-' and '.' stay: they
# only matter at the start of a line, and user values are always mid-sentence.
_ACTIVE = re.compile(r"([\\`*_{}\[\]()#+!<>$~|:])")
# Where GFM starts a literal autolink: "scheme://", "www." and the "@" of an e-mail address.
_AUTOLINK = re.compile(r"://|www\.|@", re.IGNORECASE)
JOINER = "\u2060"  # WORD JOINER: invisible, not a word character, so the autolink never matches
_BACKTICKS = re.compile(r"`+")
_LIST_START = re.compile(r"^(\d*)([-.)=])")  # what starts a list or a heading at a line start


def md(text: object) -> str:
    """Backslash-escape Markdown in user text and break autolinks (shown the same, never a link)."""
    broken = _AUTOLINK.sub(lambda m: m.group(0)[0] + JOINER + m.group(0)[1:], str(text))
    return _ACTIVE.sub(r"\\\1", broken)


def code(text: object) -> str:
    """An inline code span that shows ``text`` literally: the fence is one backtick longer than
    the longest run of backticks inside, padded with spaces where the text starts or ends with
    one (CommonMark strips one space on each side). Newlines show as spaces."""
    value = " ".join(str(text).splitlines()) or " "
    fence = "`" * (1 + max((len(m) for m in _BACKTICKS.findall(value)), default=0))
    spaced = value[0] == value[-1] == " " and value.strip()
    pad = " " if value[0] == "`" or value[-1] == "`" or spaced else ""
    return f"{fence}{pad}{value}{pad}{fence}"


def literal(value: object, *, quote: bool = False) -> str:
    """A user value inside a Markdown message: itself (``repr``-quoted with ``quote``) when it
    is plain text, else a code span that shows it exactly as typed."""
    text = str(value)
    if md(text) != text or not text:
        return code(text)
    return repr(text) if quote else text


def md_in(message: str, *user: str | None) -> str:
    """``message`` (our own Markdown) with the user-provided strings in it made literal: a quoted
    occurrence (``'value'``, as ``{value!r}`` writes it) goes through `literal` (a code span
    unless plain), any other occurrence through `md`. One pass, longest value first."""
    values = sorted({u for u in user if u}, key=len, reverse=True)
    if not values:
        return message
    quoted = {repr(v): v for v in values}
    pattern = "|".join(re.escape(s) for s in [*quoted, *values])

    def shown(m: re.Match[str]) -> str:
        found = m.group(0)
        return literal(quoted[found], quote=True) if found in quoted else md(found)

    return re.sub(pattern, shown, message)


def continuation(prompt: str, tokens: list[str], current: int, max_prompt_chars: int = 600) -> str:
    """Markdown of the prompt (plain text) followed by the generated tokens, one code chip each,
    the ``current`` one in ⟦ ⟧ and bold. Prompt and tokens are escaped (text, never
    markup); newlines show as ↵ so that the prompt stays one paragraph."""
    shown = prompt if len(prompt) <= max_prompt_chars else "…" + prompt[-max_prompt_chars:]
    shown = " ↵ ".join(shown.splitlines()) if "\n" in shown or "\r" in shown else shown
    text = _LIST_START.sub(r"\1\\\2", md(shown.lstrip()))  # "1. x" / "- x" first: not a list
    chips = [f"**{code(f'⟦{t}⟧')}**" if i == current else code(t) for i, t in enumerate(tokens)]
    return f"{text} ▸ " + " ".join(chips)


def scrub(text: str, token: str | None) -> str:
    return text.replace(token, "***") if token else text


@contextlib.contextmanager
def guarded(what: str, token: str | None = None, user: tuple[str, ...] = ()) -> Iterator[list[BaseException]]:
    """Run a block; an `AttnvizError` shows ``st.error`` with its message (which says what to
    do), anything else a generic message; the page goes on. ``user`` strings (a model name)
    are shown literally, never as Markdown. Yields a list that holds the error."""
    caught: list[BaseException] = []
    try:
        yield caught
    except AttnvizError as err:
        caught.append(err)
        st.error(md_in(scrub(str(err), token), *user), icon=":material/error:")
    except Exception as err:  # noqa: BLE001 - the app must keep serving
        caught.append(err)
        log.error("unexpected error while %s: %s", what, scrub(traceback.format_exc(), token))
        st.error(
            f"Something unexpected went wrong while {what} ({type(err).__name__}). The app is still "
            "running: try again, shorten the text, or pick another model. Details are in the server log.",
            icon=":material/error:",
        )
