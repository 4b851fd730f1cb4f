"""Compare page helpers: which positions two results share, and how much every head changed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnviz import AttentionResult
from attnviz import figures as F
from attnviz.layout import Stack
from ui import models


@dataclass(frozen=True, eq=False)
class Pairing:
    """What is compared: the first ``m`` query and key positions of both results."""

    m: int
    n_a: int
    n_b: int
    same_tokens: bool
    labels: list[str]  # "(i) token", or "(i) a | b" where the two differ
    differ: list[int]  # positions < m whose tokens differ
    causal: bool

    @property
    def note(self) -> str:
        if self.same_tokens:
            return f"Both sides have the same {self.m} tokens: every weight is compared one to one."
        parts = []
        if self.n_a != self.n_b:
            parts.append(
                f"The two sides have {self.n_a} and {self.n_b} tokens, so the first {self.m} query and key "
                "positions are compared (the common length)."
            )
            if self.causal:
                parts.append("With causal attention these rows are complete: a token never sees later ones.")
            else:
                parts.append(
                    "This model attends both ways, so weight on the later keys of the longer text is left "
                    "out of the block; the Δ entropy column compares whole heads at any length."
                )
        if self.differ:
            shown = ", ".join(str(i) for i in self.differ[:12]) + ("…" if len(self.differ) > 12 else "")
            parts.append(f"Tokens differ at positions {shown}; labels show 'A | B' there.")
        return " ".join(parts)


def pair(a: AttentionResult, b: AttentionResult, stack: Stack) -> Pairing:
    qa, ka = a.axes(stack)
    qb, kb = b.axes(stack)
    if len(qa) != len(ka) or len(qb) != len(kb):  # cross-attention: compare the common block too
        m = min(len(qa), len(qb), len(ka), len(kb))
    else:
        m = min(len(qa), len(qb))
    differ = [i for i in range(m) if qa.ids[i] != qb.ids[i] or qa.display[i] != qb.display[i]]
    labels = [
        f"({i}) {qa.display[i]}" + (f" | {qb.display[i]}" if i in set(differ) else "") for i in range(m)
    ]
    same = not differ and len(qa) == len(qb) and len(ka) == len(kb)
    causal = stack == "decoder" or (stack == "self" and a.layout.kind == "decoder")
    return Pairing(m, len(qa), len(qb), same, labels, differ, causal)


def block(res: AttentionResult, layer: int, stack: Stack, m: int, sl: slice = slice(None)) -> np.ndarray:
    """(heads, rows ``sl`` of the first m, first m keys) float32."""
    start, stop, _ = sl.indices(m)
    t = res.layer_tensor(layer, rows=slice(start, stop), stack=stack)
    return t[..., :m].float().cpu().numpy()


def change_scores(a: AttentionResult, b: AttentionResult, stack: Stack, m: int, key: tuple) -> np.ndarray:
    """(layers, heads): mean over the compared query rows of the total variation distance
    0.5 * sum_key |A - B| (0 = same weights, 1 = disjoint keys)."""

    def build() -> np.ndarray:
        n_layers = a.n_layers(stack)
        out = np.zeros((n_layers, a.n_heads))
        rows = max(1, (1 << 23) // max(1, a.n_heads * m))
        for layer in range(n_layers):
            total = np.zeros(a.n_heads)
            for r in range(0, m, rows):
                sl = slice(r, min(m, r + rows))
                total += 0.5 * np.abs(block(a, layer, stack, m, sl) - block(b, layer, stack, m, sl)).sum(
                    -1
                ).sum(-1)
            out[layer] = total / m
        return out

    return models.cached("change", key, build)


def grids(
    a: AttentionResult, b: AttentionResult, layer: int, stack: Stack, p: Pairing, side: int, key: tuple
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """Pooled A, B (max) and A - B (mean) of one layer over the compared block, and bin labels."""

    def build():
        pa, re, _ = F.pooled_rows(lambda sl: block(a, layer, stack, p.m, sl), p.m, p.m, side)
        pb, _, _ = F.pooled_rows(lambda sl: block(b, layer, stack, p.m, sl), p.m, p.m, side)
        pd, _, _ = F.pooled_rows(
            lambda sl: block(a, layer, stack, p.m, sl) - block(b, layer, stack, p.m, sl),
            p.m,
            p.m,
            side,
            "mean",
        )
        return pa, pb, pd, F.bin_labels(p.labels, re)

    return models.cached("compare_grid", (key, layer, side), build)
