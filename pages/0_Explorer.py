"""Explorer: type a sentence, pick a model, see every head of a layer and one head up close.

The page reads top to bottom: the result (cached per model and text), its summary, then one
fragment with the layer's controls, the layer grid (`ui.layer_grid`), the big head
(`ui.head_view`) and the token views (`ui.token_views`). A head change reruns the fragment: the
model never reruns, the grid's data are cached and unchanged (the browser keeps them and moves
the frame). The fragment gets a `models.ResultRef` and fetches the result when it runs:
Streamlit keeps fragments (and this page's globals) for the session's lifetime, so a result in
a global or a closure would stay alive outside the bounded result cache.
"""

import streamlit as st

from attnviz import AttentionResult
from attnviz import figures as F
from ui import attention, head_view, layer_grid, longview, models, shell, state, token_views, views
from ui.attention import Drawing
from ui.params import ExplorerParams
from ui.text import md

STACK_NAMES = {
    "self": "self",
    "encoder": "encoder",
    "decoder": "decoder",
    "cross": "cross (decoder → encoder)",
}

frame = shell.begin(ExplorerParams)
st.title("Attention explorer")


def summary(res: AttentionResult) -> None:
    """The model line and the token table (each token as text; a split character's pieces)."""
    st.caption(
        f"**{md(res.model_name)}** · {models.describe_layout(res.layout)} · {res.n_tokens} tokens · "
        f"{res.method or res.path}, extracted in {res.seconds:.2f} s"
        + (f" · {res.check.caption()}" if res.check else "")
        + (" · rows give part of their weight to learned sinks (they sum to < 1)" if res.has_sinks else "")
    )
    with st.expander(f"Tokens ({res.n_tokens})", expanded=False):
        toks = res.tokens
        table = {"position": list(range(len(toks))), "token": list(toks.display), "id": list(toks.ids)}
        if any(toks.pieces):
            table["pieces"] = list(toks.pieces)
        table |= {"special": list(toks.special), "chat template": list(toks.template)}
        st.dataframe(table, hide_index=True, height=min(400, 36 + 35 * len(toks)))


def controls(ref: models.ResultRef, res: AttentionResult) -> Drawing | None:
    """The layer and view controls; what the run draws (None: nothing to draw, message shown)."""
    stack = attention.stack_picker(res.stacks, lambda s: STACK_NAMES.get(s, s))
    n_layers = res.n_layers(stack)
    state.clamp("layer", 0, n_layers - 1, "layer")
    c1, c2, c3 = st.columns([4, 3, 3])
    with c1:
        layer = int(
            st.slider("Layer", 0, n_layers - 1, key="layer")
            if n_layers > 1
            else st.number_input("Layer", 0, 0, key="layer")
        )
    with c2:
        cmap = str(st.selectbox("Colour map", F.COLORSCALES, key="cmap"))
        choice = views.scale_picker()
    with c3:
        hide = st.toggle("Hide special tokens", key="hide", help=HIDE_HELP)
        nosink = st.toggle("Renormalise without the sink", key="nosink", help=NOSINK_HELP)
        vw = st.toggle("Value-weighted", key="vw", help=VW_HELP)
    shown, key = views.value_weighted(ref, res, vw)
    view = attention.View(stack=stack, hide=hide, nosink=nosink)
    ax = attention.axes(shown, view)
    n = max(len(ax.q_idx), len(ax.k_idx))
    if min(len(ax.q_idx), len(ax.k_idx)) == 0:
        st.info("Every token is hidden by the options above; turn 'Hide special tokens' off.")
        return None
    scale, note = views.scale_for(choice, n)
    side = F.grid_side(res.n_heads, n_tokens=n)
    how = "max"
    if n > side and longview.applies(shown, view, ax):
        with c2:
            how = st.segmented_control(
                "Pooling", F.POOLS, key="pool", required=True,
                help="A long text is drawn in blocks: each block's largest weight (max) or its mean.",
            ) or "max"  # required=True: never None  # fmt: skip
    kv = attention.kv_heads(res, stack)
    return Drawing(shown, key, view, layer, ax, kv, cmap, choice, scale, note, side, how)


HIDE_HELP = (
    "Drop special and chat-template tokens from both axes and renormalise each row over the keys left."
)
NOSINK_HELP = "Drop key 0 (the first token, where many heads park attention) and renormalise each row."
VW_HELP = (
    "‖α·W_O v‖ (Kobayashi et al. 2020): each weight times the norm of what that key's value adds to "
    "the output, relative to the layer's largest; a sink with a tiny value fades."
)


@st.fragment
def layer_view(ref: models.ResultRef) -> None:
    """The layer grid, the big head and the token views; a control here reruns only this part."""
    res = models.result(ref)
    if res is None:
        return
    d = controls(ref, res)
    if d is None:
        state.share_box()
        return
    head = head_view.current(res.n_heads)
    left, right = st.columns([1, 1], gap="medium")
    # the big head first when it needs nothing from the grid (log / rank / per head: no shared
    # maximum): on a long text it is one head to pool where the grid is all of them
    head_first = d.scale != "linear" or d.choice == "perhead"
    if head_first:
        with right:
            head_view.draw(ref, d, head, None)
    with left:
        drawn, zmax = layer_grid.draw(ref, d, head)
    if drawn and not head_first:
        with right:
            head_view.draw(ref, d, head, zmax)
    if drawn:
        st.subheader("Tokens")
        names = [F.head_title(h, d.kv[h] if d.kv else None) for h in range(res.n_heads)]
        token_views.draw(ref, d.res, d.key, d.stack, d.layer, head, names, d.scale)
    state.share_box()


def main() -> None:
    """The model and the result stay locals of this run; the fragment gets the ref."""
    _, res, ref = shell.load_and_extract(frame)
    summary(res)
    layer_view(ref)


main()
