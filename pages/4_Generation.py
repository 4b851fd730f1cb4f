"""Generation: generate k tokens (greedy or sampled) and step through them, one attention row per head."""

import numpy as np
import streamlit as st

from attnviz import figures as F
from attnviz.extract import Sampling
from ui import export, pickers, shell, state
from ui.generation import mixers as generation_mixers
from ui.params import GEN_ROWS, SCALE_CHOICES, GenerationParams
from ui.text import continuation, md

frame = shell.begin(GenerationParams, text_label="Prompt")

st.title("Attention while generating")
c1, c2 = st.columns([1, 3])
with c1:
    k = st.number_input(
        "Tokens to generate", 1, 64, key="k", step=1,
        help="They count against the token limit in the sidebar with the prompt: prompt + these.",
    )  # fmt: skip
    sample = st.toggle(
        "Sample",
        key="sample",
        help="Draw each token (temperature, top-p, seed) instead of greedy.",
        wrap=True,
    )
with c2:
    st.caption(
        "The model continues the prompt one token at a time, taking the most likely token (greedy) or "
        "drawing one (sampling, reproducible with its seed). For each step you see where the new token's "
        "query looks, in every head of a layer. The prompt and the tokens to generate count together "
        "against the sidebar's token limit."
    )
    sampling = None
    if sample:
        s1, s2, s3 = st.columns(3)
        temp = s1.number_input("Temperature", 0.05, 5.0, key="temp", step=0.05)
        topp = s2.number_input("Top-p", 0.01, 1.0, key="topp", step=0.05)
        seed = s3.number_input("Seed", 0, 2**31 - 1, key="seed", step=1)
        sampling = Sampling(temperature=float(temp), top_p=float(topp), seed=int(seed))


def step_label(step: int, token: str) -> str:
    """The step slider's label: "step 1 · '.'" (a bare "1: ." read as punctuation, not a token)."""
    return f"step {step} · {token!r}"


def main() -> None:
    """The page body. The model and the result stay locals of this run: the download callables
    and the step slider's format function outlive it and hold the page's globals (see app.py)."""
    spec = frame.params.model
    if spec:
        lm = shell.load(spec, frame.token)
        if lm.layout.kind == "encoder":
            st.error(
                f"{md(spec)} is an encoder ({md(lm.layout.model_type)}): it does not generate "
                "text. Pick a decoder such as smollm2-135m, or an encoder-decoder model."
            )
            shell.stop()
    lm, res, _ = shell.load_and_extract(frame, generate=int(k), sampling=sampling)

    stack = pickers.stack_picker([s for s in res.stacks if s in ("self", "decoder", "cross")])
    q_tokens, k_tokens = res.axes(stack)
    generated = [i for i, g in enumerate(q_tokens.generated) if g]
    if not generated:
        st.info("The model stopped at once (it produced its end-of-text token). Try another prompt.")
        shell.stop()
    prompt_ids = [t for t, g in zip(q_tokens.ids, q_tokens.generated, strict=True) if not g]
    n_steps = len(generated)
    if n_steps < int(k):
        st.caption(f"The model produced its end-of-text token after {n_steps} tokens.")

    state.clamp("gstep", 1, n_steps, "step")
    n_layers, n_heads = res.n_layers(stack), res.n_heads
    labels_q = F.token_labels(q_tokens.display)
    labels_k = F.token_labels(k_tokens.display)
    step = (
        st.select_slider(
            "Step",
            options=list(range(1, n_steps + 1)),
            key="gstep",
            format_func=lambda s: step_label(s, q_tokens.display[generated[s - 1]]),
        )
        if n_steps > 1
        else 1
    )
    pos = generated[step - 1]
    spec, prompt = lm.spec, lm.tokenizer.decode(prompt_ids, skip_special_tokens=False)
    with st.container(border=True, key="continuation"):
        st.markdown(continuation(prompt, [q_tokens.display[i] for i in generated], step - 1))
    st.caption(
        f"The prompt ({len(q_tokens) - n_steps} tokens) ▸ the {n_steps} generated tokens; "
        f"⟦ ⟧ marks step {step}."
    )

    if not n_layers:  # a pure recurrent / state-space model: its mixer heads' rows are the view
        st.info(
            f"{md(spec)} has no softmax attention; below is each new token's own row in its mixers' heads.",
            icon=":material/info:",
        )
        generation_mixers.draw(
            res, pos, pos + 1, labels_k, labels_q[pos], F.figure_name(spec, f"step{step}", "mixer")
        )
        state.share_box()
        return
    state.clamp("layer", 0, n_layers - 1, "layer")
    c1, c2, c3, c4 = st.columns([3, 3, 2, 2])
    with c1:
        layer = st.slider("Layer", 0, n_layers - 1, key="layer") if n_layers > 1 else 0
    with c2:
        row = st.segmented_control(
            "Query row",
            GEN_ROWS,
            key="grow",
            required=True,
            help="'new token': the generated token's own row (what it attends to once it is in the text). "
            "'predicting position': the row of the token before it, whose output predicted it.",
        )
    with c3:
        cmap = st.selectbox("Colour map", F.COLORSCALES, key="cmap")
    with c4:
        choice = pickers.scale_picker(SCALE_CHOICES)  # rows on one colour range: no "per head"

    q = pos if row == "new token" else pos - 1
    causal = stack != "cross"
    n_keys = q + 1 if causal else len(k_tokens)
    kv = pickers.kv_heads(res, stack)
    scale, scale_note = pickers.scale_for(choice, len(k_tokens))
    rows = res.layer(layer, rows=slice(q, q + 1), stack=stack)[:, 0, :n_keys]  # (heads, keys)
    head_names = [F.head_title(h, kv[h] if kv else None) for h in range(n_heads)]
    what = "predicting" if row != "new token" else "new token"
    title = f"{res.layout.layer_label(layer)} · query {labels_q[q]} ({what} {q_tokens.display[pos]!r})"
    fig = F.rows_heatmap(
        rows,
        head_names,
        labels_k[:n_keys],
        title=title,
        colorscale=cmap,
        scale=scale,
        highlight=q if causal else None,
    )
    name = F.figure_name(spec, f"step{step}", f"L{layer}")
    export.chart(fig, name, key="gen_heads")
    if scale_note:
        st.caption(scale_note)
    generation_mixers.draw(res, q, n_keys, labels_k, labels_q[q], name)  # a hybrid's mixer blocks

    # every layer's mean row only when asked for: a collapsed expander still ran all the layers
    every_layer = st.toggle("Every layer at this step (mean over heads)", key="glayers", wrap=True)
    means = None
    if every_layer:
        means = np.stack(
            [res.layer(i, rows=slice(q, q + 1), stack=stack)[:, 0, :n_keys].mean(0) for i in range(n_layers)]
        )
        fig_layers = F.rows_heatmap(
            means,
            [res.layout.layer_label(i) for i in range(n_layers)],
            labels_k[:n_keys],
            title=f"every layer, mean over heads · query {labels_q[q]}",
            colorscale=cmap,
            scale=scale,
        )
        export.chart(fig_layers, F.figure_name(spec, f"step{step}", "layers"), key="gen_layers")

    export.downloads(
        name,
        npz=lambda: export.npz_bytes(
            heads=rows,
            **({"layer_means": means} if means is not None else {}),
            key_tokens=np.array(labels_k[:n_keys]),
            query=q,
            step=step,
            layer=layer,
            model=spec,
            prompt=prompt,
        ),
        csv=lambda: export.csv_text(rows, head_names, labels_k[:n_keys], "head \\ key"),
        fig=fig,
        key="gen",
        what=f"attention rows of step {step}",
    )
    state.share_box()


main()
