"""One text -> one cache entry: the computation both engines run, on the driver (local engine) or
in a Ray worker. A worker loads its model from a `ModelRef` (a spec, not weights, crosses the
wire)."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import AttnvizError, OutOfMemory
from ..extract import extract_ids
from ..inputs import tokenize
from ..layout import Stack
from ..loading import LoadedModel, is_out_of_memory, load_model
from ..metrics import head_metrics
from .cache import Entry
from .ranking import STATISTICS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelRef:
    """What a worker needs to load the model itself: a spec and how to load it."""

    spec: str
    device: str = "auto"
    dtype: str = "auto"
    revision: str | None = None

    def load(self) -> LoadedModel:
        return load_model(self.spec, device=self.device, dtype=self.dtype, revision=self.revision)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def fingerprint(lm: LoadedModel) -> str:
    """The weights a result came from: layout, dtype and the sums of the first and last parameter
    (enough to tell two checkpoints apart; not a proof of equality)."""
    h = hashlib.sha256(f"{lm.layout!r}|{lm.dtype}".encode())
    params = list(lm.model.parameters())
    for p in (params[0], params[-1]) if params else ():
        if p.device.type != "meta":
            h.update(f"{tuple(p.shape)}:{float(p.detach().double().sum()):.10e}".encode())
    return h.hexdigest()[:20]


def strongest_links(probs: torch.Tensor) -> np.ndarray:
    """(heads, q, k) -> float64 (heads, 3): query, key and weight of the largest weight outside
    row 0 and key 0 (-1, -1, 0 when there is no such cell)."""
    h, n_q, n_k = probs.shape
    if n_q < 2 or n_k < 2:
        return np.tile(np.array([-1.0, -1.0, 0.0]), (h, 1))
    inner = probs[:, 1:, 1:].reshape(h, -1)
    w, idx = inner.max(dim=-1)
    q = (idx // (n_k - 1) + 1).double().cpu().numpy()
    k = (idx % (n_k - 1) + 1).double().cpu().numpy()
    return np.stack([q, k, w.double().cpu().numpy()], axis=-1)


def layer_labels(lm: LoadedModel, stack: Stack) -> tuple[str, ...]:
    return tuple(lm.layout.layer_label(i) for i in range(lm.layout.layers_in(stack)))


def compute_entry(
    lm: LoadedModel, key: str, text: str, *, stack: Stack, max_tokens: int, weights: str = ""
) -> Entry:
    """Every head's statistics and strongest link on ``text``; a failure becomes an entry with
    the reason (final when the text itself is the cause, e.g. too long; not final when a retry
    may pass, e.g. out of memory)."""
    labels = layer_labels(lm, stack)
    try:
        ids, template = tokenize(lm, text)
        if len(ids) > max_tokens:
            reason = f"{len(ids)} tokens, over the atlas limit of {max_tokens}"
            return Entry(key, error=reason, fingerprint=weights, stack=stack)
        res = extract_ids(lm, ids, template=template, max_tokens=max_tokens)
        hm = head_metrics(res, stack=stack)
        values = np.stack([np.asarray(hm.values(s), dtype=np.float64) for s in STATISTICS])  # type: ignore[arg-type]
        links = np.stack([strongest_links(t) for _, t in res.iter_layers(stack)])  # (layers, heads, 3)
        q_tokens, _ = res.axes(stack)
    except AttnvizError as err:
        retry = isinstance(err, OutOfMemory)
        return Entry(key, error=str(err), final=not retry, fingerprint=weights, stack=stack)
    except Exception as err:  # any failure of one text is recorded, the run goes on
        log.warning("atlas text %s failed: %s", key, err, exc_info=True)
        reason = "out of memory" if is_out_of_memory(err) else f"{type(err).__name__}: {err}"
        return Entry(key, error=reason, final=False, fingerprint=weights, stack=stack)
    return Entry(
        key,
        tokens=tuple(q_tokens.display),
        values=values,
        links=links,
        fingerprint=weights,
        layer_labels=labels,
        stack=stack,
    )
