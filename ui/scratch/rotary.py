"""From scratch: a head's query-key score split by rotary frequency band (`attnviz.explain.rotary`).

Drawn under the step-by-step walkthrough of one layer: it reads the walkthrough's post-rotary
queries and keys and the cos/sin tables the model passed to that layer, so it costs no forward.
"""

from __future__ import annotations

import numpy as np
import streamlit as st
import torch

from attnviz import AttnvizError
from attnviz.explain import bands
from attnviz.explain.rotary import spec_from_tables
from attnviz.figures import explain as FX
from attnviz.figures import figure_name
from ui import export, state


def _pick(name: str, n: int, label: str, labels: list[str], default: int) -> int:
    options = [-1, *range(n)]
    if int(state.get(name)) not in options:
        state.put(name, -1)
    choice = st.selectbox(
        label, options, key=name, format_func=lambda i: f"auto: {labels[default]}" if i == -1 else labels[i]
    )
    return default if int(choice) == -1 else int(choice)


def bands_view(spec: str, wt, layout, head: int, labels: list[str]) -> None:
    """The bands of ``head`` for a query and a key of the walkthrough's layer, and across keys."""
    st.subheader("Rotary frequency bands")
    if not wt.rotary:
        st.info("This model has no rotary embedding inside attention, so its scores have no frequency bands.")
        return
    q = torch.tensor(np.asarray(wt.q[head], dtype=np.float32))  # (T, d_head) after RoPE
    k = torch.tensor(np.asarray(wt.k[layout.kv_head_of(head)], dtype=np.float32))
    try:
        rot = spec_from_tables(
            torch.tensor(np.asarray(wt.step("rope_cos").value)),
            torch.tensor(np.asarray(wt.step("rope_sin").value)),
            layout.head_dim,
        )
    except (AttnvizError, KeyError) as err:
        st.info(f"The rotary bands are not available here: {err}")
        return
    n = q.shape[0]
    c1, c2 = st.columns(2)
    with c1:
        i = _pick("rq", n, "Query", labels, n - 1)
    with c2:
        j = _pick("rk", i + 1, "Key", labels, int(np.argmax(wt.probs[head][i][: i + 1])))
    b = bands(q, k, rot, wt.scaling, i=i, j=min(j, i), layer=wt.layer, head=head)
    name = figure_name(spec, f"L{wt.layer}", f"H{head}", "rotary")
    export.chart(FX.rotary_view(b), name, key="rotary_chart")
    carried = b.carries
    pos = [m for m, c in enumerate(carried) if c == "position"]
    st.caption(
        f"q·k·scale = {b.score:.3f} is the sum of the {len(rot.pairs)} bands' terms"
        + (" and the unrotated dims" if rot.rest else "")
        + f" ({rot.pairing} pairing, read from the model's own rotary tables). Right: over the keys "
        f"0..{i}, how much each band's term moves when only the distance changes (orange: every key "
        "given the average key content) and when only the content does (green: every key at the "
        f"query's position). Distance dominates in {len(pos)} bands"
        + (f" (the fastest: {', '.join(map(str, pos[:6]))})" if pos else "")
        + "; the others carry content."
    )
