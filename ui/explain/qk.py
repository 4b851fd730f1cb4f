"""The Explain page's "why this head attends" view (`attnviz.explain.qk_attribution`).

One head's pre-softmax score for (query, key), split exactly into what wrote the query and what
wrote the key, read from the page's cached trace (no new forward). The query is the page's
position; the head and key come from the link (``wl``, ``wh``, ``wk``), so the explorer's big head
opens it with a click's settings. A clicked part that is a head opens that head in the explorer.
Hybrids, Bloom and MPT are read at block boundaries instead (`attnviz.explain.mixed_trace`, one
forward, cached): parts are named by the model's own block index, the picker by attention layer.
"""

from __future__ import annotations

import streamlit as st

from attnviz import LoadedModel
from attnviz import explain as X
from attnviz.figures import figure_name
from attnviz.figures import qk as FQ
from attnviz.server.settings import settings
from ui import clicks, export, models, shell, state
from ui.explain.views import PICKER_OPTIONS, computed, open_in_explorer, position_picker
from ui.params import QK_BY_CHOICES, ExplainParams, ExplorerParams
from ui.text import guarded, md

Source = X.Trace | X.MixedTrace

VIEW = "why this head attends"
SPACE_CHART = "qk_space_chart"  # the Q/K scatter: a clicked point becomes the query


def before_widgets() -> None:
    """Before the page's position picker is drawn: a new click on the Q/K scatter picks its token."""
    picked = clicks.click(SPACE_CHART)
    if picked:
        state.put("pos", int(picked[0]))


def page(lm: LoadedModel, p: ExplainParams, token: str | None, chat: bool) -> None:
    """The view for a model read at block boundaries (`X.reads_blocks`): its own cached forward."""
    key = (lm.spec, models.token_key(token), p.text, chat, "blocks")
    tr = None
    with guarded(f"reading {md(lm.spec)}'s stream block by block", token, (lm.spec, p.text)):
        max_tokens = settings().max_tokens
        tr = computed(
            "explain_qk_blocks",
            key,
            f"Running {md(lm.spec)} on the text (keeping every block's parts)",
            lambda _r: X.mixed_trace(lm, p.text, chat=chat, max_tokens=max_tokens),
        )
    if tr is None:
        shell.stop()
    blocks = ", ".join(f"{layer} (block {b})" for layer, b in enumerate(tr.layer_blocks))
    st.caption(
        f"**{md(lm.spec)}** · {models.describe_layout(lm.layout)} · {tr.n_tokens} tokens · read at "
        f"block boundaries: the parts are what each earlier block wrote. Attention layers: {blocks}"
    )
    before_widgets()
    why(lm, tr, key, p, position_picker(tr))  # type: ignore[arg-type]


def _key_picker(tr: Source, pos: int) -> int:
    """The key (-1: the one the head attends to most), among the keys up to the query."""
    if not -1 <= int(state.get("wk")) <= pos:
        state.put("wk", -1)
    if pos + 1 > PICKER_OPTIONS:
        return int(
            st.number_input(f"Key (0 .. {pos}; -1: the one it attends to most)", -1, pos, key="wk", step=1)
        )
    return int(
        st.selectbox(
            "Key",
            [-1, *range(pos, -1, -1)],
            key="wk",
            format_func=lambda j: (
                "the one it attends to most" if j == -1 else f"({j}) {tr.tokens.display[j]}"
            ),
        )
    )


def why(lm: LoadedModel, tr: Source, key: tuple, p: ExplainParams, pos: int) -> None:
    """The split of one score, the top terms in words, and the query's whole row on request."""
    state.clamp("wl", 0, tr.n_layers - 1, "layer")
    state.clamp("wh", 0, tr.n_heads - 1, "head")
    c1, c2, c3, c4 = st.columns([1, 1, 2, 1.4])
    mixed = isinstance(tr, X.MixedTrace)
    layer = int(
        c1.number_input("Attention layer" if mixed else "Layer", 0, tr.n_layers - 1, key="wl", step=1)
    )
    head = int(c2.number_input("Head", 0, tr.n_heads - 1, key="wh", step=1))
    with c3:
        wk = _key_picker(tr, pos)
    by = c4.segmented_control("Parts", list(QK_BY_CHOICES), key="wby", required=True)
    cell = computed(
        "explain_qk",
        (*key, layer, head, pos, wk),
        "Splitting the score",
        lambda _r: X.qk_attribution(lm, tr, layer=layer, head=head, query=pos, key=None if wk < 0 else wk),
    )
    if cell is None:
        return
    name = figure_name(lm.spec, "why", f"L{cell.block}", f"H{head}", pos, cell.key)
    event = export.chart(FQ.qk_view(cell, by=str(by)), name, key="qk_chart", on_select=True)
    st.caption(
        f"The score of query ({cell.query}) {md(tr.tokens.display[cell.query])} and key ({cell.key}) "
        f"{md(tr.tokens.display[cell.key])} is exactly the sum of the {cell.terms.size} terms"
        + (" and the position bias" if cell.position_bias else "")
        + f" (rounding {abs(cell.error):.1e}): each term is one part of the query's residual stream "
        "times one part of the key's, through the layer's norm (its scale frozen at this forward), "
        "W_Q / W_K, the q/k norms and the rotary turn. Red raises the score, blue lowers it; the bars "
        "are each part with the whole other side. Click a head's part to open it in the explorer. "
        + " ".join(cell.notes)
    )
    st.markdown("**The largest terms**")
    st.markdown("\n".join(f"{n + 1}. {md(s)}" for n, s in enumerate(FQ.term_sentences(cell, 10))))
    if cell.bands is not None and st.toggle("The top terms by rotary band", key="qk_bands_on"):
        export.chart(FQ.qk_band_view(cell, top=10), figure_name(lm.spec, "why_bands", name), key="qk_bands")
        st.caption(
            "With RoPE the score adds up over pairs of the head's dims, each pair turned by its own "
            "angle per position; each column is one term split over those pairs (band 0 turns fastest, "
            "as in the rotary view) and sums to the term exactly."
        )
    picked = clicks.clicked(event, "qk_chart")
    if picked and len(picked) >= 2 and int(picked[1]) >= 0:
        state.remember("qk_head", (int(picked[0]), int(picked[1])))
    chosen = state.recall("qk_head")  # (the model's block, head) of a clicked head's part
    if chosen and chosen[0] < cell.block and chosen[1] < tr.n_heads:
        at = lm.layout.attention_layer_of(chosen[0])  # the explorer's attention layer
        open_in_explorer(
            p,
            at,
            chosen[1],
            pos,
            f"Open layer {chosen[0]}, head {chosen[1]} in the explorer",
            "qk_open",
        )
    if st.toggle("The whole query row (every key's key side)", key="qk_row_on"):
        row = computed(
            "explain_qk_row",
            (*key, layer, head, pos),
            "Splitting every key's score",
            lambda _r: X.qk_row(lm, tr, layer=layer, head=head, query=pos),
        )
        if row is not None:
            labels = [tr.tokens.labels[int(j)] for j in row.keys]
            st.dataframe(
                FQ.key_side_table(labels, row.key_terms, row.components), hide_index=True, height=300
            )
            st.caption(
                "Each key's score with the whole query, and the key parts that add most to it. "
                "The same split per layer of origin is `attnviz.qk_row(...).by_origin()`."
            )
    if st.toggle("The head in query/key space", key="qk_space_on"):
        space_view(lm, tr, key, layer, head)
    if st.toggle("Every head's OV circuit", key="qk_ov_on"):
        ov_view(lm, p, layer, head, pos)


def space_view(lm: LoadedModel, tr: Source, key: tuple, layer: int, head: int) -> None:
    """The head's queries and keys as one PCA scatter; a clicked point becomes the query."""
    space = computed(
        "explain_qk_space",
        (*key, layer, head),
        "Projecting the queries and keys",
        lambda _r: X.qk_space(lm, tr, layer=layer, head=head),
    )
    if space is None:
        return
    export.chart(
        FQ.qk_space_view(space),
        figure_name(lm.spec, "qk_space", f"L{layer}", f"H{head}"),
        key=clicks.chart_key(SPACE_CHART),
        on_select=True,
    )
    st.caption(
        "The model's own queries and keys of this head (keys after RoPE are what the scores use; before "
        "RoPE, turned back through the layer's rotary map) on the first two principal axes of all of "
        "them together. Click a point to make its token the query."
    )


def ov_view(lm: LoadedModel, p: ExplainParams, layer: int, head: int, pos: int) -> None:
    """Every head's OV copying score (once per model, cached) and this head's copied tokens."""
    ov = computed("ov_circuits", (lm.spec,), "Reading every head's OV circuit", lambda _r: X.ov_circuits(lm))
    if ov is None:
        return
    event = export.chart(FQ.ov_map_view(ov), figure_name(lm.spec, "ov"), key="qk_ov_chart", on_select=True)
    st.caption(
        "Copying score: the sum of the eigenvalues of W_U W_O W_V W_E over the sum of their sizes "
        "(Elhage et al. 2021): 1 when the head raises the logits of the tokens it attends to, −1 when "
        "it lowers them. " + " ".join(ov.notes) + " Click a head to open it in the explorer."
    )
    picked = clicks.clicked(event, "qk_ov_chart")
    if picked and len(picked) >= 2:
        state.remember("ov_head", (int(picked[0]), int(picked[1])))
    chosen = state.recall("ov_head")
    if chosen:
        open_in_explorer(
            p,
            chosen[0],
            chosen[1],
            pos,
            f"Open {lm.layout.layer_label(chosen[0])}, head {chosen[1]} in the explorer",
            "ov_open",
        )
    copied, suppressed = models.cached(
        "ov_tokens",
        (lm.spec, layer, head),
        lambda: X.ov_tokens(lm, layer, head, k=10),
        nbytes=lambda _v: 1 << 12,
    )
    c1, c2 = st.columns(2)
    for col, title, rows in ((c1, "Copies most", copied), (c2, "Suppresses most", suppressed)):
        col.dataframe(
            {title: [t for t, _ in rows], "own logit": [round(v, 3) for _, v in rows]}, hide_index=True
        )
    st.caption(
        f"L{lm.layout.model_layer(layer)}H{head}: the tokens whose own logit it raises (lowers) most "
        "when it attends to them."
    )


def explain_link(p: ExplorerParams, layer: int, head: int, query: int, key: int) -> None:
    """A link from the explorer's big head to this view for (query, key) of ``layer``/``head``."""
    target = ExplainParams(
        model=p.model, text=p.text, chat=p.chat, view=VIEW, pos=query, wl=layer, wh=head, wk=key
    )
    st.page_link(
        shell.entry(ExplainParams).file,
        label=f"Why does head {head} attend from {query} to {key}?",
        icon=":material/help:",
        query_params=target.to_query().params,
    )


def _position(label: object) -> int | None:
    """The position of a ``"(i) token"`` axis label; None for a pooled bin ``"(i–j) …"``."""
    text = str(label)
    if not text.startswith("(") or ") " not in text:
        return None
    head = text[1:].split(") ", 1)[0]
    return int(head) if head.isdigit() else None


def big_head_link(event: object, layer: int, head: int) -> None:
    """Under the explorer's big head: after a click on one cell, a link to why the head attends
    there (the explorer's model, text and template, the cell's query and key)."""
    try:
        points = list(event["selection"]["points"]) if event else []  # type: ignore[index]
    except (KeyError, TypeError):
        points = []
    if points:
        q, k = _position(points[0].get("y")), _position(points[0].get("x"))
        state.remember("qk_cell", (layer, head, q, k))
    kept = state.recall("qk_cell")
    if not kept or kept[:2] != (layer, head):
        st.caption("Click a cell of the head to ask why it attends there.")
        return
    _, _, q, k = kept
    if q is None or k is None:
        st.caption("That cell pools several tokens: zoom in to pick one query and one key, then ask why.")
        return
    p = state.current(ExplorerParams)
    assert isinstance(p, ExplorerParams)
    explain_link(p, layer, head, q, k)
