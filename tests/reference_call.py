"""The named reference on one captured attention call, shared by the reference tests and the
source properties."""

from __future__ import annotations

import torch

from attnviz.reference.attention import attention_probabilities


def reference_of(cap) -> torch.Tensor:
    """The reference on one captured call: (heads, q, k) float32. A float mask is its allowed
    entries plus whatever finite bias it carries (Falcon adds ALiBi into its mask)."""
    bias, mask = cap.position_bias, None
    if cap.mask is not None:
        m = cap.mask.float()
        mask = m > torch.finfo(cap.mask.dtype).min / 2 if cap.mask.dtype != torch.bool else cap.mask
        if cap.mask.dtype != torch.bool:
            extra = m.masked_fill(~mask, 0.0)
            bias = extra if bias is None else bias + extra
    p = attention_probabilities(
        cap.query,
        cap.key,
        scaling=cap.scaling,
        causal=cap.is_causal and cap.mask is None,
        mask=mask,
        softcap=cap.softcap,
        bias=bias,
    )
    return p[0]
