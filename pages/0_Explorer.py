"""Explorer: type a sentence, pick a model, see every head of a layer and one head up close.

The page reads top to bottom: the result (cached per model and text), its summary, then a
fragment with the layer's controls (`layer_controls`) and grid (`layer_grid`), and inside it a
fragment with the big head (`big_head`) and the token views (`token_views`), all in ui/explorer/. A layer
change reruns the first; a head change only the second (the grid is not sent again); the model
never reruns. The fragments get a `models.ResultRef` and fetch the result when they run:
Streamlit keeps fragments (and this page's globals) for the session's lifetime, so a result in
a global or a closure would stay alive outside the bounded result cache.
"""

import streamlit as st

from attnviz import AttentionResult
from attnviz import figures as F
from ui import heatmaps, mixers, models, shell, shown, state
from ui.explorer import big_head, exactness, layer_controls, layer_grid, token_views
from ui.params import ExplorerParams
from ui.text import md

# The first screen at 1280x800 holds the grid and the big head: less room above the title
FIRST_SCREEN_CSS = "<style>[data-testid='stMainBlockContainer']{padding-top:2.5rem}</style>"
frame = shell.begin(ExplorerParams)
st.html(FIRST_SCREEN_CSS)
st.title("Attention explorer")
READING = (
    "How to read a heatmap: **row = query** (the token that attends), **column = key** (the token it "
    "attends to); each row's weights sum to 1. Brighter = more attention."
)


def summary_sentence(res: AttentionResult) -> str:
    """One plain sentence: the model, the text's length and whether the weights are checked; a
    hybrid's blocks counted as blocks ("1 layers of 4 heads" named a 4-block hybrid)."""
    lay = res.layout

    def many(n: int, what: str) -> str:
        return f"{n} {what}" + ("" if n == 1 else "s")

    if models.mixer_line(lay) or not lay.n_layers:  # a hybrid or a pure recurrent model
        shape = many(len(lay.mixers), "block")
        shape += f", {many(lay.n_layers, 'softmax attention layer')}" if lay.n_layers else ""
    else:
        shape = f"{many(lay.n_layers, 'layer')} of {many(lay.n_heads, 'head')}"
    checked = "checked against eager attention" if res.checks else "not checked against eager attention"
    return (
        f"**{md(res.model_name)}** read {res.n_tokens} tokens through {shape}; the weights are its own, "
        + (f"{checked}.")
    )


def summary(res: AttentionResult) -> None:
    """One sentence; the details (model line, the check, how to read a map, the token table:
    each token as text, a split character's pieces) in an expander."""
    st.markdown(summary_sentence(res))
    with st.expander(f"Details: the model, the check, how to read a map, the {res.n_tokens} tokens"):
        st.caption(
            f"**{md(res.model_name)}** · {models.describe_layout(res.layout)} · {res.n_tokens} tokens · "
            f"{res.method or res.path}, extracted in {res.seconds:.2f} s"
            + (f" · {res.check_caption()}" if res.checks else "")
            + (
                " · rows give part of their weight to learned sinks (they sum to < 1)"
                if res.has_sinks
                else ""
            )
        )
        if not mixers.applies(res.layout):  # a hybrid's block says how to read its own maps
            st.caption(READING)
        toks = res.tokens
        table = {"position": list(range(len(toks))), "token": list(toks.display), "id": list(toks.ids)}
        if any(toks.pieces):
            table["pieces"] = list(toks.pieces)
        # ticks as text: checkboxes in a read-only table looked editable
        table |= {name: ["✓" if f else "" for f in flags] for name, flags in
                  (("special", toks.special), ("chat template", toks.template))}  # fmt: skip
        st.dataframe(table, hide_index=True, height=min(400, 36 + 35 * len(toks)))


@st.fragment
def layer_view(ref: models.ResultRef) -> None:
    """The layer's controls and grid; the big head and the token views are a fragment inside
    it, so a head change reruns only them (the grid is not sent again)."""
    state.reseed()
    res = models.result(ref)
    if res is None:
        return
    pool_column = layer_controls.draw(res)
    big_head.current(res.n_heads)  # a click on a grid tile becomes the head before anything is drawn
    d = layer_controls.drawing(ref, res)
    if d is None:
        state.share_box()
        return
    mixers.attention_note(res.layout, d.stack, d.layer)  # zaya / inkling: a conv the maps miss
    if d.n_shown > d.side and shown.applies(d.res, d.view, d.ax):
        with pool_column:
            st.segmented_control(
                "Pooling", F.POOLS, key="pool", required=True,
                help="A long text is drawn in blocks: each block's largest weight (max) or its mean.",
            )  # fmt: skip
    left, right = st.columns([1, 1], gap="medium")
    # the big head first when it needs nothing from the grid (log / rank / per head: no shared
    # maximum): on a long text it is one head to pool where the grid is all of them
    shared = d.scale == "linear" and d.choice != "perhead"
    zmax = None
    if shared:
        with left:
            drawn, zmax = layer_grid.draw(ref, d)
        if not drawn:
            state.share_box()
            return
    with right, layer_controls.shared(ref, d):  # the head fragment reuses this run's drawing
        head_panel(ref, zmax)
    if not shared:
        with left:
            layer_grid.draw(ref, d)
    with left:  # under the grid: is the layer on screen exact?
        exactness.draw(ref, res, d.stack, d.layer)


@st.fragment
def head_panel(ref: models.ResultRef, zmax: float | None) -> None:
    """The head picker, the big head and the token views: a head change reruns only this."""
    state.reseed()
    res = models.result(ref)
    d = layer_controls.drawing(ref, res) if res is not None else None
    if res is None or d is None:
        return
    head = big_head.current(res.n_heads)
    big_head.draw(ref, d, head, zmax)
    st.subheader("Tokens")
    names = [F.head_title(h, d.kv[h] if d.kv else None) for h in range(res.n_heads)]
    token_views.draw(ref, d.res, d.key, d.stack, d.layer, head, names, d.scale, d.cmap)
    state.share_box()  # here: a head change inside this fragment moves the link too
    heatmaps.mark(big_head.GRID_KEY, head)  # the grid's frame moves to the open head (in the browser)


def main() -> None:
    """The model and the result stay locals of this run; the fragment gets the ref."""
    _, res, ref = shell.load_and_extract(frame)
    summary(res)
    block = mixers.block_picker(res) if mixers.applies(res.layout) else None  # hybrids: every block
    if block is not None:
        st.caption(mixers.reading(res, block))  # signed maps: rows do not sum to 1
        mixers.draw(ref, res, block)
        return
    if mixers.applies(res.layout):  # a hybrid's attention block: its reading line here
        st.caption(READING)
    layer_view(ref)


main()
