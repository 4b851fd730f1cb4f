"""The oracle of `attnviz.explain.qk_attribution`, written with plain forward hooks.

`scores(model, ids, layer)` runs the model once and rebuilds a layer's pre-softmax scores from
what its attention module received (the normed hidden states and the rotary tables) through the
module's own q_proj / k_proj (GPT-NeoX: query_key_value), its q/k norms and transformers' own
``apply_rotary_pos_emb`` of that model's file: (heads, N, N) float64, scaling · q · k, no mask.
`term` recomputes one T[a, b] by hand from hooks on a head's z (o_proj's input), an MLP's output
and the layer's input, at the input norm's RMS scale frozen from that input. Nothing here reads
attnviz's trace, maps or captures.
"""

from __future__ import annotations

import sys

import torch


def q_k(attn, x: torch.Tensor, heads: int, kv: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(q (heads, N, d), k (kv, N, d)) before rotary, after the q/k norms, float32."""
    n = x.shape[0]
    if hasattr(attn, "q_proj"):
        q, k = attn.q_proj(x), attn.k_proj(x)
    else:  # GPT-NeoX: (N, heads, [q | k | v])
        qkv = attn.query_key_value(x).view(n, heads, 3 * d)
        q, k = qkv[..., :d].reshape(n, -1), qkv[..., d : 2 * d].reshape(n, -1)
    for side, t in (("q", q), ("k", k)):
        norm = getattr(attn, f"{side}_norm", None)
        if norm is not None and norm.weight.shape[0] != d:  # OLMo 2: over every head at once
            t = norm(t)
        t = t.view(n, -1, d)
        if norm is not None and norm.weight.shape[0] == d:  # Qwen3, Gemma 3: per head
            t = norm(t)
        if side == "q":
            q = t.transpose(0, 1)
        else:
            k = t.transpose(0, 1)
    return q.float(), k.float()


def rope(attn, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """transformers' own apply_rotary_pos_emb of the module's file on the first cos-width dims."""
    if not getattr(attn, "use_rope", True):  # SmolLM3's NoPE layers
        return q, k
    apply = sys.modules[type(attn).__module__].apply_rotary_pos_emb
    rot = cos.shape[-1]
    q_r, k_r = apply(q[None, ..., :rot], k[None, ..., :rot], cos, sin)
    return torch.cat([q_r[0], q[..., rot:]], -1), torch.cat([k_r[0], k[..., rot:]], -1)


def attention_of(model, layer: int):
    layers = model.base_model.layers
    block = layers[layer]
    return block, getattr(block, "self_attn", None) or block.attention


def head_dims(cfg) -> tuple[int, int, int]:
    """(query heads, key/value heads, d_head) from a config."""
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    return heads, kv, getattr(cfg, "head_dim", None) or cfg.hidden_size // heads


def scores(model, ids: list[int], layer: int) -> torch.Tensor:
    """scaling · q_i · k_j of every head and pair: (heads, N, N) float64 (GQA resolved)."""
    _block, attn = attention_of(model, layer)
    seen: dict = {}

    def pre(_m, args, kwargs):
        seen["x"] = (args[0] if args else kwargs["hidden_states"])[0].detach()
        seen["pe"] = kwargs.get("position_embeddings")

    h = attn.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]))
            heads, kv, d = head_dims(model.config)
            q, k = q_k(attn, seen["x"], heads, kv, d)
            if seen["pe"] is not None:
                q, k = rope(attn, q, k, *seen["pe"])
    finally:
        h.remove()
    k = k.repeat_interleave(heads // kv, dim=0)
    return attn.scaling * (q.double() @ k.double().transpose(-1, -2))


def term(model, ids: list[int], layer: int, head: int, query: int, key: int, a: str, b: str) -> float:
    """T[a, b] by hand for a, b in {"L{m}H{g}", "L{m}.mlp"} (Llama-layout models, RMSNorm input)."""
    block, attn = attention_of(model, layer)
    store: dict = {}
    hooks = [
        block.register_forward_pre_hook(
            lambda _m, args, kw: store.__setitem__(
                "x", (args[0] if args else kw["hidden_states"])[0].detach()
            ),
            with_kwargs=True,
        )
    ]
    hooks.append(
        attn.register_forward_pre_hook(
            lambda _m, args, kw: store.__setitem__("pe", kw["position_embeddings"]), with_kwargs=True
        )
    )
    for m in range(layer):
        src = model.base_model.layers[m]
        hooks.append(
            src.self_attn.o_proj.register_forward_pre_hook(
                lambda _m, args, m=m: store.__setitem__(f"z{m}", args[0][0].detach())
            )
        )
        hooks.append(
            src.mlp.register_forward_hook(
                lambda _m, _a, out, m=m: store.__setitem__(f"mlp{m}", out[0].detach())
            )
        )
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]))
            heads, kv, d = head_dims(model.config)

            def part(name: str, p: int) -> torch.Tensor:
                m = int(name[1:].split(".")[0].split("H")[0])
                if name.endswith(".mlp"):
                    return store[f"mlp{m}"][p]
                g = int(name.split("H")[1])
                w_o = model.base_model.layers[m].self_attn.o_proj.weight[:, g * d : (g + 1) * d]
                return w_o @ store[f"z{m}"][p, g * d : (g + 1) * d]

            x, norm = store["x"], block.input_layernorm
            r = torch.rsqrt(x.pow(2).mean(-1) + norm.variance_epsilon)  # frozen RMS scale per position
            gain = norm.weight + (1.0 if "Gemma" in type(norm).__name__ else 0.0)
            full = x * r[:, None] * gain  # the normed stream: for the q/k norms' frozen scales

            def side(which: str, p: int, name: str, h: int) -> torch.Tensor:
                proj = attn.q_proj if which == "q" else attn.k_proj
                w = proj.weight.view(-1, d, proj.weight.shape[-1])[h]
                v = w @ (part(name, p) * r[p] * gain)
                qn = getattr(attn, f"{which}_norm", None)
                if qn is not None:  # per-head RMSNorm frozen at the whole projection's scale
                    raw = proj(full[p]).view(-1, d)[h]
                    s = torch.rsqrt(raw.pow(2).mean() + qn.variance_epsilon)
                    v = v * s * (qn.weight + (1.0 if "Gemma" in type(qn).__name__ else 0.0))
                cos, sin = store["pe"]
                one = v[None, None]  # (heads 1, positions 1, d)
                turned, _ = rope(attn, one, one, cos[:, p : p + 1], sin[:, p : p + 1])
                return turned[0, 0]

            q_a = side("q", query, a, head)
            k_b = side("k", key, b, head // (heads // kv))
    finally:
        for h in hooks:
            h.remove()
    return float(attn.scaling * (q_a.double() @ k_b.double()))
