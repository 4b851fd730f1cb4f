"""The explorer's view of a model's blocks by their token mixers (hybrids: Qwen3.5, Falcon-H1, ...).

A model with any non-softmax mixer gets a block picker listing every block with its mixers
("block 0 · Gated DeltaNet"). An attention block hands over to the usual layer view (the picker
writes its attention layer into ``layer``, the URL's parameter); any other block draws its exact
effective attention with `attnviz.figures.mixers` (signed, diverging scale centred at 0), the
per-head token-contribution bars of one query, a parallel block's branches side by side with
their shares (``res.branch_shares``, measured during the extract's own forward), and the block's
self-check line from ``res.checks`` / ``res.mixer_check``. The chosen block is in the share link
(``block``).
"""

from __future__ import annotations

import functools

import numpy as np
import streamlit as st

from attnviz import AttentionResult, AttnvizError
from attnviz.figures import mixers as M
from attnviz.figures.labels import bin_labels
from attnviz.layout import AttentionLayout
from attnviz.mixers import BranchShares
from ui import export, models, state

BLOCK_KEY = "block"  # a parameter of the link (ui.params.ExplorerParams.block)
HEAD_KEY = "_attnviz_mixer_head"
QUERY_KEY = "_attnviz_mixer_query"
BARS_KEY = "_attnviz_mixer_bars"
WEIGHT = "weight A[t,s] (signed)"
CONTRIBUTION = "contribution ‖c_{t,s}‖ (through the output projection)"
BARS_HELP = (
    "A[t,s] is how much of source token s's value enters token t's output in this head (signed); "
    "‖c_{t,s}‖ is the size of what s adds to the mixer's output through its output projection, gates "
    "and norm scales frozen at their forward values (the value-weighted view)."
)
MAX_ROWS = 512  # query rows of a mixer head drawn at once (rows are computed on demand)
HEAD_CELLS = 256  # past MAX_ROWS tokens: bins a side of the big head's pooled view
GRID_CELLS = 96  # ... and of each head of the grid


def applies(layout: AttentionLayout) -> bool:
    """Whether the model has a block with a mixer other than softmax attention."""
    return any(tuple(kinds) != ("attention",) for kinds in layout.mixers)


def attention_block_line(layout: AttentionLayout, layer: int) -> str:
    """Which block an attention layer of a hybrid is: the picker and the maps' titles count blocks,
    the engine counts attention layers ("layer 0 (of 0–0)" beside "Layer 3" read as a bug)."""
    block = layout.model_layer(layer)
    blocks = ", ".join(map(str, layout.attention_layers))
    return (
        f"Block {block} is softmax attention: the maps below are its probabilities (titled layer "
        f"{block}, by block). The engine counts only the attention blocks ({blocks}): this is their "
        f"attention layer {layer}."
    )


def attention_note(layout: AttentionLayout, stack: str, layer: int) -> None:
    """Under an attention layer's maps: what else its block does to mix tokens that they do not
    show (zaya / inkling: a short conv on k/v; `AttentionLayout.mixer_note`)."""
    note = layout.mixer_note(layout.model_layer(layer)) if stack == "self" else ""
    if note:
        st.caption(f"Block {layout.model_layer(layer)}: {note}.")


SIGNED_READING = (
    "How to read this block's maps: **row = query**, **column = source token**. They are signed, not "
    "probabilities: **red** = a positive weight (the source's value is added), **blue** = negative "
    "(subtracted), white = 0; rows do not sum to 1."
)
NORMS_READING = (
    "How to read this block's maps: **row = query**, **column = source token**; the colour is the size "
    "‖c‖ of what the source adds to the query's output (0 = nothing), not a probability."
)


def reading(res: AttentionResult, block: int) -> str:
    """The heatmap reading line for a non-softmax block (the explorer's softmax line says rows sum
    to 1, which a signed map does not)."""
    kinds = [k for k in res.mixers(block) if k != "attention"]
    return NORMS_READING if all(M.is_norms(k) for k in kinds) else SIGNED_READING


def block_label(layout: AttentionLayout, block: int) -> str:
    """ "block 3 · Gated DeltaNet", "block 0 · softmax attention + Mamba-2 (SSD)"."""
    return f"block {block} · " + " + ".join(M.kind_name(k) for k in layout.mixers[block])


def block_picker(res: AttentionResult) -> int | None:
    """The block picker; returns the chosen block when it needs the mixer view, None when it is
    an attention-only block (its attention layer is then put in ``layer`` for the layer view)."""
    lay = res.layout
    blocks = list(range(len(lay.mixers)))
    if int(state.get(BLOCK_KEY)) < 0:  # no block named: a link's attention layer's block, else 0
        try:
            linked = lay.n_layers and state.linked("layer")
            state.put(BLOCK_KEY, lay.model_layer(int(state.get("layer") or 0)) if linked else 0)
        except (AttnvizError, IndexError, ValueError):
            state.put(BLOCK_KEY, 0)
    state.clamp(BLOCK_KEY, 0, len(blocks) - 1, "block")
    block = int(
        st.selectbox(
            "Block (layer) · token mixer",
            blocks,
            key=BLOCK_KEY,
            format_func=lambda b: block_label(lay, b),
            help="Every block of the model with its token mixers. Softmax attention shows "
            "probabilities; the other mixers show their exact effective attention (signed, not "
            "probabilities).",
        )
    )
    if tuple(lay.mixers[block]) == ("attention",):
        state.put("layer", lay.attention_layer_of(block))
        return None
    return block


def check_lines(res: AttentionResult, block: int) -> list[tuple[bool, str]]:
    """(passed, sentence) per non-softmax mixer of the block: its self-check against the kernel's
    own output (from ``res.checks`` when extract ran it on this block, else run now)."""
    lines = []
    for kind in res.mixers(block):
        if kind == "attention":
            continue
        done = next((c for c in res.checks if c.mixer == kind and c.layer == block), None)
        try:
            check = done or res.mixer_check(block, kind)
        except AttnvizError as err:
            lines.append((False, str(err)))
            continue
        lines.append((True, "Exact: " + check.caption() + "."))
    return lines


def _keep_in(key: str, hi: int) -> None:
    """A session-only widget value kept in 0..hi (another block or text can have fewer)."""
    state.keep_widget_in(key, hi)


def _rows(n: int) -> slice:
    """All rows, or a window of `MAX_ROWS` query rows chosen with a slider."""
    if n <= MAX_ROWS:
        return slice(0, n)
    _keep_in("_attnviz_mixer_row0", n - MAX_ROWS)
    r0 = int(
        st.slider(f"Query rows ({MAX_ROWS} of {n} at a time)", 0, n - MAX_ROWS, key="_attnviz_mixer_row0")
    )
    return slice(r0, r0 + MAX_ROWS)


def _heads(
    res: AttentionResult, block: int, kind: str, heads: list[int], cells: int
) -> tuple[np.ndarray, list[str]]:
    """(heads, N, N) exact matrices and token labels; past `MAX_ROWS` tokens each head's pooled
    view (the signed mean over blocks of tokens, never the N×N matrix) and bin labels."""
    labels = list(res.tokens.labels)
    if res.n_tokens <= MAX_ROWS:
        return np.stack([res.head(block, h, mixer=kind) for h in heads]), labels
    views = [res.mixer_pooled(block, kind, h, cells=cells) for h in heads]
    edges = np.arange(0, res.n_tokens, views[0].tokens_per_bin)
    return np.stack([v.mean for v in views]), bin_labels(labels, edges)


def _pooled_note(res: AttentionResult, shown: list[str]) -> str:
    return (
        ""
        if len(shown) == res.n_tokens
        else f" (mean over blocks of {-(-res.n_tokens // len(shown))} tokens)"
    )


def _shares(res: AttentionResult, block: int) -> BranchShares | None:
    try:
        return res.branch_shares(block)
    except AttnvizError as err:
        st.caption(f"Branch shares are not available here: {err}.")
        return None


def draw(ref: models.ResultRef, res: AttentionResult, block: int) -> None:
    """Block ``block``'s non-softmax mixers: figures, the token-contribution view, the checks."""
    lay = res.layout
    kinds = [k for k in res.mixers(block) if k != "attention"]
    lines = check_lines(res, block)
    for passed, text in lines:
        (st.caption if passed else st.error)(text)
    if not all(p for p, _ in lines):
        state.share_box()
        return
    if lay.mixer_note(block):
        st.info(
            lay.mixer_note(block)[0].upper() + lay.mixer_note(block)[1:] + ".", icon=":material/call_split:"
        )
    for kind in kinds:
        st.caption(f"{M.kind_name(kind)}: {res.mixer_meaning(kind)}.")
    n_heads = max(res.mixer_heads(block, k) for k in kinds)
    _keep_in(HEAD_KEY, n_heads - 1)
    head = int(st.selectbox("Head", list(range(n_heads)), key=HEAD_KEY)) if n_heads > 1 else 0
    labels = list(res.tokens.labels)
    where = f"{ref.name} · block {block}"
    if len(res.mixers(block)) > 1:
        shares = _shares(res, block)
        rows = _rows(res.n_tokens)  # a window of exact query rows past MAX_ROWS tokens
        q_labels = labels[rows]
        branches = [
            (k, res.head(block, min(head, res.mixer_heads(block, k) - 1), mixer=k, rows=rows))
            for k in res.mixers(block)
        ]
        fig = M.parallel_block(
            branches,
            q_labels,
            labels,
            shares=shares.shares if shares else None,
            title=f"{where} · head {head}",
        )
        export.chart(fig, f"attnviz_{ref.name}_B{block}_H{head}_branches", key="mixer_branches")
        if shares is not None:
            st.caption(shares.how[0].upper() + shares.how[1:] + ".")
    kind = kinds[0]
    h = min(head, res.mixer_heads(block, kind) - 1)
    n = res.mixer_heads(block, kind)
    left, right = st.columns([1, 1], gap="medium")
    with left:
        if n > 1:
            stack, g_labels = _heads(res, block, kind, list(range(n)), GRID_CELLS)
            grid = M.mixer_grid(stack, g_labels, kind=kind, title=where + _pooled_note(res, g_labels))
            export.chart(grid, f"attnviz_{ref.name}_B{block}_grid", key="mixer_grid")
    with right:
        (z,), b_labels = _heads(res, block, kind, [h], HEAD_CELLS)
        big = M.mixer_heatmap(
            z, b_labels, kind=kind, title=f"{where} · head {h}" + _pooled_note(res, b_labels)
        )
        export.chart(big, f"attnviz_{ref.name}_B{block}_H{h}", key="mixer_head")
    st.subheader("Token contributions")
    if res.n_tokens <= MAX_ROWS:
        q = int(
            st.selectbox(
                "Query token",
                list(range(res.n_tokens)),
                index=res.n_tokens - 1,
                key=QUERY_KEY,
                format_func=lambda i: labels[i],
            )
        )
    else:
        q = int(st.number_input("Query position", 0, res.n_tokens - 1, res.n_tokens - 1, key=QUERY_KEY))
    norms = (
        M.is_norms(kind)
        or st.radio("Bars show", [WEIGHT, CONTRIBUTION], key=BARS_KEY, horizontal=True, help=BARS_HELP)
        == CONTRIBUTION
    )
    one = slice(q, q + 1)  # one exact row, on demand
    if norms and not M.is_norms(kind):
        row = res.mixer_contributions(block, kind, heads=[h], rows=one)[0, 0]
    else:
        row = res.head(block, h, mixer=kind, rows=one)[0]
    bars = M.token_contributions(
        row, labels, kind=kind, query_label=labels[q], title=f"{where} · head {h}", norms=norms
    )
    export.chart(bars, f"attnviz_{ref.name}_B{block}_H{h}_q{q}", key="mixer_bars")
    state.share_box()


STAT_NAMES = {
    "distance": "mean |A| distance",
    "self": "self share of |A|",
    "negative": "negative share of |A|",
    "row_sum": "mean row sum Σ_s A",
}
OVERVIEW_ROWS = 256  # past this many tokens the statistics read the last rows (rows × N per head)


def overview(ref: models.ResultRef, res: AttentionResult) -> None:
    """Every block of a hybrid with the statistics that apply to it: attention blocks keep the
    page's attention statistics; a non-softmax mixer gets the |A| statistics of
    `attnviz.figures.mixer_stats` per head, and entropy / sink share / rollout / induction are
    labelled not applicable (signed, unnormalised)."""
    from attnviz.figures.mixer_stats import NOT_APPLICABLE, STATISTICS, WHY_NOT, mixer_statistics

    st.subheader("Every block")
    n = res.n_tokens
    rows = slice(max(0, n - OVERVIEW_ROWS), n)
    table: dict[str, list] = {"block": [], "mixer": [], "head": [], "exact": []}
    table |= {STAT_NAMES[s]: [] for s in STATISTICS}
    table |= {name: [] for name in NOT_APPLICABLE}
    lay = res.layout
    for block, kinds in enumerate(lay.mixers):
        for kind in kinds:
            if kind == "attention":
                table["block"].append(block)
                table["mixer"].append(M.kind_name(kind))
                table["head"].append(f"all {lay.n_heads}")
                table["exact"].append(f"attention layer {lay.attention_layer_of(block)}: see below")
                for s in STATISTICS:
                    table[STAT_NAMES[s]].append(None)
                for name in NOT_APPLICABLE:
                    table[name].append("see the attention statistics below")
                continue
            try:
                check = res.mixer_check(block, kind)
                stats = models.cached(
                    "mixer-stats",
                    (*ref.key, block, kind, rows.start),
                    functools.partial(mixer_statistics, res, block, kind, rows),
                )
            except AttnvizError as err:
                table["block"].append(block)
                table["mixer"].append(M.kind_name(kind))
                table["head"].append("—")
                table["exact"].append(f"not shown: {err}")
                for s in STATISTICS:
                    table[STAT_NAMES[s]].append(None)
                for name in NOT_APPLICABLE:
                    table[name].append(WHY_NOT)
                continue
            for h, row in enumerate(stats):
                table["block"].append(block)
                table["mixer"].append(M.kind_name(kind))
                table["head"].append(str(h) if not M.is_norms(kind) else "all channels")
                table["exact"].append(f"max |Δ| {check.max_abs_diff:.1e} (scale {check.scale or 0:.1e})")
                for s, v in zip(STATISTICS, row, strict=True):
                    table[STAT_NAMES[s]].append(float(v))
                for name in NOT_APPLICABLE:
                    table[name].append(WHY_NOT)
    st.dataframe(table, hide_index=True)
    part = "" if rows.start == 0 else f" over the last {n - rows.start} query rows"
    st.caption(
        "Statistics that apply to a non-softmax mixer's effective attention A (signed, not "
        f"probabilities), per head{part}: the mean |A|-weighted distance back (tokens), the share "
        "of Σ|A| on the token itself and on negative entries, and the mean row sum Σ_s A[t,s]. "
        f"Entropy, sink share, rollout and the induction score assume probabilities: {WHY_NOT}. "
        "Per-channel mixers (Mamba-1 ...) are summarised by their token-contribution norms."
    )
