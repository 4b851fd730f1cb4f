"""GPT-2: one fused Conv1D c_attn for Q, K and V (weights stored (in, out)), c_proj for W_o."""

from __future__ import annotations

from typing import Any

from .common import LayerModules, LayerWeights, cpu

MODEL_TYPES = ("gpt2",)
X_FROM = "after the input norm"


def modules(base: Any, layer: int) -> LayerModules:
    attn = base.h[layer].attn
    what = f"h.{layer}.attn output (c_proj of the concatenated heads, before the residual add)"
    return LayerModules(attn, attn.c_proj, what)


def weights(attn: Any, mods: LayerModules, layer: int, config: Any) -> LayerWeights:
    p, C = f"h.{layer}.attn", attn.c_attn.weight.shape[0]
    W, b = cpu(attn.c_attn.weight), cpu(attn.c_attn.bias)  # Conv1D stores (in, out): (C, 3C)
    Wq, Wk, Wv = (W[:, i * C : (i + 1) * C].T.contiguous() for i in range(3))  # (C, C) as (out, in)
    bq, bk, bv = (b[i * C : (i + 1) * C] for i in range(3))  # (C,) each
    return LayerWeights(
        q=Wq, k=Wk, v=Wv, o=cpu(attn.c_proj.weight).T.contiguous(),
        bq=bq, bk=bk, bv=bv, bo=cpu(attn.c_proj.bias),
        scaling=float(attn.scaling),
        causal=True,
        rotary=False,
        names={"q": f"{p}.c_attn[:, :C]", "k": f"{p}.c_attn[:, C:2C]", "v": f"{p}.c_attn[:, 2C:]",
               "o": f"{p}.c_proj"},
    )  # fmt: skip
