"""Direct logit attribution: each head's and each MLP's own share of one logit.

The final stream at position t is the sum of what every block wrote (checked on the trace):

    x = embedding + Σ_l ( N_l(Σ_h W_O^h z^h + b_O) + c_l + mlp_l )

with z^h = Σ_j α^h_tj v^h_j the head's output and N_l the norm between the heads and the stream
(identity in most models; Gemma 2/3, OLMo 2: frozen at its actual per-token scale). The logit of
``target`` minus the logit of ``contrast`` is ``u · (N_f(x) + b_f) + b_U`` with u the difference of
their unembedding rows and N_f the final norm, frozen at its actual scale for this token. Both
norms frozen, the logit is linear in every part:

    logit = r · embedding + Σ_l,h r · N_l(W_O^h z^h) + Σ_l r · mlp_l + rest,   r = N_fᵀ u

``rest`` holds what no head or MLP owns (b_O, the norms' biases, the LM head's bias). The parts
plus the rest give the logit up to float rounding (``error``, tested ≤ 1e-4 relative). Models
that soft-cap their logits (Gemma 2) are attributed before the cap, which is monotonic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from ..errors import AttnvizError
from ..loading import LoadedModel
from ..tokens import Tokens, displays
from .norms import FrozenNorm, identify
from .residual import Trace, final_norm, logit_multiplier, trace

PartKind = Literal["head", "mlp", "embedding"]


@dataclass(frozen=True)
class TargetLogit:
    """What a direct logit attribution explains: ``logit`` = logit(target) − logit(contrast) at
    ``position`` (the fields `target_fields` fills), and the embedding's direct part of it."""

    model_name: str
    tokens: Tokens
    position: int
    target: int
    target_token: str
    contrast: int | None
    contrast_token: str
    logit: float  # the model's logit difference (its logit multiplier applied, before a soft-cap)
    embedding: float


@dataclass(frozen=True)
class Attribution(TargetLogit):
    """Direct contributions to ``logit`` = logit(target) − logit(contrast) at ``position``."""

    heads: np.ndarray  # (n_layers, heads) float64
    mlps: np.ndarray  # (n_layers,) float64
    rest: float  # biases and norm constants: owned by no head or MLP
    error: float  # logit − (embedding + heads + mlps + rest): float rounding

    def ranking(self, top: int | None = None) -> list[tuple[PartKind, int, int, float]]:
        """(kind, layer, head (-1 for an MLP / the embedding), contribution), largest |value| first."""
        parts: list[tuple[PartKind, int, int, float]] = [("embedding", -1, -1, self.embedding)]
        parts += [("mlp", layer, -1, float(v)) for layer, v in enumerate(self.mlps)]
        parts += [
            ("head", layer, head, float(self.heads[layer, head]))
            for layer in range(self.heads.shape[0])
            for head in range(self.heads.shape[1])
        ]
        parts.sort(key=lambda p: -abs(p[3]))
        return parts if top is None else parts[:top]

    def to_frame(self) -> Any:
        import pandas as pd

        return pd.DataFrame(self.ranking(), columns=["kind", "layer", "head", "contribution"])


def token_id(lm: LoadedModel, token: int | str | None, default: int | None) -> int | None:
    """A token id from an id or a one-token string (``default`` for None)."""
    if token is None:
        return default
    if isinstance(token, str):
        ids = lm.tokenizer(token, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise AttnvizError(
                f"{token!r} is {len(ids)} tokens for this tokenizer; give one token (or its id)"
            )
        return int(ids[0])
    vocab = lm.model.get_output_embeddings().weight.shape[0]
    if not 0 <= int(token) < vocab:
        raise AttnvizError(f"token id {token} is outside this model's vocabulary (0 .. {vocab - 1})")
    return int(token)


@torch.inference_mode()
def final_frozen(lm: LoadedModel, x: torch.Tensor) -> FrozenNorm:
    """The final norm at row x (1, d_model), frozen at its actual scale (or why it cannot be)."""
    name, module = final_norm(lm)
    frozen = identify(module, x, module(x[None])[0], name)
    if frozen is None:
        raise AttnvizError(
            f"{lm.spec!r}'s final norm ({type(module).__name__}) is not one attnviz can freeze"
        )
    return frozen


def head_outputs(tr: Trace, layer: int, row: int) -> torch.Tensor:
    """z^h = Σ_j α^h_tj v^h_j for every head at one query row: float32 (heads, d_head)."""
    return torch.einsum("hk,hkd->hd", tr.probs(layer, row), tr.values(layer))


def head_writes(lm: LoadedModel, tr: Trace, layer: int, row: int, z: torch.Tensor) -> torch.Tensor:
    """What each head's output z (heads, d_head) adds to the stream at ``row``: (heads, d_model),
    through the frozen norm after the heads (without its bias)."""
    vec = torch.einsum("hmd,hd->hm", tr.w_o(lm, layer).to(z.device), z)
    norm = tr.attn_norm[layer]
    return vec if norm is None else norm.apply(vec, row)


@torch.inference_mode()
def readout(
    lm: LoadedModel, tr: Any, row: int, target: int, contrast: int | None
) -> tuple[torch.Tensor, float]:
    """(r, constant): logit(target) − logit(contrast) = r · x + constant for the final stream x
    at ``row``, the final norm frozen there."""
    head = lm.model.get_output_embeddings()
    w = head.weight.detach().float()
    m = logit_multiplier(lm)  # μP / Granite: the head's output scaled by one number
    u = (w[target] - (w[contrast] if contrast is not None else 0.0)) * m
    x = tr.stream[-1][row : row + 1]
    frozen = final_frozen(lm, x)
    r = frozen.pullback(u.to(x.device), 0)
    const = 0.0
    if frozen.constant is not None:
        const += float(frozen.constant.to(u.device) @ u)
    bias = getattr(head, "bias", None)
    if isinstance(bias, torch.Tensor):
        b = bias.detach().float()
        const += float(b[target] - (b[contrast] if contrast is not None else 0.0)) * m
    return r, const


def logit_attribution(
    lm: LoadedModel,
    text: str | Trace,
    token: int = -1,
    target: int | str | None = None,
    contrast: int | str | None = None,
    *,
    chat: bool = False,
) -> Attribution:
    """Each head's and MLP's direct contribution to the logit of ``target`` (default: the model's
    prediction) minus ``contrast`` (a token id or a one-token string; default none) at ``token``."""
    tr = text if isinstance(text, Trace) else trace(lm, text, chat=chat)
    for problem in (tr.unembed_problem, tr.heads_problem):
        if problem:
            raise AttnvizError(problem)
    t = tr.position(token)
    with torch.inference_mode():
        head = lm.model.get_output_embeddings()
        logits = head(final_norm(lm)[1](tr.stream[-1][t : t + 1][None]))[0, 0].float() * logit_multiplier(lm)
        chosen = target_fields(lm, logits, target, contrast)
        tgt, con = chosen["target"], chosen["contrast"]
        r, rest = readout(lm, tr, t, tgt, con)
        f64 = torch.float64
        embedding = float(tr.stream[0][t].to(f64) @ r.to(f64))
        heads = np.zeros((tr.n_layers, tr.n_heads))
        mlps = np.zeros(tr.n_layers)
        for layer in range(tr.n_layers):
            writes = head_writes(lm, tr, layer, t, head_outputs(tr, layer, t))  # (heads, d_model)
            heads[layer] = (writes.to(f64) @ r.to(f64)).cpu().numpy()
            mlps[layer] = float(tr.mlp_added[layer][t].to(f64) @ r.to(f64))
            rest += float(_layer_constant(tr, layer, t) @ r.double().cpu())
    total = embedding + heads.sum() + mlps.sum() + rest
    return Attribution(
        model_name=tr.model_name,
        tokens=tr.tokens,
        position=t,
        **chosen,
        embedding=embedding,
        heads=heads,
        mlps=mlps,
        rest=float(rest),
        error=chosen["logit"] - float(total),
    )


def target_fields(
    lm: LoadedModel, logits: torch.Tensor, target: int | str | None, contrast: int | str | None
) -> dict[str, Any]:
    """The target (default: the argmax of ``logits``) and contrast as the attributions record them:
    ``target``, ``target_token``, ``contrast``, ``contrast_token`` (each token shown alone, never
    merged) and ``logit``, the target's logit minus the contrast's."""
    tgt = token_id(lm, target, int(logits.argmax()))
    con = token_id(lm, contrast, None)
    assert tgt is not None
    shown = displays(lm.tokenizer, [tgt] + ([con] if con is not None else []))
    return {
        "target": tgt,
        "target_token": shown[0],
        "contrast": con,
        "contrast_token": shown[1] if con is not None else "",
        "logit": float(logits[tgt] - (logits[con] if con is not None else 0.0)),
    }


def _layer_constant(tr: Trace, layer: int, row: int) -> torch.Tensor:
    """What layer ``layer``'s attention adds at ``row`` that no head owns: N(b_O) + the norm's bias."""
    d = tr.stream[0].shape[-1]
    out = torch.zeros(d, dtype=torch.float64)
    bias, norm = tr.out_bias[layer], tr.attn_norm[layer]
    if bias is not None:
        b = bias[None]
        out += (b if norm is None else norm.apply(b.to(norm.scale.device), row)).double().cpu()[0]
    if norm is not None and norm.constant is not None:
        out += norm.constant.double().cpu()
    return out
