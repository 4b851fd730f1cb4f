"""Information-flow routes (Ferrando & Voita 2024; the LLM Transparency Tool's graph).

A block's *whole* is the residual stream it writes at token t; its *parts* are the vectors that
add up to it. The attention block: whole ``mid[t]`` (the stream after attention), parts
``stream[t]`` (the residual) and one vector per key token j and head h,

    part_jh = α^h_tj · W_O^h v^h_j        (through the frozen norm after the heads where there is one)

The FFN block: whole ``stream_next[t]``, parts ``mid[t]`` and ``mlp[t]``. Parallel-residual blocks
(GPT-J, NeoX, Falcon) are one block: whole ``stream_next[t]``, parts ``stream[t]``, ``mlp[t]``
and the heads' parts. The importance of a part is

    imp = max(‖whole‖₁ − ‖whole − part‖₁, 0),   c = imp / Σ_parts imp

then, as LLM-TT does, every c ≤ threshold is set to 0 and the rest renormalised to sum to 1 per
block. An attention edge j → t carries Σ_h c_jh (each head's share kept); an edge is kept when its
weight is above the threshold. The graph is built backwards from one token's final stream,
expanding only nodes reached by kept edges: the cost is the kept graph's, O(heads · N · d_model)
per expanded node, never an (N, N, d_model) tensor. `dense_contributions` in the tests computes
every part of every block densely and must give the same graph (float32, 1e-5).

LLM-TT's code clips imp at 1e-5 instead of 0 and gives its self-edge j = t and the residual edge
one slot in a graph (the later one wins); here imp is clipped at 0 as in the paper and the two
edges stay apart (kinds "attention" and "residual").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch

from ..errors import AttnvizError
from ..loading import LoadedModel
from ..tokens import Tokens
from .residual import Residual, Trace, trace

EdgeKind = Literal["attention", "ffn", "residual"]
EDGE_KINDS: tuple[str, ...] = get_args(EdgeKind)
Stage = Literal["in", "mid"]
DEFAULT_THRESHOLD = 0.04
ROW_ELEMENTS = 2**22  # (targets, heads, keys) floats per step of a block's expansion
MAX_ROWS = 32  # targets per step: α rows (rows, heads, N) stay within O(heads · N · d_model)
FLIP_DIMS = 64  # components of a target row searched for sign flips per part (see below)
Progress = Callable[[int, int], None]  # (blocks done, blocks in all); raising cancels


@dataclass(frozen=True, order=True)
class Node:
    """The residual stream at one token: entering block ``layer`` (stage "in"; layer == n_layers is
    the final stream the prediction reads) or after block ``layer``'s attention ("mid")."""

    layer: int
    token: int
    stage: Stage = "in"

    @property
    def depth(self) -> float:
        """Height in a tokens × layers drawing: layer, + 0.5 after the attention."""
        return self.layer + (0.5 if self.stage == "mid" else 0.0)


@dataclass(frozen=True)
class Edge:
    """A kept edge: ``weight`` is the renormalised importance (attention: summed over heads,
    each head's share in ``heads``)."""

    layer: int
    kind: EdgeKind
    source: Node
    target: Node
    weight: float
    heads: tuple[float, ...] = ()


@dataclass(frozen=True)
class FlowGraph:
    """The routes that lead to one token's prediction."""

    model_name: str
    tokens: Tokens
    token: int  # the position the graph starts from
    threshold: float
    residual: Residual
    n_layers: int
    n_heads: int
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    expanded: int  # block rows computed (the cost grows with this, not with N²)
    notes: tuple[str, ...] = ()

    def to_frame(self) -> Any:
        """A pandas DataFrame: one row per edge, one column per head's share."""
        import pandas as pd

        rows = []
        for e in self.edges:
            row = {
                "layer": e.layer,
                "kind": e.kind,
                "source_token": e.source.token,
                "source_stage": e.source.stage,
                "source_layer": e.source.layer,
                "target_token": e.target.token,
                "target_stage": e.target.stage,
                "target_layer": e.target.layer,
                "weight": e.weight,
            }
            row.update({f"head_{h}": (e.heads[h] if e.heads else 0.0) for h in range(self.n_heads)})
            rows.append(row)
        return pd.DataFrame(rows, columns=list(rows[0]) if rows else None)

    def edges_into(self, node: Node) -> list[Edge]:
        return [e for e in self.edges if e.target == node]


def threshold_renormalise(
    c_attn: torch.Tensor, c_single: torch.Tensor, threshold: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """LLM-TT's `apply_threshold_and_renormalize`: per block row, contributions ≤ threshold are
    erased and the rest rescaled to sum to 1. c_attn (T, heads, keys), c_single (T, parts)."""
    c_attn = c_attn * (c_attn > threshold)
    c_single = c_single * (c_single > threshold)
    denom = c_attn.sum(dim=(1, 2)) + c_single.sum(dim=1)
    denom = torch.where(denom > 0, denom, torch.ones_like(denom))  # nothing kept: all stay 0
    return c_attn / denom[:, None, None], c_single / denom[:, None]


def importances(
    whole: torch.Tensor,
    singles: torch.Tensor,
    alpha: torch.Tensor | None = None,
    u: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(imp of the attention parts (T, heads, keys), imp of the single parts (T, S)), float32.

    whole (T, d); singles (T, S, d); attention part (t, h, j) = alpha[t, h, j] · u[h, j]
    (alpha ≥ 0 (T, heads, keys), u (heads, keys, d)). Memory O(heads · keys · d).
    """
    wn = whole.abs().sum(-1)  # (T,)
    imp_s = (wn[:, None] - (whole[:, None] - singles).abs().sum(-1)).clamp_(min=0)
    if alpha is None or u is None:
        return whole.new_zeros(whole.shape[0], 0, 0), imp_s
    return attention_importances(whole, alpha, u), imp_s


def attention_importances(whole: torch.Tensor, alpha: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """max(‖w‖₁ − ‖w − a·u‖₁, 0) for every target row w (T, d) and part a·u, a = alpha[t, h, j] ≥ 0,
    u = u[h, j]: (T, heads, keys), without making the (T, heads, keys, d) parts.

    With s = sign(w) (+1 at 0), for each component |w_i − a u_i| = |w_i| − a s_i u_i, plus
    2 (a s_i u_i − |w_i|) where that is positive (the part flips the component's sign), so

        ‖w‖₁ − ‖w − a u‖₁ = a (s · u) − 2 Σ_i relu(a s_i u_i − |w_i|)

    The first term is one matrix product for all parts. A component can flip only where
    |w_i| < a |u_i| ≤ a · max|u|: for almost every part those are among the few smallest |w_i|,
    so the sum runs over the `FLIP_DIMS` smallest components of w; the parts that could flip more
    (large α) are computed in full. Same numbers as the literal definition (float32 rounding).
    """
    n_t, n_h, n_k = alpha.shape
    d = whole.shape[-1]
    sign = torch.where(whole >= 0, 1.0, -1.0)  # (T, d)
    imp = torch.einsum("hkd,td->thk", u, sign).mul_(alpha)  # a (s · u): (T, heads, keys)
    aw = whole.abs()
    order = aw.argsort(dim=-1)  # (T, d): components by |w_i|, smallest first
    ranked = aw.gather(-1, order)
    reach = alpha * u.abs().amax(dim=-1)[None]  # a · max|u|: components below it may flip
    flips = torch.searchsorted(ranked.contiguous(), reach.reshape(n_t, -1)).reshape(n_t, n_h, n_k)
    k = min(d, FLIP_DIMS)
    ut = u.permute(2, 0, 1)  # (d, heads, keys): a component of every part is one slab
    for t in range(n_t):
        idx = order[t, :k]
        su = ut[idx] * sign[t, idx][:, None, None]  # s_i u_i: (k, heads, keys)
        su.mul_(alpha[t][None]).sub_(aw[t, idx][:, None, None]).clamp_(min=0)
        imp[t].sub_(su.sum(dim=0), alpha=2.0)
    big = torch.nonzero(flips > k)  # (n, 3) parts that may flip beyond the k smallest
    for a in range(0, big.shape[0], 4096):
        bt, bh, bj = big[a : a + 4096].unbind(1)
        parts = alpha[bt, bh, bj][:, None] * u[bh, bj]  # (n, d)
        imp[bt, bh, bj] = wn_minus(whole[bt], parts)
    return imp.clamp_(min=0)


def wn_minus(whole: torch.Tensor, parts: torch.Tensor) -> torch.Tensor:
    """‖w‖₁ − ‖w − part‖₁ row by row (the literal definition)."""
    return whole.abs().sum(-1) - (whole - parts).abs().sum(-1)


def block_contributions(
    whole: torch.Tensor,
    singles: torch.Tensor,
    alpha: torch.Tensor | None,
    u: torch.Tensor | None,
    threshold: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised (and, with a threshold, thresholded + renormalised) contributions of a block's
    parts: (attention (T, heads, keys), singles (T, S))."""
    imp_a, imp_s = importances(whole, singles, alpha, u)
    total = imp_a.sum(dim=(1, 2)) + imp_s.sum(dim=1)
    total = torch.where(total > 0, total, torch.ones_like(total))
    c_a, c_s = imp_a / total[:, None, None], imp_s / total[:, None]
    return (c_a, c_s) if threshold is None else threshold_renormalise(c_a, c_s, threshold)


def head_vectors(lm: LoadedModel, tr: Trace, layer: int) -> torch.Tensor:
    """W_O^h v^h_j for every head and key, through the frozen norm after the heads without its
    per-token scale (that scale multiplies α per target): float32 (heads, keys, d_model)."""
    v = tr.values(layer)  # (heads, keys, d_head)
    u = torch.matmul(v, tr.w_o(lm, layer).to(v.device).transpose(1, 2))  # (heads, keys, d_model)
    norm = tr.attn_norm[layer]
    return u if norm is None else norm.unscaled(u)


def _alpha(tr: Trace, layer: int, targets: Sequence[int], keys: int) -> torch.Tensor:
    """α rows of ``targets`` over the first ``keys`` keys, times the frozen post-norm's scale."""
    rows = torch.stack([tr.probs(layer, t)[:, :keys] for t in targets])  # (T, heads, keys)
    norm = tr.attn_norm[layer]
    if norm is not None:
        rows = rows * norm.scale[list(targets)].to(rows.device)[:, None, None]
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
        u_all = head_vectors(self.lm, tr, layer)  # (heads, N, d_model)
        step = max(1, min(MAX_ROWS, ROW_ELEMENTS // (u_all.shape[0] * tr.n_tokens)))
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
            c_a, c_s = block_contributions(whole, singles, alpha, u_all[:, :keys], self.threshold)
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
    text: str | Trace,
    token: int = -1,
    threshold: float = DEFAULT_THRESHOLD,
    *,
    chat: bool = False,
    progress: Progress | None = None,
) -> FlowGraph:
    """The information-flow routes to ``token``'s prediction (default: the last token).

    ``text`` may be a `Trace` of it (one forward for every explanation). Edges with a
    renormalised importance above ``threshold`` are kept; only their nodes are expanded.
    """
    if not 0.0 <= float(threshold) < 1.0:
        raise AttnvizError(f"threshold {threshold} is outside 0 .. 1")
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
