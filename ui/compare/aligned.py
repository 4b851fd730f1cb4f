"""Compare page helpers: which positions two results share (aligned tokens), and how much every
head changed on them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnviz import AttentionResult
from attnviz import figures as F
from attnviz.analysis.align import align_tokens
from attnviz.layout import Stack
from ui import models

MIN_ALIGNED = 4  # aligned tokens below which the head ranking comes with a caution
ALIGNED_SHARE = 0.25  # ... or below this share of the longer text (most of it is not compared)


@dataclass(frozen=True, eq=False)
class Pairing:
    """What is compared: aligned positions (`attnviz.analysis.align`), query ``qa[k]`` of A with ``qb[k]``
    of B and key ``ka[k]`` with ``kb[k]``; tokens only one side has are left out."""

    qa: np.ndarray
    qb: np.ndarray
    ka: np.ndarray
    kb: np.ndarray
    n_a: int
    n_b: int
    same_tokens: bool
    labels: list[str]  # "(i) token" or "(i|j) token" when the positions differ
    k_labels: list[str]
    causal: bool
    by: str

    @property
    def m(self) -> int:
        return len(self.qa)

    @property
    def caution(self) -> str:
        """A warning when few tokens are aligned ("" otherwise): every score below rests on the
        aligned rows, and a handful of rows ranks heads by chance (1,500 vs 9 tokens: 2 aligned,
        scores ~0.5)."""
        if self.m >= MIN_ALIGNED and self.m >= ALIGNED_SHARE * max(self.n_a, self.n_b):
            return ""
        return (
            f"Only {self.m} of {self.n_a} / {self.n_b} tokens are aligned: every change score below is a "
            f"mean over {self.m} query row(s), so the ranking of heads says little. Compare texts that "
            "share more of their tokens (one edited word, a swapped name)."
        )

    @property
    def note(self) -> str:
        if self.same_tokens:
            return f"Both sides have the same {self.m} tokens: every weight is compared one to one."
        left = max(self.n_a, self.n_b) - self.m
        parts = [
            f"The texts have {self.n_a} and {self.n_b} tokens; {self.m} are aligned (same token "
            f"{'ids' if self.by == 'ids' else 'text'}, in order) and compared: A's weight between two "
            f"aligned tokens against B's between the same two. {left} token(s) without a partner "
            "are left out."
        ]
        if not self.causal:
            parts.append("This model attends both ways: weight on unaligned keys is not in the comparison.")
        return " ".join(parts)


def pair(a: AttentionResult, b: AttentionResult, stack: Stack) -> Pairing:
    qa, ka = a.axes(stack)
    qb, kb = b.axes(stack)
    q_al = align_tokens(qa, qb)
    k_al = q_al if (qa is ka and qb is kb) or stack != "cross" else align_tokens(ka, kb)

    def label(al, ta) -> list[str]:
        return [f"({i}) {ta.display[i]}" if i == j else f"({i}|{j}) {ta.display[i]}" for i, j in al.pairs()]

    same = q_al.coverage == 1.0 and len(qa) == len(qb) and list(qa.ids) == list(qb.ids)
    causal = stack == "decoder" or (stack == "self" and a.layout.kind == "decoder")
    return Pairing(
        np.array(q_al.a, dtype=np.int64), np.array(q_al.b, dtype=np.int64),
        np.array(k_al.a, dtype=np.int64), np.array(k_al.b, dtype=np.int64),
        len(qa), len(qb), same, label(q_al, qa), label(k_al, ka), causal, q_al.by,
    )  # fmt: skip


def block(
    res: AttentionResult, layer: int, stack: Stack, q: np.ndarray, k: np.ndarray, sl: slice = slice(None)
):
    """(heads, aligned query rows ``sl``, aligned keys) float32: rows q[sl], columns k."""
    rows = q[sl]
    if rows.size == 0:
        return np.zeros((res.n_heads, 0, len(k)), dtype=np.float32)
    lo, hi = int(rows.min()), int(rows.max()) + 1
    t = res.layer_tensor(layer, rows=slice(lo, hi), stack=stack).float().cpu().numpy()
    return t[:, rows - lo][:, :, k]


def side(res: AttentionResult, p: Pairing, which: str, layer: int, stack: Stack, sl: slice = slice(None)):
    """`block` of side A or B of a pairing."""
    return (
        block(res, layer, stack, p.qa, p.ka, sl) if which == "a" else block(res, layer, stack, p.qb, p.kb, sl)
    )


def change_scores(a: AttentionResult, b: AttentionResult, stack: Stack, p: Pairing, key: tuple) -> np.ndarray:
    """(layers, heads): mean over the aligned query rows of the total variation distance
    0.5 * sum over aligned keys |A - B| (0 = same weights, 1 = disjoint keys)."""

    def build() -> np.ndarray:
        n_layers, m = a.n_layers(stack), max(1, p.m)
        out = np.zeros((n_layers, a.n_heads))
        rows = max(1, (1 << 23) // max(1, a.n_heads * max(1, len(p.ka))))
        for layer in range(n_layers):
            total = np.zeros(a.n_heads)
            for r in range(0, m, rows):
                sl = slice(r, min(m, r + rows))
                total += 0.5 * np.abs(
                    side(a, p, "a", layer, stack, sl) - side(b, p, "b", layer, stack, sl)
                ).sum((-1, -2))
            out[layer] = total / m
        return out

    return models.cached("change", key, build)


def grids(
    a: AttentionResult, b: AttentionResult, layer: int, stack: Stack, p: Pairing, px: int, key: tuple
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """Pooled A, B (max) and A - B (mean) of one layer over the compared block, and bin labels."""

    def build():
        n_k = len(p.ka)
        pa, re, _ = F.pooled_rows(lambda sl: side(a, p, "a", layer, stack, sl), p.m, n_k, px)
        pb, _, _ = F.pooled_rows(lambda sl: side(b, p, "b", layer, stack, sl), p.m, n_k, px)
        pd, _, _ = F.pooled_rows(
            lambda sl: side(a, p, "a", layer, stack, sl) - side(b, p, "b", layer, stack, sl),
            p.m,
            n_k,
            px,
            "mean",
        )
        return pa, pb, pd, F.bin_labels(p.labels, re)

    return models.cached("compare_grid", (key, layer, px), build)


def matched(lm_a, res_a: AttentionResult, ref_a, lm_b, res_b: AttentionResult, ref_b, token) -> None:
    """Two models of different sizes: per-layer statistics on a relative depth axis, and every
    head of A matched with its most similar head of B on the aligned tokens of the same text."""
    import streamlit as st

    from attnviz.analysis import align
    from ui import export, head_stats

    stack_a, stack_b = res_a.stacks[0], res_b.stacks[0]
    st.info(
        f"{lm_a.spec} has {lm_a.layout.n_layers} layers × {lm_a.layout.n_heads} heads and {lm_b.spec} "
        f"{lm_b.layout.n_layers} × {lm_b.layout.n_heads}: heads cannot be paired one to one, so they are "
        "compared by matched statistics: per-layer profiles on a relative depth axis (0 = first layer, "
        "1 = last) and each head's most similar head in the other model.",
        icon=":material/info:",
    )
    hm_a, _ = head_stats.head_metrics(lm_a, res_a, ref_a.key, stack_a, induction=False, token=token)
    hm_b, _ = head_stats.head_metrics(lm_b, res_b, ref_b.key, stack_b, induction=False, token=token)
    stat = st.selectbox(
        "Statistic", ["entropy", "sink", "previous_token", "diagonal", "distance"], key="cmp_stat",
        format_func=lambda m: head_stats.METRIC_NAMES.get(m, m),
    )  # fmt: skip
    depth, pa, pb = align.layer_profiles(hm_a.values(stat), hm_b.values(stat))
    fig = F.profile_chart(
        depth.tolist(),
        {lm_a.spec: pa.tolist(), lm_b.spec: pb.tolist()},
        title=f"Mean {head_stats.METRIC_NAMES.get(stat, stat)} per layer",
        x_title="relative depth (0 = first layer, 1 = last)",
        y_title=stat,
    )
    export.chart(fig, F.figure_name("compare", lm_a.spec, lm_b.spec, stat), key="profile_chart")
    al = align.align_tokens(res_a.axes(stack_a)[0], res_b.axes(stack_b)[0])
    st.caption(f"{len(al)} tokens aligned between the two tokenizations (by {al.by}).")
    if len(al) < 2:
        st.warning("The two tokenizations share fewer than 2 tokens; head similarity needs more.")
        return
    sim = models.cached(
        "headsim", (ref_a.key, ref_b.key), lambda: align.head_similarity(res_a, res_b, al, stack=stack_a)
    )
    best = align.best_matches(sim)
    r = np.array([m[4] for m in best]).reshape(sim.shape[:2])
    fig = F.metric_heatmap(r, f"best pattern correlation with any head of {lm_b.spec}", zmin=-1, zmax=1)
    export.chart(fig, F.figure_name("compare", lm_a.spec, lm_b.spec, "similarity"), key="sim_chart")
    order = sorted(best, key=lambda m: -m[4])
    st.dataframe(
        {
            "A layer": [m[0] for m in order],
            "A head": [m[1] for m in order],
            "B layer": [m[2] for m in order],
            "B head": [m[3] for m in order],
            "correlation": [round(m[4], 3) for m in order],
        },
        hide_index=True,
        height=320,
    )
    st.caption("Pearson correlation of the two heads' weights between aligned tokens (1 = same pattern).")


def mixer_heads(res_a: AttentionResult, res_b: AttentionResult) -> None:
    """Hybrids and recurrent models: every non-softmax mixer head of A beside B by the statistics
    that apply to a signed matrix (`attnviz.metrics.mixer_compare`); nothing without such mixers."""
    import streamlit as st

    from attnviz.errors import AttnvizError
    from attnviz.metrics.mixer_compare import compare_mixer_heads, mixer_heads_of

    if not (mixer_heads_of(res_a.layout) or mixer_heads_of(res_b.layout)):
        return
    st.subheader("Mixer heads (not softmax)")
    try:
        found = compare_mixer_heads(res_a, res_b)
    except AttnvizError as err:
        st.info(f"{err}. Each model's mixer heads are on its Model overview.", icon=":material/info:")
        return
    st.caption(
        "Each non-softmax mixer head's exact effective attention A (signed, not probabilities) on "
        "A's text and on B's, each over its own rows: distance back (|A|-weighted), self share and "
        "negative share of Σ|A| (a per-channel mixer's one head is its contribution norms: no sign, "
        "so no negative share). Entropy and sink share do not apply to these heads. Largest change "
        "in distance back first."
    )
    st.dataframe(found.to_frame(), hide_index=True, key="cmp_mixer_heads")
