"""The sidebar: the model picker, the Hugging Face token (this session only) and the text.

It draws the shared parameters (model, text, chat) with widget keys equal to their names; the
values go into the page's parameters through `ui.state`. The chat switch is drawn once the
model is known and only for a model that has a chat template (`chat_toggle`).
"""

from __future__ import annotations

from collections.abc import Sequence

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

import attnviz
from attnviz import LoadedModel
from attnviz.inputs import Admission, token_limit
from attnviz.server.settings import settings
from ui import state
from ui.params import MAX_TEXT_CHARS
from ui.text import literal

OTHER = "Other: a Hub id or a local folder…"


def _describe(option: str) -> str:
    desc = attnviz.BUILTIN_MODELS.get(option)
    return f"{option} — {desc.split(' (')[0]}" if desc else option


def _choices() -> list[str]:
    """The picker's options: the server's models (built-ins first), and "Other" off the demo."""
    cfg = settings()
    return (list(cfg.model_choices) or list(attnviz.BUILTIN_MODELS)) + ([] if cfg.demo else [OTHER])


def typed(choice: str | None) -> bool:
    """Whether the picker holds a model the user typed (a Hub id, a folder), not one it offers."""
    return bool(choice) and (choice == OTHER or choice not in _choices())


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
    cfg = settings()
    choices = _choices()
    _seed_model_widgets(param, key, custom_key, choices)
    choice = st.selectbox(
        label,
        choices,
        key=key,
        format_func=_describe,
        # a Hub id or a folder typed into the box is taken as it is ("No results" until "Other"
        # was picked first tripped newcomers); the demo serves its list only
        accept_new_options=not cfg.demo,
        help="The built-in models run offline. Type any Hugging Face Hub id or a local folder into the "
        "box, or choose 'Other' for a field to type it in.",
    )
    spec = choice
    if choice == OTHER:
        spec = st.text_input(
            f"{label}: Hub id or local folder",
            key=custom_key,
            max_chars=1024,
            placeholder="gpt2 · Qwen/Qwen2.5-0.5B · /path/to/model",
            help="A Hugging Face Hub id (owner/name) or a folder with config.json and safetensors weights.",
        )
    spec = (spec or "").strip()
    if spec:
        state.put(param, spec)
    return spec


def draw(*, text_label: str = "Text") -> tuple[str | None, DeltaGenerator, DeltaGenerator]:
    """Model, token and text in the sidebar (the chat switch comes with the model: see
    `chat_toggle`). Call after `state.start`. Returns this session's token, if any, and the
    place of the chat switch and of the token cap caption (see `token_cap`)."""
    cfg = settings()
    with st.sidebar:
        st.caption("Real attention weights of a transformer, per layer and head.")
        model_picker()
        token = None
        if typed(state.widget_value("model_choice")) and cfg.allow_token_field:
            value = st.text_input(
                "Hugging Face token (gated models)",
                type="password",
                key="hf_token",
                persist_state="session",  # kept across pages (Streamlit's own; was a copy by hand)
                help="Used only for this session's load. Never put in the link, a cache key or the logs.",
            )
            token = (value or "").strip() or None
        # no max_chars: the browser would drop a longer paste silently and keep the old text;
        # the page says what is wrong instead (`ui.shell.begin`)
        st.text_area(text_label, key="text", height=110, help=f"Up to {MAX_TEXT_CHARS:,} characters.")
        chat_slot = st.empty()
        cap_slot = st.empty()
        cap_slot.caption(
            f"Up to {cfg.max_tokens} tokens." + (" Public demo: one request at a time." if cfg.demo else "")
        )
    return token, chat_slot, cap_slot


def token_cap(lm: LoadedModel, slot: DeltaGenerator, admission: Admission | None = None) -> None:
    """Rewrite the cap caption (``slot``) once the model is known: the engine's limit for this
    model on its device (`attnviz.inputs.token_limit`: the configured cap, the model's position
    table or the free memory, whichever is smallest), and which one it is. With the text's
    ``admission`` (`ui.shell.admitted`), the limit it was admitted against: the caption and a
    refusal read the same figures."""
    cfg = settings()
    if admission is not None:
        cap, limit = admission.limit_tokens, admission.limit
    else:
        cap, limit = token_limit(lm, max_tokens=cfg.max_tokens)
    why = {
        "positions": " (the model's own position limit)",
        "memory": f" (the free memory on {lm.device})",
        "cap": "",
    }[limit]
    slot.caption(f"Up to {cap} tokens{why}." + (" Public demo: one request at a time." if cfg.demo else ""))


def chat_toggle(lm: LoadedModel, slot: DeltaGenerator) -> bool:
    """Draw the chat-template switch (in ``slot``) for a model that has a template; returns the
    value to use. A link's ``chat=1`` on a model without one gets a note and is dropped."""
    if not lm.has_chat_template:
        if state.get("chat"):
            st.warning(f"{literal(lm.spec)} has no chat template; showing the plain text.")
            state.put("chat", False)
        return False
    with slot.container():
        return st.toggle(
            "Chat template",
            key="chat",
            help="Wrap the text in the model's chat template (user turn + assistant prompt), as a chat "
            "model sees it. Template tokens are marked and can be hidden.",
            wrap=True,
        )
