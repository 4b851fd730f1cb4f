"""The page frame: page config, the sidebar's model picker and text, and the stop helper."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import streamlit as st

import attnviz
from ui import models, state

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


def page(title: str, icon: str = "🔍") -> None:
    st.set_page_config(page_title=f"{title} · attnviz", page_icon=icon, layout="wide")


def _describe(option: str) -> str:
    desc = attnviz.BUILTIN_MODELS.get(option)
    return f"{option} — {desc.split(' (')[0]}" if desc else option


def _seed_model_widgets(choices: Sequence[str]) -> None:
    """Point the picker at the stored model spec (first run or a new link)."""
    ss = st.session_state
    spec = state.get("model")
    if "model_choice" in ss and not state.applied("model"):
        if ss["model_choice"] == OTHER and "model_custom" not in ss:
            ss["model_custom"] = spec
        return
    if spec in choices:
        ss["model_choice"] = spec
    elif OTHER in choices:
        ss["model_choice"] = OTHER
        ss["model_custom"] = spec
    else:
        if spec:
            st.warning(f"Model {spec!r} is not offered on this server; showing {choices[0]!r}.")
        ss["model_choice"] = choices[0]
        state.put("model", choices[0])


def model_picker(*, key: str = "model_choice", custom_key: str = "model_custom", label: str = "Model") -> str:
    """The model selectbox (built-ins first) and, for "Other", the free field. Returns the spec."""
    cfg = models.config()
    choices = list(cfg.model_choices) or list(attnviz.BUILTIN_MODELS)
    if cfg.allow_local_paths or not cfg.demo:
        choices.append(OTHER)
    if key == "model_choice":
        _seed_model_widgets(choices)
    elif st.session_state.get(key) not in choices:
        st.session_state[key] = choices[0]
    choice = st.selectbox(
        label,
        choices,
        key=key,
        format_func=_describe,
        help="The built-in models run offline. Choose 'Other' for any Hugging Face Hub id or a local folder.",
    )
    if choice != OTHER:
        return choice
    custom = st.text_input(
        "Hub id or local folder",
        key=custom_key,
        placeholder="gpt2 · Qwen/Qwen2.5-0.5B · /path/to/model",
        help="A Hugging Face Hub id (owner/name) or a folder with config.json and safetensors weights.",
    )
    return (custom or "").strip()


def sidebar(*, text_label: str = "Text") -> Choice:
    """Model, token, text and chat template in the sidebar. Call after `state.start`."""
    cfg = models.config()
    with st.sidebar:
        st.markdown("### attnviz")
        st.caption("Real attention weights of a transformer, per layer and head.")
        spec = model_picker()
        token = None
        if st.session_state.get("model_choice") == OTHER and cfg.allow_token_field:
            if "hf_token" not in st.session_state and _TOKEN in st.session_state:
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
    if spec:
        state.put("model", spec)
    return Choice(spec=spec, text=str(state.get("text")), chat=bool(state.get("chat")), token=token)


def stop(names: Sequence[str]) -> None:
    """End the page early (after an error already shown) but keep the URL and share link."""
    state.share_box(names)
    st.stop()


def load_and_extract(choice: Choice, names: Sequence[str], *, generate: int = 0):
    """Model + result for the sidebar choice, or stop the page after showing the error."""
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
        st.warning(f"{choice.spec} has no chat template; showing the plain text. Turn the chat option off.")
        chat = False
    res, key = models.extract(lm, choice.text, token=choice.token, chat=chat, generate=generate)
    if res is None:
        stop(names)
    return lm, res, key
