"""The exact path for attention transformers' fast kernels cannot reproduce: one layer at a time.

The model runs its own eager forward once without ``output_attentions`` (each layer's
probabilities exist only while that layer runs), while a hook keeps each attention module's
inputs. Asking for layer i calls that one module again, in eager mode with
``output_attentions=True``, on its recorded inputs: the model's own probabilities for that
layer, and never all layers' (heads, N, N) at once.
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .sites import AttentionSite

METHOD = "eager exact (one layer at a time)"
_CACHES = ("past_key_values", "past_key_value", "layer_past", "cache")


@dataclass
class LayerInput:
    """One attention module's call: enough to run it again."""

    module: torch.nn.Module
    bound: inspect.BoundArguments
    out_index: int

    def tensors(self) -> list[torch.Tensor]:
        return [v for v in self.bound.arguments.values() if isinstance(v, torch.Tensor)]

    def probabilities(self) -> torch.Tensor:
        """(heads, query_pos, key_pos) float32; the caller has put the model in eager mode."""
        args = self.bound.arguments
        if "output_attentions" in inspect.signature(self.module.forward).parameters:
            args["output_attentions"] = True
        with torch.inference_mode():
            out = self.module(*self.bound.args, **self.bound.kwargs)
        weights = out if self.out_index < 0 else out[self.out_index]
        return weights[0].float()


def record(
    model: Any, sites: dict[str, list[AttentionSite]], run: Callable[[], Any]
) -> dict[str, list[LayerInput]]:
    """Run ``run()`` (one forward) while keeping every attention site's inputs."""
    modules = dict(model.named_modules())
    wanted = {s.module_name for found in sites.values() for s in found}
    seen: dict[str, list[inspect.BoundArguments]] = {}
    calls: Counter[str] = Counter()
    handles = []

    def hook(name: str, module: torch.nn.Module):
        sig = inspect.signature(module.forward)

        def fn(_module, args, kwargs):
            calls[name] += 1
            bound = sig.bind(*args, **kwargs)
            for key in _CACHES:  # a cache the forward filled would be appended to a second time
                if key in bound.arguments:
                    bound.arguments[key] = None
            seen.setdefault(name, []).append(bound)

        return fn

    for name in wanted:
        handles.append(modules[name].register_forward_pre_hook(hook(name, modules[name]), with_kwargs=True))
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    return {
        stack: [LayerInput(modules[s.module_name], seen[s.module_name][s.call], s.out_index) for s in found]
        for stack, found in sites.items()
    }
