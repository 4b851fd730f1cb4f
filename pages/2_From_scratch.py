"""From scratch: the textbook multi-head attention, step by step, on a real layer's weights."""

import math

import numpy as np
import streamlit as st

import attnviz
from attnviz import figures as F
from attnviz.inputs import first_tokens
from attnviz.layout import AttentionLayout
from attnviz.reference import walkthrough as W
from attnviz.reference.walkthrough import Walkthrough
from attnviz.server.settings import settings
from ui import export, gate, models, pickers, shell, sidebar, state
from ui.params import CHANGES, SCALE_CHOICES, SCRATCH_MODES, ScratchParams
from ui.scratch import mixers as scratch_mixers
from ui.scratch import rotary, steps
from ui.text import guarded, md

TOY_HEADS = [1, 2, 4, 8, 16]
TOLERANCE = 1e-4  # float32 recomputation vs the model: differences of ~1e-7 are rounding

frame = shell.begin(ScratchParams)

st.title("Multi-head attention from scratch")
st.caption(
    "The textbook pipeline — project to Q, K, V, split into heads, scores, scale, mask, softmax, "
    "weighted sum of V, concatenate, W_o — run by hand and checked against the real thing."
)


def parity(label: str, value: float, help_text: str) -> None:
    ok = math.isfinite(value) and value < TOLERANCE
    mark = "✓" if ok else ("n/a" if not math.isfinite(value) else "⚠")
    shown = "n/a" if not math.isfinite(value) else ("0 (exact) ✓" if value == 0 else f"{value:.1e} {mark}")
    st.metric(label, shown, help=help_text)


def step_browser(
    step_list: list[tuple[str, str, np.ndarray]], layout: AttentionLayout, labels: list[str], head: int
) -> None:
    """A list of the steps and the chosen one drawn for one head."""
    names = [name for name, _, _ in step_list]
    if state.get("wstep") not in names:  # e.g. k_rope in a model without RoPE: quietly show the weights
        state.put("wstep", "probs" if "probs" in names else names[0])
    left, right = st.columns([1, 2], gap="medium")
    with left:
        st.radio(
            "Step",
            names,
            key="wstep",
            format_func=lambda n: (
                f"{names.index(n) + 1}. {n}" + (f" — {steps.STEP_NAMES[n]}" if n in steps.STEP_NAMES else "")
            ),
        )
    name = state.get("wstep")
    desc, value = next((d, v) for n, d, v in step_list if n == name)
    pic = steps.step_picture(name, value, head, layout, labels)
    with right:
        st.markdown(f"**{steps.STEP_NAMES.get(name, name)}** (`{name}`)")
        st.caption(f"Shape: {steps.axis_names(name, tuple(value.shape), layout)}.")
        st.caption(desc + (f" · showing {pic.note}" if pic.note else ""))
        title = f"{name} · {pic.note}" if pic.note else name
        if name == "probs":  # weights: the page's colour scale (a linear map looks empty at 512 tokens)
            choice = pickers.scale_picker(SCALE_CHOICES)
            scale, note = pickers.scale_for(choice, max(pic.array.shape))
            fig = F.head_heatmap(pic.array, pic.rows, pic.cols, title=title, scale=scale, height=500)
            if note:
                st.caption(note)
        else:
            fig = F.matrix_heatmap(
                pic.array,
                title=title,
                row_labels=pic.rows,
                col_labels=pic.cols,
                x_title="key" if name in steps.KEY_AXIS_STEPS else "dimension",
                y_title="query" if name in steps.KEY_AXIS_STEPS else "position",
                height=500,
            )
        export.chart(fig, F.figure_name("scratch", name, f"H{head}"), key="step_chart")


def shape_rows(layout: AttentionLayout, n_tokens: int) -> dict:
    rows = W.shape_table(layout, n_tokens)
    return {
        "step": [r[0] for r in rows],
        "operation": [r[1] for r in rows],
        "shape": [str(r[2]) for r in rows],
    }


def toy_mode() -> None:
    """The textbook MHA with random weights, checked against torch.nn.MultiheadAttention."""
    st.subheader("Toy model: random weights")
    c1, c2, c3, c4 = st.columns(4)
    with c1:
        state.nearest("toy_h", TOY_HEADS)
        n_heads = st.select_slider("Heads", options=TOY_HEADS, key="toy_h")
    with c2:
        dims = [n_heads * k for k in (2, 4, 8, 16, 32) if n_heads * k <= 512]
        state.nearest("toy_d", dims)
        d_model = st.select_slider("d_model", options=dims, key="toy_d", help="A multiple of the heads.")
    with c3:
        n_tok = st.slider("Sequence length", 2, 64, key="toy_n")
    with c4:
        causal = st.toggle("Causal mask", key="toy_causal", wrap=True)
        seed = st.number_input("Seed", 0, 10_000, key="toy_seed", step=1)
    toy = steps.toy(d_model, n_heads, n_tok, causal, int(seed))
    m1, m2 = st.columns(2)
    with m1:
        parity(
            "max |Δ| weights vs torch.nn.MultiheadAttention",
            toy.max_diff_weights,
            "Our textbook class with PyTorch's own weights; ~1e-7 is float32 rounding.",
        )
    with m2:
        parity("max |Δ| output", toy.max_diff_output, "Same comparison for the layer output.")
    labels = [f"({i}) x{i}" for i in range(n_tok)]
    st.markdown(f"**Attention weights of all {n_heads} heads**")
    grid = F.head_grid(toy.weights, labels, colorscale="Viridis")
    export.chart(grid, F.figure_name("toy", f"d{d_model}", f"h{n_heads}"), key="toy_grid")
    with st.expander("Shape table", expanded=True):
        st.dataframe(shape_rows(toy.layout, n_tok), hide_index=True)
    state.clamp("head", 0, n_heads - 1, "head")
    head = st.selectbox("Head", list(range(n_heads)), key="head") if n_heads > 1 else 0
    step_list = [(n, steps.TOY_DESCRIPTIONS.get(n, ""), v) for n, v in toy.steps.items()]
    step_browser(step_list, toy.layout, labels, min(int(head), n_heads - 1))


def real_layer() -> None:
    """One layer of the sidebar's model recomputed step by step, and the counterfactuals.

    The model and the walkthrough stay locals of this run: widget format functions outlive it
    and hold the page's globals (see app.py)."""
    p = frame.params
    if not p.model or not p.text.strip():
        st.info("Pick a model and type a text in the sidebar.")
        shell.stop()
    lm = shell.load(p.model, frame.token)
    chat = sidebar.chat_toggle(lm, frame.chat_slot)
    lay = lm.layout
    mixer = scratch_mixers.picker(lm)  # hybrids: a Gated DeltaNet or Mamba-2 block by hand instead
    if mixer is not None:
        scratch_mixers.draw(lm, p.text, chat, *mixer)
        return
    shell.need_attention(
        lm,
        "From scratch (Mamba-2 and Gated DeltaNet blocks have their own walkthrough, other mixers not yet)",
    )
    if lay.kind == "encoder-decoder":
        st.error(
            f"{md(p.model)} is an encoder-decoder model; the walkthrough covers decoder and encoder "
            f"models ({', '.join(W.SUPPORTED)}). Pick smollm2-135m or minilm-l6, or use the toy mode."
        )
        shell.stop()
    state.clamp("layer", 0, lay.n_layers - 1, "layer")
    state.clamp("head", 0, lay.n_heads - 1, "head")
    c1, c2 = st.columns([3, 2])
    with c1:
        layer = st.slider("Layer", 0, lay.n_layers - 1, key="layer") if lay.n_layers > 1 else 0
    with c2:
        kv = [lay.kv_head_of(h) for h in range(lay.n_heads)] if lay.group_size > 1 else None
        head = pickers.head_picker(lay.n_heads, kv)

    max_tokens = min(W.DEFAULT_MAX_TOKENS, settings().max_tokens)
    text = p.text
    n_ids = len(attnviz.tokenize(lm, text, chat=chat)[0]) if text.strip() else 0
    if n_ids > max_tokens:
        st.warning(
            f"The text has {n_ids} tokens; the step-by-step view keeps (heads, N, N) arrays at every "
            f"step and takes up to {max_tokens}. It shows the first {max_tokens} tokens instead "
            "(switch to the toy mode for a made-up layer).",
            icon=":material/content_cut:",
        )
        text = first_tokens(lm, text, max_tokens, chat=chat)
    wt = None
    with guarded(f"recomputing {lay.layer_label(layer)} of {md(p.model)}", frame.token, (p.model,)):
        key = (lm.spec, models.token_key(frame.token), text, chat, layer)
        with st.spinner(f"Recomputing layer {layer} step by step…", show_time=True):
            wt = models.cached(
                "walkthrough",
                key,
                gate.gated(lambda: W.layer_walkthrough(lm, text, layer, chat=chat, max_tokens=max_tokens)),
                nbytes=lambda w: sum(s.value.nbytes for s in w.steps),
            )
    if wt is None:
        shell.stop()

    labels = F.token_labels(wt.tokens.display)
    n_tok = len(labels)
    st.caption(
        f"**{md(lm.spec)}** · {lay.layer_label(layer)} · {models.describe_layout(lm.layout)} · "
        f"{n_tok} tokens · "
        f"recomputed in float32 on the CPU in {wt.seconds:.2f} s"
    )
    m1, m2, m3 = st.columns(3)
    with m1:
        parity(
            "max |Δ| weights vs model",
            wt.max_abs_diff_probs,
            "Our softmax(QKᵀ·scale + mask) against the model's own eager attention weights.",
        )
    with m2:
        parity(
            "max |Δ| concat vs model",
            wt.max_abs_diff_context,
            "The concatenated heads against the input of W_o.",
        )
    with m3:
        parity(
            "max |Δ| output vs model", wt.max_abs_diff_output, f"Our W_o output against {wt.compared_output}."
        )

    with st.expander(f"Shape table for {md(lm.spec)} ({n_tok} tokens)", expanded=False):
        st.dataframe(shape_rows(lay, n_tok), hide_index=True)

    st.subheader("Step by step")
    step_list = [(s.name, s.description, s.value) for s in wt.steps]
    step_browser(step_list, lay, labels, int(head))
    counterfactuals(lm.spec, lay, wt, labels, layer, head)
    rotary.bands_view(lm.spec, wt, lay, int(head), labels)


def counterfactuals(
    spec: str, lay: AttentionLayout, wt: Walkthrough, labels: list[str], layer: int, head: int
) -> None:
    """The real pattern next to the pattern with one ingredient changed."""
    st.subheader("Change one ingredient")
    cf = wt.counterfactuals
    available = {
        "none": wt.probs,
        "no RoPE": None if cf is None else cf.no_rope,
        "no mask": None if cf is None else cf.no_mask,
        "no scaling": None if cf is None else cf.no_scaling,
        "ungrouped K/V": None if cf is None else cf.ungrouped,
    }
    why_not = {
        "no RoPE": "this model has no rotary embedding inside attention (positions are added to the input)",
        "no mask": "this is an encoder: every token already sees every token",
        "ungrouped K/V": "this model has one K/V head per query head (no GQA)",
    }
    explain = {
        "none": "The model's real pattern.",
        "no RoPE": "Queries and keys before the rotary embedding: the scores lose the distance between "
        "tokens.",
        "no mask": "No causal mask: tokens also look at later tokens, which a decoder never sees.",
        "no scaling": f"Scores not multiplied by {wt.scaling:.4g}: the softmax gets sharper (closer to one "
        "key).",
        "ungrouped K/V": "Query head h reads KV head h % n_kv, not h // group: the learned pairing is lost.",
    }
    # open on a real change, not the same map twice, unless the link named one (a bad value
    # was warned about as showing 'none': show that)
    if state.get("change") == "none" and state.page_changed() and not state.linked("change"):
        first = next((c for c in CHANGES if c != "none" and available.get(c) is not None), "none")
        state.put("change", first)
    change = str(st.segmented_control("Change", CHANGES, key="change", required=True))
    changed = available.get(change)
    if changed is None:
        st.info(f"'{change}' does not apply to {md(spec)}: {why_not.get(change, 'not available')}.")
    else:
        st.caption(explain[change])
        if change == "ungrouped K/V" and cf is not None and cf.ungrouped_kv_heads:
            read, own = cf.ungrouped_kv_heads[head], lay.kv_head_of(head)
            st.caption(f"Head {head} reads KV head {read} here instead of {own}.")
        a, b = st.columns(2)
        with a:
            fig = F.head_heatmap(
                wt.probs[head], labels, title=f"real · {lay.layer_label(layer)} · head {head}", height=460
            )
            export.chart(fig, F.figure_name(spec, f"L{layer}", f"H{head}"), key="cf_real")
        with b:
            fig = F.head_heatmap(
                changed[head],
                labels,
                title=f"{change} · {lay.layer_label(layer)} · head {head}",
                height=460,
            )
            export.chart(fig, F.figure_name(spec, f"L{layer}", f"H{head}", change), key="cf_changed")
        if change != "none":
            delta = changed[head] - wt.probs[head]
            diff = float(np.abs(delta).max())
            d1, d2 = st.columns(2)
            with d1:
                fig = F.head_grid(
                    delta[None], labels, titles=[f"{change} − real"], diverging=True, facet_px=380
                )
                export.chart(fig, F.figure_name(spec, f"L{layer}", f"H{head}", change, "diff"), key="cf_diff")
            with d2:
                st.caption(
                    f"The change itself: red where '{change}' puts more weight on a key than the real "
                    f"layer, blue where less. Largest change of a weight in this head: {diff:.3f}."
                )


mode = st.segmented_control("Mode", SCRATCH_MODES, key="mode", required=True)
if mode == "toy":
    toy_mode()
else:
    real_layer()
state.share_box()
