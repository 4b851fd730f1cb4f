"""Every head's statistics of one result: `head_metrics` and its typed `HeadMetrics`.

Each layer runs the fast computation (`attnviz.metrics.fast`, from the fused kernels'
log-sum-exp — kept by the forward itself with ``extract(statistics=True)``, else one second
fused pass — no N×N tensor) when `attnviz.exact.lse.layer_spec` says its scores are exactly
scale · q·k plus a mask the kernels reproduce; otherwise (soft-capping, a position bias, learned
sinks, an odd mask, an eager result) the dense definitions over `AttentionResult.layer_tensor`
rows, in chunks. `HeadMetrics.paths` records which ran for each layer (a fused kernel that refused
its inputs shows as "blocked: <why>", never as "fused").
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from ..errors import AttnvizError
from ..exact.lse import captured, layer_spec, mask_of
from ..layout import Stack, kv_heads_of, repeat_kv
from ..result import AttentionResult
from .definitions import METRICS, ROW_METRICS, Metric, _row_sums, key_counts
from .fast import layer_sums
from .probe import InductionProbe, head_induction

log = logging.getLogger(__name__)

# Elements of one (layers, head, query rows, key_pos) chunk of the dense path; a few temporaries
# of this size live at once (float32: 128 MiB each).
CHUNK_ELEMENTS = 1 << 25
Computation = Literal["auto", "dense"]


@dataclass(frozen=True, eq=False)
class HeadMetrics:
    """Per-head metrics of one stack: each array is float64 (layer, head)."""

    stack: Stack
    n_tokens: int  # query positions the metrics were computed over
    group_size: int  # query heads per KV head
    entropy: np.ndarray
    sink: np.ndarray
    previous_token: np.ndarray
    diagonal: np.ndarray
    distance: np.ndarray
    induction: np.ndarray | None = None  # on the induction probe, not on this text
    gqa_coherence: np.ndarray | None = None  # the KV group's coherence, repeated for each head
    # per layer, which computation ran: "forward" (L and expectations kept by the model's own
    # forward, `extract(statistics=True)`; "forward + causal pass" on a bidirectional layer),
    # "fused" (a second fused attention pass), "blocked: <why>" (the exact blocked softmax, where a
    # fused kernel documented that it takes no such inputs), or "dense: <why>"
    paths: tuple[str, ...] = ()

    @property
    def n_layers(self) -> int:
        return int(self.entropy.shape[0])

    @property
    def n_heads(self) -> int:
        return int(self.entropy.shape[1])

    @property
    def n_kv_heads(self) -> int:
        return self.n_heads // max(self.group_size, 1)

    @property
    def metrics(self) -> tuple[str, ...]:
        """Names of the metrics present, in `METRICS` order."""
        return tuple(m for m in METRICS if getattr(self, m) is not None)

    def values(self, metric: Metric) -> np.ndarray:
        got = getattr(self, metric, None) if metric in METRICS else None
        if got is None:
            raise AttnvizError(f"metric {metric!r} was not computed; available: {self.metrics}")
        return got

    def kv_coherence(self) -> np.ndarray | None:
        """GQA coherence per (layer, kv_head), or None without GQA."""
        if self.gqa_coherence is None:
            return None
        return self.gqa_coherence[:, :: self.group_size]  # each KV group's first head (`repeat_kv`)

    def top(self, metric: Metric, k: int = 5) -> list[tuple[int, int, float]]:
        """The k highest-scoring heads as (layer, head, value)."""
        vals = self.values(metric)
        order = np.argsort(-vals, axis=None, kind="stable")[:k]
        return [(int(i // self.n_heads), int(i % self.n_heads), float(vals.flat[i])) for i in order]

    def to_rows(self) -> list[dict[str, int | float]]:
        """One dict per head (layer, head, kv_head, then each metric) for a sortable table."""
        names = self.metrics
        kv = kv_heads_of(range(self.n_heads), self.n_heads, self.n_kv_heads)
        return [
            {
                "layer": layer,
                "head": head,
                "kv_head": kv[head],
                **{m: float(self.values(m)[layer, head]) for m in names},  # type: ignore[arg-type]
            }
            for layer in range(self.n_layers)
            for head in range(self.n_heads)
        ]


def _chunks(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


Sums = dict[str, tuple[torch.Tensor, torch.Tensor]]


def _dense_sums(
    result: AttentionResult,
    stack: Stack,
    layers: list[int],
    group: int | None,
    batch_layers: int | None,
    chunk_elements: int,
) -> dict[int, Sums]:
    """The dense definitions over `layer_tensor` rows: ``batch_layers`` layers and a chunk of
    query rows at a time (default: as many as fit ``chunk_elements``)."""
    q_tokens, k_tokens = result.axes(stack)
    n_q, n_k = len(q_tokens), len(k_tokens)
    n_heads = result.n_heads
    row_size = max(1, min(n_q, chunk_elements // max(1, n_heads * n_k)))
    if batch_layers is None:
        batch_layers = max(1, chunk_elements // max(1, n_heads * n_q * n_k)) if row_size == n_q else 1
    which = [*ROW_METRICS, "gqa_coherence"]
    out: dict[int, Sums] = {}
    for i in range(0, len(layers), max(1, int(batch_layers))):
        batch = layers[i : i + max(1, int(batch_layers))]
        acc: Sums = {}
        for rows in _chunks(n_q, row_size):
            parts = [result.layer_tensor(layer, rows=rows, stack=stack) for layer in batch]
            dev = parts[0].device  # layers may sit on different GPUs (device_map="auto")
            probs = torch.stack([t.to(dev) for t in parts])  # (layer, head, query_pos, key_pos)
            del parts
            qpos = torch.arange(rows.start, rows.stop, device=dev)
            counts = torch.stack(
                [
                    key_counts(qpos, n_k, causal=c, window=w)
                    for c, w in (mask_of(result.layout, j, stack) for j in batch)
                ]
            )[:, None, :]  # (layer, 1, query_pos)
            for k, (total, n) in _row_sums(probs, rows.start, counts, which=which, group_size=group).items():
                acc[k] = (total, n) if k not in acc else (acc[k][0] + total, acc[k][1] + n)
        for j, layer in enumerate(batch):
            out[layer] = {k: (t[j], n[j] if n.dim() else n) for k, (t, n) in acc.items()}
    return out


def head_metrics(
    result: AttentionResult,
    *,
    stack: Stack | None = None,
    batch_layers: int | None = None,
    induction: InductionProbe | None = None,
    chunk_elements: int = CHUNK_ELEMENTS,
    computation: Computation = "auto",
) -> HeadMetrics:
    """Entropy, sink, previous-token, diagonal, distance (and GQA coherence) of every head.

    ``computation="auto"`` runs the fast log-sum-exp formulas on every layer whose scores allow
    them and the dense definitions elsewhere; ``"dense"`` runs the dense definitions everywhere
    (the oracle). Dense layers are fetched with ``result.layer_tensor`` ``batch_layers`` at a
    time (default: as many as fit ``chunk_elements``), split into query-row chunks when big.
    ``induction`` adds each head's score on that probe (same model).
    """
    if computation not in ("auto", "dense"):
        raise AttnvizError(f"computation must be 'auto' or 'dense', not {computation!r}")
    t0 = time.perf_counter()
    stack = stack if stack is not None else result.stacks[0]
    layout = result.layout
    n_layers = result.n_layers(stack)
    q_tokens, _ = result.axes(stack)
    group = layout.group_size if stack != "cross" and layout.group_size > 1 else None
    sums: dict[int, Sums] = {}
    paths: list[str] = []
    dense: list[int] = []
    for layer in range(n_layers):
        cap = captured(result, stack, layer)
        spec, why = layer_spec(cap, layout, layer, stack)
        if computation == "dense" or spec is None or cap is None:
            dense.append(layer)
            paths.append(f"dense: {why if computation == 'auto' else 'asked'}")
        else:
            sums[layer], source = layer_sums(cap, spec, group)
            paths.append(source)
    sums.update(_dense_sums(result, stack, dense, group, batch_layers, chunk_elements))
    arrays: dict[str, np.ndarray] = {}
    for k in sums[0]:
        rows = [(sums[i][k][0] / sums[i][k][1].clamp(min=1)).cpu().double().numpy() for i in range(n_layers)]
        means = np.stack(rows)  # (layer, head) or (layer, kv_head)
        if k == "gqa_coherence":
            means = repeat_kv(torch.from_numpy(means), layout.group_size, dim=-1).numpy()  # (layer, head)
        arrays[k] = means
    ind = None
    if induction is not None:
        if induction.result.layout != layout:
            raise AttnvizError("the induction probe was run on a different model; probe this model")
        ind = head_induction(induction, stack=stack, dense=computation == "dense")
    log.info(
        "head_metrics model=%s stack=%s tokens=%d layers=%d fused=%d seconds=%.3f",
        result.model_name,
        stack,
        len(q_tokens),
        n_layers,
        n_layers - len(dense),
        time.perf_counter() - t0,
    )
    return HeadMetrics(
        stack=stack,
        n_tokens=len(q_tokens),
        group_size=layout.group_size if stack != "cross" else 1,
        entropy=arrays["entropy"],
        sink=arrays["sink"],
        previous_token=arrays["previous_token"],
        diagonal=arrays["diagonal"],
        distance=arrays["distance"],
        induction=ind,
        gqa_coherence=arrays.get("gqa_coherence"),
        paths=tuple(paths),
    )
