"""Information-flow routes (Ferrando & Voita 2024; the LLM Transparency Tool's graph).

A block's *whole* is the residual stream it writes at token t; its *parts* are the vectors that
add up to it. The attention block: whole ``mid[t]`` (the stream after attention), parts
``stream[t]`` (the residual) and one vector per key token j and head h,

    part_jh = α^h_tj · W_O^h v^h_j        (through the frozen norm after the heads where there is one)

The FFN block: whole ``stream_next[t]``, parts ``mid[t]`` and ``mlp[t]``. Parallel-residual blocks
(GPT-J, NeoX, Falcon) are one block: whole ``stream_next[t]``, parts ``stream[t]``, ``mlp[t]``
and the heads' parts. The importance of a part is

    imp = max(‖whole‖₁ − ‖whole − part‖₁, 0),   c = imp / Σ_parts imp

then every c ≤ threshold is set to 0 and the rest renormalised to sum to 1 per block and target
token, as the paper defines it: a token's proportions compare the parts of that token's own stream.
An attention edge j → t carries Σ_h c_jh (each head's share kept); an edge is kept when its
weight is above the threshold. The graph is built backwards from one token's final stream,
expanding only nodes reached by kept edges: the cost is the kept graph's, O(heads · N · d_model)
per expanded node, never an (N, N, d_model) tensor. The test suite's `dense_graph` (tiny_explain.py) computes
every part of every block densely and must give the same graph (float32, 1e-5).

Where LLM-TT's code differs: it clips imp at 1e-5, not 0; it sums its self-edge j = t and the
residual edge into one edge (here two, kinds "attention" and "residual"); and for the FFN block
its `apply_threshold_and_renormalize` sums over no block dimension, ``sum(dim=())``, which torch
reduces over every token: a token's FFN share is divided by its residual share plus the FFN shares
of all tokens of the layer, a bug (one token's large FFN dims every other token's FFN edge, and a
token's residual and FFN shares no longer sum to 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..errors import AttnvizError
from ..loading import LoadedModel
from .flow_graph import EDGE_KINDS, Edge, EdgeKind, FlowGraph, Node, Stage
from .residual import Trace, trace

if TYPE_CHECKING:
    from .block_trace import BlockTrace

__all__ = ["EDGE_KINDS", "Edge", "EdgeKind", "FlowGraph", "Node", "Stage", "information_flow"]

DEFAULT_THRESHOLD = 0.04
ROW_ELEMENTS = 2**22  # (targets, heads, keys) floats per step of a block's expansion
MAX_ROWS = 32  # targets per step: α rows (rows, heads, N) stay within O(heads · N · d_model)
FLIP_DIMS = 16  # components of a target row searched for sign flips per part (see below)
Progress = Callable[[int, int], None]  # (blocks done, blocks in all); raising cancels


def threshold_renormalise(
    c_attn: torch.Tensor, c_single: torch.Tensor, threshold: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per block row (one target token), contributions ≤ threshold are erased and the rest rescaled
    to sum to 1, the paper's per-token renormalisation (LLM-TT's `apply_threshold_and_renormalize`
    for the attention block; see the module doc for its FFN block). c_attn (T, heads, keys),
    c_single (T, parts)."""
    c_attn = c_attn * (c_attn > threshold)
    c_single = c_single * (c_single > threshold)
    denom = c_attn.sum(dim=(1, 2)) + c_single.sum(dim=1)
    denom = torch.where(denom > 0, denom, torch.ones_like(denom))  # nothing kept: all stay 0
    return c_attn / denom[:, None, None], c_single / denom[:, None]


@dataclass(frozen=True)
class HeadVectors:
    """One layer's heads, enough to make any part u_hj = W'_h v^h_j on demand, where W'_h is W_O^h
    through the frozen norm after the heads without its per-token scale (that scale multiplies α
    per target; W' = W_O without such a norm). Never the (heads, N, d_model) parts themselves."""

    w: torch.Tensor  # (heads, d_model, d_head) W'_h
    v: torch.Tensor  # (heads, N, d_head) values per query head (GQA's KV heads repeated)
    bound: torch.Tensor  # (heads, N) ≥ max_i |u_hj,i|: max row norm of W'_h times ‖v_j‖

    def parts(self, h: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """u for parts (h[n], j[n]): (n, d_model), one head at a time."""
        out = torch.empty(h.shape[0], self.w.shape[1], dtype=self.w.dtype, device=self.w.device)
        for head in torch.unique(h).tolist():
            sel = h == head
            out[sel] = self.v[head, j[sel]] @ self.w[head].T
        return out


def head_vectors(lm: LoadedModel, tr: Trace, layer: int) -> HeadVectors:
    v = tr.values(layer)  # (heads, N, d_head)
    w = tr.w_o(lm, layer).to(v.device)  # (heads, d_model, d_head)
    norm = tr.attn_norm[layer]
    if norm is not None:  # the norm acts on d_model: apply it to each column of W_O^h
        w = norm.unscaled(w.transpose(1, 2)).transpose(1, 2)
    bound = w.norm(dim=-1).amax(dim=-1)[:, None] * v.norm(dim=-1)  # Cauchy-Schwarz per component
    return HeadVectors(w.contiguous(), v, bound * (1 + 1e-5))


def importances(
    whole: torch.Tensor,
    singles: torch.Tensor,
    alpha: torch.Tensor | None = None,
    hv: HeadVectors | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(imp of the attention parts (T, heads, keys), imp of the single parts (T, S)), float32.

    whole (T, d); singles (T, S, d); attention part (t, h, j) = alpha[t, h, j] · u_hj with
    u_hj = W'_h v_j (`HeadVectors`), alpha ≥ 0 (T, heads, keys). Memory O(heads · N · d_head).
    """
    wn = whole.abs().sum(-1)  # (T,)
    imp_s = (wn[:, None] - (whole[:, None] - singles).abs().sum(-1)).clamp_(min=0)
    if alpha is None or hv is None:
        return whole.new_zeros(whole.shape[0], 0, 0), imp_s
    return attention_importances(whole, alpha, hv), imp_s


def attention_importances(whole: torch.Tensor, alpha: torch.Tensor, hv: HeadVectors) -> torch.Tensor:
    """max(‖w‖₁ − ‖w − a·u‖₁, 0) for every target row w (T, d) and part a·u, a = alpha[t, h, j] ≥ 0,
    u = W'_h v_j: (T, heads, keys), without making the (T, heads, keys, d) parts.

    With s = sign(w) (+1 at 0), for each component |w_i − a u_i| = |w_i| − a s_i u_i, plus
    2 (a s_i u_i − |w_i|) where that is positive (the part flips the component's sign), so

        ‖w‖₁ − ‖w − a u‖₁ = a (s · u) − 2 Σ_i relu(a s_i u_i − |w_i|)

    The first term needs no part: s · W'_h v_j = (W'_hᵀ s) · v_j, one small matrix product. A
    component can flip only where |w_i| < a |u_i| ≤ a · bound_hj, i.e. among the components of w
    below that: none for most parts (small α), a few for some (summed over the `FLIP_DIMS`
    smallest |w_i|, u made for those components only), many for the rare large parts (made in
    full). Same numbers as the literal definition, to float32 rounding.
    """
    n_t, n_h, n_k = alpha.shape
    d = whole.shape[-1]
    v = hv.v[:, :n_k]  # (heads, keys, d_head)
    sign = torch.where(whole >= 0, 1.0, -1.0)  # (T, d)
    pulled = torch.einsum("hmd,tm->thd", hv.w, sign)  # W'_hᵀ s: (T, heads, d_head)
    imp = torch.einsum("hkd,thd->thk", v, pulled).mul_(alpha)  # a (s · u): (T, heads, keys)
    aw = whole.abs()
    order = aw.argsort(dim=-1)  # (T, d): components by |w_i|, smallest first
    ranked = aw.gather(-1, order).contiguous()
    reach = alpha * hv.bound[None, :, :n_k]  # components of w below it may flip
    loose = torch.searchsorted(ranked, reach.reshape(n_t, -1)).reshape(n_t, n_h, n_k)
    cand = torch.nonzero(loose > 0)  # (n, 3) parts that may flip a component
    if cand.numel() == 0:
        return imp.clamp_(min=0)
    t, h, j = cand.unbind(1)
    pairs, inv = torch.unique(h * n_k + j, return_inverse=True)  # their (head, key) pairs
    u = hv.parts(pairs // n_k, pairs % n_k)  # (pairs, d): u made for these only
    a = alpha[t, h, j]
    reach_t = a * u.abs().amax(dim=-1)[inv]  # the exact max |u_i| now
    flips = torch.empty_like(t)
    for row in torch.unique(t).tolist():
        sel = t == row
        flips[sel] = torch.searchsorted(ranked[row], reach_t[sel])
    k = min(d, FLIP_DIMS)
    few = torch.nonzero((flips > 0) & (flips <= k)).flatten()  # a correction over k components
    for c in range(0, few.shape[0], 1 << 15):
        n = few[c : c + (1 << 15)]
        comp = order[t[n], :k]  # (n, k): the k smallest |w_i| of each part's target
        su = u[inv[n][:, None], comp] * sign[t[n][:, None], comp]  # s_i u_i
        corr = (a[n][:, None] * su - aw[t[n][:, None], comp]).clamp_(min=0).sum(-1)
        imp[t[n], h[n], j[n]] -= 2 * corr
    many = torch.nonzero(flips > k).flatten()  # the full sum
    for c in range(0, many.shape[0], 1024):
        n = many[c : c + 1024]
        imp[t[n], h[n], j[n]] = wn_minus(whole[t[n]], a[n][:, None] * u[inv[n]])
    return imp.clamp_(min=0)


def wn_minus(whole: torch.Tensor, parts: torch.Tensor) -> torch.Tensor:
    """‖w‖₁ − ‖w − part‖₁ row by row (the literal definition)."""
    return whole.abs().sum(-1) - (whole - parts).abs().sum(-1)


def block_contributions(
    whole: torch.Tensor,
    singles: torch.Tensor,
    alpha: torch.Tensor | None,
    hv: HeadVectors | None,
    threshold: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised (and, with a threshold, thresholded + renormalised) contributions of a block's
    parts: (attention (T, heads, keys), singles (T, S))."""
    imp_a, imp_s = importances(whole, singles, alpha, hv)
    total = imp_a.sum(dim=(1, 2)) + imp_s.sum(dim=1)
    total = torch.where(total > 0, total, torch.ones_like(total))
    c_a, c_s = imp_a / total[:, None, None], imp_s / total[:, None]
    return (c_a, c_s) if threshold is None else threshold_renormalise(c_a, c_s, threshold)


def _alpha(tr: Trace, layer: int, targets: list[int], n_keys: int) -> torch.Tensor:
    """α rows of ``targets`` over the first ``n_keys`` keys (T, heads, keys), exact as eager's,
    times the frozen post-norm's scale of each target."""
    rows = tr.probs_rows(layer, targets, n_keys)
    norm = tr.attn_norm[layer]
    if norm is not None:
        rows = rows * norm.scale[targets].to(rows.device)[:, None, None]
    return rows


class _Builder:
    def __init__(self, lm: LoadedModel, tr: Trace, threshold: float) -> None:
        self.lm, self.tr, self.threshold = lm, tr, threshold
        self.edges: list[Edge] = []
        self.expanded = 0

    def _f(self, x: torch.Tensor) -> torch.Tensor:
        return x.float()

    def attention(self, layer: int, targets: list[int], stage: Stage) -> set[int]:
        """Expand the attention block of ``targets`` a few rows at a time (memory O(heads · N · d)):
        sequential: whole = mid, parts = the stream + the heads' parts (target stage "mid");
        parallel: whole = the next stream, parts = the stream, the MLP + the heads' parts."""
        tr, f = self.tr, self._f
        hv = head_vectors(self.lm, tr, layer)
        step = max(1, min(MAX_ROWS, ROW_ELEMENTS // (hv.v.shape[0] * tr.n_tokens)))
        sources: set[int] = set()
        for a in range(0, len(targets), step):
            chunk = targets[a : a + step]
            keys = max(chunk) + 1  # causal: a target sees keys 0 .. t
            if stage == "mid":
                whole, singles = f(tr.mid(layer, chunk)), f(tr.stream[layer][chunk])[:, None]
            else:
                whole = f(tr.stream[layer + 1][chunk])
                singles = torch.stack([f(tr.stream[layer][chunk]), f(tr.mlp_added[layer][chunk])], dim=1)
            alpha = _alpha(tr, layer, chunk, keys)
            c_a, c_s = block_contributions(whole, singles, alpha, hv, self.threshold)
            self.expanded += len(chunk)
            sources |= self.keep_attention(layer, chunk, c_a, stage)
            for i, t in enumerate(chunk):
                if stage == "mid":
                    kept = self.keep_single(
                        layer, "residual", Node(layer, t), Node(layer, t, "mid"), float(c_s[i, 0])
                    )
                else:
                    src, dst = Node(layer, t), Node(layer + 1, t)
                    kept = self.keep_single(layer, "residual", src, dst, float(c_s[i, 0]))
                    kept |= self.keep_single(layer, "ffn", src, dst, float(c_s[i, 1]))
                if kept:
                    sources.add(t)
        return sources

    def keep_attention(
        self, layer: int, targets: list[int], c_a: torch.Tensor, target_stage: Stage
    ) -> set[int]:
        """Attention edges j → t above the threshold; their source tokens."""
        sources: set[int] = set()
        weights = c_a.sum(dim=1)  # (T, keys)
        tgt_layer = layer if target_stage == "mid" else layer + 1
        for i, t in enumerate(targets):
            for j in torch.nonzero(weights[i] > self.threshold).flatten().tolist():
                heads = tuple(float(x) for x in c_a[i, :, j])
                self.edges.append(
                    Edge(
                        layer,
                        "attention",
                        Node(layer, j),
                        Node(tgt_layer, t, target_stage),
                        float(weights[i, j]),
                        heads,
                    )
                )
                sources.add(j)
        return sources

    def keep_single(self, layer: int, kind: EdgeKind, source: Node, target: Node, c: float) -> bool:
        if c > self.threshold:
            self.edges.append(Edge(layer, kind, source, target, c))
            return True
        return False

    def sequential(self, layer: int, frontier: set[int]) -> set[int]:
        tr, f = self.tr, self._f
        targets = sorted(frontier)
        mids: set[int] = set()
        if targets:  # FFN block: whole = next stream, parts = mid, mlp
            mid = f(tr.mid(layer, targets))
            singles = torch.stack([mid, f(tr.mlp_added[layer][targets])], dim=1)
            _, c_s = block_contributions(
                f(tr.stream[layer + 1][targets]), singles, None, None, self.threshold
            )
            self.expanded += len(targets)
            for i, t in enumerate(targets):
                src, dst = Node(layer, t, "mid"), Node(layer + 1, t)
                kept = self.keep_single(layer, "residual", src, dst, float(c_s[i, 0]))
                kept |= self.keep_single(layer, "ffn", src, dst, float(c_s[i, 1]))
                if kept:
                    mids.add(t)
        return self.attention(layer, sorted(mids), "mid") if mids else set()

    def parallel(self, layer: int, frontier: set[int]) -> set[int]:
        return self.attention(layer, sorted(frontier), "in") if frontier else set()


def information_flow(
    lm: LoadedModel,
    text: str | Trace | BlockTrace,
    token: int = -1,
    threshold: float = DEFAULT_THRESHOLD,
    *,
    chat: bool = False,
    progress: Progress | None = None,
) -> FlowGraph:
    """The information-flow routes to ``token``'s prediction (default: the last token).

    ``text`` may be a `Trace` of it (one forward for every explanation), or on a hybrid or
    recurrent model a `BlockTrace` (`attnviz.explain.block_routes`: mixer heads' c_{t,s} as edges).
    Edges with a renormalised importance above ``threshold`` are kept; only their nodes are expanded.
    """
    if not 0.0 <= float(threshold) < 1.0:
        raise AttnvizError(f"threshold {threshold} is outside 0 .. 1")
    from .block_routes import block_flow  # (it builds on this module)
    from .block_trace import BlockTrace
    from .stream import needs_stream

    if not isinstance(text, str | list | tuple | Trace | BlockTrace):
        raise AttnvizError(
            f"routes read a text, a Trace or (hybrids, recurrent models) a block_trace, not a "
            f"{type(text).__name__} (a Stream keeps no mixer's parts): pass "
            "attnviz.explain.block_trace(lm, text)"
        )
    if isinstance(text, BlockTrace) or (not isinstance(text, Trace) and needs_stream(lm.layout)):
        return block_flow(lm, text, token, threshold, chat=chat, progress=progress)
    tr = text if isinstance(text, Trace) else trace(lm, text, chat=chat)
    if tr.heads_problem:
        raise AttnvizError(tr.heads_problem)
    start = tr.position(token)
    build = _Builder(lm, tr, float(threshold))
    frontier = {start}
    with torch.inference_mode():
        for done, layer in enumerate(reversed(range(tr.n_layers))):
            step = build.sequential if tr.residual == "sequential" else build.parallel
            frontier = step(layer, frontier)
            if progress is not None:
                progress(done + 1, tr.n_layers)
    nodes = {Node(tr.n_layers, start)} | {e.source for e in build.edges} | {e.target for e in build.edges}
    return FlowGraph(
        model_name=tr.model_name,
        tokens=tr.tokens,
        token=start,
        threshold=float(threshold),
        residual=tr.residual,
        n_layers=tr.n_layers,
        n_heads=tr.n_heads,
        nodes=tuple(sorted(nodes)),
        edges=tuple(build.edges),
        expanded=build.expanded,
        notes=tr.notes,
    )
