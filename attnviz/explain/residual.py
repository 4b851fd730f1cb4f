"""One forward pass that keeps what the explanations need: the residual stream around every block.

`trace(lm, text)` runs the model once with attnviz's capture on (each layer's Q, K, V and mask,
`attnviz.capture`) and forward hooks on the decoder blocks and their direct children (the
attention module, the MLP and the norms) keeping, per layer and for every token:

- ``stream[l]``: the residual stream entering block l (``stream[n_layers]``: the final one);
- ``attn_added[l]`` / ``mlp_added[l]``: what the attention and the MLP add to it (after a norm
  between them and the residual, Gemma 2/3 and OLMo 2, whose per-token scale is kept frozen);

so peak memory is O(N · d_model) per layer. The hooks read the block's structure from the tensors
themselves: where the MLP reads from (the stream after the attention: sequential; the block's
input: parallel residual, GPT-J / NeoX / Falcon) and which norm reads the attention's or the MLP's
output. Every block is then checked to be exactly ``input + attention + MLP`` (within the dtype's
rounding) and the attention output to be ``Σ_h W_O^h Σ_j α_tj v_j + b_O`` at the last token; a
model that does anything else (residual multipliers, gated attention, recurrent blocks) is
refused with the reason, never explained wrongly.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ..capture.hook import editing, recording
from ..capture.projections import output_bias, output_weight
from ..errors import AttnvizError
from ..exact.probabilities import attention_scores, probs_from_capture, softmax_fp32
from ..inputs import admit_ids, tokenize
from ..layout import by_kv_group, query_group, repeat_kv
from ..limits import bytes_per_element, capture_bytes, forward_bytes, require
from ..loading import LoadedModel
from ..records import CapturedAttention
from ..tokens import Tokens
from .blocks import Block, BlockHooks, Residual, Unsupported
from .norms import FrozenNorm, close

log = logging.getLogger(__name__)

# (LFM2 names its final norm "embedding_norm"; RWKV "ln_out")
FINAL_NORM_NAMES = (
    *("norm", "ln_f", "final_layer_norm", "final_layernorm", "norm_f", "final_norm"),
    *("ln_out", "embedding_norm"),
)
DEFAULT_TRACE_TOKENS = 8192


@dataclass(frozen=True)
class Trace:
    """The residual stream of one forward pass, block by block, and each layer's attention.

    Rows are token positions (one sequence); ``stream`` has n_layers + 1 entries, the others
    n_layers. Tensors are in the model's dtype on its device; `whole`-style sums recompute the
    model's own additions in that dtype.
    """

    model_name: str
    tokens: Tokens
    residual: Residual
    stream: tuple[torch.Tensor, ...]  # (N, d_model) entering each block, + the final stream
    attn_added: tuple[torch.Tensor, ...]  # (N, d_model) what the attention adds to the stream
    mlp_added: tuple[torch.Tensor, ...]  # (N, d_model) what the MLP adds
    attn_norm: tuple[FrozenNorm | None, ...]  # the norm between heads and residual, frozen
    captured: tuple[CapturedAttention, ...]  # Q, K, V, mask of each layer's attention call
    attn_modules: tuple[str, ...]  # module name of each layer's attention
    out_bias: tuple[torch.Tensor | None, ...]  # (d_model,) b_O of each layer, float32
    logits: torch.Tensor  # (vocab,) float32: the model's own logits at the last position
    heads_problem: str  # "" when every layer's output is Σ_h W_O^h z^h + b_O (checked), else why not
    unembed_problem: str  # "" when the logits are unembed(final norm(stream)) (checked), else why not
    head_means: tuple[torch.Tensor, ...] | None  # (heads, d_head) per layer: mean output per head
    rotary: tuple[tuple[torch.Tensor, torch.Tensor] | None, ...]  # (cos, sin) given to each layer
    notes: tuple[str, ...] = ()
    _w_o: dict[int, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)

    @property
    def n_layers(self) -> int:
        return len(self.attn_added)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        """Bytes the trace holds (streams and the captured Q / K / V / masks)."""
        seen: set[int] = set()
        total = 0
        tensors = [*self.stream, *self.attn_added, *self.mlp_added]
        tensors += [t for c in self.captured for t in (c.query, c.key, c.value, c.mask) if t is not None]
        for t in tensors:
            if id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()
        return total

    @property
    def n_heads(self) -> int:
        return int(self.captured[0].query.shape[1])

    def position(self, token: int) -> int:
        """A token index (negative counts from the end) as a position, or an error."""
        n = self.n_tokens
        if not -n <= int(token) < n:
            raise AttnvizError(f"token {token} is out of range: this text has tokens 0..{n - 1}")
        return int(token) % n

    def mid(self, layer: int, rows: Any = slice(None)) -> torch.Tensor:
        """The stream after layer ``layer``'s attention (sequential blocks), the model's own sum."""
        return self.stream[layer][rows] + self.attn_added[layer][rows]

    def w_o(self, lm: LoadedModel, layer: int) -> torch.Tensor:
        """W_O split by head, float32 (heads, d_model, d_value) (cached on the trace); d_value is
        d_head but in MLA (DeepSeek V2/V3: v_head_dim ≠ the query/key width)."""
        if layer not in self._w_o:
            cap = self.captured[layer]
            d_value = cap.query.shape[-1] if cap.value is None else cap.value.shape[-1]  # MLA: ≠ d_head
            self._w_o[layer] = output_weight(
                lm.model, self.attn_modules[layer], int(cap.query.shape[1]), int(d_value)
            )
        return self._w_o[layer]

    def probs(self, layer: int, row: int) -> torch.Tensor:
        """α of query ``row`` at ``layer``: float32 (heads, key_pos), exact (as eager)."""
        return self.probs_rows(layer, [row])[0]

    def probs_rows(self, layer: int, rows: list[int], n_keys: int | None = None) -> torch.Tensor:
        """α of the query ``rows`` over the first ``n_keys`` keys: float32 (rows, heads, keys).

        Eager's order of operations (q · k · scaling, soft-cap, the mask, softmax in float32) on
        these rows only, each KV head's keys read in place by its group of query heads (no copy).
        Sinks and position biases go through `probs_from_capture` row by row.
        """
        cap = self.captured[layer]
        n_k = cap.key.shape[2] if n_keys is None else n_keys
        if cap.sinks is not None or cap.position_bias is not None or cap.query.shape[2] != cap.key.shape[2]:
            return torch.stack([probs_from_capture(cap, None, slice(r, r + 1))[:, 0, :n_k] for r in rows])
        heads, n = cap.query.shape[1], len(rows)
        g = query_group(heads, cap.key.shape[1])
        idx = torch.tensor(rows, device=cap.query.device)
        q = by_kv_group(cap.query[0].index_select(1, idx), g, 0).flatten(1, 2)  # (kv, group · rows, d_head)
        mask = None
        if cap.mask is not None:
            m = cap.mask[0].index_select(1, idx)[..., :n_k]  # (1|heads, rows, keys)
            if m.shape[0] == 1:  # one mask for every head: the same rows for each head of a group
                mask = m.repeat(g, 1, 1).reshape(1, g * n, n_k)
            else:
                mask = by_kv_group(m, g, 0).flatten(1, 2)  # (kv, group · rows, keys)
        elif cap.is_causal:
            causal = torch.arange(n_k, device=idx.device)[None, :] <= idx[:, None]  # (rows, keys)
            mask = causal.repeat(g, 1)  # (group · rows, keys)
        scores = attention_scores(q, cap.key[0, :, :n_k], scaling=cap.scaling, softcap=cap.softcap, mask=mask)
        return softmax_fp32(scores).reshape(heads, n, n_k).transpose(0, 1)

    def values(self, layer: int) -> torch.Tensor:
        """V per query head: float32 (heads, key_pos, d_head) (GQA's KV heads repeated)."""
        cap = self.captured[layer]
        assert cap.value is not None
        v = cap.value[0].float()
        # contiguous: the copy repeat_interleave always made, so the callers' products see one layout
        return repeat_kv(v, query_group(cap.query.shape[1], v.shape[0]), dim=0).contiguous()


def _decoder_layers(lm: LoadedModel) -> tuple[list[Any], list[Any], list[str]]:
    """(blocks, attention modules, attention module names), or the reason it cannot."""
    lay = lm.layout
    if lay.kind != "decoder":
        raise Unsupported(
            f"{lm.spec!r} is an {lay.kind} model; routes, the logit lens and attributions follow a "
            "decoder's next-token prediction through its residual stream (encoders normalise the "
            "stream after each block and predict no next token)"
        )
    if not lay.n_layers or lay.attention_layers or lay.has_mixers:  # hybrids, Mamba, RWKV, ...
        what = (
            lay.mixer_summary()
            or f"other mixers in blocks {', '.join(map(str, lay.blocks_without_attention))}"
        )
        raise Unsupported(
            f"{lm.spec!r} "
            + (
                f"has no softmax attention: its token mixers are {what}"
                if not lay.n_layers
                else f"is a hybrid: it mixes tokens with {what}"
            )
            + ". This trace splits each block into softmax heads' parts α·W_O v, which the views over "
            "softmax heads only (head ablation, the QK split) need; the per-head parts of these mixers "
            "are read elsewhere. What runs: routes and node inspection (information_flow / node_writes "
            "on a block_trace: each mixer head's c_{t,s} through out_proj as edges), block_attribution "
            "(each block part, a per-head mixer by head), ablate_mixer_heads, search_mixer_heads; the "
            "logit lens and patching over 'residual' and 'blocks' read the stream at block boundaries"
        )
    if not lm.fast_exact or lm.probe is None:
        raise Unsupported(
            f"{lm.spec!r} runs attention attnviz does not capture exactly; the explanations need each "
            "layer's captured values (the fast path)"
        )
    names = [s.module_name for s in lm.probe.sites["self"]]
    attn = [lm.model.get_submodule(n) for n in names]
    blocks = [lm.model.get_submodule(n.rsplit(".", 1)[0]) for n in names]
    return blocks, attn, names


def final_norm(lm: LoadedModel) -> tuple[str, Any]:
    """The norm between the last block and the unembedding (name, module)."""
    base = getattr(lm.model, "base_model", lm.model)
    for name in FINAL_NORM_NAMES:
        mod = getattr(base, name, None)
        if isinstance(mod, torch.nn.Module):
            return name, mod
    raise Unsupported(f"cannot find the final norm of {lm.spec!r} (looked for {', '.join(FINAL_NORM_NAMES)})")


def logit_multiplier(lm: LoadedModel) -> float:
    """The scalar the model multiplies its LM head's output by: μP's ``lm_head_multiplier``
    (Falcon-H1), 1 / ``logits_scaling`` (Granite), else 1."""
    config = lm.model.config.get_text_config()
    multiplier = float(getattr(config, "lm_head_multiplier", None) or 1.0)
    scaling = getattr(config, "logits_scaling", None)
    return multiplier / float(scaling) if scaling else multiplier


def unembed(lm: LoadedModel, x: torch.Tensor) -> torch.Tensor:
    """Logits of hidden states x (rows, d_model) as the model's head makes them: final norm,
    output embedding, soft-capping where the config has it. float32 (rows, vocab)."""
    head = lm.model.get_output_embeddings()
    if head is None:
        raise Unsupported(f"{lm.spec!r} has no output embedding (LM head) to read the stream with")
    normed = final_norm(lm)[1](x[None])  # Mamba's norm returns float32 on a bf16 model: cast as it does
    logits = head(normed.to(head.weight.dtype))[0].float()
    multiplier = logit_multiplier(lm)
    if multiplier != 1.0:
        logits = logits * multiplier
    cap = getattr(lm.model.config.get_text_config(), "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


@contextlib.contextmanager
def _observe_heads(lm: LoadedModel, means: dict[str, torch.Tensor]) -> Iterator[None]:
    """Keep each attention call's mean output per head over the positions (for mean ablation)."""

    def edit(module: torch.nn.Module, out: torch.Tensor) -> torch.Tensor:
        means[lm.module_names.get(id(module), "")] = out[0].float().mean(dim=0)  # (heads, d_head)
        return out

    with editing(edit):
        yield


def trace(
    lm: LoadedModel,
    text: str | list[int],
    *,
    chat: bool = False,
    max_tokens: int = DEFAULT_TRACE_TOKENS,
    progress: Callable[[int, int], None] | None = None,
) -> Trace:
    """Run ``lm`` once on ``text`` (or token ids) keeping the residual stream around every block.
    ``progress(done, total)`` hears each attention layer of the forward (an exception it raises
    stops the forward)."""
    blocks, attn, names = _decoder_layers(lm)
    ids, template = tokenize(lm, text, chat=chat) if isinstance(text, str) else (list(text), None)
    admit_ids(lm, ids, max_tokens=max_tokens, memory=False).check()  # the cap and the position table
    dtype = next(lm.model.parameters()).dtype
    lay = lm.layout
    streams = 3 * (lay.n_layers + 1) * len(ids) * lay.d_model * bytes_per_element(dtype)
    require(
        capture_bytes(lay, len(ids), dtype) + forward_bytes(lay, len(ids), dtype) + streams,
        lm.device,
        what=f"tracing {len(ids)} tokens (the residual stream around every block)",
        hint="a shorter text",
    )
    means: dict[str, torch.Tensor] = {}
    watch = _observe_heads(lm, means) if lm.supports_capture else contextlib.nullcontext()
    tell = None if progress is None else (lambda done: progress(min(done, len(blocks)), len(blocks)))
    hooks = BlockHooks(blocks, attn, dtype)  # on the model only during the forward, this thread's
    with recording(lm.module_names, on_call=tell) as rec, watch:
        out = lm.forward(ids, hooks=hooks.hooks, logits_at="last")
    problem = next((b.problem for b in hooks.blocks if b.problem), "")
    if problem or len(hooks.blocks) != len(blocks) or len(rec.calls) != len(blocks) or rec.unsupported:
        raise Unsupported(
            f"{lm.spec!r}: {problem or 'the forward did not run each attention layer once'}; "
            "the explanations cannot decompose this model exactly"
        )
    kinds = {b.residual for b in hooks.blocks}
    if len(kinds) != 1:
        raise Unsupported(f"{lm.spec!r} mixes sequential and parallel blocks; not supported")
    logits = out.logits[0, -1].float()  # the last position's
    tr = Trace(
        model_name=lm.spec,
        tokens=Tokens.build(lm.tokenizer, ids, template=template),
        residual=hooks.blocks[0].residual or "sequential",
        stream=tuple(s[0] for s in hooks.stream),
        attn_added=tuple(b.attn_added[0] for b in hooks.blocks if b.attn_added is not None),
        mlp_added=tuple(b.mlp_added[0] for b in hooks.blocks if b.mlp_added is not None),
        attn_norm=tuple(b.attn_norm for b in hooks.blocks),
        captured=tuple(rec.calls),
        attn_modules=tuple(names),
        out_bias=tuple(_out_bias(lm, n) for n in names),
        logits=logits,
        heads_problem="",
        unembed_problem="",
        head_means=tuple(means[n] for n in names) if len(means) == len(names) else None,
        rotary=tuple(hooks.rotary),
        notes=_notes(hooks.blocks),
    )
    with torch.inference_mode():
        return replace(
            tr, heads_problem=_heads_sum_problem(lm, tr, dtype), unembed_problem=_unembed_problem(lm, tr)
        )


def _out_bias(lm: LoadedModel, module_name: str) -> torch.Tensor | None:
    bias = output_bias(lm.model, module_name)
    return None if bias is None else bias.detach().float()


def _notes(blocks: list[Block]) -> tuple[str, ...]:
    normed = [b.attn_norm for b in blocks if b.attn_norm is not None]
    if not normed:
        return ()
    return (
        f"A norm ({normed[0].name or normed[0].kind}) sits between the heads and the residual stream: "
        "its per-token scale is frozen at its actual value, so the heads' parts still add up to "
        "what the attention adds, exactly.",
    )


def _heads_sum_problem(lm: LoadedModel, tr: Trace, dtype: torch.dtype) -> str:
    """At the last token of every layer: Σ_h W_O^h Σ_j α v_j + b_O is the attention's output."""
    last = tr.n_tokens - 1
    for layer in range(tr.n_layers):
        # float64 sums: a float32 sum over 8,192 keys alone is off by ~3e-5 relative, which would
        # fail an exact model (measured on smollm2-135m; the model's own output is within 5e-7)
        z = torch.einsum("hk,hkd->hd", tr.probs(layer, last).double(), tr.values(layer).double())
        out = torch.einsum("hmd,hd->m", tr.w_o(lm, layer).to(z.device).double(), z)
        if tr.out_bias[layer] is not None:
            out = out + tr.out_bias[layer].to(out.device).double()  # type: ignore[union-attr]
        out = out.float()
        norm = tr.attn_norm[layer]
        if norm is not None:
            out = norm.apply(out[None], slice(last, last + 1))[0]
            if norm.constant is not None:
                out = out + norm.constant.to(out.device)
        if not close(out, tr.attn_added[layer][last], dtype):
            return (
                f"{lm.spec!r}: layer {layer}'s attention output is not Σ heads W_O α V + bias (a gate or "
                "another term on the heads); its parts cannot be separated exactly"
            )
    return ""


def _unembed_problem(lm: LoadedModel, tr: Trace) -> str:
    """The model's logits at the last position are unembed(final norm(final stream))."""
    try:
        with torch.inference_mode():
            mine = unembed(lm, tr.stream[-1][-1:])[0]
    except Unsupported as err:
        return str(err)
    if not close(mine, tr.logits, next(lm.model.parameters()).dtype):
        return (
            f"{lm.spec!r}'s logits are not its output embedding of its final norm (a logit scale or "
            "another head); the logit lens and attributions would not match its prediction"
        )
    return ""
