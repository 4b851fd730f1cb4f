"""From scratch, for hybrids: one Gated DeltaNet or Mamba-2 (SSD) head by hand
(`attnviz.reference.mixers`): the recurrence token by token, the closed form A, and the model's
own kernel output, with the differences shown as numbers."""

from __future__ import annotations

import numpy as np
import streamlit as st

import attnviz
from attnviz import AttnvizError, LoadedModel
from attnviz import figures as F
from attnviz.figures import mixers as M
from attnviz.inputs import first_tokens
from attnviz.reference import SUPPORTED
from attnviz.reference import mixers as R
from ui import state

CHOICE_KEY = "_attnviz_scratch_mixer"
HEAD_KEY = "_attnviz_scratch_mixer_head"
MAX_TOKENS = 64  # the recurrence is a Python loop over tokens and the closed form a dense N×N solve
ATTENTION = "softmax attention (the textbook walkthrough)"


def choices(lm: LoadedModel) -> list[tuple[int, str]]:
    """(block, kind) of every block this walkthrough explains."""
    return [(b, k) for b, kinds in enumerate(lm.layout.mixers) for k in kinds if k in R.KINDS]


def picker(lm: LoadedModel) -> tuple[int, str] | None:
    """A choice between the attention walkthrough and each SSD / GDN block; None: attention."""
    found = choices(lm)
    if not found:
        return None
    # the attention walkthrough first where it knows the architecture, else after the mixers
    known = lm.layout.n_layers and lm.layout.model_type in SUPPORTED
    mixers = [f"block {b} · {M.kind_name(k)}" for b, k in found]
    attention = [ATTENTION] if lm.layout.n_layers else []
    options = [*attention, *mixers] if known else [*mixers, *attention]
    picked = st.selectbox("Layer to recompute", options, key=CHOICE_KEY)
    if picked == ATTENTION:
        return None
    return found[mixers.index(picked)]


def _parity(label: str, value: float, scale: float, help_text: str) -> None:
    ok = value <= 1e-5 * max(scale, 1e-6)
    st.metric(label, f"{value:.1e} {'✓' if ok else '⚠'}", help=help_text)


def draw(lm: LoadedModel, text: str, chat: bool, block: int, kind: str) -> None:
    """The walkthrough of one head of block ``block`` on (the first `MAX_TOKENS` tokens of) ``text``."""
    if not text.strip():
        return
    res = attnviz.extract(lm, first_tokens(lm, text, MAX_TOKENS, chat=chat), chat=chat)
    n_heads = res.mixer_heads(block, kind)
    state.keep_widget_in(HEAD_KEY, n_heads - 1)
    head = int(st.selectbox("Head", list(range(n_heads)), key=HEAD_KEY))
    try:
        rec, output = R.capture(lm, list(res.tokens.ids), block, kind)
        w = R.walkthrough(rec, output, head, res.head(block, head, mixer=kind))
    except AttnvizError as err:
        st.error(f"Cannot recompute block {block}: {err}.")
        return
    labels = F.token_labels(res.tokens.display)
    scale = float(np.abs(w.model_output).max())
    st.caption(
        f"**{lm.spec}** · block {block} · {M.kind_name(kind)} · head {head} · {res.n_tokens} tokens"
        + (f" (the first {MAX_TOKENS})" if res.n_tokens >= MAX_TOKENS else "")
        + " · recomputed in float64 from the kernel's own inputs (the model's column: its kernel run again "
        "on them, equal to the forward's own output at the rows the capture keeps, max |Δ| "
        f"{w.diffs['kernel re-run vs the forward (its kept rows)']:.0e}); the model ran in "
        f"{str(lm.dtype).removeprefix('torch.')} (its output's scale {scale:.2g})"
    )
    st.code(R.FORMULAS[kind], language=None)
    m1, m2, m3 = st.columns(3)
    with m1:
        _parity("max |Δ| recurrence vs model", w.diffs["recurrence vs model"], scale,
                "The token-by-token recurrence against the kernel's own output for this head.")  # fmt: skip
    with m2:
        _parity("max |Δ| closed form vs model", w.diffs["closed form vs model"], scale,
                "Σ_s A[t,s] v_s (+ D x_t), closed-form A, against the kernel's own output.")  # fmt: skip
    with m3:
        _parity("max |Δ| recurrence vs closed form", w.diffs["recurrence vs closed form"], scale,
                "The two ways of computing the same thing, both in float64.")  # fmt: skip
    st.subheader("1 · The recurrence, token by token")
    st.caption("The state after each token (its size ‖S_t‖), the output it reads, and the model's own.")
    t = int(st.select_slider("Token", list(range(res.n_tokens)), value=res.n_tokens - 1,
                             format_func=lambda i: labels[i], key="_attnviz_scratch_mixer_t"))  # fmt: skip
    st.dataframe(
        {
            "channel": list(range(w.recurrence.shape[1])),
            "recurrence o_t": w.recurrence[t],
            "closed form Σ_s A[t,s] v_s": w.closed_output[t],
            "model (kernel)": w.model_output[t],
        },
        hide_index=True,
        height=min(300, 36 + 35 * w.recurrence.shape[1]),
    )
    st.plotly_chart(
        F.bar_chart(
            w.state_norms.tolist(), labels, title="‖state‖ after each token", x_title="‖S_t‖ (Frobenius)"
        ),
        key="scratch_state",
    )
    st.subheader("2 · The closed form: effective attention A")
    st.plotly_chart(
        M.mixer_heatmap(w.closed_form, labels, kind=kind, title=f"block {block} · head {head} · closed form"),
        key="scratch_closed_form",
    )
    st.plotly_chart(
        M.token_contributions(w.closed_form[t], labels, kind=kind, query_label=labels[t]),
        key="scratch_row",
    )
    with st.expander("The kernel's inputs, as the kernel uses them"):
        name = st.radio(
            "Input", [s.name for s in w.steps], horizontal=True, key="_attnviz_scratch_mixer_step"
        )
        step = next(s for s in w.steps if s.name == name)
        st.caption(step.description)
        st.plotly_chart(F.matrix_heatmap(step.value, row_labels=labels, title=step.name), key="scratch_step")
