"""The output projection W_O of an attention module, split by head: value-weighted attention
(`attnviz.analysis.value_weighted`) and the explanations' residual writes (`attnviz.explain`)
read each head's columns and the bias from here."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import AttnvizError

# Output projections by attribute of the attention module: Llama/Mistral/Qwen/Gemma (o_proj),
# BART/OPT/Whisper (out_proj), GPT-2 (c_proj, a Conv1D), T5 (o), GPT-NeoX/Phi (dense).
_OUT_ATTRS = ("o_proj", "out_proj", "c_proj", "o", "dense")


def _conv1d(mod: Any) -> bool:
    return type(mod).__name__ == "Conv1D"  # GPT-2 stores weights as (in, out)


def _out_projection(model: Any, module_name: str) -> tuple[Any, str]:
    """The output projection that reads the concatenated heads of attention ``module_name``."""
    modules = dict(model.named_modules())
    attn = modules.get(module_name)
    if attn is None:
        raise AttnvizError(f"internal: no module {module_name!r} in the model; please report this model")
    for name in _OUT_ATTRS:
        mod = getattr(attn, name, None)
        if isinstance(mod, torch.nn.Linear) or (mod is not None and _conv1d(mod)):
            return mod, f"{module_name}.{name}"
    parent_name = module_name.rsplit(".", 1)[0] if "." in module_name else ""
    dense = getattr(getattr(modules.get(parent_name), "output", None), "dense", None)
    if isinstance(dense, torch.nn.Linear):  # BERT family: attention.self + attention.output.dense
        return dense, f"{parent_name}.output.dense"
    raise AttnvizError(
        f"value-weighted attention cannot find the output projection of {module_name!r} "
        f"({type(attn).__name__}); it knows {', '.join(_OUT_ATTRS)} and BERT's output.dense. "
        "Use the raw attention weights for this model"
    )


def output_weight(model: Any, module_name: str, n_heads: int, head_dim: int) -> torch.Tensor:
    """W_O split by head: float32 (heads, d_model, head_dim) on the projection's device."""
    mod, name = _out_projection(model, module_name)
    w = mod.weight.detach()
    if w.device.type == "meta":
        raise AttnvizError(f"{name}'s weights are offloaded (not in memory); load the model on one device")
    w = w.T if _conv1d(mod) else w  # (d_model out, heads * head_dim in)
    if w.shape[1] != n_heads * head_dim:
        raise AttnvizError(
            f"{name} reads {w.shape[1]} features, not heads x head_dim = {n_heads} x {head_dim}; "
            "value-weighted attention cannot split it by head for this model"
        )
    return w.float().reshape(w.shape[0], n_heads, head_dim).permute(1, 0, 2)  # (heads, d_model, d_head)


def output_bias(model: Any, module_name: str) -> torch.Tensor | None:
    """b_O of attention ``module_name``'s output projection (None without one)."""
    bias = getattr(_out_projection(model, module_name)[0], "bias", None)
    return bias if isinstance(bias, torch.Tensor) else None
