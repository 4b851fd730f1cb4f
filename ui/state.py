"""The page's parameters between the URL, the widgets and the session: one object, one place.

A page's parameters are one `ui.params.Params` dataclass. `start` reads a new link through
``Params.from_query`` (a bad value gives a warning and keeps the last good one) and seeds the
widgets, whose keys are the field names; `current` is the dataclass of what the widgets and the
session hold now; `commit` writes ``current().to_query()`` back to ``st.query_params``. No other
code reads or writes the URL, so the share link, the widgets and the session agree.

Values also live in a session store, so they survive page switches (Streamlit forgets the state
of widgets that a page does not draw).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import streamlit as st
from streamlit.errors import StreamlitAPIException

from ui import share_link
from ui.params import LINK_BUDGET, Params, Problem, Query
from ui.text import literal

MODEL_PARAMS = ("model", "model2")  # drawn by the model pickers (two widgets each), not by one widget
_STORE = "_attnviz_store"
_WRITTEN = "_attnviz_written"
_APPLIED = "_attnviz_applied"
_PAGE = "_attnviz_page"
_PAGE_CHANGED = "_attnviz_page_changed"
_PATH = "_attnviz_path"
_CLS = "_attnviz_params"
_LINKED = "_attnviz_linked"
_LEFT = "_attnviz_left"  # {parameter: value} as the last finished run left its widgets


def _store() -> dict[str, Any]:
    return st.session_state.setdefault(_STORE, {})


def page_params() -> type[Params]:
    """The parameters class of the page being drawn (set by `start`)."""
    return st.session_state.get(_CLS, Params)


def get(name: str) -> Any:
    """The current value: the widget's if it was drawn, else the stored one, else the default."""
    if name in st.session_state:
        return st.session_state[name]
    return _store().get(name, page_params().default(name))


def widget_value(key: str, default: Any = None) -> Any:
    """A widget's value by its key, drawn in this run or kept (`persist_state`), else ``default``."""
    return st.session_state.get(key, default)


def _short(raw: str, limit: int = 40) -> str:
    return raw if len(raw) <= limit else raw[:limit] + "…"


def start(cls: type[Params], path: str = "") -> None:
    """Before a page's widgets: apply a new link's parameters and seed the widget keys.

    A link is new when the URL differs from what this session last wrote (a fresh session, a
    pasted link, `st.switch_page` with query params). On arriving from another page every
    widget is seeded from the store: Streamlit gives a widget on a new page its default value.
    ``path`` is the page's URL path ("" for the explorer, "Compare" ...), for the share link.
    """
    ss = st.session_state
    store = _store()
    changed = ss.get(_PAGE) != cls.PAGE
    ss[_PAGE], ss[_PATH], ss[_CLS], ss[_PAGE_CHANGED] = cls.PAGE, path, cls, changed
    names = cls.names()
    for n in names:
        store.setdefault(n, cls.default(n))
    url = st.query_params.to_dict()
    applied: set[str] = set()
    ss[_LINKED] = set()
    if url and url != ss.get(_WRITTEN):
        ss[_LINKED] = set(url)
        base = cls(**{n: store[n] for n in names})
        parsed, applied, problems = cls.from_query(url, base)
        link_problems(problems)
        for n in applied:
            store[n] = getattr(parsed, n)
            if n not in MODEL_PARAMS:
                ss[n] = store[n]
    ss[_APPLIED] = applied
    for n in names:
        if n not in MODEL_PARAMS and (n not in ss or (changed and n not in applied)):
            ss[n] = store[n]
    reseed()


TYPED = ("text", "text2")  # text boxes: drawn in every run (the sidebar), never re-sent while typed in


def reseed() -> None:
    """Write every parameter's value to its widget key again, before its widget is drawn.

    A widget that one run did not draw (the page stopped early: a Cancel, an empty text, an
    error; or a fragment returned before it) is forgotten by the browser; when it is drawn
    again, Streamlit hands the script the session's value but the browser shows the widget's
    default (layer 0, head 0) unless that value was written in this run. Writing it again each
    run makes the browser show what the page draws. Call at the top of every full run (`start`
    does) and of every fragment that draws parameter widgets.

    Except the value a widget has just sent (`sent_now`): the browser shows it already, and the
    write would go back as "set the widget to this". Arriving after further key presses (→ on
    the layer slider of a loaded server) it put the slider back, and the presses after it
    counted from there: one of seven was lost."""
    ss = st.session_state
    for n in page_params().names():
        if n in MODEL_PARAMS or n in TYPED or sent_now(n):
            continue
        # a widget already drawn in this run (the sidebar's, or an outer fragment's during a
        # full run) shows its value already; Streamlit refuses the write
        with contextlib.suppress(StreamlitAPIException):
            ss[n] = ss[n] if n in ss else get(n)


def sent_now(name: str) -> bool:
    """True when this run came with a new value from ``name``'s widget: its value differs from
    what the last finished run left (`commit` keeps that). Only the browser changes a widget's
    value between runs, and the page's own writes this run (`put`) reach the browser anyway.
    Public session state only (it read Streamlit's private ``_key_id_mapper``,
    ``_new_widget_state`` and ``_widget_changed`` before)."""
    ss = st.session_state
    left = ss.get(_LEFT, {})
    return name in ss and name in left and ss[name] != left[name]


def _value(raw: str) -> str:
    """A link value in a message: quoted and shortened, or "an empty value" (a blank read as a
    gap in the sentence)."""
    return literal(_short(raw), quote=True) if raw.strip() else "an empty value"


def link_problems(problems: Sequence[Problem]) -> None:
    """One warning for every value of a link that could not be read (a link with garbage in
    every parameter gets one box, not one per parameter)."""
    if not problems:
        return
    lines = [
        f"`{pr.name}`: {_value(pr.raw)} is not valid ({pr.reason}); showing {_value(pr.kept)}"
        for pr in problems
    ]
    if len(lines) == 1:
        st.warning(f"The link's {lines[0]} instead.")
        return
    st.warning(
        f"{len(lines)} values of the link could not be read; each shows its last good value:\n\n"
        + "\n".join(f"- {line}" for line in lines)
    )


def page_changed() -> bool:
    """True on the first run of a page after another page (or the first run of the session)."""
    return bool(st.session_state.get(_PAGE_CHANGED, True))


def applied(name: str) -> bool:
    """True when this run's link set ``name`` (e.g. to reseed the model picker)."""
    return name in st.session_state.get(_APPLIED, set())


def linked(name: str) -> bool:
    """True when this run's new link named ``name``, read or not (a bad value was warned about
    with the value shown instead: a page must not then show another)."""
    return name in st.session_state.get(_LINKED, set())


def put(name: str, value: Any) -> None:
    """Set a value (before its widget is drawn in this run)."""
    _store()[name] = value
    if name not in MODEL_PARAMS:
        st.session_state[name] = value


def clamp(name: str, lo: int, hi: int, what: str, *, quiet: bool = False) -> int:
    """Keep an integer parameter in lo..hi; out of range -> a warning and the nearest valid value
    (``quiet``: no warning, for a default that this server's limits lower)."""
    value = get(name)
    try:
        value = int(value)
    except (TypeError, ValueError):
        value = lo
    if lo <= value <= hi:
        return value
    fixed = min(max(value, lo), hi)
    if not quiet:
        st.warning(f"{what.capitalize()} {value} is out of range ({lo}–{hi}); showing {what} {fixed}.")
    put(name, fixed)
    return fixed


def choose(name: str, options: Sequence[str], what: str) -> str:
    """Keep a parameter inside ``options``; anything else -> a warning and the first option."""
    value = get(name)
    if value in options:
        return value
    if value not in ("", None):
        st.warning(
            f"{what.capitalize()} {literal(value, quote=True)} is not available here; "
            f"showing {literal(options[0], quote=True)}."
        )
    put(name, options[0])
    return options[0]


def nearest(name: str, options: Sequence[int]) -> int:
    """Snap an integer parameter to the nearest of ``options`` (quietly: options depend on
    other controls, e.g. d_model must be a multiple of the heads)."""
    try:
        value = int(get(name))
    except (TypeError, ValueError):
        value = options[0]
    if value not in options:
        value = min(options, key=lambda o: (abs(o - value), o))
        put(name, value)
    return value


def current(cls: type[Params] | None = None) -> Params:
    """The page's parameters as the widgets and the session hold them now."""
    cls = cls or page_params()
    store = _store()
    values = {}
    for n in cls.names():
        store[n] = values[n] = get(n)
    return cls(**values)


def commit(cls: type[Params] | None = None) -> Query:
    """After the widgets: write the current parameters to the URL. Returns the link's query."""
    now = current(cls)
    query = now.to_query()
    if st.query_params.to_dict() != query.params:
        st.query_params.from_dict(query.params)
    st.session_state[_WRITTEN] = dict(query.params)
    # what this run leaves in the widgets: a value that differs next run was sent by the browser
    st.session_state[_LEFT] = {n: st.session_state[n] for n in now.names() if n in st.session_state}
    return query


def share_url(params: dict[str, str], path: str | None = None) -> str:
    """The link to this view, ``<app>/<page path>?<params>`` (``<app>/?…`` on the explorer).
    ``<app>`` comes from the browser (``st.context.url``); without one (tests, bare mode) the link
    is root-relative. ``path`` defaults to the page's, as given to `start`."""
    path = st.session_state.get(_PATH, "") if path is None else path.strip("/")
    try:
        url = st.context.url or ""
    except Exception:  # noqa: BLE001 - no browser context (tests, bare mode): a relative link
        url = ""
    root = url.rstrip("/")  # the browser's URL ends with the page's path on other pages
    if path and root.endswith("/" + path):
        root = root.removesuffix("/" + path)
    return Query(params).url(root, path)


def share_box(*, note: str = "") -> None:
    """Commit the state and show the share link as plain text with a Copy button (`ui.share_link`:
    no syntax highlighter, which cost 0.3–0.8 s of the browser's CPU on a long text's link)."""
    query = commit()
    with st.expander("Share this view", expanded=False, icon=":material/share:"):
        if query.left_out:
            which = " and ".join(f"`{n}`" for n in query.left_out)
            st.warning(
                f"The text ({which}) is too long for a link even compressed (over {LINK_BUDGET:,} "
                "characters): this link opens the same page and options with the default text; "
                "whoever opens it has to paste the text.",
                icon=":material/link_off:",
            )
        share_link.show(share_url(query.params))
        msg = (
            "Opening this link shows the same page and options, without the text. The token is never in it."
            if query.left_out
            else "Opening this link in another browser shows the same view. The token is never in it."
        )
        if any(n in query.params for n in ("tz", "tz2")):
            msg += " The long text travels compressed in the link."
        st.caption(msg + (" " + note if note else ""))


# -- session-only values (never in the link) ---------------------------------------------------
# Every key the app keeps in st.session_state besides the widgets' own (a parameter's widget key
# is its name; a few session-only widgets have their key beside the widget) is named here, with
# who keeps what under it. A name missing here is a KeyError, not a second store.
SESSION_KEYS = {
    "visitor": "_attnviz_visitor",  # ui.gate: this session's random id (the queue's key)
    "cancelled": "_attnviz_cancelled",  # ui.progress: the run key whose Cancel was pressed
    "checks_asked": "_attnviz_checks_asked",  # ui.explorer.exactness: layers whose check was asked for
    "seen_clicks": "_attnviz_seen_clicks",  # ui.clicks: the selection already handled per chart
    "click_rounds": "_attnviz_click_rounds",  # ui.clicks: a clickable chart's key generation
    "atlas_just_ran": "_attnviz_atlas_just_ran",  # the atlas page: its last run (key, atlas, s)
    "compare_picked": "_cmp_picked",  # Compare: the pair and the clicked cell handled last
    "patch_head": "explain_patch_head",  # Explain: the (layer, head) clicked on each chart
    "search_head": "explain_search_head",
    "dla_head": "explain_dla_head",
    "qk_head": "explain_qk_head",
    "ov_head": "explain_ov_head",
    "qk_cell": "qk_cell",  # Explain: the (layer, head, query, key) cell clicked
}


def recall(name: str, default: Any = None) -> Any:
    """The session-only value ``name`` (see `SESSION_KEYS`), else ``default``."""
    return st.session_state.get(SESSION_KEYS[name], default)


def remember(name: str, value: Any) -> None:
    """Keep a session-only value under ``name`` (see `SESSION_KEYS`)."""
    st.session_state[SESSION_KEYS[name]] = value


def kept(name: str, default: Any) -> Any:
    """The session-only value ``name``, set to ``default`` first when there is none (a mutable
    container the caller fills)."""
    return st.session_state.setdefault(SESSION_KEYS[name], default)


def forget(name: str) -> None:
    st.session_state.pop(SESSION_KEYS[name], None)


def keep_widget_in(key: str, hi: int) -> None:
    """A session-only widget's value (``key``) kept in 0..hi before it is drawn (another block or
    text can have fewer heads or rows)."""
    if not 0 <= int(st.session_state.get(key, 0)) <= hi:
        st.session_state[key] = 0
