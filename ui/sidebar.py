"""The page frame: page config, the sidebar's model picker and text, and the stop helper."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

import attnviz
from ui import logs, models, state
from ui.text import literal

ROOT = Path(__file__).resolve().parent.parent
PAGES = (
    ("app.py", "Explorer", ":material/search:"),
    ("pages/1_Model_overview.py", "Model overview", ":material/grid_view:"),
    ("pages/2_From_scratch.py", "From scratch", ":material/calculate:"),
    ("pages/3_Compare.py", "Compare", ":material/compare:"),
    ("pages/4_Generation.py", "Generation", ":material/edit_note:"),
)
OTHER = "Other: a Hub id or a local folder…"
SHARED = ("model", "text", "chat")
_TOKEN = "_attnviz_session_token"  # this session's token, in memory only


@dataclass(frozen=True)
class Choice:
    """What the sidebar selected. ``token`` is this session's only; never in the URL."""

    spec: str
    text: str
    chat: bool
    token: str | None


def url_path(file: str) -> str:
    """The URL path Streamlit gives a page file: "" for the main script, "Model_overview" for
    ``pages/1_Model_overview.py`` (the number prefix dropped)."""
    if not file.startswith("pages/"):
        return ""
    stem = Path(file).stem
    head, _, rest = stem.partition("_")
    return rest if head.isdigit() and rest else stem


def page(title: str, names: Sequence[str], icon: str = ":material/search:") -> None:
    """Page config, then the URL/state start for this page's parameters."""
    st.set_page_config(page_title=f"{title} · attnviz", page_icon=icon, layout="wide")
    logs.configure()
    path = next((url_path(file) for file, label, _ in PAGES if label == title), "")
    state.start(names, page=title, path=path)


def _describe(option: str) -> str:
    desc = attnviz.BUILTIN_MODELS.get(option)
    return f"{option} — {desc.split(' (')[0]}" if desc else option


def _seed_model_widgets(param: str, key: str, custom_key: str, choices: Sequence[str]) -> None:
    """Point a picker at the stored spec (first run, a new link, or arriving from another page)."""
    ss = st.session_state
    spec = state.get(param)
    if key in ss and not state.applied(param) and not state.page_changed():
        return
    if spec in choices:
        ss[key] = spec
    elif OTHER in choices:
        ss[key] = OTHER
        ss[custom_key] = spec
    else:
        if spec:
            st.warning(
                f"Model {literal(spec, quote=True)} is not offered on this server; "
                f"showing {literal(choices[0], quote=True)}."
            )
        ss[key] = choices[0]
        state.put(param, choices[0])


def model_picker(
    param: str = "model", *, key: str = "model_choice", custom_key: str = "model_custom", label: str = "Model"
) -> str:
    """The model selectbox (built-ins first) and, for "Other", the free field. Returns the spec
    and stores it as ``param``."""
    cfg = models.config()
    choices = list(cfg.model_choices) or list(attnviz.BUILTIN_MODELS)
    if not cfg.demo:
        choices.append(OTHER)
    _seed_model_widgets(param, key, custom_key, choices)
    choice = st.selectbox(
        label,
        choices,
        key=key,
        format_func=_describe,
        help="The built-in models run offline. Choose 'Other' for any Hugging Face Hub id or a local folder.",
    )
    spec = choice
    if choice == OTHER:
        spec = st.text_input(
            f"{label}: Hub id or local folder",
            key=custom_key,
            placeholder="gpt2 · Qwen/Qwen2.5-0.5B · /path/to/model",
            help="A Hugging Face Hub id (owner/name) or a folder with config.json and safetensors weights.",
        )
    spec = (spec or "").strip()
    if spec:
        state.put(param, spec)
    return spec


def sidebar(*, text_label: str = "Text") -> Choice:
    """Model, token, text and chat template in the sidebar. Call after `state.start`."""
    cfg = models.config()
    with st.sidebar:
        st.markdown("### attnviz")
        st.caption("Real attention weights of a transformer, per layer and head.")
        for path, label, icon in PAGES:
            if (ROOT / path).exists():
                st.page_link(path, label=label, icon=icon)
        st.divider()
        spec = model_picker()
        token = None
        if st.session_state.get("model_choice") == OTHER and cfg.allow_token_field:
            if _TOKEN in st.session_state and ("hf_token" not in st.session_state or state.page_changed()):
                st.session_state["hf_token"] = st.session_state[_TOKEN]  # kept across pages
            st.text_input(
                "Hugging Face token (gated models)",
                type="password",
                key="hf_token",
                help="Used only for this session's load. Never put in the link, a cache key or the logs.",
            )
            token = (st.session_state.get("hf_token") or "").strip() or None
            st.session_state[_TOKEN] = token or ""
        st.text_area(text_label, key="text", height=110, max_chars=state.MAX_TEXT_CHARS)
        st.toggle(
            "Chat template",
            key="chat",
            help="Wrap the text in the model's chat template (user turn + assistant prompt), as a chat "
            "model sees it. Template tokens are marked and can be hidden.",
        )
        st.caption(
            f"Up to {cfg.max_tokens} tokens." + (" Public demo: one request at a time." if cfg.demo else "")
        )
    return Choice(spec=spec, text=str(state.get("text")), chat=bool(state.get("chat")), token=token)


def stop(names: Sequence[str]) -> None:
    """End the page early (after an error already shown) but keep the URL and share link."""
    state.share_box(names)
    st.stop()


def load_and_extract(choice: Choice, names: Sequence[str], *, generate: int = 0):
    """(model, result, `models.ResultRef`) for the sidebar choice, or stop the page after showing
    the error. Keep the model and the result in function locals: callables that outlive the run
    (fragments, downloads, format functions) hold the page's globals; give them the ref."""
    if not choice.spec:
        st.info("Type a Hugging Face Hub id (like `gpt2`) or a local folder in the sidebar.")
        stop(names)
    if not choice.text.strip():
        st.info("Type a text in the sidebar to see its attention.")
        stop(names)
    lm = models.load(choice.spec, choice.token)
    if lm is None:
        stop(names)
    chat = choice.chat
    if chat and not lm.has_chat_template:
        st.warning(
            f"{literal(choice.spec)} has no chat template; showing the plain text. Turn the chat option off."
        )
        chat = False
    res, ref = models.extract(
        lm, choice.text, spec=choice.spec, token=choice.token, chat=chat, generate=generate
    )
    if res is None:
        stop(names)
    return lm, res, ref
