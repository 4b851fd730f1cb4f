"""Generation on hybrids and recurrent models: each new token's row of every head of one
non-softmax mixer block (its exact effective attention, signed, or a per-channel mixer's
contribution norms), beside the softmax heads' rows."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attnviz import AttentionResult
from attnviz.figures.mixers import is_norms, kind_name, mixer_heatmap
from attnviz.metrics.mixer_compare import mixer_heads_of

BLOCK_KEY = "gmixer"


def rows_of(res: AttentionResult, block: int, kind: str, q: int, n_keys: int) -> np.ndarray:
    """float32 (heads, n_keys): query row ``q`` of every head of block ``block``'s ``kind`` mixer."""
    return res.layer(block, mixer=kind, rows=slice(q, q + 1))[:, 0, :n_keys]


def draw(
    res: AttentionResult, q: int, n_keys: int, labels_k: Sequence[str], query_label: str, name: str
) -> None:
    """A block picker over the non-softmax mixers and that block's rows at query ``q``."""
    import streamlit as st

    from ui import export

    blocks = mixer_heads_of(res.layout)
    if not blocks:
        return
    st.subheader("Mixer heads at this step (not softmax)")
    i = st.selectbox(
        "Mixer block",
        range(len(blocks)),
        format_func=lambda j: f"block {blocks[j][0]} · {kind_name(blocks[j][1])}",
        key=BLOCK_KEY,
    )
    block, kind = blocks[int(i or 0)]
    rows = rows_of(res, block, kind, q, n_keys)
    heads = ["channels (one)"] if is_norms(kind) else [f"head {h}" for h in range(rows.shape[0])]
    fig = mixer_heatmap(
        rows,
        heads,
        list(labels_k[:n_keys]),
        kind=kind,
        title=f"block {block} · query {query_label}",
        height=400,
    )
    fig.update_yaxes(title_text="head")
    export.chart(fig, f"{name}_B{block}_{kind}", key="gen_mixer")
    # where the rows come from: generate's own prefill and decode steps ("… + 4 × …_state_update")
    # where every step was captured and checks, else a forward over the prompt and generated tokens
    against = res.mixer_check(block, kind).against
    st.caption(
        f"Each row is the query's exact row of that head, rebuilt from what the mixer's kernels received "
        f"and checked against {against}: signed weights that need not sum to 1, not probabilities."
        if not is_norms(kind)
        else "This mixer mixes per channel: its one row is ‖c‖, how much each earlier token adds to the "
        "new token's mixer output (non-negative, not probabilities)."
    )
