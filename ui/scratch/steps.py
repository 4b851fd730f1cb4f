"""From-scratch page helpers: one step's array as a 2-D picture for one head, the toy model."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attnviz.layout import AttentionLayout
from attnviz.reference import walkthrough as W
from attnviz.reference.textbook import MultiHeadAttention, causal_mask, from_torch_multihead

# Steps whose last axis is key positions (labelled with tokens, not dimensions).
KEY_AXIS_STEPS = {"scores_raw", "scores_scaled", "scores_softcapped", "mask", "scores_masked", "probs"}

TOY_DESCRIPTIONS = {
    "x": "random input: one row of d_model numbers per position",
    "q_proj": "Q = x W_q^T + b_q",
    "k_proj": "K = x W_k^T + b_k",
    "v_proj": "V = x W_v^T + b_v",
    "q_view": "view: split Q into heads",
    "k_view": "view: split K into heads",
    "v_view": "view: split V into heads",
    "q_heads": "transpose(1, 2): heads first",
    "k_heads": "transpose(1, 2): heads first",
    "v_heads": "transpose(1, 2): heads first",
    "scores_raw": "Q K^T: every query against every key, per head",
    "scores_scaled": "times 1/sqrt(head_dim), so the softmax does not saturate",
    "mask": "mask, True = may attend",
    "scores_masked": "blocked scores set to -inf",
    "probs": "softmax over the keys: each row sums to 1",
    "context_heads": "weights @ V, per head",
    "context_transposed": "transpose(1, 2) back: positions first",
    "concat": "reshape: the heads side by side",
    "output": "output = concat W_o^T + b_o",
}


STEP_NAMES = {
    "x": "the input",
    "q_proj": "queries Q",
    "k_proj": "keys K",
    "v_proj": "values V",
    "q_view": "Q split into heads",
    "k_view": "K split into heads",
    "v_view": "V split into heads",
    "q_heads": "Q, heads first",
    "k_heads": "K, heads first",
    "v_heads": "V, heads first",
    "rope_cos": "cos of each position's rotation angles",
    "rope_sin": "sin of each position's rotation angles",
    "q_rope": "Q rotated by position (RoPE)",
    "k_rope": "K rotated by position (RoPE)",
    "k_repeated": "K shared across its query heads (GQA)",
    "v_repeated": "V shared across its query heads (GQA)",
    "scores_raw": "scores Q·Kᵀ",
    "scores_scaled": "scores ÷ √head_dim",
    "scores_softcapped": "scores soft-capped",
    "mask": "the mask",
    "scores_masked": "scores with the mask",
    "probs": "attention weights (softmax)",
    "context_heads": "weights × V, per head",
    "context_transposed": "tokens first again",
    "concat": "the heads side by side",
    "output": "the output (× W_o)",
}


def axis_names(name: str, shape: tuple[int, ...], layout: AttentionLayout) -> str:
    """A step's shape with its axes named, e.g. "batch 1 × heads 9 × tokens 12 × head_dim 64"."""
    names: tuple[str, ...]
    if name in KEY_AXIS_STEPS:
        names = ("batch", "heads", "query tokens", "key tokens")
    elif name.endswith("_view") or name == "context_transposed":
        names = ("batch", "tokens", "heads", "head_dim")
    elif name.endswith(("_heads", "_rope", "_repeated")):
        names = ("batch", "heads", "tokens", "head_dim")
    else:
        last = "d_model" if shape and shape[-1] == layout.d_model else "features"
        names = ("batch", "tokens", last)
    names = (
        names[-len(shape) :] if len(shape) <= len(names) else (*("?",) * (len(shape) - len(names)), *names)
    )
    if name.endswith(("_view", "_heads", "_rope", "_repeated")) and len(shape) >= 3:  # kv heads
        i = names.index("heads")
        if shape[i] == layout.n_kv_heads != layout.n_heads:
            names = (*names[:i], "kv heads", *names[i + 1 :])
    return " × ".join(f"{a} {n}" for a, n in zip(names, shape, strict=True))


@dataclass(frozen=True, eq=False)
class Picture:
    array: np.ndarray  # 2-D
    rows: list[str]
    cols: list[str]
    note: str


def step_picture(
    name: str, value: np.ndarray, head: int, layout: AttentionLayout, labels: list[str]
) -> Picture:
    """One head's slice of a step's value as (positions x something)."""
    a = np.asarray(value)
    if a.ndim >= 3 and a.shape[0] == 1:
        a = a[0]  # drop the batch dimension
    note = ""
    if a.ndim == 3:
        axis = 1 if name.endswith("_view") else 0
        n = a.shape[axis]
        idx = head
        if n == layout.n_kv_heads and n != layout.n_heads:
            idx = layout.kv_head_of(head)
            note = f"KV head {idx} (read by query head {head})"
        elif n == layout.n_heads:
            note = f"head {head}"
        idx = min(idx, n - 1)
        a = np.take(a, idx, axis=axis)
    if a.dtype == bool:
        a = a.astype(np.float32)
    a = np.asarray(a, dtype=np.float32)
    if a.ndim == 1:
        a = a[None, :]
    rows = labels if a.shape[0] == len(labels) else [str(i) for i in range(a.shape[0])]
    if name in KEY_AXIS_STEPS and a.shape[1] == len(labels):
        cols = labels
    else:
        cols = [f"d{j}" for j in range(a.shape[1])]
    return Picture(a, list(rows), list(cols), note)


@dataclass(frozen=True, eq=False)
class Toy:
    steps: dict[str, np.ndarray]
    layout: AttentionLayout
    weights: np.ndarray  # (heads, T, T)
    max_diff_weights: float  # vs torch.nn.MultiheadAttention
    max_diff_output: float


def toy(d_model: int, n_heads: int, n_tokens: int, causal: bool, seed: int) -> Toy:
    """The textbook MHA with random weights on random input, checked against PyTorch's own
    ``nn.MultiheadAttention`` with the same weights; every intermediate kept."""
    torch.manual_seed(seed)
    ref = torch.nn.MultiheadAttention(d_model, n_heads, batch_first=True).eval()
    for p in ref.parameters():  # PyTorch starts biases at 0; random ones show them in the steps
        if p.dim() == 1:
            torch.nn.init.normal_(p, std=0.1)
    ours: MultiHeadAttention = from_torch_multihead(ref).eval()
    x = torch.randn(1, n_tokens, d_model)  # (B, T, C)
    allowed = causal_mask(n_tokens) if causal else None
    with torch.no_grad():
        out, weights = ours(x, mask=allowed)  # (B, T, C), (B, nh, T, T)
        ref_out, ref_w = ref(
            x, x, x, attn_mask=None if allowed is None else ~allowed, average_attn_weights=False
        )
        lay = AttentionLayout(
            model_type="toy",
            kind="decoder" if causal else "encoder",
            n_layers=1,
            n_heads=n_heads,
            n_kv_heads=n_heads,
            head_dim=d_model // n_heads,
            d_model=d_model,
        )
        w = W.LayerWeights(
            q=ours.W_q.weight,
            k=ours.W_k.weight,
            v=ours.W_v.weight,
            o=ours.W_o.weight,
            bq=ours.W_q.bias,
            bk=ours.W_k.bias,
            bv=ours.W_v.bias,
            bo=ours.W_o.bias,
            scaling=(d_model // n_heads) ** -0.5,
            causal=causal,
            rotary=False,
        )
        t = W.recompute(x, w, lay)
    return Toy(
        steps={k: v.detach().numpy() for k, v in t.items()},
        layout=lay,
        weights=weights[0].numpy(),
        max_diff_weights=float((weights - ref_w).abs().max()),
        max_diff_output=float((out - ref_out).abs().max()),
    )
