"""A head in query/key space over a text, and each head's OV circuit from the weights.

`qk_space(lm, text, layer=, head=)`: the head's queries and keys over the text as one PCA (the
model's own captured Q and K after RoPE, and the keys turned back to before RoPE through the
layer's checked rotary map, `qk_maps`), fitted on all three sets together so they share axes.

`ov_circuits(lm)`: per head, the OV circuit W_U W_O^h W_V^h W_E (vocab x vocab; Elhage et al. 2021)
read from the weights alone, with the input norm's and the final norm's gains folded in and their
per-token scales left out (the weights-only convention of Elhage et al. and TransformerLens; no
text). Its nonzero eigenvalues are those of the d_head x d_head matrix W_V^h (W_Eᵀ W_U) W_O^h
(eig(AB) = eig(BA) away from 0), so every head's score costs d_head³ after one d_model² product:

    copying = Σ_i λ_i / Σ_i |λ_i|   (1: the head copies the tokens it attends to; −1: suppresses)
    positive = share of the eigenvalues with a positive real part

`ov_tokens(lm, layer, head)` reads the circuit's diagonal (each token's logit raised at its own
id when the head attends to it): the tokens it copies and suppresses most.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..capture.projections import output_weight
from ..errors import AttnvizError
from ..layout import kv_heads_of
from ..loading import LoadedModel
from ..tokens import displays
from .blocks import Unsupported
from .norms import identify
from .qk_maps import codegen_qvk, falcon_value, layer_maps
from .qk_mixed import MixedTrace
from .qk_parts import source
from .residual import Trace, final_norm

INPUT_NORMS = ("input_layernorm", "ln_1", "attention_norm", "ln_attn", "pre_attention_layernorm", "norm_1")


@dataclass(frozen=True)
class QKSpace:
    """One head's queries and keys over a text, projected on their first two principal axes."""

    model_name: str
    layer: int
    head: int
    labels: tuple[str, ...]  # "(i) token" per position
    queries: np.ndarray  # (N, 2)
    keys: np.ndarray  # (N, 2) after RoPE (what the scores use)
    keys_unrotated: np.ndarray  # (N, 2) before RoPE; = keys without rotary
    explained: tuple[float, float]  # share of the variance on each axis
    rotary: bool
    block: int = -1  # the model's own block index of ``layer`` (= layer but in hybrids)


@dataclass(frozen=True)
class OVCircuits:
    """Every head's OV circuit summary from the weights: (layers, heads) arrays."""

    model_name: str
    copying: np.ndarray  # Σλ / Σ|λ|
    positive: np.ndarray  # share of eigenvalues with a positive real part
    notes: tuple[str, ...] = ()
    blocks: tuple[int, ...] = ()  # the model's own block index of each row (hybrids: not the row)

    @property
    def nbytes(self) -> int:
        return int(self.copying.nbytes + self.positive.nbytes)


def _pca(*sets: torch.Tensor) -> tuple[list[np.ndarray], tuple[float, float]]:
    x = torch.cat(sets).double()
    x = x - x.mean(0)
    _, s, v = torch.linalg.svd(x, full_matrices=False)
    var = (s**2) / max(float((s**2).sum()), 1e-30)
    axes = v[:2].T  # (d_head, 2)
    out, start = [], 0
    for t in sets:
        out.append((x[start : start + len(t)] @ axes).numpy())
        start += len(t)
    return out, (float(var[0]), float(var[1]) if len(var) > 1 else 0.0)


def qk_space(
    lm: LoadedModel, text: str | list[int] | Trace | MixedTrace, *, layer: int, head: int
) -> QKSpace:
    """``head``'s queries and keys at ``layer`` over the text (see the module doc)."""
    tr = text if isinstance(text, Trace | MixedTrace) else source(lm, text)
    if not 0 <= layer < tr.n_layers or not 0 <= head < tr.n_heads:
        raise AttnvizError(f"layer {layer} / head {head} is out of range for this model")
    cap = tr.captured[layer]
    kv = kv_heads_of([head], int(cap.query.shape[1]), int(cap.key.shape[1]))[0]  # GQA: the one rule
    q, k = cap.query[0, head].float().cpu(), cap.key[0, kv].float().cpu()
    kmap = layer_maps(lm, tr, layer)[1]
    k_pre = kmap.unrotate(k, torch.arange(tr.n_tokens))
    (qs, ks, kps), explained = _pca(q, k, k_pre)
    block = tr.layer_blocks[layer] if isinstance(tr, MixedTrace) else layer
    return QKSpace(
        tr.model_name,
        layer,
        head,
        tuple(tr.tokens.labels),
        qs,
        ks,
        kps,
        explained,
        kmap.cos is not None,
        block,
    )


def _value_weight(attn: Any, heads: int, kv: int, d: int) -> torch.Tensor:
    """W_V split by KV head: (kv, d_head, d_model) float32."""

    def w(mod: Any) -> torch.Tensor:
        if not isinstance(getattr(mod, "weight", None), torch.Tensor):  # Zaya's CCA projection
            raise Unsupported(f"{type(mod).__name__}: the value projection is not one weight matrix")
        t = mod.weight.detach().float()
        return t.T if type(mod).__name__ == "Conv1D" else t

    if hasattr(attn, "v_proj"):
        v = w(attn.v_proj)
        return v.reshape(kv, v.shape[0] // kv, -1)  # MiMo-V2: a value width of its own
    if type(attn).__name__ == "CodeGenAttention":
        return codegen_qvk(w(attn.qkv_proj), heads, d)[1]
    fused = next((getattr(attn, n) for n in ("c_attn", "qkv_proj", "Wqkv") if hasattr(attn, n)), None)
    if fused is not None:  # [q | k | v]: GPT-2, GPT-BigCode (one KV head), Phi-3, MPT
        rows = w(fused)
        kv = (rows.shape[0] // d - heads) // 2  # the weight's own count (GPT-BigCode's multi-query: 1)
        return rows[(heads + kv) * d :].reshape(kv, d, -1)
    if hasattr(attn, "query_key_value"):
        cfg = getattr(attn, "config", None)
        if getattr(cfg, "model_type", "") == "falcon":
            return falcon_value(w(attn.query_key_value), cfg, heads, kv, d)
        return w(attn.query_key_value).reshape(heads, 3, d, -1)[:, 2]
    raise Unsupported(f"{type(attn).__name__}: attnviz does not know where its value projection is")


def _gain(mod: torch.nn.Module | None) -> torch.Tensor | float:
    """The norm's gain as it computes it: read by running it once on a probe (Gemma's and
    Qwen3.5 / Qwen3-Next's RMSNorm scale by 1 + weight), else its weight (+1 for Gemma)."""
    weight = getattr(mod, "weight", None)
    if not isinstance(weight, torch.Tensor) or mod is None:
        return 1.0
    probe = torch.randn(3, weight.shape[0], generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        out = mod(probe.to(weight.device, weight.dtype)).float().cpu()
    frozen = identify(mod, probe, out)
    if frozen is not None:
        return frozen.gain.cpu()
    offset = 1.0 if "Gemma" in type(mod).__name__ else 0.0  # Gemma's RMSNorm scales by 1 + weight
    return weight.detach().float() + offset


def _heads(lm: LoadedModel):
    """(attention module, input norm, heads, kv, d_head, W_O) per layer, from the probe's sites."""
    if lm.probe is None or lm.layout.kind != "decoder":
        raise Unsupported(f"{lm.spec!r}: OV circuits are read for decoders")
    lay = lm.layout
    d = lay.head_dim
    for site in lm.probe.sites["self"]:
        attn = lm.model.get_submodule(site.module_name)
        block = lm.model.get_submodule(site.module_name.rsplit(".", 1)[0])
        norm = next((getattr(block, n) for n in INPUT_NORMS if hasattr(block, n)), None)
        v = getattr(attn, "v_proj", None)
        d_v = v.weight.shape[0] // lay.n_kv_heads if isinstance(v, torch.nn.Linear) else d
        w_o = output_weight(lm.model, site.module_name, lay.n_heads, d_v).cpu()  # (heads, d_model, d_v)
        yield attn, norm, lay.n_heads, lay.n_kv_heads, d, w_o


def _unembed(lm: LoadedModel) -> tuple[torch.Tensor, torch.Tensor]:
    """(W_E (vocab, d_model), W_U with the final norm's gain folded in (vocab, d_model))."""
    emb, unemb = lm.model.get_input_embeddings(), lm.model.get_output_embeddings()
    if getattr(emb, "weight", None) is None or getattr(unemb, "weight", None) is None:
        raise Unsupported(f"{lm.spec!r} names no input embedding and LM head matrix (W_E, W_U) to read")
    w_e = emb.weight.detach().float().cpu()
    w_u = unemb.weight.detach().float().cpu()
    if w_e.shape[0] != w_u.shape[0]:  # Moshi: its own input and output vocabularies
        raise Unsupported(f"{lm.spec!r} reads {w_e.shape[0]} input tokens and predicts {w_u.shape[0]}")
    return w_e, w_u * _gain(final_norm(lm)[1])


@torch.inference_mode()
def ov_circuits(lm: LoadedModel) -> OVCircuits:
    """Every head's copying score and share of positive eigenvalues (see the module doc)."""
    w_e, w_u = _unembed(lm)
    g = w_e.T.double() @ w_u.double()  # (d_model, d_model): W_Eᵀ W_U, once
    copying, positive = [], []
    for attn, norm, heads, kv, d, w_o in _heads(lm):
        w_v = _value_weight(attn, heads, kv, d) * _gain(norm)  # (kv, d_head, d_model)
        if w_v.shape[-1] != g.shape[0]:  # Zamba2's shared block: the stream joined to the embeddings
            raise Unsupported(f"the attention reads {w_v.shape[-1]} features, not the stream's {g.shape[0]}")
        row_c, row_p = [], []
        for h in range(heads):
            m = w_v[h // (heads // w_v.shape[0])].double() @ g @ w_o[h].double()  # (d_head, d_head)
            lam = torch.linalg.eigvals(m)
            row_c.append(float(lam.sum().real / lam.abs().sum().clamp(min=1e-30)))
            row_p.append(float((lam.real > 0).double().mean()))
        copying.append(row_c)
        positive.append(row_p)
    notes = [
        "Weights only: the norms' gains folded in, their per-token scales and any embedding "
        "multiplier left out (Elhage et al. 2021's convention)."
    ]
    if any(_gated(attn, heads, d) for attn, _n, heads, _kv, d, _w in _heads(lm)):
        notes.append(
            "Each head's output is gated per token (sigmoid of a projection of the input, Qwen3.5 / "
            "Qwen3-Next): input-dependent, so left out of this weights-only circuit."
        )
    blocks = tuple(lm.layout.model_layer(layer) for layer in range(len(copying)))
    return OVCircuits(lm.spec, np.array(copying), np.array(positive), tuple(notes), blocks)


def _gated(attn: Any, heads: int, d: int) -> bool:
    """A q_proj that also makes a per-head output gate (Qwen3.5 / Qwen3-Next: [query | gate])."""
    q = getattr(attn, "q_proj", None)
    return isinstance(q, torch.nn.Linear) and q.out_features == 2 * heads * d


@torch.inference_mode()
def ov_tokens(
    lm: LoadedModel, layer: int, head: int, k: int = 10
) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """(copied, suppressed): the tokens whose own logit the head raises / lowers most, from the
    diagonal of its OV circuit, largest first."""
    rows = list(_heads(lm))
    if not 0 <= layer < len(rows) or not 0 <= head < rows[0][2]:
        raise AttnvizError(f"layer {layer} / head {head} is out of range for this model")
    attn, norm, heads, kv, d, w_o = rows[layer]
    w_e, w_u = _unembed(lm)
    w_v = (_value_weight(attn, heads, kv, d) * _gain(norm))[head // (heads // kv)]  # (d_head, d_model)
    diag = ((w_e @ w_v.T) * (w_u @ w_o[head])).sum(1)  # (vocab,) [t] = u_t · W_O W_V e_t
    top, bottom = torch.topk(diag, k), torch.topk(-diag, k)

    def named(idx: torch.Tensor) -> list[tuple[str, float]]:
        ids = [int(i) for i in idx]
        return list(zip(displays(lm.tokenizer, ids), [float(diag[i]) for i in ids], strict=True))

    return named(top.indices), named(bottom.indices)
