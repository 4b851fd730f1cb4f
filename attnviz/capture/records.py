"""What one attention call saw: the record the capture keeps and the exact math reads."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .statistics import ForwardStats


@dataclass
class CapturedAttention:
    """What one attention call saw; enough to recompute its probabilities exactly."""

    module_name: str
    query: torch.Tensor  # (1, heads, q_pos, d_head), post-RoPE / post-norm, model dtype
    key: torch.Tensor  # (1, kv_heads, key_pos, d_head), before GQA repetition
    mask: torch.Tensor | None  # bool (True = attend) or additive float, (1, 1|heads, q_pos, key_pos)
    is_causal: bool  # applies when mask is None
    scaling: float
    softcap: float | None = None
    position_bias: torch.Tensor | None = None  # T5-style additive bias (1, heads, q_pos, key_pos)
    value: torch.Tensor | None = None  # (1, kv_heads, key_pos, d_head), before GQA repetition
    sinks: torch.Tensor | None = None  # (heads,) learned sink logits in the softmax (GPT-OSS `s_aux`)
    forward: ForwardStats | None = None  # L and expectations from the forward (statistics=True)

    @property
    def nbytes(self) -> int:
        return (0 if self.forward is None else self.forward.nbytes) + sum(
            t.numel() * t.element_size()
            for t in (self.query, self.key, self.mask, self.position_bias, self.value, self.sinks)
            if t is not None
        )
