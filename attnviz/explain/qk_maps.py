"""One layer's query and key as affine maps of the residual stream, each norm frozen.

A head's query at position p is q(p) = R_p · QN_p(W_Q · N_p(x(p)) + b_Q) with N_p the block's
input norm and QN_p a q-norm (Qwen3, Gemma 3, OLMo 2), each frozen at its forward scale for p, and
R_p the rotary turn at p (identity without rotary tables: NoPE layers, learned positions). Frozen,
every step is linear, so a sum of residual parts maps to the sum of their images plus one constant
(the norm's bias, b_Q, through the later steps). The same holds for the key.

`layer_maps` reads the projection's layout from the attention module (separate q_proj / k_proj,
GPT-2's c_attn, GPT-NeoX's and Falcon's fused query_key_value, Phi-3's qkv_proj), picks the input
norm among the block's children, and checks the whole map on the trace: the stream entering the
layer must map to the model's own captured Q and K at every position (within the dtype's
rounding). A model it cannot rebuild that way is refused with the reason, never attributed wrongly.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..errors import AttnvizError
from ..loading import LoadedModel
from .blocks import Unsupported
from .norms import FrozenNorm, close, identify
from .qk_mixed import MixedTrace
from .residual import Trace
from .rotary import spec_from_tables


@dataclass(frozen=True)
class Projection:
    """W (heads, d_head, d_model) and b (heads, d_head) of one side, float32."""

    weight: torch.Tensor
    bias: torch.Tensor | None


Side = tuple[Projection, torch.Tensor | None]  # a side's projection and its latent norm's scale (MLA)


@dataclass(frozen=True)
class SideMap:
    """One side (query or key) of one layer: x (positions, parts, d_model) -> (positions, parts, d_head)."""

    in_norm: FrozenNorm | None  # the block's input norm frozen per position (None: reads the stream)
    proj: Projection
    head_norm: FrozenNorm | None  # q/k norm frozen per (position, head) or per position
    head_norm_width: int  # d_head (per head) or heads * d_head (over the projection)
    cos: torch.Tensor | None  # (N, rot) rotary tables at each position, float32
    sin: torch.Tensor | None
    pairing: str  # "half" or "interleaved"
    multiplier: float = 1.0  # a scalar on the side read from the tensors (Falcon-H1's μP multipliers)
    dim_scale: torch.Tensor | None = None  # (N, d_head) a latent norm's frozen scale per position (MLA)

    def linear(self, parts: torch.Tensor, rows: torch.Tensor, head: int) -> torch.Tensor:
        """The images of ``parts`` (len(rows), C, d_model) for ``head``, no constant: (rows, C, d_head)."""
        y = parts if self.in_norm is None else self.in_norm.apply(parts, rows)
        return self._after_projection(torch.einsum("pcm,dm->pcd", y, self.proj.weight[head]), rows, head)

    def constant(self, rows: torch.Tensor, head: int) -> torch.Tensor:
        """What the side adds that no part owns (norm bias, projection bias): (rows, d_head)."""
        d = self.proj.weight.shape[1]
        c = torch.zeros(len(rows), d)
        if self.in_norm is not None and self.in_norm.constant is not None:
            c = c + self.proj.weight[head] @ self.in_norm.constant.cpu()
        if self.proj.bias is not None:
            c = c + self.proj.bias[head]
        return self._after_projection(c[:, None], rows, head)[:, 0]

    def unrotate(self, v: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """v (rows, d_head) after the rotary turn, turned back to before it (R_p⁻¹ = R_p(−θ))."""
        if self.cos is None or self.sin is None:
            return v
        cos, sin = self.cos[rows], self.sin[rows]
        return self._turn(v, cos, -sin)

    def _turn(self, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        rot = cos.shape[-1]
        x, rest = v[..., :rot], v[..., rot:]
        if self.pairing == "half":
            turned = torch.cat([-x[..., rot // 2 :], x[..., : rot // 2]], dim=-1)
        else:
            turned = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
        return torch.cat([x * cos + turned * sin, rest], dim=-1)

    def _after_projection(self, v: torch.Tensor, rows: torch.Tensor, head: int) -> torch.Tensor:
        """q/k norm at its frozen scale, then the rotary turn at each row. v (rows, C, d_head)."""
        if self.head_norm is not None:
            d = v.shape[-1]
            if self.head_norm_width == d:  # per head: scale indexed [row, head]
                s = self.head_norm.scale.reshape(-1, self.proj.weight.shape[0])[rows, head]
                v = v * self.head_norm.gain[:d] * s[:, None, None]
            else:  # over the whole projection: this head's slice of the gain
                if self.head_norm.kind == "layer":
                    raise Unsupported("a LayerNorm over all heads' queries mixes the heads; not split")
                gain = self.head_norm.gain[head * d : (head + 1) * d]
                v = v * gain * self.head_norm.scale[rows][:, None, None]
        if self.dim_scale is not None:
            v = v * self.dim_scale[rows][:, None, :]
        if self.multiplier != 1.0:
            v = v * self.multiplier
        if self.cos is None or self.sin is None:
            return v
        cos, sin = self.cos[rows][:, None], self.sin[rows][:, None]  # (rows, 1, rot)
        return self._turn(v, cos, sin)


CODEGEN_MP = 4  # CodeGen's qkv_proj: 4 chunks (its TPU cores) of [q | v | k], each a quarter of the heads


def codegen_qvk(w: torch.Tensor, heads: int, d_head: int) -> tuple[torch.Tensor, ...]:
    """CodeGen's fused rows (3 · heads · d_head, ...) as its forward splits them: (q, v, k), each
    (heads, d_head, ...) (a bias: (heads, d_head))."""
    chunks = w.reshape(CODEGEN_MP, 3, heads // CODEGEN_MP, d_head, *w.shape[1:])
    return tuple(chunks[:, i].reshape(heads, d_head, *w.shape[1:]) for i in range(3))


def _weights(attn: Any, n_heads: int, n_kv: int, d_head: int) -> tuple[Projection, Projection]:
    """(query, key) projections split by head, from the attention module's layout."""

    def linear(mod: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        w = mod.weight.detach().float()
        w = w.T if type(mod).__name__ == "Conv1D" else w  # (out, d_model)
        b = getattr(mod, "bias", None)
        return w, (b.detach().float() if isinstance(b, torch.Tensor) else None)

    def split(w: torch.Tensor, b: torch.Tensor | None, heads: int) -> Projection:
        return Projection(w.reshape(heads, d_head, -1), None if b is None else b.reshape(heads, d_head))

    if hasattr(attn, "q_proj") and hasattr(attn, "k_proj"):
        wq, bq = linear(attn.q_proj)
        if wq.shape[0] == 2 * n_heads * d_head:  # Qwen3-Next / Qwen3.5: per head [query | gate]
            wq = wq.reshape(n_heads, 2, d_head, -1)[:, 0].reshape(n_heads * d_head, -1)
            bq = None if bq is None else bq.reshape(n_heads, 2, d_head)[:, 0].reshape(-1)
        return split(wq, bq, n_heads), split(*linear(attn.k_proj), n_kv)
    hd_q, hd_k = n_heads * d_head, n_kv * d_head
    if type(attn).__name__ == "CodeGenAttention":
        w, b = linear(attn.qkv_proj)
        q, _, k = codegen_qvk(w, n_heads, d_head)
        qb, kb = (None, None) if b is None else codegen_qvk(b, n_heads, d_head)[::2]
        return Projection(q, qb), Projection(k, kb)
    fused = next((getattr(attn, n) for n in ("qkv_proj", "Wqkv") if hasattr(attn, n)), None)
    if hasattr(attn, "c_attn") and not getattr(attn, "is_cross_attention", False):
        fused = attn.c_attn  # GPT-2: [q | k | v]; GPT-BigCode's multi-query: one key head
    if fused is not None:  # Phi-3, MPT, GPT-2: [q | k | v]
        w, b = linear(fused)
        pick = lambda t, a, z: None if t is None else t[a:z]  # noqa: E731
        return split(w[:hd_q], pick(b, 0, hd_q), n_heads), split(
            w[hd_q : hd_q + hd_k], pick(b, hd_q, hd_q + hd_k), n_kv
        )
    if hasattr(attn, "query_key_value"):
        w, b = linear(attn.query_key_value)
        cfg = getattr(attn, "config", None)
        if getattr(cfg, "model_type", "") == "falcon":
            return _falcon(w, b, cfg, n_heads, n_kv, d_head)
        # GPT-NeoX: (heads, [q | k | v] of d_head each)
        w3 = w.reshape(n_heads, 3, d_head, -1)
        b3 = None if b is None else b.reshape(n_heads, 3, d_head)
        return (
            Projection(w3[:, 0], None if b3 is None else b3[:, 0]),
            Projection(w3[:, 1], None if b3 is None else b3[:, 1]),
        )
    raise Unsupported(f"{type(attn).__name__}: attnviz does not know where its query and key projections are")


def falcon_value(w: torch.Tensor, cfg: Any, n_heads: int, n_kv: int, d_head: int) -> torch.Tensor:
    """Falcon's W_V from its fused rows (same layouts as `_falcon`): (kv, d_head, d_model)."""
    d_model = w.shape[-1]
    if getattr(cfg, "new_decoder_architecture", False):
        return w.reshape(n_kv, n_heads // n_kv + 2, d_head, d_model)[:, -1]
    if getattr(cfg, "multi_query", False):
        return w.reshape(n_heads + 2, d_head, d_model)[-1:]
    return w.reshape(n_heads, 3, d_head, d_model)[:, 2]


def _falcon(w, b, cfg, n_heads: int, n_kv: int, d_head: int) -> tuple[Projection, Projection]:
    """Falcon's fused layouts (its _split_heads): grouped (new decoder), multi-query, or per head."""
    d_model = w.shape[-1]
    if getattr(cfg, "new_decoder_architecture", False):
        g = n_heads // n_kv
        w4 = w.reshape(n_kv, g + 2, d_head, d_model)
        b4 = None if b is None else b.reshape(n_kv, g + 2, d_head)
        q = Projection(
            w4[:, :g].reshape(n_heads, d_head, d_model),
            None if b4 is None else b4[:, :g].reshape(n_heads, d_head),
        )
        return q, Projection(w4[:, g], None if b4 is None else b4[:, g])
    if getattr(cfg, "multi_query", False):
        w3 = w.reshape(n_heads + 2, d_head, d_model)
        b3 = None if b is None else b.reshape(n_heads + 2, d_head)
        return (
            Projection(w3[:n_heads], None if b3 is None else b3[:n_heads]),
            Projection(w3[n_heads : n_heads + 1], None if b3 is None else b3[n_heads : n_heads + 1]),
        )
    w3 = w.reshape(n_heads, 3, d_head, d_model)
    b3 = None if b is None else b.reshape(n_heads, 3, d_head)
    return (
        Projection(w3[:, 0], None if b3 is None else b3[:, 0]),
        Projection(w3[:, 1], None if b3 is None else b3[:, 1]),
    )


def _latent(attn: Any, y: torch.Tensor, heads: int, kv: int, d_head: int) -> tuple[Side, Side]:
    """Multi-head latent attention (Kimi Linear's, DeepSeek's layout): q = W_qb N_q(W_qa y) (or
    q_proj y), k_h = [W_kb^h N_kv(W_kva y) | W_krope y], the rope part shared by every head. With
    each latent norm frozen at its scale s_p per position, head h's side is (W_b^h ⊙ gain) W_a
    times s_p on the dims that pass the norm: ((q projection, its (N, d_head) scale), (k ...))."""
    if any(
        getattr(getattr(attn, n, None), "bias", None) is not None for n in ("q_a_proj", "kv_a_proj_with_mqa")
    ):
        raise Unsupported(f"{type(attn).__name__}: a bias before the latent norm is not split yet")
    n_pos = y.shape[0]

    def frozen(norm: Any, w_a: torch.Tensor) -> FrozenNorm:
        latent = y @ w_a.T  # (N, rank)
        with torch.inference_mode():
            out = norm(latent.to(norm.weight.device, norm.weight.dtype)).float().cpu()
        f = identify(norm, latent, out, "latent norm")
        if f is None or f.kind == "layer":
            raise Unsupported(f"{type(norm).__name__} on the latent is not an RMS norm attnviz can freeze")
        return f

    def weight(mod: Any) -> torch.Tensor:
        return mod.weight.detach().float().cpu()

    q: tuple[Projection, torch.Tensor | None]
    if getattr(attn, "q_proj", None) is not None:
        q = (Projection(weight(attn.q_proj).reshape(heads, d_head, -1), None), None)
    else:
        w_a = weight(attn.q_a_proj)
        f = frozen(attn.q_a_layernorm, w_a)
        w_b = weight(attn.q_b_proj).reshape(heads, d_head, -1)
        w_q = torch.einsum("hdr,r,rm->hdm", w_b, f.gain.cpu(), w_a)
        q = (Projection(w_q, None), f.scale[:, None].cpu().expand(n_pos, d_head))
    rank, d_nope = int(attn.kv_lora_rank), int(attn.qk_nope_head_dim)
    w_a = weight(attn.kv_a_proj_with_mqa)  # (rank + d_rope, d_model)
    f = frozen(attn.kv_a_layernorm, w_a[:rank])
    w_b = weight(attn.kv_b_proj).reshape(kv, -1, rank)[:, :d_nope]  # each head's k_nope rows
    nope = torch.einsum("hdr,r,rm->hdm", w_b, f.gain.cpu(), w_a[:rank])
    rope = w_a[rank:][None].expand(kv, -1, -1)
    scale = torch.cat([f.scale[:, None].cpu().expand(n_pos, d_nope), torch.ones(n_pos, d_head - d_nope)], 1)
    return q, (Projection(torch.cat([nope, rope], 1), None), scale)


def _own_tables(attn: Any, n_pos: int) -> list[tuple[torch.Tensor | None, torch.Tensor | None, str]]:
    """GPT-J / CodeGen turn inside the attention from their own ``embed_positions`` buffer
    ((positions, rot) = [sin | cos], interleaved pairs, the first rot dims): the tables it reads at
    positions 0..N-1, checked later like any reading."""
    table = getattr(attn, "embed_positions", None)
    if (
        not isinstance(table, torch.Tensor)
        or table.dim() != 2
        or table.shape[0] < n_pos
        or table.shape[1] % 2
    ):
        return []
    sin, cos = table[:n_pos].float().cpu().chunk(2, dim=-1)
    return [(cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1), "interleaved")]


def _rotary(
    tr: Trace | MixedTrace, layer: int, d_head: int, attn: Any = None
) -> list[tuple[torch.Tensor | None, torch.Tensor | None, str]]:
    """Readings of the layer's rotary tables, each checked later: the pairing the tables show
    (partial rotary: narrower tables), a half-width table that turns dims m and m + d_head/2 by
    the same angle (gpt-oss), the first half of the tables turning neighbours (GLM's
    repeat_interleave), the module's own table (GPT-J), or no rotation (learned positions, ALiBi,
    NoPE layers)."""
    tables = tr.rotary[layer]
    if tables is None:
        return [*_own_tables(attn, tr.n_tokens), (None, None, "half")]
    cos, sin = (t.reshape(-1, t.shape[-1]).float().cpu() for t in tables)
    if cos.shape[0] != tr.n_tokens:
        raise Unsupported(
            f"layer {layer}'s rotary tables cover {cos.shape[0]} positions, not the text's {tr.n_tokens}"
        )
    out: list[tuple[torch.Tensor | None, torch.Tensor | None, str]] = []
    with contextlib.suppress(AttnvizError):
        out.append((cos, sin, spec_from_tables(cos, sin, d_head).pairing if cos.shape[0] >= 2 else "half"))
    if 2 * cos.shape[-1] == d_head:
        out.append((torch.cat([cos, cos], -1), torch.cat([sin, sin], -1), "half"))
    half = cos.shape[-1] // 2
    out.append(
        (cos[:, :half].repeat_interleave(2, -1), sin[:, :half].repeat_interleave(2, -1), "interleaved")
    )
    return [*out, (None, None, "half")]  # a NoPE layer is handed the tables and leaves them unused


def _candidates(block: Any, attn: Any, x: torch.Tensor) -> list[FrozenNorm | None]:
    """The block's input norm: None (the attention reads the stream) or a child norm, frozen."""
    out: list[FrozenNorm | None] = [None]
    for name, child in block.named_children():
        weight = getattr(child, "weight", None)
        if child is attn or (weight is None and "norm" not in type(child).__name__.lower()):
            continue
        if weight is not None and (
            getattr(weight, "dim", lambda: 0)() != 1 or weight.shape[0] != x.shape[-1]
        ):
            continue
        like = weight if weight is not None else x  # a norm with no gain runs in the stream's dtype
        with torch.inference_mode():
            y = child(x[None].to(like.device, like.dtype))[0].float().cpu()
        frozen = identify(child, x, y, name)
        if frozen is not None:
            out.append(frozen)
    return out


def _head_norm(
    attn: Any, side: str, raw: torch.Tensor, heads: int, d_head: int
) -> tuple[FrozenNorm | None, int]:
    """The q/k norm (``q_norm`` / ``k_norm``, ``q_layernorm``) frozen on the raw projection
    (N, heads, d_head)."""
    mod = next(
        (
            getattr(attn, n)
            for n in (f"{side}_norm", f"{side}_layernorm")
            if getattr(attn, n, None) is not None
        ),
        None,
    )
    if mod is None:
        return None, 0
    weight = getattr(mod, "weight", None)
    width = d_head if weight is None else int(weight.shape[0])  # no gain (NanoChat): over each head
    like = raw if weight is None else weight
    x = raw.reshape(-1, d_head) if width == d_head else raw.reshape(raw.shape[0], -1)
    with torch.inference_mode():
        y = mod(x.to(like.device, like.dtype)).float().cpu()
    frozen = identify(mod, x, y, f"{side}_norm")
    if frozen is None:
        raise Unsupported(f"{type(mod).__name__} on the {side}s is not a norm attnviz can freeze")
    return frozen, width


def _fitted(
    side_map: SideMap, rebuilt: torch.Tensor, want: torch.Tensor, dtype: torch.dtype
) -> SideMap | None:
    """The map, or the map times the one scalar that makes it the model's own (a μP multiplier on
    the attention's input or on its keys), each checked on every position and head; else None."""
    if close(rebuilt, want, dtype):
        return side_map
    r, w = rebuilt.double().flatten(), want.double().flatten()
    c = float((r @ w) / (r @ r).clamp_min(1e-300))
    if c != 0.0 and close((rebuilt.double() * c).float(), want, dtype):
        return replace(side_map, multiplier=c)
    return None


def layer_maps(lm: LoadedModel, tr: Trace | MixedTrace, layer: int) -> tuple[SideMap, SideMap]:
    """(query map, key map) of ``layer``, checked: the stream maps to the captured Q and K."""
    name = tr.attn_modules[layer]
    attn = lm.model.get_submodule(name)
    block = lm.model.get_submodule(name.rsplit(".", 1)[0])
    cap = tr.captured[layer]
    heads, kv, d_head = int(cap.query.shape[1]), int(cap.key.shape[1]), int(cap.query.shape[-1])
    x = tr.stream[layer].float().cpu()  # (N, d_model)
    plain: tuple[Side, Side] | None = None  # None: MLA, whose projections depend on its latent norms
    if not hasattr(attn, "kv_a_proj_with_mqa"):
        qp, kp = _weights(attn, heads, kv, d_head)
        plain = ((qp, None), (kp, None))
        if qp.weight.shape[:2] != (heads, d_head) or kp.weight.shape[:2] != (kv, d_head):
            raise Unsupported(
                f"layer {layer}'s projections do not split into {heads} / {kv} heads of {d_head}"
            )
    if plain is not None and plain[0][0].weight.shape[-1] != x.shape[-1]:
        raise Unsupported(
            f"layer {layer}'s attention reads {plain[0][0].weight.shape[-1]} features, not the stream's "
            f"{x.shape[-1]} "
            "(Zamba2's shared block reads the stream concatenated with the embeddings, then writes "
            "through a linear layer inside a Mamba block): its score is not a map of the stream alone"
        )
    rows = torch.arange(tr.n_tokens)
    dtype = cap.query.dtype
    readings = _rotary(tr, layer, d_head, attn)
    for in_norm, (cos, sin, pairing) in ((n, r) for n in _candidates(block, attn, x) for r in readings):
        y = (
            x
            if in_norm is None
            else in_norm.apply(x, slice(None)) + (in_norm.constant if in_norm.constant is not None else 0)
        )
        sides = _latent(attn, y, heads, kv, d_head) if plain is None else plain
        maps = []
        for side, (proj, dims), want, n in (("q", sides[0], cap.query, heads), ("k", sides[1], cap.key, kv)):
            raw = torch.einsum("pm,hdm->phd", y, proj.weight) + (0 if proj.bias is None else proj.bias)
            norm, width = (None, 0) if plain is None else _head_norm(attn, side, raw, n, d_head)
            side_map = SideMap(in_norm, proj, norm, width, cos, sin, pairing, dim_scale=dims)
            rebuilt = torch.stack(
                [side_map.linear(x[:, None], rows, h)[:, 0] + side_map.constant(rows, h) for h in range(n)]
            )
            maps.append(_fitted(side_map, rebuilt, want[0].float().cpu(), dtype))
        if maps[0] is not None and maps[1] is not None:
            return maps[0], maps[1]
    raise Unsupported(
        f"{lm.spec!r}: layer {layer}'s captured queries and keys are not the block's input norm, "
        f"{type(attn).__name__}'s projections, q/k norms and the rotary tables applied to the stream "
        "(rotation inside the module, another transform on Q/K); its scores cannot be split exactly"
    )
