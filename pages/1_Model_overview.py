"""Model overview: every layer x head at once, head statistics, and a head finder."""

from contextlib import nullcontext

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from attnviz import AttentionResult, LoadedModel
from attnviz import figures as F
from attnviz.figures import panels as P
from attnviz.layout import Stack
from attnviz.metrics import HeadMetrics
from ui import export, head_stats, heatmaps, mixers, models, pickers, progress, shell, shown, state
from ui.overview import flow
from ui.params import SCALE_CHOICES, ExplorerParams, OverviewParams
from ui.text import guarded, md

SHORT = {"previous_token": "prev. token", "diagonal": "self", "gqa_coherence": "GQA coherence"}
# Past this many tokens the rollout (below the fold; ~0.4-0.6x a forward at 1,500 tokens) runs
# when asked, not on every first view of the page.
ROLLOUT_AUTO_TOKENS = 1024
MOSAIC_KEY = "mosaic_tiles"  # the mosaic's element (`ui.heatmaps`): its clicks are read under this key
MOSAIC_TILE_PX = 64  # a tile's side at most; the element fits the layers across the page

frame = shell.begin(OverviewParams)

st.title("Model overview")


def main() -> None:
    """The page body: the model and the result stay locals of this run (widget format functions
    outlive it and hold the page's globals; see app.py)."""
    # the statistics come from the forward itself when this page runs the model (a result the
    # explorer left in the cache is reused: the statistics then take one second pass)
    lm, res, ref = shell.load_and_extract(frame, statistics=True)
    st.caption(f"**{md(lm.spec)}** · {models.describe_layout(lm.layout)} · {res.n_tokens} tokens")
    if mixers.applies(res.layout):  # a hybrid: every block, with the statistics that apply to it
        mixers.overview(ref, res)
        if not res.layout.n_layers:
            shell.stop()

    c1, c2, _ = st.columns([2, 2, 3])
    with c1:
        stack = pickers.stack_picker(res.stacks)
        cmap = st.selectbox("Colour map", F.COLORSCALES, key="cmap")
    with c2:
        choice = pickers.scale_picker(SCALE_CHOICES)  # one mosaic, one colour range: no "per head"
        induction = st.toggle(
            "Induction probe",
            value=True,
            key="induction",
            help="Also run the model on 50 random tokens repeated twice and score every head on copying "
            "the token after the earlier occurrence (induction heads).",
            wrap=True,
        )
    explorer = ExplorerParams(model=ref.spec, text=ref.text, chat=ref.chat, stack=stack)
    # The mosaic sits on top but is pooled last: the browser draws the statistics and the head
    # finder while the server pools every head, instead of waiting for it.
    top = st.container()
    hm = statistics(lm, res, ref.key, stack, cmap, induction=induction, token=frame.token)
    if hm is not None:
        head_finder(hm, stack, explorer, pickers.kv_heads(res, stack))
    with top:
        every_head(lm.spec, res, ref.key, stack, cmap, choice, explorer)
    if hm is None:
        shell.stop()
    if res.n_tokens <= ROLLOUT_AUTO_TOKENS or st.toggle(
        "Attention rollout",
        key="rollout_on",
        help=f"Where a token's information comes from, layer by layer. Past {ROLLOUT_AUTO_TOKENS:,} "
        "tokens it runs when asked: about half a forward pass of work.",
        wrap=True,
    ):
        flow.rollout_section(lm.spec, res, ref.key, stack, cmap, frame.token)
    state.share_box()


def every_head(
    spec: str,
    res: AttentionResult,
    key: tuple,
    stack: Stack,
    cmap: str,
    choice: str,
    explorer: ExplorerParams,
) -> None:
    """The mosaic of every layer x head on the colour scale ``choice`` (`pickers.scale_picker`);
    a click on a tile opens that head in the explorer."""
    n_layers, n_heads = res.n_layers(stack), res.n_heads
    open_clicked_tile(n_layers, explorer)
    kv = pickers.kv_heads(res, stack)
    view = shown.View(stack=stack)
    ax = shown.axes(res, view)
    st.subheader(f"Every head: {n_layers} layers × {n_heads} heads")
    side = F.mosaic_side(n_layers, n_heads)
    how = "max"
    if max(len(ax.q_idx), len(ax.k_idx)) > side:
        how = st.segmented_control(
            "Pooling", F.POOLS, key="pool", required=True,
            help="Each tile is drawn in blocks: each block's largest weight (max) or its mean.",
        ) or "max"  # required=True: never None  # fmt: skip
    run_key = ("mosaic", key, stack, side, how)
    if progress.cancelled(run_key):
        return
    tiles, pooled_note = [], ""
    q_bins, k_bins = ax.q_labels, ax.k_labels
    slow = len(ax.q_idx) > 256
    with progress.steps("Pooling the layers", run_key, unit="layer") if slow else nullcontext() as report:
        for layer in range(n_layers):
            with guarded("pooling the layers") as caught:  # past the free memory: the message
                img = shown.layer_image(res, key, layer, view, ax, side, how)
            if caught:
                return
            tiles.append(img.z)
            q_bins, k_bins, pooled_note = img.q_labels, img.k_labels, f", {img.note}" if img.note else ""
            if report is not None:
                report(layer + 1, n_layers)
    images = np.stack(tiles)
    st.caption(
        "Columns: layers, rows: heads (the same for every model). Each tile is one head's attention "
        f"pattern (queries down, keys across){pooled_note}."
    )
    scale, note = pickers.scale_for(choice, max(len(ax.q_idx), len(ax.k_idx)))
    layer_names = [res.layout.layer_label(i) for i in range(n_layers)]
    # drawn once by the browser (`ui.heatmaps`: a PNG per tile, each cell's exact value in the
    # hover, a hovered tile enlarged), not a Plotly heatmap of every cell that Streamlit plots twice
    panels = F.mosaic_panels(
        images, q_labels=q_bins, k_labels=k_bins, scale=scale, layer_names=layer_names, kv_heads=kv
    )
    name = F.figure_name(spec, stack if stack != "self" else "", "all_heads")
    heatmaps.show(
        panels, P.colour_bar(scale, cmap, None, images), key=MOSAIC_KEY, cols=n_layers,
        tile_px=MOSAIC_TILE_PX, click="panel", preview=True, name=name,
        col_titles=[n.removeprefix("layer ") for n in layer_names],  # "12" fits a 16 px tile, "L12" not
        row_titles=F.mosaic_row_titles(kv, n_heads),
    )  # fmt: skip
    st.caption("Hover a tile to see it enlarged; click it to open that head in the explorer. " + note)

    def figure() -> go.Figure:  # the download's figure (HTML), made when clicked
        return F.model_mosaic(
            images, colorscale=cmap, scale=scale, kv_heads=kv, q_labels=q_bins, k_labels=k_bins,
            layers_across=True, layer_names=layer_names,
        )  # fmt: skip

    export.html_buttons(lambda: [figure()], name, key="mosaic", what="every head")


def open_clicked_tile(n_layers: int, explorer: ExplorerParams) -> None:
    """A click on a mosaic tile (panel ``head * layers + layer``) opens that head in the explorer,
    before anything is pooled."""
    picked = heatmaps.clicked(MOSAIC_KEY)
    if picked is None or not n_layers:
        return
    state.commit()
    layer, head = picked["panel"] % n_layers, picked["panel"] // n_layers
    st.switch_page(
        shell.PAGES[0].file, query_params=explorer.replace(layer=layer, head=head).to_query().params
    )


def statistics(
    lm: LoadedModel,
    res: AttentionResult,
    key: tuple,
    stack: Stack,
    cmap: str,
    *,
    induction: bool,
    token: str | None,
) -> HeadMetrics | None:
    """The statistics as (layer, head) heatmaps in one chart; the metrics, or None after an error
    (shown)."""
    st.subheader("Head statistics")
    hm = None
    with guarded("computing the head statistics", token):
        with st.spinner("Computing the head statistics…", show_time=True):
            hm, note = head_stats.head_metrics(lm, res, key, stack, induction=induction, token=token)
        if note:
            st.caption(md(note))
    if hm is None:
        return None
    kv = pickers.kv_heads(res, stack)
    kv_coh = hm.kv_coherence()
    panels = []
    for m in hm.metrics:
        values, names = hm.values(m), None
        if m == "gqa_coherence" and kv_coh is not None:
            values = kv_coh  # one value per KV group: its query heads' agreement
            names = [f"kv {g}" for g in range(values.shape[1])]
        bounded = m != "distance"
        panels.append(
            F.MetricPanel(
                values, head_stats.METRIC_NAMES.get(m, m), head_names=names,
                zmin=0.0 if bounded else None, zmax=1.0 if bounded else None,
            )
        )  # fmt: skip
    # one chart for every statistic (it was one chart each: the browser's fixed cost per chart)
    fig = F.metric_panels(panels, kv_heads=kv, colorscale=cmap)
    name = F.figure_name(lm.spec, stack if stack != "self" else "", "head_statistics")
    export.chart(fig, name, key="metrics")
    return hm


def head_finder(hm: HeadMetrics, stack: Stack, explorer: ExplorerParams, kv: list[int] | None) -> None:
    """The heads sorted by a statistic, each with a link to the explorer (``explorer`` with the
    row's layer and head); the KV head of each only with GQA (``kv``)."""
    present = list(hm.metrics)
    st.subheader("Head finder")
    metric = state.choose("metric", present, "metric")
    metric = st.selectbox(
        "Sort by", present, key="metric", format_func=lambda m: head_stats.METRIC_NAMES.get(m, m)
    )
    rows = sorted(hm.to_rows(), key=lambda r: -float(r[metric]))

    def explorer_link(layer: int, head: int) -> str:
        return explorer.replace(layer=layer, head=head).to_query().url(".", "")

    # a link per row while links are short; with a long (compressed) text only the button below
    linked = len(explorer_link(0, 0)) <= 4_000
    table = {
        "layer": [r["layer"] for r in rows],
        "head": [r["head"] for r in rows],
        **({"kv head": [r["kv_head"] for r in rows]} if kv else {}),  # only where heads share K/V
        **({"open": [explorer_link(int(r["layer"]), int(r["head"])) for r in rows]} if linked else {}),
        **{m: [round(float(r[m]), 4) for r in rows] for m in present},
    }
    st.caption("Click a column to sort. Select a row and open it in the explorer, or follow its link.")
    picked = st.dataframe(
        table,
        key="head_table",
        on_select="rerun",
        selection_mode="single-row",
        hide_index=True,
        height=360,
        column_config={
            "open": st.column_config.LinkColumn("open", display_text="explorer ↗"),
            **{
                m: st.column_config.NumberColumn(
                    SHORT.get(m, m), help=head_stats.METRIC_NAMES.get(m, m), format="%.3f"
                )
                for m in present
            },
        },
    )
    selected = list(picked.selection.rows) if picked is not None and picked.selection else []
    if not selected:  # no head named before one is picked (the top row's read as a choice made)
        st.button("Select a row to open its head in the explorer", key="open_head", disabled=True)
        return
    row = rows[selected[0]]
    layer_sel, head_sel = int(row["layer"]), int(row["head"])
    if st.button(
        f"Open layer {layer_sel}, head {head_sel} in the explorer",
        key="open_head",
        type="primary",
        icon=":material/open_in_new:",
    ):
        state.commit()
        target = explorer.replace(layer=layer_sel, head=head_sel).to_query().params
        st.switch_page(shell.PAGES[0].file, query_params=target)


main()
