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

ATTENTION_NAMES = ("self_attn", "self_attention", "attn", "attention")
MIXER_KINDS = ("mamba2", "gated_delta", "kimi_delta")


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


def vectors(model, ids: list[int], layer: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(q (heads, N, d), k (heads, N, d) GQA resolved, scaling): a layer's queries and keys after
    the q/k norms and RoPE, float32."""
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
    return q, k.repeat_interleave(heads // kv, dim=0), float(attn.scaling)


def scores(model, ids: list[int], layer: int) -> torch.Tensor:
    """scaling · q_i · k_j of every head and pair: (heads, N, N) float64 (GQA resolved)."""
    q, k, scaling = vectors(model, ids, layer)
    return scaling * (q.double() @ k.double().transpose(-1, -2))


def _mixer(block):
    """A hybrid block's non-attention token mixer with heads read through its out_proj (or None)."""
    return next(
        (c for n, c in block.named_children() if n not in ATTENTION_NAMES and hasattr(c, "out_proj")), None
    )


def term(model, ids: list[int], layer: int, head: int, query: int, key: int, a: str, b: str) -> float:
    """T[a, b] by hand for a, b in {"L{m}H{g}", "L{m}.mlp", "L{m}.{kind}{h}"} (a mixer head of a
    hybrid, read at its out_proj's input), at block ``layer`` of a Llama-layout attention (RMSNorm
    input, q_proj / k_proj, Bamba's partial rotary too)."""
    layers = model.base_model.layers
    block, attn = layers[layer], block_attention(model, layer)
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
        src = layers[m]
        own = getattr(src, "self_attn", None)
        writer = own.o_proj if own is not None else _mixer(src).out_proj
        hooks.append(
            writer.register_forward_pre_hook(
                lambda _m, args, m=m: store.__setitem__(f"z{m}", args[0][0].detach())
            )
        )
        mlp = getattr(src, "mlp", None) or src.feed_forward
        hooks.append(
            mlp.register_forward_hook(lambda _m, _a, out, m=m: store.__setitem__(f"mlp{m}", out[0].detach()))
        )
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]))
            heads, kv, d = head_dims(model.config)

            def part(name: str, p: int) -> torch.Tensor:
                m = int(name[1:].split(".")[0].split("H")[0])
                if name.endswith(".mlp"):
                    return store[f"mlp{m}"][p]
                src = layers[m]
                if "H" in name:
                    g, proj, n_g = int(name.split("H")[1]), src.self_attn.o_proj, heads
                else:  # a mixer head: the trailing digits of "L0.mamba21" (kind mamba2, head 1)
                    mixer = _mixer(src)
                    n_g, kind_head = int(mixer.num_heads), name.split(".")[1]
                    kind = next(k for k in MIXER_KINDS if kind_head.startswith(k))
                    g, proj = int(kind_head[len(kind) :]), mixer.out_proj
                w = proj.weight.shape[1] // n_g
                return proj.weight[:, g * w : (g + 1) * w] @ store[f"z{m}"][p, g * w : (g + 1) * w]

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


# --- a softmax attention block anywhere: hybrids (Qwen3.5 / Qwen3-Next, Bamba, Falcon-H1, LFM2),
# Bloom and MPT (fused qkv, ALiBi). The same plain hook on the attention module, its own weights.


def block_attention(model, block: int):
    base = model.base_model
    layers = next(getattr(base, n) for n in ("layers", "h", "blocks") if hasattr(base, n))
    blk = layers[block]
    return next(getattr(blk, n) for n in ATTENTION_NAMES if getattr(blk, n, None) is not None)


def _projections(attn, x: torch.Tensor, heads: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(q (N, heads·d), k (N, kv·d)) straight from the module's own projection(s)."""
    n = x.shape[0]
    if hasattr(attn, "kv_a_proj_with_mqa"):  # MLA (Kimi Linear): its own latent path and expand_kv
        q = attn.q_proj(x) if attn.q_proj is not None else attn.q_b_proj(attn.q_a_layernorm(attn.q_a_proj(x)))
        kv_nope, k_rot = attn.kv_a_proj_with_mqa(x).split([attn.kv_lora_rank, attn.qk_rope_head_dim], -1)
        k, _v = attn.expand_kv(attn.kv_a_layernorm(kv_nope).view(1, 1, n, -1), k_rot.view(1, 1, n, -1))
        return q, k[0].transpose(0, 1).reshape(n, -1)
    if hasattr(attn, "q_proj"):
        q = attn.q_proj(x)
        if q.shape[-1] == 2 * heads * d:  # Qwen3-Next / Qwen3.5: per head [query | gate], as it chunks
            q = q.view(n, heads, 2 * d)[..., :d].reshape(n, -1)
        return q, attn.k_proj(x)
    if hasattr(attn, "Wqkv"):  # MPT: [q | k | v]
        q, k, _v = attn.Wqkv(x).chunk(3, dim=-1)
        return q, k
    qkv = attn.query_key_value(x).view(n, heads, 3, d)  # Bloom: per head [q | k | v]
    return qkv[:, :, 0].reshape(n, -1), qkv[:, :, 1].reshape(n, -1)


def block_scores(model, ids: list[int], block: int) -> torch.Tensor:
    """Block ``block``'s attention scores + the position bias the model hands the module (ALiBi):
    (heads, N, N) float64, no mask; q/k norms (q_norm, q_layernorm), Falcon-H1's key multiplier and
    transformers' own apply_rotary_pos_emb of the module's file, as the module applies them."""
    attn = block_attention(model, block)
    seen: dict = {}

    def pre(_m, args, kwargs):
        seen["x"] = (args[0] if args else kwargs["hidden_states"])[0].detach()
        seen["kw"] = kwargs

    h = attn.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]))
            cfg = model.config.get_text_config()
            heads = cfg.num_attention_heads
            d = (
                getattr(attn, "head_dim", None)
                or getattr(attn, "qk_head_dim", None)
                or cfg.hidden_size // heads
            )
            x, kw, n = seen["x"], seen["kw"], seen["x"].shape[0]
            q, k = _projections(attn, x, heads, d)
            out = []
            for side, t in (("q", q), ("k", k)):
                norm = getattr(attn, f"{side}_norm", None) or getattr(attn, f"{side}_layernorm", None)
                if norm is not None and norm.weight.shape[0] != d:
                    t = norm(t)
                t = t.view(n, -1, d)
                if norm is not None and norm.weight.shape[0] == d:
                    t = norm(t)
                out.append(t.transpose(0, 1).float())
            q, k = out
            k = k * getattr(attn, "key_multiplier", 1.0)  # Falcon-H1
            if kw.get("position_embeddings") is not None:
                q, k = rope(attn, q, k, *kw["position_embeddings"])
            k = k.repeat_interleave(heads // k.shape[0], dim=0)
            scaling = next(
                float(getattr(attn, a))
                for a in ("scaling", "inv_norm_factor", "softmax_scale")
                if hasattr(attn, a)
            )
            s = scaling * (q.double() @ k.double().transpose(-1, -2))
            if kw.get("alibi") is not None:  # Bloom: beta · alibi (batch·heads, 1, keys), by key position
                s = s + attn.beta * kw["alibi"].view(heads, 1, -1)[..., :n].double()
            if kw.get("position_bias") is not None:  # MPT: the module's own slice of its table
                pb = kw["position_bias"]
                s = s + pb[:, max(0, pb.shape[1] - n) :, max(0, pb.shape[2] - n) :].double()
    finally:
        h.remove()
    return s
