"""The rollout section of the model overview: a token strip and a layer × token flow map.

Colour is log₁₀ of the share by default, over the shares' own range. On decoder models with an
attention sink (SmolLM2: the first token holds most of nearly every row) rollout, a product of
one matrix per layer, gives the last token 1.0 on token 0 and 1e-8..1e-5 on every other token:
a linear scale shows one bright cell. Dropping the sink ("Without the first token") does not fix
that (the flow collapses onto token 1 instead, 0.98) and changes the quantity; the log colour
keeps the rollout as defined (the hover gives each share) and shows the rest.
"""

from __future__ import annotations

import streamlit as st

from attnviz import figures as F
from attnviz.analysis.rollout import TokenRollout, token_rollout
from attnviz.figures.flow import flow_map, token_strip
from attnviz.layout import Stack
from attnviz.result import AttentionResult
from ui import export, models

ROLLOUT_SCALES = {"log": "log₁₀", "linear": "linear"}


def rollout_of(res: AttentionResult, key: tuple, stack: Stack, token: int, sink_aware: bool) -> TokenRollout:
    """`attnviz.analysis.rollout.token_rollout`, cached per result, token and variant."""
    return models.cached(
        "rollout",
        (key, stack, token, sink_aware),
        lambda: token_rollout(res, token, stack=stack, sink_aware=sink_aware),
        nbytes=lambda r: r.sources.nbytes,
    )


def rollout_section(
    spec: str, res: AttentionResult, key: tuple, stack: Stack, cmap: str, token: str | None
) -> None:
    """Pick a token (default: the last); draw where its information comes from, layer by layer."""
    st.subheader("Where a token's information comes from (attention rollout)")
    if stack == "cross":
        st.caption("Rollout follows self-attention; pick the encoder or decoder stack.")
        return
    labels = res.axes(stack)[0].labels
    n = len(labels)
    c1, c2, c3 = st.columns([3, 3, 2])
    with c1:
        picked = st.selectbox(
            "Token", list(range(n)), index=n - 1, key="rollout_token", format_func=lambda i: labels[i]
        )
    with c2:
        sink_aware = st.toggle(
            "Without the first token",
            key="rollout_sink",
            help="Drop the first token (the attention sink) from every head and renormalise.",
            wrap=True,
        )
    with c3:
        log = (
            st.segmented_control(
                "Rollout colour",
                list(ROLLOUT_SCALES),
                key="rollout_scale",
                default="log",
                required=True,
                format_func=lambda s: ROLLOUT_SCALES[s],
                help="log₁₀ (default): every share visible, even beside a sink that holds most of "
                "the row; linear: the shares as they are.",
            )
            != "linear"
        )
    with models.guarded("computing the rollout", token):
        with st.spinner("Rolling out…", show_time=True):
            roll = rollout_of(res, key, stack, int(picked), bool(sink_aware))
        fused = sum(p == "fused" for p in roll.paths)
        st.caption(
            f"Rollout (Abnar & Zuidema): per layer A = ½ mean over heads + ½ identity. "
            f"The strip is the token's row of A_last ⋯ A_first; the map shows, at the input of each "
            f"layer, how much of each token ends up in it. {fused} of {len(roll.paths)} layers from "
            "the fused kernels, the rest exact from the probabilities."
            + (
                " Colour is log₁₀ of the share, from the smallest share drawn up to 1: rollout "
                "multiplies one matrix per layer, so on sink-heavy models the first token takes "
                "nearly all the flow and the rest is 1e-8–1e-3, invisible on a linear scale."
                if log
                else ""
            )
        )
        name = labels[roll.token]
        strip = token_strip(roll.rollout, labels, title=f"sources of {name}", colorscale=cmap, log=log)
        export.chart(strip, F.figure_name(spec, "rollout", roll.token), key="rollout_strip")
        layer_names = [res.layout.layer_label(i) for i in range(len(roll.paths))]
        flow = flow_map(
            roll.sources, labels, title=f"flow into {name}, layer by layer", layer_names=layer_names,
            colorscale=cmap, log=log,
        )  # fmt: skip
        export.chart(flow, F.figure_name(spec, "flow", roll.token), key="rollout_flow")
