"""What every architecture family gives the walkthrough: one layer's weights as the textbook needs
them (`LayerWeights`) and the modules to hook (`LayerModules`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ...errors import AttnvizError


@dataclass(frozen=True, eq=False)
class LayerWeights:
    """One attention layer as the textbook needs it: float32 CPU tensors, nn.Linear layout (out, in)."""

    q: torch.Tensor  # (nh*hs, C)
    k: torch.Tensor  # (nkv*hs, C)
    v: torch.Tensor  # (nkv*hs, C)
    o: torch.Tensor  # (C, nh*hs)
    bq: torch.Tensor | None
    bk: torch.Tensor | None
    bv: torch.Tensor | None
    bo: torch.Tensor | None
    scaling: float
    causal: bool
    rotary: bool
    softcap: float | None = None
    sliding_window: int | None = None
    q_norm: tuple[torch.Tensor, float] | None = None  # (weight (hs,), eps)
    k_norm: tuple[torch.Tensor, float] | None = None
    names: dict[str, str] = field(default_factory=dict)  # q/k/v/o -> the model's module path


@dataclass(frozen=True, eq=False)
class LayerModules:
    """The modules of one layer the walkthrough hooks, and what its output is compared with."""

    attn: torch.nn.Module  # hooked for its inputs and output
    out_proj: torch.nn.Module  # hooked for its input (the concatenated heads) and output
    compared_output: str
    output_is_projection: bool = False  # compare with out_proj's output (BERT), else attn's


def cpu(t: torch.Tensor) -> torch.Tensor:
    """A float32 CPU copy of a weight (refused when the weight is offloaded to the meta device)."""
    if t.device.type == "meta":
        raise AttnvizError("this layer's weights are offloaded (not in memory); load the model on one device")
    return t.detach().to("cpu", torch.float32).clone()


def maybe(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else cpu(t)


def from_linears(q: Any, k: Any, v: Any, o: Any, **facts: Any) -> LayerWeights:
    """LayerWeights from four nn.Linear modules (weights (out, in), optional biases)."""
    return LayerWeights(
        q=cpu(q.weight), k=cpu(k.weight), v=cpu(v.weight), o=cpu(o.weight),
        bq=maybe(q.bias), bk=maybe(k.bias), bv=maybe(v.bias), bo=maybe(o.bias),
        **facts,
    )  # fmt: skip
