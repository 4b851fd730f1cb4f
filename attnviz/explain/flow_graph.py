"""The routes graph: nodes (the residual stream at one token, entering a block or after its token
mixing), kept edges and the graph to one token's prediction (`attnviz.explain.routes` builds it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

from ..tokens import Tokens
from .blocks import Residual

EdgeKind = Literal["attention", "mixer", "ffn", "residual"]
EDGE_KINDS: tuple[str, ...] = get_args(EdgeKind)
Stage = Literal["in", "mid"]


@dataclass(frozen=True, order=True)
class Node:
    """The residual stream at one token: entering block ``layer`` (stage "in"; layer == n_layers is
    the final stream the prediction reads) or after block ``layer``'s attention / token mixing
    ("mid")."""

    layer: int
    token: int
    stage: Stage = "in"

    @property
    def depth(self) -> float:
        """Height in a tokens × layers drawing: layer, + 0.5 after the attention."""
        return self.layer + (0.5 if self.stage == "mid" else 0.0)


@dataclass(frozen=True)
class Edge:
    """A kept edge: ``weight`` is the renormalised importance (attention, mixer: summed over heads,
    each head's share in ``heads``; a per-channel mixer has one). ``part``: the block's branch
    ("attention" or the mixer kind, "gated_delta") on hybrids and recurrent models."""

    layer: int
    kind: EdgeKind
    source: Node
    target: Node
    weight: float
    heads: tuple[float, ...] = ()
    part: str = ""


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
    # per layer, the block's parts ("attention" / mixer kinds, then "mlp"): hybrids and recurrent
    # models; () for a transformer's trace (every block: attention + FFN)
    parts: tuple[tuple[str, ...], ...] = ()

    def writer(self, node: Node) -> tuple[int, str]:
        """(layer, part) of the block part whose output ``node`` is (`attnviz.explain.node_writes`):
        after a block's token mixing, that mixing ("mixing" where two branches run side by side);
        entering layer l > 0, layer l - 1's FFN (a parallel block's two parts: "block"; a block
        without an MLP: its mixing)."""
        if not self.parts:
            if node.stage == "mid":
                return node.layer, "attention"
            return node.layer - 1, "block" if self.residual != "sequential" else "ffn"
        layer = node.layer if node.stage == "mid" else node.layer - 1
        parts = self.parts[layer]
        mixing = [p for p in parts if p != "mlp"]
        if node.stage == "in" and "mlp" in parts:
            return layer, "ffn"
        return layer, mixing[0] if len(mixing) == 1 else "mixing"

    def to_frame(self) -> Any:
        """A pandas DataFrame: one row per edge, one column per head's share."""
        import pandas as pd

        rows = []
        for e in self.edges:
            row = {
                "layer": e.layer,
                "kind": e.kind,
                **({"part": e.part} if self.parts else {}),
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
