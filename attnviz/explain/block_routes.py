"""Information-flow routes through any block kind: hybrids and recurrent models.

The rule of `attnviz.explain.routes`, unchanged: a block's whole is the stream it writes at token
t, its parts the vectors that add up to it, each scored imp = max(‖whole‖₁ − ‖whole − part‖₁, 0),
normalised over the block's parts of that target, thresholded and renormalised per target. Here
the token-mixing block's parts are the residual stream[t] and, for every branch of the block (a
softmax attention, a per-head mixer, a per-channel mixer; Falcon-H1's two side by side), its
c_{t,s} (`attnviz.explain.route_parts`): whole = the stream after the branches (a block with an
MLP / MoE, target stage "mid") or the next block's stream (no MLP: Mamba, target stage "in").
The MLP block is as before: whole = the next stream, parts = the stream after the mixing and the
MLP's write. An edge s → t of one branch carries Σ_h c (each head's share kept; a per-channel
mixer has one "head"); an edge is kept when its weight is above the threshold. Kinds:
"attention" (softmax heads), "mixer" (``part`` names the kind), "residual", "ffn".

Cost: per expanded target, O(heads · t · d_head) for each per-head branch (plus the parts that may
flip a sign of the whole, made in full: O(heads · t · d_model) at worst), O(t · ch) for a
per-channel one; never a (targets, sources, d_model) tensor.
"""

from __future__ import annotations

import torch

from ..errors import AttnvizError
from ..loading import LoadedModel
from .block_trace import BlockTrace, block_trace
from .routes import (
    ROW_ELEMENTS,
    Edge,
    EdgeKind,
    FlowGraph,
    Node,
    Progress,
    Stage,
    importances,
    threshold_renormalise,
)


def refusal(tr: BlockTrace) -> str:
    """ "" when every block's parts are checked, else the first reason the routes cannot run."""
    problems = [p for p in tr.problems if p]
    if problems:
        return f"{tr.model_name!r}: {problems[0]}; the routes follow every block, so they stop here"
    return ""


class _BlockBuilder:
    def __init__(self, tr: BlockTrace, threshold: float) -> None:
        self.tr, self.threshold = tr, threshold
        self.edges: list[Edge] = []
        self.expanded = 0

    def _single(self, layer: int, kind: EdgeKind, source: Node, target: Node, c: float) -> bool:
        if c > self.threshold:
            self.edges.append(Edge(layer, kind, source, target, c))
            return True
        return False

    def step(self, layer: int, frontier: set[int]) -> set[int]:
        tr, targets = self.tr, sorted(frontier)
        if not targets:
            return set()
        if tr.mlp[layer] is None:  # the block is its mixing: whole = the next stream
            return self.mixing(layer, targets, "in")
        mid = tr.mixed(layer, targets)
        mlp = tr.mlp[layer]
        assert mlp is not None
        singles = torch.stack([mid, mlp[targets]], dim=1)
        _, imp = importances(tr.next_stream(layer, targets), singles)
        c_s = _normalised([], imp, self.threshold)[1]
        self.expanded += len(targets)
        mids = set()
        for i, t in enumerate(targets):
            src, dst = Node(layer, t, "mid"), Node(layer + 1, t)
            kept = self._single(layer, "residual", src, dst, float(c_s[i, 0]))
            kept |= self._single(layer, "ffn", src, dst, float(c_s[i, 1]))
            if kept:
                mids.add(t)
        return self.mixing(layer, sorted(mids), "mid") if mids else set()

    def mixing(self, layer: int, targets: list[int], stage: Stage) -> set[int]:
        tr = self.tr
        parts = tr.parts[layer]
        heads = sum(p.n_heads for p in parts.values()) or 1
        step = max(1, min(32, ROW_ELEMENTS // (heads * tr.n_tokens)))
        tgt_layer = layer if stage == "mid" else layer + 1
        sources: set[int] = set()
        for a in range(0, len(targets), step):
            chunk = targets[a : a + step]
            keys = max(chunk) + 1  # causal: target t reads sources 0 .. t
            whole = tr.mixed(layer, chunk) if stage == "mid" else tr.next_stream(layer, chunk)
            _, imp_s = importances(whole, tr.residual_in[layer][chunk][:, None])
            imp_parts = [p.importances(whole, chunk, keys).float() for p in parts.values()]
            c_parts, c_s = _normalised(imp_parts, imp_s, self.threshold)
            self.expanded += len(chunk)
            for name, c in zip(parts, c_parts, strict=True):
                sources |= self._keep_part(layer, name, chunk, c, tgt_layer, stage)
            for i, t in enumerate(chunk):
                if self._single(
                    layer, "residual", Node(layer, t), Node(tgt_layer, t, stage), float(c_s[i, 0])
                ):
                    sources.add(t)
        return sources

    def _keep_part(
        self,
        layer: int,
        name: str,
        targets: list[int],
        c: torch.Tensor,
        tgt_layer: int,
        stage: Stage,
    ) -> set[int]:
        """Edges s → t of one branch above the threshold (heads summed); their source tokens."""
        sources: set[int] = set()
        kind: EdgeKind = "attention" if name == "attention" else "mixer"
        weights = c.sum(dim=1)  # (T, keys)
        for i, t in enumerate(targets):
            for s in torch.nonzero(weights[i] > self.threshold).flatten().tolist():
                shares = tuple(float(x) for x in c[i, :, s])
                target = Node(tgt_layer, t, stage)
                self.edges.append(
                    Edge(layer, kind, Node(layer, s), target, float(weights[i, s]), shares, name)
                )
                sources.add(s)
        return sources


def _normalised(
    imp_parts: list[torch.Tensor], imp_s: torch.Tensor, threshold: float
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each target's importances over all its parts divided by their sum, thresholded and
    renormalised (`threshold_renormalise`, the branches' heads side by side)."""
    n_t = imp_s.shape[0]
    cat = torch.cat(imp_parts, dim=1) if imp_parts else imp_s.new_zeros(n_t, 0, 0)
    total = cat.sum(dim=(1, 2)) + imp_s.sum(dim=1)
    total = torch.where(total > 0, total, torch.ones_like(total))
    c_a, c_s = threshold_renormalise(cat / total[:, None, None], imp_s / total[:, None], threshold)
    return list(c_a.split([p.shape[1] for p in imp_parts], dim=1)), c_s


def block_flow(
    lm: LoadedModel,
    text: str | BlockTrace,
    token: int,
    threshold: float,
    *,
    chat: bool = False,
    progress: Progress | None = None,
) -> FlowGraph:
    """`attnviz.explain.information_flow` on a hybrid or recurrent model (module doc)."""
    tr = text if isinstance(text, BlockTrace) else block_trace(lm, text, chat=chat)
    why = refusal(tr)
    if why:
        raise AttnvizError(why)
    start = tr.position(token)
    build = _BlockBuilder(tr, float(threshold))
    frontier = {start}
    with torch.inference_mode():
        for done, layer in enumerate(reversed(range(tr.n_layers))):
            frontier = build.step(layer, frontier)
            if progress is not None:
                progress(done + 1, tr.n_layers)
    nodes = {Node(tr.n_layers, start)} | {e.source for e in build.edges} | {e.target for e in build.edges}
    return FlowGraph(
        model_name=tr.model_name,
        tokens=tr.tokens,
        token=start,
        threshold=float(threshold),
        residual="sequential",
        n_layers=tr.n_layers,
        n_heads=tr.n_heads,
        nodes=tuple(sorted(nodes)),
        edges=tuple(build.edges),
        expanded=build.expanded,
        notes=tr.notes,
        parts=tuple(tr.part_names(b) for b in range(tr.n_layers)),
    )
