"""Tiny models with sharper attention (q/k weights scaled up) and the fast-vs-dense comparison
of head statistics that the statistics, rollout and pooling tests share."""

from __future__ import annotations

import copy

import numpy as np
import tiny
import torch

import attnviz
from attnviz import metrics as M

# Long enough (> 40 tokens) that a sliding window of 4 and several 512-row blocks matter.
TEXT = (
    "the financial bank is located on river bank and a quick brown fox jumps over the lazy dog; "
    "attention is all you need, heads look at tokens, the bank of the river floods in spring"
)
FUSED = {"llama-gqa", "qwen3", "mistral-sliding", "gpt2", "bert", "bart"}
_SHARP: dict[str, attnviz.LoadedModel] = {}


def sharp(arch: str) -> attnviz.LoadedModel:
    """The tiny model with its q/k weights scaled 3x more: peaked, varied patterns (the shared
    tiny models attend almost uniformly, which would make parity a weak check)."""
    if arch not in _SHARP:
        base = tiny.loaded(arch)
        model = copy.deepcopy(base.model)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 2 and any(
                    k in name for k in ("q_proj", "k_proj", "query", "key", ".q.", ".k.", "c_attn")
                ):
                    p.mul_(3.0)
        _SHARP[arch] = attnviz.wrap_model(model, base.tokenizer, spec=f"tiny-{arch}-sharp")
    return _SHARP[arch]


def assert_same(fast: M.HeadMetrics, dense: M.HeadMetrics, tol: float) -> dict[str, float]:
    errs = {}
    assert fast.metrics == dense.metrics
    for m in fast.metrics:
        a, b = fast.values(m), dense.values(m)
        assert a.shape == b.shape and np.isfinite(a).all(), m
        errs[m] = float(np.abs(a - b).max())
        assert errs[m] <= tol * (fast.n_tokens if m == "distance" else 1), (m, errs[m])
    return errs
