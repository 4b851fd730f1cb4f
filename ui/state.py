"""Page state in the URL: every view is a share link.

Widget keys equal query-parameter names (``layer``, ``head`` ...). A page calls `start` with
the names it uses before drawing widgets, and `commit` after them: `start` applies a link's
parameters (validated; a bad one gives a warning and the last good value), `commit` writes the
current values back to ``st.query_params``. Values also live in a session store, so they survive
page switches (Streamlit forgets the state of widgets that a page does not draw).

The Hugging Face token is never a parameter: it is not in this table, so it cannot reach a URL.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import streamlit as st

import attnviz
from attnviz.figures import COLORSCALES
from attnviz.metrics import METRICS
from ui.text import literal

DEFAULT_TEXT = "the financial bank is located on river bank"
MAX_TEXT_CHARS = 60_000
MAX_LINK_TEXT = 4_000  # longer texts are left out of share links (browsers cut long URLs)

CompareMode = Literal["two texts", "two models"]
COMPARE_MODES: tuple[str, ...] = get_args(CompareMode)
ScratchMode = Literal["real layer", "toy"]
SCRATCH_MODES: tuple[str, ...] = get_args(ScratchMode)
Change = Literal["none", "no RoPE", "no mask", "no scaling", "ungrouped K/V"]
CHANGES: tuple[str, ...] = get_args(Change)
GenRow = Literal["new token", "predicting position"]
GEN_ROWS: tuple[str, ...] = get_args(GenRow)
STACKS: tuple[str, ...] = ("", *get_args(attnviz.layout.Stack))

MODEL_PARAMS = ("model", "model2")  # drawn by the model pickers (two widgets each), not by one widget
_STORE = "_attnviz_store"
_WRITTEN = "_attnviz_written"
_APPLIED = "_attnviz_applied"
_PAGE = "_attnviz_page"
_PAGE_CHANGED = "_attnviz_page_changed"
_PATH = "_attnviz_path"


def _bool(raw: str) -> bool:
    low = raw.strip().lower()
    if low in {"1", "true", "yes", "on"}:
        return True
    if low in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError("use 1 or 0")


def _dump_bool(value: Any) -> str:
    return "1" if value else "0"


def _int(lo: int = 0, hi: int = 1_000_000) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError("use a whole number") from None
        if not lo <= value <= hi:
            raise ValueError(f"use {lo}..{hi}")
        return value

    return parse


def _choice(options: Sequence[str]) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if raw not in options:
            raise ValueError("use one of " + ", ".join(repr(o) for o in options if o))
        return raw

    return parse


def _text(raw: str) -> str:
    if len(raw) > MAX_TEXT_CHARS:
        raise ValueError(f"at most {MAX_TEXT_CHARS} characters")
    return raw


def _spec(raw: str) -> str:
    spec = raw.strip()
    if not spec or len(spec) > 300 or any(ord(c) < 32 for c in spec):
        raise ValueError("use a built-in model name, a Hub id or a local folder")
    return spec


def _spec_or_empty(raw: str) -> str:
    return _spec(raw) if raw.strip() else ""


@dataclass(frozen=True)
class Param:
    default: Any
    parse: Callable[[str], Any]
    dump: Callable[[Any], str] = str


PARAMS: dict[str, Param] = {
    # shared by the pages
    "model": Param(attnviz.DEFAULT_MODEL, _spec),
    "text": Param(DEFAULT_TEXT, _text),
    "chat": Param(False, _bool, _dump_bool),
    "stack": Param("", _choice(STACKS)),
    "layer": Param(0, _int()),
    "head": Param(0, _int()),
    "cmap": Param("Viridis", _choice(COLORSCALES)),
    "log": Param(False, _bool, _dump_bool),
    # explorer
    "hide": Param(False, _bool, _dump_bool),
    "nosink": Param(False, _bool, _dump_bool),
    "row0": Param(0, _int()),
    # model overview
    "metric": Param("entropy", _choice(METRICS)),
    # from scratch
    "mode": Param("real layer", _choice(SCRATCH_MODES)),
    "change": Param("none", _choice(CHANGES)),
    "wstep": Param("probs", _text),
    "toy_d": Param(32, _int(4, 512)),
    "toy_h": Param(4, _int(1, 16)),
    "toy_n": Param(8, _int(2, 64)),
    "toy_causal": Param(True, _bool, _dump_bool),
    "toy_seed": Param(0, _int(0, 10_000)),
    # compare
    "cmp": Param("two texts", _choice(COMPARE_MODES)),
    "text2": Param("the river bank is located near the financial bank", _text),
    "model2": Param("", _spec_or_empty),
    # generation
    "k": Param(8, _int(1, 64)),
    "gstep": Param(1, _int(1, 64)),
    "grow": Param("new token", _choice(GEN_ROWS)),
}


def _store() -> dict[str, Any]:
    return st.session_state.setdefault(_STORE, {})


def get(name: str) -> Any:
    """The current value: the widget's if it was drawn, else the stored one, else the default."""
    if name in st.session_state:
        return st.session_state[name]
    return _store().get(name, PARAMS[name].default)


def _short(raw: str, limit: int = 40) -> str:
    return raw if len(raw) <= limit else raw[:limit] + "…"


def start(names: Sequence[str], page: str, path: str = "") -> None:
    """Before a page's widgets: apply a new link's parameters and seed the widget keys.

    A link is new when the URL differs from what this session last wrote (a fresh session, a
    pasted link, `st.switch_page` with query params). Malformed values show a warning and keep
    the previous value; unknown parameters are ignored. On arriving from another page every
    widget is seeded from the store: Streamlit gives a widget on a new page its default value.
    ``path`` is the page's URL path ("" for the main page, "Compare" ...), for the share link.
    """
    ss = st.session_state
    store = _store()
    changed = ss.get(_PAGE) != page
    ss[_PAGE] = page
    ss[_PATH] = path
    ss[_PAGE_CHANGED] = changed
    for n in names:
        store.setdefault(n, PARAMS[n].default)
    url = st.query_params.to_dict()
    applied: set[str] = set()
    if url and url != ss.get(_WRITTEN):
        for n, raw in url.items():
            if n not in PARAMS:
                continue
            try:
                value = PARAMS[n].parse(raw)
            except ValueError as err:
                last_good = PARAMS[n].dump(store.get(n, PARAMS[n].default))
                st.warning(
                    f"The link's `{n}` value {literal(_short(raw), quote=True)} is not valid ({err}); "
                    f"showing {literal(_short(last_good), quote=True)} instead."
                )
                continue
            store[n] = value
            applied.add(n)
            if n not in MODEL_PARAMS:
                ss[n] = value
    ss[_APPLIED] = applied
    for n in names:
        if n not in MODEL_PARAMS and (n not in ss or (changed and n not in applied)):
            ss[n] = store[n]


def page_changed() -> bool:
    """True on the first run of a page after another page (or the first run of the session)."""
    return bool(st.session_state.get(_PAGE_CHANGED, True))


def applied(name: str) -> bool:
    """True when this run's link set ``name`` (e.g. to reseed the model picker)."""
    return name in st.session_state.get(_APPLIED, set())


def put(name: str, value: Any) -> None:
    """Set a value (before its widget is drawn in this run)."""
    _store()[name] = value
    if name not in MODEL_PARAMS:
        st.session_state[name] = value


def clamp(name: str, lo: int, hi: int, what: str) -> int:
    """Keep an integer parameter in lo..hi; out of range -> a warning and the nearest valid value."""
    value = get(name)
    try:
        value = int(value)
    except (TypeError, ValueError):
        value = lo
    if lo <= value <= hi:
        return value
    fixed = min(max(value, lo), hi)
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


def values(names: Sequence[str]) -> dict[str, str]:
    """The URL parameters of the current view (text left out when too long for a link)."""
    store = _store()
    out = {}
    for n in names:
        value = get(n)
        store[n] = value
        if n in ("text", "text2") and len(str(value)) > MAX_LINK_TEXT:
            continue
        out[n] = PARAMS[n].dump(value)
    return out


def commit(names: Sequence[str]) -> dict[str, str]:
    """After the widgets: store the values and write them to the URL. Returns the params."""
    params = values(names)
    if st.query_params.to_dict() != params:
        st.query_params.from_dict(params)
    st.session_state[_WRITTEN] = dict(params)
    return params


def share_url(params: dict[str, str], path: str | None = None) -> str:
    """The link to this view, ``<app>/<page path>?<params>`` (``<app>/?…`` on the main page).
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
    return f"{root}/{path}?{urllib.parse.urlencode(params, quote_via=urllib.parse.quote)}"


def share_box(names: Sequence[str], *, note: str = "") -> None:
    """Commit the state and show a copyable share link (st.code has a copy button)."""
    params = commit(names)
    with st.expander("Share this view", expanded=False, icon=":material/share:"):
        st.code(share_url(params), language=None, wrap_lines=True)
        left_out = [n for n in ("text", "text2") if n in names and n not in params]
        msg = "Opening this link in another browser shows the same view. The token is never in it."
        if left_out:
            msg += f" The text is longer than {MAX_LINK_TEXT} characters and is not in the link."
        st.caption(msg + (" " + note if note else ""))
