"""Explain: why the model predicts what it predicts. Information-flow routes to a token's
prediction, the logit lens, each head's direct share of the logit and head ablation, all read
from one forward of the text (`attnviz.explain`)."""

import streamlit as st

from attnviz import AttnvizError
from attnviz import explain as X
from ui import models, shell, sidebar, state
from ui.explain import blocks as B
from ui.explain import patching, qk
from ui.explain import views as E
from ui.params import EXPLAIN_VIEWS, ExplainParams
from ui.text import md

frame = shell.begin(ExplainParams)
st.title("Explain a prediction")
st.caption(
    "Information-flow routes (Ferrando & Voita 2024, as in Meta's LLM Transparency Tool), the logit "
    "lens, direct logit attribution and head ablation: exact decompositions of the model's own "
    "forward pass, at any length."
)


def main() -> None:
    p = frame.params
    if not p.model or not p.text.strip():
        st.info("Pick a model and type a text in the sidebar.")
        shell.stop()
    lm = shell.load(p.model, frame.token)
    if frame.cap_slot is not None:
        sidebar.token_cap(lm, frame.cap_slot)
    chat = sidebar.chat_toggle(lm, frame.chat_slot)
    view = st.segmented_control("View", list(EXPLAIN_VIEWS), key="view", required=True)
    if view == "patching":  # two prompts, a trace of neither (ui/explain/patching.py, issue 33)
        patching.page(lm, p, frame.token, chat)
        state.share_box()
        return
    if view == qk.VIEW and X.reads_blocks(lm):  # hybrids, Bloom, MPT: the stream's parts per block
        try:
            qk.page(lm, p, frame.token, chat)
        except AttnvizError as err:
            E.when_unsupported(err)
        state.share_box()
        return
    if view in ("logit lens", "attribution") and X.needs_stream(lm.layout):  # a hybrid: by blocks
        stream, key = E.load_stream(lm, p, frame.token, chat)
        if stream is None:
            shell.stop()
        st.caption(
            f"**{md(lm.spec)}** · {models.describe_layout(lm.layout)} · {stream.n_tokens} tokens · "
            "rows are block boundaries, whatever mixes the tokens"
        )
        try:
            E.lens(lm, stream, key) if view == "logit lens" else E.block_attribution(lm, stream)
        except AttnvizError as err:
            E.when_unsupported(err)
        state.share_box()
        return
    if view == "routes" and X.needs_stream(lm.layout):  # a hybrid: each mixing branch's c_(t,s)
        blocks, key = B.load_block_trace(lm, p, frame.token, chat)
        if blocks is None:
            shell.stop()
        st.caption(B.caption(lm, blocks))
        try:
            E.routes(lm, blocks, key, p, E.position_picker(blocks))
        except AttnvizError as err:
            E.when_unsupported(err)
        state.share_box()
        return
    tr, key = E.load_trace(lm, p, frame.token, chat)
    if tr is None:
        shell.stop()
    st.caption(
        f"**{md(lm.spec)}** · {models.describe_layout(lm.layout)} · {tr.n_tokens} tokens · "
        f"{tr.residual} residual blocks"
    )
    try:
        if view == qk.VIEW:
            qk.before_widgets()  # a clicked point of its Q/K scatter picks the query
        pos = E.position_picker(tr) if view != "logit lens" else tr.n_tokens - 1
        if view == "routes":
            E.routes(lm, tr, key, p, pos)
        elif view == "logit lens":
            E.lens(lm, tr, key)
        elif view == "attribution":
            E.attribution(lm, tr, key, p, pos)
        elif view == qk.VIEW:
            qk.why(lm, tr, key, p, pos)
        else:
            E.ablation(lm, tr, key, p, pos)
    except AttnvizError as err:
        E.when_unsupported(err)
    state.share_box()


main()
