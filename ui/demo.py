"""The public demo's guard rails that live in the Streamlit shell: client messages that reach
other visitors are refused, and the demo's limits are said on the page.

Streamlit's browser protocol (``BackMsg`` in streamlit/proto/BackMsg.proto, dispatched by
``AppSession.handle_backmsg``) lets any client send, besides its own reruns and stops:

- ``clear_cache``: clears ``st.cache_data`` and ``st.cache_resource`` for the whole process
  (Streamlit's own docstring: "it will be cleared for all users"): every visitor's models,
  results and the demo's queue. Accepted in viewer mode; no configuration turns it off.
- ``set_run_on_save``: a developer setting (rerun on a source change); nothing for a visitor.
- ``file_urls_request``: upload URLs for file uploaders; the demo has none (the Head atlas takes
  no uploads there), so any upload is someone else's bytes in this server's memory.
- ``backend_operation_request`` with ``install_skills`` / ``dismiss_skills_nudge``: writes into
  the app's folder (Streamlit gates installs to loopback clients already).

The others are per session (``rerun_script``, ``stop_script``, ``app_heartbeat``,
``load_git_info``, ``backend_operation_request`` for a deferred download or a dataframe chunk of
this session's own elements) or developer-only (``debug_*``: refused by Streamlit outside
development mode). `refuse_shared_messages` wraps ``AppSession.handle_backmsg`` once per process
(the smallest hook Streamlit has: the server has no message filter): on a demo server the
refused ones are dropped with a warning in the log. On any server it also notes a link that
Streamlit will drop for its size, so the page says so (`link_too_long_notice`). It is
installed by the first script run (``app.py``), so before any visitor can have put anything
into the shared caches.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import streamlit as st

from attnviz.server.settings import Settings, settings

log = logging.getLogger("attnviz.ui")

REFUSED: dict[str, str] = {
    "clear_cache": "clears every visitor's models, results and queue",
    "set_run_on_save": "a developer setting",
    "file_urls_request": "the demo takes no uploads",
}
REFUSED_BACKEND_OPERATIONS = frozenset({"install_skills", "dismiss_skills_nudge"})


def refused(msg: Any) -> str:
    """Why a demo server refuses this ``BackMsg`` ("" when it is allowed)."""
    kind = msg.WhichOneof("type")
    if kind in REFUSED:
        return REFUSED[kind]
    if kind == "backend_operation_request":
        payload = msg.backend_operation_request.WhichOneof("payload")
        if payload in REFUSED_BACKEND_OPERATIONS:
            return "writes into the app's folder"
    return ""


def refuse_shared_messages() -> None:
    """Wrap ``AppSession.handle_backmsg`` (once per process): on a demo server (checked at each
    message) the messages in `REFUSED` are dropped and logged."""
    from streamlit.runtime.app_session import AppSession

    if getattr(AppSession.handle_backmsg, "_attnviz_guard", False):
        return
    original = AppSession.handle_backmsg

    @functools.wraps(original)
    def handle_backmsg(self: AppSession, msg: Any) -> None:
        why = refused(msg) if settings().demo else ""
        if why:
            log.warning("public demo: refused a %r message from a client (%s)", msg.WhichOneof("type"), why)
            return
        if msg.WhichOneof("type") == "rerun_script":
            size = link_size(msg.rerun_script.query_string)
            if size is not None:
                if len(_too_long) > 1000:  # sessions that left before their run: never unbounded
                    _too_long.clear()
                _too_long[self.id] = size
        original(self, msg)

    handle_backmsg._attnviz_guard = True  # type: ignore[attr-defined]
    AppSession.handle_backmsg = handle_backmsg  # type: ignore[method-assign]


# Streamlit reads a link's query string only up to these (streamlit.runtime.state.query_params:
# longer, it is dropped with a line in the server log and the page opens with its defaults)
LINK_MAX_CHARS = 512 * 1024
LINK_MAX_FIELDS = 1000
_too_long: dict[str, tuple[int, int]] = {}  # session id -> (characters, parameters) of its last link


def link_size(query: str) -> tuple[int, int] | None:
    """(characters, parameters) of a query string Streamlit will drop; None when it is read."""
    fields = query.count("&") + 1 if query else 0
    return (len(query), fields) if len(query) > LINK_MAX_CHARS or fields > LINK_MAX_FIELDS else None


def link_too_long_notice() -> None:
    """Say so when this session's link was dropped for its size (instead of a silent default
    page); once per link."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    size = _too_long.pop(ctx.session_id, None) if ctx is not None else None
    if size is not None:
        st.warning(
            f"This link is too long to open: it has {size[0]:,} characters and {size[1]:,} parameters, "
            f"and the server reads at most {LINK_MAX_CHARS:,} characters and {LINK_MAX_FIELDS:,} "
            "parameters, so the page opened with its defaults. Make the text shorter and share again.",
            icon=":material/link_off:",
        )


def limits_text(cfg: Settings) -> str:
    """The demo's limits in one line."""
    parts = [
        f"texts up to {cfg.max_tokens} tokens",
        f"models: {', '.join(cfg.allowed_models)}",
        "one run at a time for everyone (a queue)",
    ]
    if cfg.queue_max:
        parts.append(f"at most {cfg.queue_max} waiting")
    if cfg.run_limit:
        parts.append(f"{cfg.run_limit:.0f} s per run")
    return "Public demo: " + " · ".join(parts) + "."


def limits_banner() -> None:
    """On a demo server, the limits at the top of every page (visible, not only in the sidebar)."""
    cfg = settings()
    if cfg.demo:
        st.info(limits_text(cfg), icon=":material/public:")
