"""Explorer: type a sentence, pick a model, see every head of a layer and one head up close.

The fragments and the download callables get a `models.ResultRef` and fetch the result when they
run: Streamlit keeps them (and this page's globals) for the session's lifetime, so a result in
a global or a closure would stay alive outside the bounded result cache.
"""

import contextlib

import numpy as np
import streamlit as st

from attnviz import AttentionResult
from attnviz import figures as F
from ui import attention, export, longview, models, shell, state, views
from ui.params import ExplorerParams
from ui.text import guarded, md

_PENDING_HEAD = "_attnviz_pending_head"  # a head clicked in the grid, applied on the rerun
STACK_NAMES = {
    "self": "self",
    "encoder": "encoder",
    "decoder": "decoder",
    "cross": "cross (decoder → encoder)",
}

frame = shell.begin(ExplorerParams)
st.title("Attention explorer")


def summary(res: AttentionResult) -> None:
    """The model line and the token table."""
    st.caption(
        f"**{md(res.model_name)}** · {models.describe_layout(res.layout)} · {res.n_tokens} tokens · "
        f"{res.method or res.path}, extracted in {res.seconds:.2f} s"
        + (f" · {res.check_caption()}" if res.checks else "")
        + (" · rows give part of their weight to learned sinks (they sum to < 1)" if res.has_sinks else "")
    )
    with st.expander(f"Tokens ({res.n_tokens})", expanded=False):
        toks = res.tokens
        st.dataframe(
            {
                "position": list(range(len(toks))),
                "token": list(toks.display),
                "id": list(toks.ids),
                "special": list(toks.special),
                "chat template": list(toks.template),
            },
            hide_index=True,
            height=min(400, 36 + 35 * len(toks)),
        )


@st.fragment
def view(ref: models.ResultRef) -> None:
    """Layer and colour controls redraw only this part; the model never reruns."""
    res = models.result(ref)
    if res is None:
        return
    if _PENDING_HEAD in st.session_state:  # before the head selector is drawn
        state.put("head", st.session_state.pop(_PENDING_HEAD))
    stack = attention.stack_picker(res.stacks, lambda s: STACK_NAMES.get(s, s))
    n_layers, n_heads = res.n_layers(stack), res.n_heads
    state.clamp("layer", 0, n_layers - 1, "layer")
    kv = attention.kv_heads(res, stack)

    c1, c2, c3 = st.columns([4, 3, 3])
    with c1:
        layer = (
            st.slider("Layer", 0, n_layers - 1, key="layer")
            if n_layers > 1
            else st.number_input("Layer", 0, 0, key="layer")
        )
    with c2:
        cmap = st.selectbox("Colour map", F.COLORSCALES, key="cmap")
        choice = views.scale_picker()
    with c3:
        hide = st.toggle(
            "Hide special tokens",
            key="hide",
            help="Drop special and chat-template tokens from both axes and renormalise each row "
            "over the keys left.",
        )
        nosink = st.toggle(
            "Renormalise without the sink",
            key="nosink",
            help="Drop key 0 (the first token, where many heads park attention) and renormalise each row.",
        )
        vw = st.toggle(
            "Value-weighted",
            key="vw",
            help="‖α·W_O v‖ (Kobayashi et al. 2020): each weight times the norm of what that key's "
            "value adds to the output, relative to the layer's largest; a sink with a tiny value fades.",
        )
    shown, key = views.value_weighted(ref, res, vw)

    v = attention.View(stack=stack, hide=hide, nosink=nosink)
    ax = attention.axes(shown, v)
    scale, scale_note = views.scale_for(choice, max(len(ax.q_idx), len(ax.k_idx)))
    if len(ax.q_idx) == 0 or len(ax.k_idx) == 0:
        st.info("Every token is hidden by the options above; turn 'Hide special tokens' off.")
        state.share_box()
        return

    side = F.grid_side(n_heads, n_tokens=max(len(ax.q_idx), len(ax.k_idx)))
    how = "max"
    if max(len(ax.q_idx), len(ax.k_idx)) > side and longview.applies(shown, v, ax):
        with c2:
            how = st.segmented_control(
                "Pooling", F.POOLS, key="pool", required=True,
                help="A long text is drawn in blocks: each block's largest weight (max) or its mean.",
            ) or "max"  # required=True: never None  # fmt: skip
    left, right = st.columns([1, 1], gap="medium")
    # The big head first when it needs nothing from the grid (log / rank / per head: no shared
    # maximum): on a long text it is one head to pool where the grid is all of them, so the
    # first view comes sooner; the grid follows in the left column.
    head_first = scale != "linear" or choice == "perhead"
    if head_first:
        with right:
            head_view(ref, shown, stack, layer, v, ax, kv, cmap, scale, None, how)
    with left:
        colour = (choice, scale, scale_note)
        drawn, zmax = layer_grid(ref, shown, key, stack, layer, v, ax, kv, cmap, colour, side, how)
    if not drawn:  # past the free memory (the message is shown)
        state.share_box()
        return
    if not head_first:
        with right:
            head_view(ref, shown, stack, layer, v, ax, kv, cmap, scale, zmax, how)
    st.subheader("Tokens")
    names = [F.head_title(h, kv[h] if kv else None) for h in range(n_heads)]
    views.token_section(ref, shown, stack, layer, int(state.get("head")), names, scale)
    state.share_box()


def layer_grid(ref, res, key, stack, layer, v, ax, kv, cmap, colour, side, how) -> tuple[bool, float | None]:
    """Every head of the layer, the selected one framed; a click on a head's corner square
    selects it. ``colour`` = (choice, scale, note). Returns (drawn, the shared colour maximum:
    None when each head has its own range or for rank); not drawn: the message is shown."""
    choice, scale, scale_note = colour
    n_heads = res.n_heads
    big = len(ax.q_idx) * len(ax.k_idx) > 1 << 20
    spin = st.spinner("Pooling the heads…", show_time=True) if big else contextlib.nullcontext()
    with guarded("pooling the heads") as caught, spin:  # past the free memory: the message
        img = longview.grid(res, key, layer, v, ax, side, how)
    if caught:
        return False, None
    pooled, q_lab, k_lab = img.z, img.q_labels, img.k_labels
    pooled_note = f" · {img.note}" if img.note else ""
    layer_name = res.layout.layer_label(layer)
    st.markdown(f"**{layer_name.capitalize()}: all {n_heads} heads**{pooled_note}")
    if img.caveat:
        st.caption(img.caveat)
    if kv:
        st.caption("Rows are KV groups: the query heads of a row share one key/value head (GQA).")
    head = state.clamp("head", 0, n_heads - 1, "head")
    shared = choice != "perhead" and scale != "rank" and pooled.size  # one range for grid and big view
    zmax = float(pooled.max()) if shared else None
    grid_fig = F.head_grid(
        pooled, q_lab, k_lab, kv_heads=kv, colorscale=cmap, scale=scale, zmax=zmax, selected=head,
        pickable=True,
    )  # fmt: skip
    name = F.figure_name(ref.name, stack if stack != "self" else "", f"L{layer}")
    event = export.chart(grid_fig, name, key="grid_chart", on_select=True)
    picked = views.clicked(event, "grid_chart")
    if picked and int(picked[0]) != head:
        # the head selector may already be drawn in this run: set it on the rerun
        st.session_state[_PENDING_HEAD] = int(picked[0])
        st.rerun()  # redraw the grid with the new head framed
    st.caption("Click a head's corner square to show it big. " + scale_note)
    export.html_buttons(lambda: [grid_fig], name, key="grid", what="this layer's grid")
    return True, zmax


def head_view(ref: models.ResultRef, res, stack, layer, v, ax, kv, cmap, scale, zmax, how) -> None:
    """The head selector and the single-head view (a head change redraws the grid too, to move
    its frame). A text too long to draw whole shows the head block-pooled on the device, or a
    zoomed region at full resolution; with hidden tokens / no sink (or value-weighted), a window
    of exact query rows."""
    n_heads = res.n_heads
    state.clamp("head", 0, n_heads - 1, "head")
    n_q, n_k = len(ax.q_idx), len(ax.k_idx)
    w = attention.window_rows(n_q, n_k)
    c1, c2 = st.columns([1, 1])
    with c1:
        head = attention.head_picker(n_heads, kv)
    sel, cols, mode, note = slice(None), slice(None), "rows", ""
    if w < n_q:
        with c2:
            zoom = st.toggle("Zoom", key="zoom", help="One region of the head at full resolution.")
        if zoom:
            sel, cols = longview.zoom_controls(n_q, n_k)
            mode = "zoom"
            note = f"Query {sel.start}–{sel.stop - 1}, key {cols.start}–{cols.stop - 1} at full resolution."
        elif longview.applies(res, v, ax):
            mode = "pooled"
        else:
            state.clamp("row0", 0, n_q - w, "first query row")
            with c2:
                row0 = st.slider(f"Query rows ({w} of {n_q} at a time)", 0, n_q - w, key="row0", step=1)
            sel = slice(row0, row0 + w)
            if type(res) is AttentionResult:
                note = "A window of exact rows: " + longview.FALLBACK_NOTE + "."

    def matrix(r) -> tuple[np.ndarray, list[str], list[str], str]:
        """(weights, query labels, key labels, how they were made) of the view, from result ``r``."""
        if mode == "pooled":
            img = longview.head(r, ref.key, layer, head, v, ax, how)
            return img.z, img.q_labels, img.k_labels, img.note[0].upper() + img.note[1:] + "."
        if mode == "zoom":
            return longview.zoomed(r, layer, head, v, ax, sel, cols), ax.q_labels[sel], ax.k_labels[cols], ""
        return attention.head_rows(r, layer, head, v, ax, sel), ax.q_labels[sel], ax.k_labels, ""

    waits = mode == "pooled" and n_q * n_k > 1 << 20
    spin = st.spinner("Pooling the head…", show_time=True) if waits else contextlib.nullcontext()
    with guarded("drawing the head") as caught, spin:  # past the free memory: the message
        probs, q_lab1, k_lab1, made = matrix(res)
    if caught:
        return
    note = made or note
    title = f"{ref.name} · {res.layout.layer_label(layer)} · {F.head_title(head, kv[head] if kv else None)}"
    if stack != "self":
        title += f" · {stack}"

    def figure(probs: np.ndarray):
        fig = F.head_heatmap(probs, q_lab1, k_lab1, title=title, colorscale=cmap, scale=scale, zmax=zmax)
        # the title starts at the figure's left edge, not the plot area's: a long text's token
        # labels push the plot area right, and a title anchored there ran past the chart's edge
        return fig.update_layout(title_xref="container", title_x=0, title_pad_l=10)

    def rows_now(rows: slice = sel) -> np.ndarray:  # for the downloads: fetched when clicked
        return attention.head_rows(models.result_now(ref), layer, head, v, ax, rows)  # raw weights

    def shown_now() -> np.ndarray:  # what the view draws (pooled, zoomed or rows), for CSV and HTML
        return matrix(models.result_now(ref))[0]

    head_fig = figure(probs)
    head_name = F.figure_name(ref.name, stack if stack != "self" else "", f"L{layer}", f"H{head}")
    export.chart(head_fig, head_name, key="head_chart")
    notes = [note.rstrip(".")] if note else []
    if v.hide and res.axes(stack)[0].hidden.any():
        notes.append("special/template tokens hidden, rows renormalised")
    if v.nosink:
        notes.append("key 0 dropped, rows renormalised (a causal row 0 has nothing left and shows 0)")
    if notes:
        text = "; ".join(notes)
        st.caption(text[0].upper() + text[1:] + ".")

    export.downloads(
        head_name,
        npz=lambda: export.npz_bytes(
            attention=rows_now(slice(None)),
            query_positions=ax.q_idx,
            key_positions=ax.k_idx,
            query_tokens=np.array(ax.q_labels),
            key_tokens=np.array(ax.k_labels),
            model=ref.name,
            layer=layer,
            head=head,
            stack=stack,
        ),
        csv=lambda: export.csv_text(shown_now(), q_lab1, k_lab1, "query \\ key"),
        fig=lambda: figure(shown_now()),
        key="head",
        what=f"weights of {res.layout.layer_label(layer)}, head {head}",
        shape=(len(ax.q_idx), len(ax.k_idx)),
    )


def main() -> None:
    """The model and the result stay locals of this run; the fragments get the ref."""
    _, res, ref = shell.load_and_extract(frame)
    summary(res)
    view(ref)


main()
