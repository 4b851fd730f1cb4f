"""BERT-like encoders: self.query/key/value, then output.dense (W_o) before dropout, residual and
LayerNorm; the attention input is the previous layer's output (no input norm)."""

from __future__ import annotations

from typing import Any

from .common import LayerModules, LayerWeights, from_linears

MODEL_TYPES = ("bert",)
X_FROM = "the previous layer's output"


def modules(base: Any, layer: int) -> LayerModules:
    att = base.encoder.layer[layer].attention
    what = (
        f"encoder.layer.{layer}.attention.output.dense output (W_o of the concatenated heads), "
        "before the dropout, residual add and LayerNorm that BERT's attention block applies next"
    )
    return LayerModules(att.self, att.output.dense, what, output_is_projection=True)


def weights(attn: Any, mods: LayerModules, layer: int, config: Any) -> LayerWeights:
    p = f"encoder.layer.{layer}.attention"
    return from_linears(
        attn.query, attn.key, attn.value, mods.out_proj,
        scaling=float(attn.scaling),
        causal=bool(getattr(attn, "is_causal", False)),
        rotary=False,
        names={"q": f"{p}.self.query", "k": f"{p}.self.key", "v": f"{p}.self.value",
               "o": f"{p}.output.dense"},
    )  # fmt: skip
