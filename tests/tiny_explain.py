"""Tiny random decoders of every block structure the explanations handle, and the dense oracles.

`loaded(name)` builds one (no network) with every weight drawn at random (transformers zero-inits
some norms and biases, which would hide a wrong norm or bias), float32, eval, wrapped.
`dense_graph(lm, tr, token, threshold)` computes every part of every block densely, as
(N, N, heads, d_model) tensors per layer, with the literal definitions of Ferrando & Voita /
LLM-TT, and returns the kept edges reachable from ``token``: the oracle of `information_flow`.
It reads the trace's tensors (streams, V, W_O, biases, frozen norms) and the model's own eager α;
tests/engine/test_explain_trace.py ties each of those tensors to transformers' own modules, so
the oracle does not rest on the engine it checks.
"""

from __future__ import annotations

import functools
import re

import torch

import attnviz

TEXT = "the financial bank is located on river bank; a quick brown fox jumps over the lazy dog"

# name -> (model_type, config overrides): sequential pre-norm (GQA, biases, sliding window),
# parallel residual, post-norms between the heads and the residual stream
MODELS: dict[str, tuple[str, dict]] = {
    "llama-gqa": ("llama", {}),
    "qwen2-bias": ("qwen2", {}),
    "gpt2": ("gpt2", {}),
    "mistral-sliding": ("mistral", {"sliding_window": 6}),
    "gpt_neox-parallel": ("gpt_neox", {"use_parallel_residual": True, "rotary_pct": 0.5}),
    "gptj": ("gptj", {"rotary_dim": 4}),
    "falcon": ("falcon", {}),
    "gemma2": ("gemma2", {"attn_logit_softcapping": 5.0, "sliding_window": 6}),
    "olmo2": ("olmo2", {}),
    "gemma3": ("gemma3_text", {"sliding_window": 6}),
}
SEQUENTIAL = ("llama-gqa", "qwen2-bias", "gpt2", "mistral-sliding", "gemma2", "olmo2", "gemma3")
PARALLEL = ("gpt_neox-parallel", "gptj", "falcon")


def randomise(model: torch.nn.Module, seed: int = 0) -> None:
    """Every parameter drawn at random: matrices ~ N(0, 1/fan_in) (q/k sharper), vectors around
    their init (norm gains near 1 or 0 as the model has them, biases small)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.dim() >= 2:
                scale = (3.0 if re.search(r"(q_proj|k_proj|query|key|qkv|c_attn)", name) else 1.0) / p.shape[
                    -1
                ] ** 0.5
                p.copy_(noise * scale)
            else:
                p.add_(noise * 0.2)


@functools.cache
def _model(name: str):
    import archs
    import transformers as tf

    model_type, overrides = MODELS[name]
    cfg = archs.tiny_config(model_type)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg)
    randomise(model)
    return model.eval()


def build(model_type: str, **overrides) -> attnviz.LoadedModel:
    """Any tiny causal model from tests/archs.py's configs, weights at random, wrapped."""
    import archs
    import tiny
    import transformers as tf

    cfg = archs.tiny_config(model_type)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg)
    randomise(model)
    return attnviz.wrap_model(model.eval(), tiny.tokenizer("decoder"), spec=f"tiny-{model_type}")


def loaded(name: str) -> attnviz.LoadedModel:
    import tiny

    return attnviz.wrap_model(_model(name), tiny.tokenizer("decoder"), spec=f"tiny-{name}")


def l1_importance(whole: torch.Tensor, parts: torch.Tensor) -> torch.Tensor:
    """max(‖whole‖₁ − ‖whole − part‖₁, 0) over the last dim; whole broadcasts against parts."""
    return (whole.abs().sum(-1) - (whole - parts).abs().sum(-1)).clamp(min=0)


def threshold_renormalise(c_attn: torch.Tensor, c_single: torch.Tensor, threshold: float):
    """LLM-TT's `apply_threshold_and_renormalize`, written out for the oracle (not the engine's):
    per row, contributions at or below the threshold become 0, the rest are divided by their sum
    (a row with nothing left stays 0). c_attn (N, heads, keys), c_single (N, S)."""
    a = torch.where(c_attn > threshold, c_attn, torch.zeros_like(c_attn))
    s = torch.where(c_single > threshold, c_single, torch.zeros_like(c_single))
    for t in range(s.shape[0]):
        total = float(a[t].sum()) + float(s[t].sum())
        if total > 0:
            a[t] /= total
            s[t] /= total
    return a, s


def dense_parts(lm, tr, layer: int, probs: torch.Tensor) -> torch.Tensor:
    """Every attention part of a layer: (N targets, N keys, heads, d_model), float32, literally
    α^h_tj · W_O^h v^h_j, through the frozen norm after the heads where there is one."""
    v = tr.values(layer)  # (heads, N, d_head)
    w_o = tr.w_o(lm, layer)  # (heads, d_model, d_head)
    u = torch.einsum("hjd,hmd->hjm", v, w_o)  # (heads, N, d_model)
    parts = torch.einsum("htj,hjm->tjhm", probs, u)  # (N, N, heads, d_model)
    norm = tr.attn_norm[layer]
    if norm is not None:
        parts = norm.apply(parts, slice(None))
    return parts


def dense_graph(lm, tr, token: int, threshold: float) -> dict[tuple, tuple[float, tuple[float, ...]]]:
    """{(layer, kind, source node, target node): (weight, heads' shares)} of every kept edge that
    leads to ``token``'s final stream, from the full dense decomposition. Nodes: (layer, token, stage)."""
    eager = attnviz.extract_ids(lm, list(tr.tokens.ids), path="eager")  # the model's own α
    n, L = tr.n_tokens, tr.n_layers
    edges: dict[tuple, tuple[float, tuple[float, ...]]] = {}
    for layer in range(L):
        probs = torch.from_numpy(eager.layer(layer)).float()  # (heads, N, N)
        parts = dense_parts(lm, tr, layer, probs)
        pre, nxt, mlp = tr.stream[layer].float(), tr.stream[layer + 1].float(), tr.mlp_added[layer].float()
        if tr.residual == "sequential":
            mid = tr.mid(layer).float()
            attn_whole, singles, tgt = mid, pre[:, None], "mid"
            imp_f = l1_importance(nxt[:, None], torch.stack([mid, mlp], 1))  # (N, 2)
            c_f = imp_f / imp_f.sum(1, keepdim=True)
            _, c_f = threshold_renormalise(torch.zeros(n, 0, 0), c_f, threshold)
            for t in range(n):
                src, dst = (layer, t, "mid"), (layer + 1, t, "in")
                for kind, c in (("residual", c_f[t, 0]), ("ffn", c_f[t, 1])):
                    if c > threshold:
                        edges[(layer, kind, src, dst)] = (float(c), ())
        else:
            attn_whole, singles, tgt = nxt, torch.stack([pre, mlp], 1), "in"
        imp_a = l1_importance(attn_whole[:, None, None], parts)  # (N, N, heads)
        imp_s = l1_importance(attn_whole[:, None], singles)  # (N, S)
        total = imp_a.sum((1, 2)) + imp_s.sum(1)
        c_a, c_s = threshold_renormalise(
            (imp_a / total[:, None, None]).permute(0, 2, 1), imp_s / total[:, None], threshold
        )  # c_a (N, heads, N keys)
        tl = layer if tgt == "mid" else layer + 1
        for t in range(n):
            w = c_a[t].sum(0)
            for j in range(n):
                if w[j] > threshold:
                    edges[(layer, "attention", (layer, j, "in"), (tl, t, tgt))] = (
                        float(w[j]),
                        tuple(float(x) for x in c_a[t, :, j]),
                    )
            kinds = ("residual",) if tgt == "mid" else ("residual", "ffn")
            for kind, c in zip(kinds, c_s[t], strict=True):
                if c > threshold:
                    edges[(layer, kind, (layer, t, "in"), (tl, t, tgt))] = (float(c), ())
    # keep what leads to the root (LLM-TT: edge_dfs on the reversed graph from the output node)
    reached, kept = {(L, token, "in")}, {}
    for key in sorted(edges, key=lambda k: -(k[3][0] + (0.5 if k[3][2] == "mid" else 0))):
        if key[3] in reached:
            kept[key] = edges[key]
            reached.add(key[2])
    return kept
