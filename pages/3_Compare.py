"""Compare: two texts on one model, or one text on two models with the same layout."""

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from attnviz import AttentionResult
from attnviz import figures as F
from attnviz.layout import Stack
from ui import export, gate, head_stats, models, pickers, shell, sidebar, state
from ui.compare import aligned as compare
from ui.params import COMPARE_MODES, COMPARE_SCALES, MAX_TEXT_CHARS, CompareParams
from ui.text import md

TOP = 15

frame = shell.begin(CompareParams, text_label="Text (A)")
spec_a, text_a = frame.params.model, frame.params.text

st.title("Compare attention")
mode = st.segmented_control("Compare", COMPARE_MODES, key="cmp", required=True)
if mode == "two texts":
    # no max_chars (a longer paste would be dropped silently): `shell.begin` says what is wrong
    st.text_area("Text B", key="text2", height=80, help=f"Up to {MAX_TEXT_CHARS:,} characters.")
    spec_b, text_b = spec_a, str(state.get("text2"))
    st.caption(f"Model: **{md(spec_a)}**. A is the sidebar's text, B the text above.")
else:
    spec_b = sidebar.model_picker("model2", key="model2_choice", custom_key="model2_custom", label="Model B")
    text_b = text_a
    st.caption(
        f"Model A: **{md(spec_a)}** (sidebar), model B above; both read the sidebar's text. The two "
        "are paired head by head when their layouts match; otherwise by matched statistics."
    )


def main() -> None:
    """The page body. Models and results stay locals of this run; the download callables get
    `models.ResultRef`s (they and the widget format functions outlive the run; see app.py)."""
    with gate.one_turn():  # demo: one place in the queue for both texts
        lm_a, res_a, ref_a = shell.load_and_extract(frame)
        if not spec_b or not text_b.strip():
            st.info("Type text B." if mode == "two texts" else "Pick model B.")
            shell.stop()
        lm_b = lm_a if spec_b == spec_a else shell.load(spec_b, frame.token)
        chat_b = ref_a.chat and lm_b.has_chat_template
        res_b, ref_b = models.extract(lm_b, text_b, spec=spec_b, token=frame.token, chat=chat_b)
    if res_b is None or ref_b is None:
        shell.stop()
    compare.mixer_heads(res_a, res_b)  # hybrids, recurrent models: by the statistics that apply
    for lm in (lm_a, lm_b):
        shell.need_attention(lm, "Comparing α head by head (see the mixer heads above)")
    la, lb = lm_a.layout, lm_b.layout
    shape_a = (la.n_layers, la.n_decoder_layers, la.n_heads, la.stacks)
    if shape_a != (lb.n_layers, lb.n_decoder_layers, lb.n_heads, lb.stacks):
        compare.matched(lm_a, res_a, ref_a, lm_b, res_b, ref_b, frame.token)
        shell.stop()

    stack = pickers.stack_picker(res_a.stacks)
    p = compare.pair(res_a, res_b, stack)
    st.info(p.note, icon=":material/info:")
    if p.caution:
        st.warning(p.caution, icon=":material/warning:")
    pair_key = (ref_a.key, ref_b.key, stack)

    with st.spinner("Comparing every head…", show_time=True):
        scores = compare.change_scores(res_a, res_b, stack, p, pair_key)
        ent_a, _ = head_stats.head_metrics(lm_a, res_a, ref_a.key, stack, induction=False, token=frame.token)
        ent_b, _ = head_stats.head_metrics(lm_b, res_b, ref_b.key, stack, induction=False, token=frame.token)
    kv = pickers.kv_heads(res_a, stack)
    heads_changed(scores, ent_b.entropy - ent_a.entropy, kv, lm_a.spec, pair_key)
    layer, head, colour = side_by_side(res_a, res_b, stack, p, scores, kv, pair_key, lm_a.spec, lm_b.spec)
    one_head(ref_a, ref_b, stack, p, layer, head, colour, float(scores[layer, head]))
    state.share_box()


def heads_changed(
    scores: np.ndarray, d_ent: np.ndarray, kv: list[int] | None, spec: str, pair_key: tuple
) -> None:
    """The most changed heads as bars and all heads in a table; a selected row picks the head
    shown below."""
    n_heads = scores.shape[1]
    order = np.argsort(-scores, axis=None, kind="stable")
    st.subheader("Heads that changed most")
    left, right = st.columns([2, 3])
    with left:
        top = order[:TOP]
        bars = F.bar_chart(
            [float(scores.flat[i]) for i in top],
            [f"L{i // n_heads} · {F.head_title(i % n_heads, kv[i % n_heads] if kv else None)}" for i in top],
            title=f"Top {len(top)} heads by change",
            x_title="TV distance (0 = same, 1 = disjoint)",
        )
        export.chart(bars, F.figure_name("compare", spec, "top_heads"), key="top_chart")
    with right:
        table = {
            "layer": [int(i // n_heads) for i in order],
            "head": [int(i % n_heads) for i in order],
            "change (TV)": [round(float(scores.flat[i]), 4) for i in order],
            "Δ entropy (B − A)": [round(float(d_ent.flat[i]), 4) for i in order],
        }
        picked = st.dataframe(
            table,
            key="change_table",
            on_select="rerun",
            selection_mode="single-row",
            hide_index=True,
            height=420,
        )
        st.caption(
            "Change: the mean total variation distance between the A and B rows of a head. Sorted by "
            "change; click a column to re-sort. Select a row to show that head below."
        )
    sel = list(picked.selection.rows) if picked is not None and picked.selection else []
    if sel and state.recall("compare_picked") != (pair_key, sel[0]):
        state.remember("compare_picked", (pair_key, sel[0]))
        state.put("layer", int(order[sel[0]] // n_heads))
        state.put("head", int(order[sel[0]] % n_heads))


def side_by_side(
    res_a: AttentionResult,
    res_b: AttentionResult,
    stack: Stack,
    p: compare.Pairing,
    scores: np.ndarray,
    kv: list[int] | None,
    pair_key: tuple,
    spec_a: str,
    spec_b: str,
) -> tuple[int, int, tuple[str, str]]:
    """Layer, head and colour controls, and every head of the layer for A, B and A − B.
    Returns (layer, head, (colour map, colour scale)); A and B share one colour range."""
    n_layers, n_heads = scores.shape
    st.subheader("Side by side")
    state.clamp("layer", 0, n_layers - 1, "layer")
    state.clamp("head", 0, n_heads - 1, "head")
    c1, c2, c3, c4 = st.columns([3, 2, 2, 2])
    with c1:
        layer = st.slider("Layer", 0, n_layers - 1, key="layer") if n_layers > 1 else 0
    with c2:
        head = pickers.head_picker(n_heads, kv)
    with c3:
        cmap = st.selectbox("Colour map", F.COLORSCALES, key="cmap")
    with c4:  # no "rank" (a percentile per figure) and no "per head": A and B share one range
        choice = pickers.scale_picker(COMPARE_SCALES)
    scale, note = pickers.scale_for(choice, max(len(p.labels), len(p.k_labels)))

    side = F.grid_side(n_heads, F.GRID_MAX_CELLS // 2)
    ga, gb, gd, bins = compare.grids(res_a, res_b, layer, stack, p, side, pair_key)
    zmax = float(max(ga.max(), gb.max())) or 1.0
    cells = F.GRID_MAX_CELLS // 2
    ca, cb = st.columns(2)
    with ca:
        st.markdown(f"**{md(names(spec_a, spec_b)[0])}** · {res_a.layout.layer_label(layer)}")
        fig_a = F.head_grid(ga, bins, kv_heads=kv, colorscale=cmap, scale=scale, zmax=zmax, max_cells=cells)
        export.chart(fig_a, F.figure_name("compare", spec_a, "A", f"L{layer}"), key="grid_a")
    with cb:
        st.markdown(f"**{md(names(spec_a, spec_b)[1])}** · {res_a.layout.layer_label(layer)}")
        fig_b = F.head_grid(gb, bins, kv_heads=kv, colorscale=cmap, scale=scale, zmax=zmax, max_cells=cells)
        export.chart(fig_b, F.figure_name("compare", spec_b, "B", f"L{layer}"), key="grid_b")
    if note:
        st.caption(note)
    st.markdown(f"**A − B** · {res_a.layout.layer_label(layer)} (red: more weight in A, blue: more in B)")
    fig_d = F.head_grid(gd, bins, kv_heads=kv, diverging=True, max_cells=cells)
    export.chart(fig_d, F.figure_name("compare", spec_a, "diff", f"L{layer}"), key="grid_diff")
    return layer, head, (cmap, scale)


def names(spec_a: str, spec_b: str) -> tuple[str, str]:
    """What the two sides are called: the models when two models are compared, else A and B."""
    return (spec_a, spec_b) if mode == "two models" else ("A", "B")


def one_head(
    ref_a: models.ResultRef,
    ref_b: models.ResultRef,
    stack: Stack,
    p: compare.Pairing,
    layer: int,
    head: int,
    colour: tuple[str, str],
    change: float,
) -> None:
    """One head of A and of B next to each other (``colour`` = (map, scale), one range for both),
    A − B under them, and the downloads."""
    st.markdown(f"**Head {head}, layer {layer}**: change {change:.3f} (TV)")
    if p.m * len(p.ka) > F.SINGLE_MAX_CELLS:
        st.caption(
            "The texts are long: the single-head view shows the pooled grids above; download the full block."
        )
        return
    name_a, name_b = names(ref_a.name, ref_b.name)

    def heads_now() -> tuple[np.ndarray, np.ndarray]:  # (A, B) of this head, fetched when needed
        return (
            compare.side(models.result_now(ref_a), p, "a", layer, stack)[head],
            compare.side(models.result_now(ref_b), p, "b", layer, stack)[head],
        )

    cells = F.SINGLE_MAX_CELLS // 3  # three heads on the page: the payload stays under the budget

    def diff_figure(ha: np.ndarray, hb: np.ndarray) -> go.Figure:
        return F.head_grid(
            (ha - hb)[None],
            p.labels,
            p.k_labels,
            titles=["A − B"],
            diverging=True,
            max_cells=cells,
            facet_px=340,
        )

    ha, hb = heads_now()
    cmap, scale = colour
    zmax = float(max(ha.max(), hb.max())) or 1.0
    h1, h2 = st.columns(2)
    with h1:
        f1 = F.head_heatmap(
            ha,
            p.labels,
            p.k_labels,
            title=name_a,
            colorscale=cmap,
            scale=scale,
            zmax=zmax,
            max_cells=cells,
            height=460,
        )
        export.chart(f1, F.figure_name("compare", "A", f"L{layer}", f"H{head}"), key="head_a")
    with h2:
        f2 = F.head_heatmap(
            hb,
            p.labels,
            p.k_labels,
            title=name_b,
            colorscale=cmap,
            scale=scale,
            zmax=zmax,
            max_cells=cells,
            height=460,
        )
        export.chart(f2, F.figure_name("compare", "B", f"L{layer}", f"H{head}"), key="head_b")
    h3, h4 = st.columns(2)
    with h3:
        export.chart(
            diff_figure(ha, hb), F.figure_name("compare", "diff", f"L{layer}", f"H{head}"), key="head_diff"
        )
    with h4:
        st.caption("A − B of this head: red where A puts more weight on a key, blue where B does.")

        def npz() -> bytes:
            a, b = heads_now()
            return export.npz_bytes(a=a, b=b, diff=a - b, tokens=np.array(p.labels), layer=layer, head=head)

        def csv() -> str:
            a, b = heads_now()
            return export.csv_text(a - b, p.labels, p.k_labels, "A − B: query \\ key")

        export.downloads(
            F.figure_name("compare", ref_a.name, f"L{layer}", f"H{head}"),
            npz=npz,
            csv=csv,
            fig=lambda: diff_figure(*heads_now()),
            key="cmp",
            what="A, B and A − B of this head",
            shape=(len(p.labels), len(p.k_labels)),
        )


main()
