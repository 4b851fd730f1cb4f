"""The app's frame: the page table `st.navigation` is built from, and what every page starts with.

A page is three lines of frame around its own body::

    frame = shell.begin(ExplorerParams)        # URL -> params, sidebar drawn, params returned
    lm, res, ref = shell.load_and_extract(frame)   # or stops the page with the error shown
    ...                                        # the page's own controls and views
    state.share_box()                          # params -> URL, with a copyable link

To add a view to a page, add a field to its params dataclass (ui/params.py) when the view needs
a control that a link should carry, and draw it in the page body.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, NoReturn, TypeVar

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from attnviz import AttentionResult, LoadedModel
from attnviz.errors import AttnvizError
from attnviz.extract import Sampling
from attnviz.inputs import Admission, admit
from attnviz.server.settings import settings
from ui import logs, models, sidebar, state
from ui.params import (
    MAX_TEXT_CHARS,
    AtlasParams,
    CompareParams,
    ExplainParams,
    ExplorerParams,
    GenerationParams,
    OverviewParams,
    Params,
    ScratchParams,
)
from ui.text import md

P = TypeVar("P", bound=Params)


@dataclass(frozen=True)
class PageEntry:
    file: str  # relative to the repository root
    params: type[Params]
    icon: str
    url_path: str  # "" = the default page


PAGES: tuple[PageEntry, ...] = (
    PageEntry("pages/0_Explorer.py", ExplorerParams, ":material/search:", ""),
    PageEntry("pages/1_Model_overview.py", OverviewParams, ":material/grid_view:", "Model_overview"),
    PageEntry("pages/2_From_scratch.py", ScratchParams, ":material/calculate:", "From_scratch"),
    PageEntry("pages/3_Compare.py", CompareParams, ":material/compare:", "Compare"),
    PageEntry("pages/4_Generation.py", GenerationParams, ":material/edit_note:", "Generation"),
    PageEntry("pages/5_Head_atlas.py", AtlasParams, ":material/travel_explore:", "Head_atlas"),
    PageEntry("pages/6_Explain.py", ExplainParams, ":material/account_tree:", "Explain"),
)


def entry(cls: type[Params]) -> PageEntry:
    return next(e for e in PAGES if e.params is cls)


@dataclass(frozen=True)
class Frame(Generic[P]):
    """What a page gets: its parameters as the link and the sidebar set them, and this session's
    Hugging Face token (never in the URL, the parameters or a cache key)."""

    params: P
    token: str | None
    chat_slot: DeltaGenerator  # where the sidebar's chat switch goes once the model is known
    cap_slot: DeltaGenerator | None = None  # the sidebar's token cap, rewritten for the model


def begin(cls: type[P], *, text_label: str = "Text") -> Frame[P]:
    """Read the link into the page's parameters, draw the sidebar, return both."""
    logs.configure()
    state.start(cls, path=entry(cls).url_path)
    with st.sidebar:
        st.markdown("### attnviz")
        for e in PAGES:  # our own links: the same menu whatever the server's config says
            st.page_link(e.file, label=e.params.PAGE, icon=e.icon)
        st.divider()
    token, chat_slot, cap_slot = sidebar.draw(text_label=text_label)
    params = state.current(cls)
    assert isinstance(params, cls)
    for name in ("text", "text2"):
        size = len(getattr(params, name, "") or "")
        if size > MAX_TEXT_CHARS:
            st.error(
                f"The {'second ' if name == 'text2' else ''}text has {size:,} characters; the limit is "
                f"{MAX_TEXT_CHARS:,}. Shorten it in the box (it keeps all of it).",
                icon=":material/error:",
            )
            stop()
    return Frame(params, token, chat_slot, cap_slot)


def stop() -> NoReturn:
    """End the page early (after an error already shown) but keep the URL and share link."""
    state.share_box()
    st.stop()
    raise AssertionError("unreachable")  # st.stop raises


def need_attention(lm: LoadedModel, what: str) -> None:
    """Stop a page whose view needs softmax attention heads on a model that has none (pure
    recurrent / state-space models: Mamba, Mamba-2, RWKV, ...), saying why and where to look."""
    lay = lm.layout
    if lay.n_layers:
        return
    st.info(
        f"{md(lm.spec)} has no softmax attention: its token mixers are {models.mixer_line(lay)}. "
        f"{what} needs softmax attention heads. The Explorer and the Model overview show each block's "
        "exact effective attention (or its token contributions) instead.",
        icon=":material/info:",
    )
    stop()


def load(spec: str, token: str | None) -> LoadedModel:
    """The model, or stop the page (the error is shown)."""
    lm = models.load(spec, token)
    if lm is None:
        stop()
    return lm


def load_and_extract(
    frame: Frame, *, generate: int = 0, sampling: Sampling | None = None, statistics: bool = False
) -> tuple[LoadedModel, AttentionResult, models.ResultRef]:
    """(model, result, `models.ResultRef`) for the sidebar's choice, or stop the page after
    showing the error. Keep the model and the result in function locals: callables that outlive
    the run (fragments, downloads, format functions) hold the page's globals; give them the ref.
    ``statistics``: a fresh run keeps the per-head statistics from the forward (`models.extract`)."""
    p = frame.params
    if not p.model:
        st.info("Type a Hugging Face Hub id (like `gpt2`) or a local folder in the sidebar.")
        stop()
    if not p.text.strip():
        st.info("Type a text in the sidebar to see its attention.")
        stop()
    lm = load(p.model, frame.token)
    chat = sidebar.chat_toggle(lm, frame.chat_slot)
    key = models.result_key(lm, frame.token, p.text, chat=chat, generate=generate, sampling=sampling)
    cached = models.is_cached(key)
    stop_here, admission = admitted(
        lm, p.text, chat=chat, generate=generate, cached=cached, cap_slot=frame.cap_slot
    )
    if stop_here:
        stop()
    res, ref = models.extract(
        lm, p.text, spec=p.model, token=frame.token, chat=chat, generate=generate, sampling=sampling,
        statistics=statistics, admission=admission,
    )  # fmt: skip
    if res is None or ref is None:
        stop()
    return lm, res, ref


def admitted(
    lm: LoadedModel,
    text: str,
    *,
    chat: bool,
    generate: int = 0,
    cached: bool = False,
    cap_slot: DeltaGenerator | None = None,
) -> tuple[bool, Admission | None]:
    """Up front, before any progress bar: the engine's admission of the text
    (`attnviz.inputs.admit`: the model's position table, e.g. minilm-l6's 512, this server's cap,
    the demo's 512 or ``ATTNVIZ_MAX_TOKENS``, and the free memory). The sidebar's cap caption
    (``cap_slot``), the refusal with its button that keeps the text's first tokens, and the
    extraction all read this one admission. (True when the page must stop, the admission for
    the extraction: the text is tokenized once; None for a bad text, which the extraction names.)
    ``cached``: the result is in the cache, so free memory, which only a new forward needs, does
    not stop the page (its views guard their own memory)."""
    cfg = settings()
    try:
        adm: Admission | None = admit(lm, text, chat=chat, generate=generate, max_tokens=cfg.max_tokens)
    except AttnvizError:
        adm = None  # an empty or bad text: the extraction says why
    if cap_slot is not None:
        sidebar.token_cap(lm, cap_slot, adm)
    if adm is None:
        return False, None
    if adm.admitted or (cached and adm.limit == "memory"):
        return False, adm
    if adm.limit == "cap":  # this server's limit: said as the server's, with why it has one
        gen = f" (+{generate} to generate)" if generate else ""
        why = "the public demo's limit" if cfg.demo else "this server's limit, ATTNVIZ_MAX_TOKENS"
        advice = (
            f"Shorten the text or use its first {adm.fits:,} tokens."
            if adm.fits >= 1
            else f"Ask for fewer than {adm.limit_tokens:,} tokens to generate."
        )
        message = (
            f"The text has {adm.n_tokens:,} tokens{gen}; this server reads at most "
            f"{adm.limit_tokens:,} ({why}). {advice}"
        )
    else:
        message = adm.refusal[0].upper() + adm.refusal[1:] + "."
    _offer(message, adm)
    return True, adm


def _offer(message: str, adm: Admission) -> None:
    """The refusal and a "Use the first n tokens" button (it cuts the text in the box; none when
    no prompt token fits beside the tokens to generate)."""
    st.error(message, icon=":material/error:")
    if adm.first is None:
        return
    st.button(
        f"Use the first {adm.fits:,} tokens", key="first_tokens", on_click=state.put,
        args=("text", adm.first), icon=":material/content_cut:",
        help="Cut the text in the box there (the rest is dropped).",
    )  # fmt: skip
