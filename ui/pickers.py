"""The controls every page shares: which stack, which head, which colour scale (and what a
scale choice resolves to at a text's length)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import streamlit as st

from attnviz import AttentionResult
from attnviz import figures as F
from attnviz.layout import Stack
from ui import state
from ui.params import EXPLORER_SCALES

SCALE_NAMES = {
    "auto": f"auto (log₁₀ past {F.LONG_TEXT_TOKENS} tokens)",
    "linear": "linear",
    "log": "log₁₀",
    "rank": "rank (percentile)",
    "perhead": "per head",
}


SCALE_HELP = {
    "auto": f"auto: linear weights for short texts, log₁₀ past {F.LONG_TEXT_TOKENS} tokens (where every "
    "weight is ~1/N)",
    "linear": "linear: the weight itself",
    "log": "log₁₀: small weights visible at any length",
    "rank": "rank: each weight's percentile among those drawn",
    "perhead": "per head: auto's scale, each head on its own range (the others share one range)",
}


def scale_for(choice: str, n_tokens: int) -> tuple[str, str]:
    """(scale to draw, note for the page) for a choice of `scale_picker`. "auto" is log past
    `F.LONG_TEXT_TOKENS` tokens (a linear scale looks empty there); "perhead" is auto's scale with
    each head on its own range (the caller drops the shared maximum)."""
    if choice in ("auto", "perhead"):
        scale = F.default_scale(n_tokens)
        note = F.scale_note(scale, n_tokens)
        lead = "Auto colour scale" if choice == "auto" else "Each head on its own colour range"
        if note:
            return scale, f"{lead}: {note[0].lower()}{note[1:]}"
        return scale, (f"{lead}." if choice == "perhead" else "")
    return choice, F.scale_note(choice, n_tokens)


def scale_picker(options: Sequence[str] = EXPLORER_SCALES, key: str = "scale") -> str:
    """Every page's one colour control ("Colour scale"): ``options`` are those that make sense on
    the page (`ui.params`: the explorer's five, "per head" only where a page draws several heads on
    their own ranges). A selectbox: five segments do not fit the controls' column."""
    state.choose(key, list(options), "colour scale")
    return str(
        st.selectbox(
            "Colour scale",
            list(options),
            key=key,
            format_func=lambda s: SCALE_NAMES.get(s, s),
            help="; ".join(SCALE_HELP[o] for o in options) + ".",
        )
    )


def stack_picker(stacks: Sequence[Stack], format_func: Callable[[str], str] = str) -> Stack:
    """Which attention to show (key "stack"): a segmented control when the model has more than
    one (encoder, decoder, cross), else the only one."""
    options = list(stacks)
    stack: str | None = state.choose("stack", options, "attention")
    if len(options) > 1:
        stack = st.segmented_control(
            "Attention", options, key="stack", format_func=format_func, required=True
        )
    return cast(Stack, stack)


def kv_heads(res: AttentionResult, stack: Stack) -> list[int] | None:
    """The KV head of each query head, or None without GQA (and for cross-attention)."""
    lay = res.layout
    if lay.group_size <= 1 or stack == "cross":
        return None
    return [lay.kv_head_of(h) for h in range(lay.n_heads)]


def head_picker(n_heads: int, kv: list[int] | None) -> int:
    """The head selectbox (key "head"). Options are "head h" whatever the model: a label that
    names the KV head ("head 7 · kv 2") stayed on screen after a switch to a model without GQA;
    the KV head is in the help and in the view's title."""
    state.clamp("head", 0, n_heads - 1, "head")
    return int(
        st.selectbox(
            "Head",
            list(range(n_heads)),
            key="head",
            format_func=lambda h: f"head {h}",
            help="With grouped K/V (GQA) the view's title names the KV head the query head reads."
            if kv
            else None,
        )
    )
