"""A normalisation layer with its per-token scale frozen at the value it had: an affine map.

RMSNorm(x) = g ⊙ x · s(x) with s(x) = 1 / sqrt(mean(x²) + eps), and LayerNorm(x) =
g ⊙ (x − mean(x)) · s(x) + b with s(x) = 1 / sqrt(var(x) + eps), are not linear in x; with
s frozen at its actual value s_t for token t they are:

    N_t(v) = g ⊙ v · s_t            (RMSNorm; Gemma's gain is 1 + weight)
    N_t(v) = g ⊙ (v − mean(v)) · s_t   (LayerNorm, plus its bias b once)

so N_t(Σ parts) = Σ N_t(part) (+ b): the parts of a normalised sum still add up to the
normalised whole exactly, which is how routes and logit attributions pass through the norms
between the heads and the residual stream (Gemma 2/3, OLMo 2) and through the final norm.
`identify` recognises the kind from what the module actually computed on the forward and
refuses a module it cannot reproduce.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

NormKind = Literal["rms", "rms_offset", "layer"]
_EPS_ATTRS = ("variance_epsilon", "eps", "epsilon", "layer_norm_eps")


def tolerance(dtype: torch.dtype) -> float:
    """Relative agreement expected between a recomputation in float32 and the model's own
    tensors: float32 rounding, or the half-precision rounding of the model's result."""
    return {torch.float32: 1e-5, torch.float64: 1e-9, torch.float16: 2e-3}.get(dtype, 2e-2)


def close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> bool:
    """max |a − b| ≤ tolerance × max(1, max |b|), in float32."""
    return sums_to(b, [a], dtype)


def sums_to(whole: torch.Tensor, parts: list[torch.Tensor], dtype: torch.dtype) -> bool:
    """max |whole − Σ parts| ≤ tolerance × max(1, max |whole|), in float32 (one temporary)."""
    if any(p.shape != whole.shape for p in parts):
        return False
    if whole.numel() == 0:
        return True
    rest = whole.float() - parts[0].float()
    for p in parts[1:]:
        rest.sub_(p.float())
    inf = float("inf")
    scale = max(1.0, float(torch.linalg.vector_norm(whole.float(), ord=inf)))
    return float(torch.linalg.vector_norm(rest, ord=inf)) <= tolerance(dtype) * scale


@dataclass(frozen=True)
class FrozenNorm:
    """One norm at its actual per-token scale: ``apply(v, rows)`` is the linear part of
    N_t for the tokens ``rows`` (no bias), ``constant`` the bias added once."""

    kind: NormKind
    gain: torch.Tensor  # (d_model,) float32
    scale: torch.Tensor  # (tokens,) float32, 1/rms or 1/std at the forward's values
    bias: torch.Tensor | None = None  # (d_model,) float32 (LayerNorm)
    name: str = ""

    def apply(self, v: torch.Tensor, rows: torch.Tensor | slice | int) -> torch.Tensor:
        """N_t(v) without the bias; v (tokens, ..., d_model) with one token per ``rows`` entry."""
        s = self.scale[rows].to(v.device)
        s = s.reshape(s.shape + (1,) * (v.dim() - s.dim()))
        if self.kind == "layer":
            v = v - v.mean(dim=-1, keepdim=True)
        return v * self.gain.to(v.device) * s

    def unscaled(self, v: torch.Tensor) -> torch.Tensor:
        """N_t(v) / s_t: the part of the frozen map that is the same for every token."""
        if self.kind == "layer":
            v = v - v.mean(dim=-1, keepdim=True)
        return v * self.gain.to(v.device)

    def pullback(self, r: torch.Tensor, row: int) -> torch.Tensor:
        """N_tᵀ r: the vector whose dot product with v equals r · N_t(v) (for attributions)."""
        gr = self.gain.to(r.device) * r * self.scale[row].to(r.device)
        return gr - gr.mean() if self.kind == "layer" else gr

    @property
    def constant(self) -> torch.Tensor | None:
        return self.bias


def _eps(module: Any) -> float | None:
    for attr in _EPS_ATTRS:
        value = getattr(module, attr, None)
        if isinstance(value, int | float):
            return float(value)
    return None


def _candidates(module: Any, x: torch.Tensor) -> list[FrozenNorm]:
    eps = _eps(module)
    weight = getattr(module, "weight", None)
    if weight is None and eps is not None and "norm" in type(module).__name__.lower():
        weight = torch.ones(x.shape[-1])  # a norm with no gain (NanoChat's RMSNorm)
    if eps is None or not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        return []
    w = weight.detach().float().to(x.device)
    bias = getattr(module, "bias", None)
    b = bias.detach().float().to(x.device) if isinstance(bias, torch.Tensor) else None
    xf = x.float()
    rms = torch.rsqrt(xf.pow(2).mean(-1) + eps)  # (tokens,)
    std = torch.rsqrt(xf.var(-1, unbiased=False) + eps)
    out = []
    if b is None:
        out += [FrozenNorm("rms", w, rms), FrozenNorm("rms_offset", 1.0 + w, rms)]
    out.append(FrozenNorm("layer", w, std, b))
    return out


def identify(module: Any, x: torch.Tensor, y: torch.Tensor, name: str = "") -> FrozenNorm | None:
    """The frozen form of ``module`` that reproduces y = module(x) (x, y: (tokens, d_model))
    within the dtype's tolerance, or None when no known norm does."""
    for cand in _candidates(module, x):
        rebuilt = cand.apply(x.float(), slice(None))
        if cand.bias is not None:
            rebuilt = rebuilt + cand.bias
        if close(rebuilt, y, y.dtype):
            return FrozenNorm(cand.kind, cand.gain, cand.scale, cand.bias, name)
    return None
