"""The Explain page's views: routes, logit lens, attribution and ablation, over one cached trace.

Every view reads one `attnviz.explain.Trace` (a hybrid's routes: a `BlockTrace`; one forward, cached
per model / text), so switching views or options never reruns the model, except the ablation. Waits
show a progress bar with Cancel (stops at the next layer, keeps nothing). A clicked head opens in
the explorer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import streamlit as st

from attnviz import AttnvizError, LoadedModel
from attnviz import explain as X
from attnviz.figures import explain as FX
from attnviz.figures import figure_name
from attnviz.server.settings import settings
from ui import clicks, export, gate, models, progress, shell, state
from ui.params import ExplainParams, ExplorerParams
from ui.text import guarded, md

TRACE_ENTRIES = 2  # traces kept per process (one is ~0.6 GiB at 2,048 tokens on smollm2-135m)
TRACE_BYTES = 3 * 2**30


@st.cache_resource(show_spinner=False)
def traces() -> models.ResultCache:
    """Traces in a cache of their own: one is larger than the shared derived-values budget, so
    there it would push out every other page's values and then be pushed out by its own graph."""
    return models.ResultCache(TRACE_ENTRIES, TRACE_BYTES)


def computed(
    name: str,
    key: tuple,
    what: str,
    build: Callable[[Callable[[int, int], None]], Any],
    store: models.ResultCache | None = None,
    unit: str = "layer",
) -> Any:
    """``build(progress)`` once per key (bounded cache: ``store``, else the shared derived
    values); while it runs a bar ("``unit`` 3 of 12") and Cancel show. None when this work was
    cancelled."""
    full = (name, *key)
    if progress.cancelled(full):
        return None

    def run() -> Any:
        with gate.turn() as check, progress.steps(what, full, unit=unit, keeps=False) as report:
            return build(gate.checked(report, check))  # demo: the one queue

    if store is None:
        return models.cached(name, key, run, nbytes=lambda v: getattr(v, "nbytes", 1 << 20))
    hit = store.get(full)
    if hit is None:
        hit = run()
        store.put(full, hit, int(getattr(hit, "nbytes", 1 << 20)))
    return hit


def load_trace(
    lm: LoadedModel, p: ExplainParams, token: str | None, chat: bool
) -> tuple[X.Trace | None, tuple]:
    """The trace of the sidebar's text (one forward, cached), or None after an error / a cancel."""
    key = (lm.spec, models.token_key(token), p.text, chat)
    tr = None
    with guarded(f"tracing {md(lm.spec)} on the text", token, (lm.spec, p.text)):
        max_tokens = settings().max_tokens
        tr = computed(
            "explain_trace",
            key,
            f"Running {md(lm.spec)} on the text (keeping the residual stream)",
            lambda report: X.trace(lm, p.text, chat=chat, max_tokens=max_tokens, progress=report),
            traces(),
        )
    return tr, key


def load_stream(
    lm: LoadedModel, p: ExplainParams, token: str | None, chat: bool
) -> tuple[X.Stream | None, tuple]:
    """A hybrid's or recurrent model's residual stream at block boundaries (one forward, cached),
    or None after an error."""
    key = (lm.spec, models.token_key(token), p.text, chat, "stream")
    got = None
    with guarded(f"reading {md(lm.spec)}'s residual stream", token, (lm.spec, p.text)):
        max_tokens = settings().max_tokens
        got = computed(
            "explain_stream",
            key,
            f"Running {md(lm.spec)} on the text (keeping the stream at every block boundary)",
            lambda _r: X.stream(lm, p.text, chat=chat, max_tokens=max_tokens),
        )
    return got, key


def block_attribution(lm: LoadedModel, stream: X.Stream) -> None:
    """A hybrid's / recurrent model's direct logit attribution by block part (a table, largest
    first), with its sum check."""
    att = X.block_attribution(lm, stream)
    st.dataframe(att.to_frame().round(4), hide_index=True)
    if att.heads:  # per-head mixers split by head through their out_proj
        st.dataframe(att.head_frame().round(4), hide_index=True)
    st.caption(
        f"Direct contributions to the logit of {md(att.target_token)} at the last token "
        f"({att.logit:.4f}): the embedding, each block's mixers (each branch on its own) and MLP, "
        f"through the final norm frozen at its scale; they sum to it within {abs(att.error):.1e}. "
        + " ".join(att.notes)
    )


def open_in_explorer(p: ExplainParams, layer: int, head: int, token: int, label: str, key: str) -> None:
    """A button that opens ``layer``/``head`` of this text in the explorer (query row ``token``)."""
    if st.button(label, key=key, icon=":material/open_in_new:", type="primary"):
        state.commit()
        target = ExplorerParams(model=p.model, text=p.text, chat=p.chat, layer=layer, head=head, tok=token)
        st.switch_page(shell.PAGES[0].file, query_params=target.to_query().params)


PICKER_OPTIONS = 512  # longer texts pick the position by number (a selectbox would send every token)


def position_picker(tr: X.Trace | X.BlockTrace) -> int:
    """The explained position: the last token unless the link / the picker says otherwise."""
    n = tr.n_tokens
    if not -1 <= int(state.get("pos")) < n:
        state.put("pos", -1)
    help_text = "Whose next-token prediction is explained: its routes, attribution and ablation."
    if n > PICKER_OPTIONS:
        choice = st.number_input(
            f"Explain the prediction at position (0 .. {n - 1}; -1: the last token)",
            min_value=-1,
            max_value=n - 1,
            step=1,
            key="pos",
            help=help_text,
        )
        at = tr.position(int(choice))
        st.caption(f"Position {at}: {md(tr.tokens.display[at])}")
        return at
    choice = st.selectbox(
        "Explain the prediction at",
        [-1, *range(n - 1, -1, -1)],
        key="pos",
        format_func=lambda i: (
            f"the last token ({n - 1}) {tr.tokens.display[-1]}"
            if i == -1
            else f"({i}) {tr.tokens.display[i]}"
        ),
        help=help_text,
    )
    return tr.position(int(choice))


def routes(lm: LoadedModel, tr: X.Trace | X.BlockTrace, key: tuple, p: ExplainParams, pos: int) -> None:
    thr = st.slider(
        "Threshold",
        0.0,
        0.5,
        key="thr",
        step=0.01,
        help="Edges whose importance (renormalised per target token, as in the paper; LLM-TT's "
        "FFN block sums over every token instead, a bug) is above this are kept; only "
        "their tokens are followed further down. Lower: a bigger graph.",
    )
    graph = computed(
        "explain_routes",
        (*key, pos, float(thr)),
        "Building the routes",
        lambda report: X.information_flow(lm, tr, token=pos, threshold=float(thr), progress=report),
    )
    if graph is None:
        return
    fig = FX.flow_view(graph)
    event = export.chart(
        fig,
        figure_name(lm.spec, "routes", pos),
        key="routes_chart",
        on_select=True,
        vector_key="routes_vector",
    )
    picked = clicks.clicked(event, "routes_chart")
    if picked:  # in the link ("edge"): a shared view opens with the same edge picked
        state.put("edge", ".".join(str(x) for x in picked[:5]))
    marks = {
        ".".join(str(x) for x in d[:5]) for t in fig.data if t.customdata is not None for d in t.customdata
    }
    # a mark of this very graph only (kept for when the threshold comes back)
    edge = str(state.get("edge")).split(".") if state.get("edge") in marks else []
    n_mix = sum(e.kind == "mixer" for e in graph.edges)
    n_attn = n_mix + sum(e.kind == "attention" for e in graph.edges)
    st.caption(
        f"{len(graph.edges)} edges ({n_attn} attention"
        + (f", of which {n_mix} mixer" if graph.parts else "")
        + f") over {len({n.token for n in graph.nodes})} tokens; "
        f"{graph.expanded} block rows computed for {tr.n_tokens} tokens. Grey: the residual stream; blue: "
        "attention (width = importance); "
        + ("green: a mixer's c_(t,s), gates frozen; " if graph.parts else "")
        + "orange squares: the FFN's share. Click a dot on an edge to pick "
        "its head (and see what it writes), a node for what the block below it writes; "
        "lower the threshold for weaker routes."
        + (
            " Most kept edges are the residual stream: a token's own stream usually carries most of "
            "what the block writes there, so one key token's share rarely passes the threshold."
            if n_attn * 4 < len(graph.edges)
            else ""
        )
        + "".join(f" {note}" for note in graph.notes)
    )
    picked_edge = len(edge) >= 4 and 0 <= int(edge[0]) < tr.n_layers
    if picked_edge:
        layer, head, src, dst = (int(x) for x in edge[:4])
        part = str(edge[4]) if len(edge) > 4 else "attention"
        node_section(lm, tr, key, layer, head, dst, part)
    if picked_edge and int(edge[1]) >= 0 and isinstance(tr, X.Trace):  # (a hybrid's blocks aren't its layers)
        layer, head, src, dst = (int(x) for x in edge[:4])
        open_in_explorer(
            p,
            layer,
            head,
            dst,
            f"Open layer {layer}, head {head} ({md(tr.tokens.labels[src])} → {md(tr.tokens.labels[dst])}) "
            "in the explorer",  # the edge's own wording in the chart's hover: source → target
            "routes_open",
        )
    with st.expander("Edges as a table"):
        df = graph.to_frame()
        st.dataframe(df, hide_index=True, height=300)
        st.download_button("⬇ CSV", df.to_csv(index=False), file_name=f"{figure_name(lm.spec, 'routes')}.csv")


def node_section(
    lm: LoadedModel, tr: X.Trace | X.BlockTrace, key: tuple, layer: int, head: int, pos: int, part: str
) -> None:
    """What the clicked node (a block's output) or edge (its strongest head) writes at its token:
    the tokens it promotes and suppresses (`attnviz.explain.node_writes`)."""
    result = computed(
        "explain_writes",
        (*key, layer, head, pos, part),
        "Projecting on the vocabulary",
        lambda _r: X.node_writes(lm, tr, layer, pos, part=part, head=head, k=10),  # type: ignore[arg-type]
    )
    if result is None:
        return
    st.markdown(f"**What {result.name} writes at {md(tr.tokens.labels[pos])}** (‖v‖ = {result.norm:.3g})")
    c1, c2 = st.columns(2)
    for col, title, rows in ((c1, "Promoted", result.promoted), (c2, "Suppressed", result.suppressed)):
        col.dataframe(
            {title: [t for t, _, _ in rows], "Δlogit": [round(v, 4) for _, _, v in rows]},
            hide_index=True,
        )
    st.caption(f"Δlogit: its {result.meaning}.")


def lens(lm: LoadedModel, tr: X.Trace | X.Stream, key: tuple) -> None:
    c1, c2 = st.columns(2)
    most = min(64, tr.n_tokens)
    if int(state.get("lpos")) > most:  # a short text has fewer positions than the default 16
        state.put("lpos", most)
    n_pos = c1.slider("Positions (the last ones)", 1, most, key="lpos") if most > 1 else 1
    k = c2.slider("Top k in the hover", 1, 20, key="k")
    positions = list(range(tr.n_tokens - int(n_pos), tr.n_tokens))
    result = computed(
        "explain_lens",
        (*key, int(n_pos), int(k)),
        "Reading every layer",
        lambda _r: X.logit_lens(lm, tr, positions, int(k)),
    )
    if result is None:
        return
    export.chart(FX.lens_view(result), figure_name(lm.spec, "lens"), key="lens_chart")
    st.caption(
        "Each cell: the stream after that layer read by the model's own final norm and unembedding "
        "(top token, its probability as colour); the last row is the model's prediction. Hover for the "
        "top k and the rank of the final prediction."
    )


def attribution(lm: LoadedModel, tr: X.Trace, key: tuple, p: ExplainParams, pos: int) -> None:
    c1, c2 = st.columns(2)
    target = c1.text_input("Token (empty: the prediction)", key="target", max_chars=64)
    contrast = c2.text_input("Minus the logit of (optional)", key="contrast", max_chars=64)
    att = None
    with guarded("attributing the logit", None, (target, contrast)):
        att = models.cached(
            "explain_dla",
            (*key, pos, target, contrast),
            lambda: X.logit_attribution(lm, tr, token=pos, target=target or None, contrast=contrast or None),
            nbytes=lambda _a: 1 << 16,
        )
    if att is None:
        return
    event = export.chart(
        FX.attribution_view(att), figure_name(lm.spec, "dla", pos), key="dla_chart", on_select=True
    )
    st.caption(
        f"Each head's and MLP's own write to the stream, read through the final norm frozen at its scale: "
        f"they and the rest ({att.rest:.3g}: biases and norm constants) add up to the logit "
        f"{att.logit:.4g} (rounding {abs(att.error):.1e}). Click a head (a cell or a bar) or pick it in "
        "the table to open it in the explorer." + (f" {tr.notes[0]}" if tr.notes else "")
    )
    ranked = att.ranking(40)
    table = {
        "part": [
            f"L{r[1]} H{r[2]}" if r[0] == "head" else (f"MLP {r[1]}" if r[0] == "mlp" else r[0])
            for r in ranked
        ],
        "contribution": [round(r[3], 4) for r in ranked],
    }
    picked = st.dataframe(
        table, key="dla_table", on_select="rerun", selection_mode="single-row", hide_index=True, height=300
    )
    clicked = clicks.clicked(event, "dla_chart")
    if clicked and len(clicked) >= 2 and int(clicked[1]) >= 0:
        state.remember("dla_head", (int(clicked[0]), int(clicked[1])))
    rows = list(picked.selection.rows) if picked is not None and picked.selection else []
    row = ranked[rows[0]] if rows else None
    points = [{"customdata": [row[1], row[2]]}] if row is not None and row[0] == "head" else []
    if clicks.clicked({"selection": {"points": points}}, "dla_table"):  # a new pick in the table
        state.remember("dla_head", (row[1], row[2]))  # type: ignore[index]
    chosen = state.recall("dla_head")
    if chosen and 0 <= chosen[0] < tr.n_layers and 0 <= chosen[1] < tr.n_heads:
        layer, head = chosen
        share = float(att.heads[layer, head])
        open_in_explorer(
            p, layer, head, pos, f"Open layer {layer}, head {head} ({share:+.3f}) in the explorer", "dla_open"
        )


def ablation(lm: LoadedModel, tr: X.Trace, key: tuple, p: ExplainParams, pos: int) -> None:
    names = [f"{layer}.{head}" for layer in range(tr.n_layers) for head in range(tr.n_heads)]
    chosen = [h for h in (p.abl.split(",") if p.abl else []) if h in names]
    c1, c2, c3 = st.columns([2.5, 1.2, 1.6])
    picked = c1.multiselect(
        "Heads to ablate (layer.head)", names, default=chosen, key="abl_pick", max_selections=64
    )
    state.put("abl", ",".join(picked))
    mode = c2.segmented_control("Replace by", list(X.MODES), key="amode", required=True)
    target = c3.text_input("Token (empty: the prediction)", key="target", max_chars=64)
    if not picked:
        st.info("Pick heads to ablate: the model runs again with their outputs replaced.")
        return
    heads = [(int(a), int(b)) for a, _, b in (h.partition(".") for h in picked)]
    ab = None
    with guarded("ablating heads", None, (target,)):
        ab = computed(
            "explain_ablation",
            (*key, pos, tuple(heads), str(mode), target),
            "Running the model with the heads replaced",
            lambda report: X.ablate_heads(
                lm,
                tr,
                heads,
                str(mode),  # type: ignore[arg-type]
                token=pos,
                target=target or None,
                progress=report,
            ),
        )
    if ab is None:
        return
    m = st.columns(4)
    m[0].metric(f"p(“{ab.target_token}”)", f"{ab.prob_after:.3f}", f"{ab.prob_after - ab.prob_before:+.3f}")
    m[1].metric("KL(before ‖ after)", f"{ab.kl:.4f}")
    m[2].metric(  # the effect is the number, the new logit its note (20.289 read as the effect)
        f"logit(“{ab.target_token}”): total effect",
        f"{ab.total_effect:+.3f}",
        f"{ab.logit_before:.3f} → {ab.logit_after:.3f}",
        delta_color="off",
        delta_arrow="off",
    )
    m[3].metric("direct effect", f"{ab.direct_effect:+.3f}" if ab.direct else "n/a")
    export.chart(FX.ablation_view(ab), figure_name(lm.spec, "ablation", pos), key="ablation_chart")
    st.caption(
        "Total effect: the change of the token's logit when the heads are replaced (zero, or their mean "
        "output over this text) and the model runs again. Direct effect: what their own writes to the "
        "stream changed in that logit, through the final norm frozen before the ablation; the difference "
        f"({ab.total_effect - ab.direct_effect:+.3f}) is what later layers did with them."
    )
    if ab.direct:
        att = models.cached(
            "explain_dla_id",
            (*key, pos, ab.target),
            lambda: X.logit_attribution(lm, tr, token=pos, target=ab.target),
            nbytes=lambda _a: 1 << 16,
        )
        st.dataframe(
            {
                "head": [f"L{layer} H{head}" for layer, head in ab.heads],
                "direct attribution": [round(float(att.heads[h]), 4) for h in ab.heads],
                f"direct effect of the {ab.mode} ablation": [round(ab.direct[h], 4) for h in ab.heads],
            },
            hide_index=True,
        )


def when_unsupported(err: AttnvizError) -> None:
    st.error(str(err), icon=":material/block:")
