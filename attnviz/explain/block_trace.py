"""One forward of a hybrid or recurrent model that keeps what its routes and node inspection need.

`block_trace(lm, text)` reads the residual stream at every block boundary (`attnviz.explain.stream`)
and, in the same forward, captures each softmax attention call (Q, K, V) and each mixer's kernel
inputs (`attnviz.capture`), and the input of each softmax attention's output projection (its
gate, if any, frozen: Qwen3.5's sigmoid gate). Each block's token-mixing branches then become
`route_parts` parts (per head, or one per-channel part), and each is checked before it is used:
Σ_s c_{t,s} + rest must be what the branch adds to the stream (read by the hooks), within the
dtype's tolerance, at the self-check's rows (a mixer: its rows over the whole text are the mixer
store's own self-check; this check of how its parts are put together reads its first 64 tokens).
A block that fails keeps the reason in ``problems``.

Where a block is the sum of its branches only after a norm on its input (RWKV's ``pre_ln`` in
block 0), the routes start from that norm's output: the embedding node is the normalised embedding.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import Linear

from ..capture.hook import editing, recording
from ..capture.projections import output_bias, output_weight
from ..errors import AttnvizError, MixerCheckFailed, MixerNotShown
from ..exact.probabilities import probs_from_capture
from ..inputs import admit_ids, tokenize
from ..layout import query_group, repeat_kv
from ..limits import bytes_per_element, capture_bytes, forward_bytes, require
from ..loading import Hook, LoadedModel
from ..mixers.kinds import MIXERS, check_rows
from ..mixers.store import HALF_RELATIVE_TOLERANCE, RELATIVE_TOLERANCE, MixerStore
from ..tokens import Tokens
from .blocks import Unsupported
from .route_parts import ChannelPart, HeadPart
from .stream import Stream, block_sites, read_stream, split_block

log = logging.getLogger(__name__)
OUT_NAMES = ("o_proj", "out_proj", "dense", "c_proj")
SHARED_BLOCK = (
    "its shared attention block (Zamba2) reads the stream concatenated with the original embeddings "
    "and passes its attention's output through its own MLP and a linear layer before the stream: "
    "the attention's c_(t,s) are not parts of what the block adds, so no route can cross it"
)
Z_ROWS = 256  # query rows of α made at once while reading a gate
ASSEMBLY_ROWS = 64  # a mixer branch's parts are checked on its first tokens (see _check)
SOURCE_NOTE = (
    "A mixer's source s is the vector its matrix weighs at s, as in the Explorer (Mamba's x_s after "
    "its short conv, RWKV's v_s after its time shift): those mix in a few earlier tokens."
)


@dataclass(frozen=True)
class BlockTrace:
    """The stream of one forward and each block's token-mixing parts, checked (module doc)."""

    stream: Stream
    parts: tuple[dict[str, HeadPart | ChannelPart], ...]  # per block: mixing branch -> its part
    added: tuple[dict[str, torch.Tensor], ...]  # per block: part -> (N, d_model) it adds, float32
    residual_in: tuple[torch.Tensor, ...]  # (N, d_model) the block's sum starts from, float32
    mlp: tuple[torch.Tensor | None, ...]  # (N, d_model) what the MLP / MoE adds (None: none)
    problems: tuple[str, ...]  # per block: "" (its parts add up, checked) or why not
    notes: tuple[str, ...] = ()

    residual = "sequential"

    @property
    def model_name(self) -> str:
        return self.stream.model_name

    @property
    def tokens(self) -> Tokens:
        return self.stream.tokens

    @property
    def n_layers(self) -> int:
        return len(self.parts)

    @property
    def n_tokens(self) -> int:
        return self.stream.n_tokens

    @property
    def n_heads(self) -> int:
        return max((p.n_heads for parts in self.parts for p in parts.values()), default=1)

    @property
    def unembed_problem(self) -> str:
        return self.stream.unembed_problem

    @property
    def nbytes(self) -> int:
        seen = [*self.stream.stream, *self.residual_in, *(m for m in self.mlp if m is not None)]
        for parts in self.parts:
            for p in parts.values():
                seen += [p.w] + ([p.v] if isinstance(p, HeadPart) else [])
        return self.stream.nbytes + sum(t.numel() * t.element_size() for t in seen)

    def position(self, token: int) -> int:
        return self.stream.position(token)

    def mixed(self, layer: int, rows: Any = slice(None)) -> torch.Tensor:
        """The stream after block ``layer``'s token mixing (float32): its input + every branch."""
        out = self.residual_in[layer][rows].clone()
        for part in self.parts[layer]:
            out += self.added[layer][part][rows]
        return out

    def next_stream(self, layer: int, rows: Any = slice(None)) -> torch.Tensor:
        return self.stream.stream[layer + 1][rows].float()

    def part_names(self, layer: int) -> tuple[str, ...]:
        """Block ``layer``'s parts: its mixing branches, then "mlp" where it has one."""
        return (*self.parts[layer], *(("mlp",) if self.mlp[layer] is not None else ()))


def block_trace(
    lm: LoadedModel, text: str | list[int], *, chat: bool = False, max_tokens: int = 8192
) -> BlockTrace:
    """Run ``lm`` once on ``text`` (or token ids) keeping each block's parts (module doc)."""
    ids = tokenize(lm, text, chat=chat)[0] if isinstance(text, str) else [int(i) for i in text]
    if not ids:
        raise AttnvizError("an empty text; type a few words")
    admit_ids(lm, ids, max_tokens=max_tokens, memory=False).check()
    sites = block_sites(lm)
    lay, n, elem = lm.layout, len(ids), bytes_per_element(lm.dtype)
    # rough bounds: the stream, each part's write (model dtype and float32), the mixers' kernel
    # inputs and their float32 values / scales (d_inner ≈ 2 d_model), the captured attention
    per_block = lay.d_model * n * (4 * elem + 16 + 6 * 4)
    require(
        capture_bytes(lay, n, lm.dtype) + forward_bytes(lay, n, lm.dtype) + (sites.n_blocks + 1) * per_block,
        lm.device,
        what=f"tracing {n} tokens through every block's mixers (the routes)",
        hint="a shorter text",
    )
    o_in: dict[int, torch.Tensor] = {}
    raw: dict[tuple[int, str], torch.Tensor] = {}
    pre_ln: dict[int, torch.Tensor] = {}
    hooks: list[Hook] = []

    def keep_input(b: int):
        return lambda _m, args: o_in.__setitem__(b, args[0][0].detach().clone())

    def keep_output(into: dict, key: Any):
        def hook(_m, _a, out):
            y = out[0] if isinstance(out, tuple) else out
            into[key] = y[0].detach().clone()

        return hook

    for b in range(sites.n_blocks):
        attn = sites.modules.get("attention", [None] * sites.n_blocks)[b]
        proj = next((getattr(attn, a) for a in OUT_NAMES if isinstance(getattr(attn, a, None), Linear)), None)
        if proj is not None:
            hooks.append(Hook(proj, keep_input(b), "before"))
        norm = getattr(sites.blocks[b], "pre_ln", None)
        if isinstance(norm, torch.nn.Module):  # RWKV's block 0: its parts' outputs, to split again
            hooks.append(Hook(norm, keep_output(pre_ln, b)))
            for part in sites.parts:
                if sites.modules[part][b] is not None:
                    hooks.append(Hook(sites.modules[part][b], keep_output(raw, (b, part))))
    heads_out: dict[str, torch.Tensor] = {}  # each attention's Σ_s α v (N, heads, d_head), pre-gate

    def keep_heads(module: torch.nn.Module, output: torch.Tensor) -> torch.Tensor:
        heads_out[lm.module_names.get(id(module), "")] = output[0].detach()
        return output

    with recording(lm.module_names) as rec, editing(keep_heads):
        st = read_stream(lm, ids, hooks)
    store = MixerStore(rec.mixers, lm.dtype)
    calls = {c.module_name: c for c in rec.calls}
    residual_in, mlp, all_parts, problems, block_added = [], [], [], [], []
    notes = {SOURCE_NOTE}
    for b in range(sites.n_blocks):
        added, scales, why = st.added[b], st.scales[b], st.problem[b]
        start = st.stream[b]
        if why and hasattr(sites.blocks[b], "shared_transformer"):
            why = SHARED_BLOCK
        if why and b in pre_ln:  # RWKV block 0: the sum starts after its pre_ln
            outs = {p: raw[(b, p)] for p in sites.parts if (b, p) in raw}
            added, scales, again = split_block(pre_ln[b], st.stream[b + 1], outs, lm.dtype)
            if not again:
                why, start = "", pre_ln[b]
                notes.add(
                    f"Block {b} normalises its input first ({type(sites.blocks[b].pre_ln).__name__}): "
                    "the routes start from the normalised embedding."
                )
        parts: dict[str, HeadPart | ChannelPart] = {}
        if not why:
            try:
                for name in added:
                    if name == "mlp":
                        continue
                    module = sites.modules[name][b]
                    parts[name] = (
                        _attention_part(lm, calls, module, o_in.get(b), heads_out, scales[name])
                        if name == "attention"
                        else _mixer_part(store, b, name, scales[name])
                    )
                why = _check(parts, added, lm.dtype, st.n_tokens)
            except (AttnvizError, MixerCheckFailed, MixerNotShown) as err:
                why = str(err)
        if "mlp" in added and "rwkv" in added:
            notes.add(
                "RWKV's FFN also reads the previous token's stream (its time shift); its edge is "
                "drawn from this token's node."
            )
        block_added.append({k: v.float() for k, v in added.items()})
        residual_in.append(start.float())
        mlp.append(added["mlp"].float() if "mlp" in added else None)
        all_parts.append(parts)
        problems.append(f"block {b}: {why}" if why and not why.startswith("block ") else why)
    if any(p.per_head and name != "attention" for parts in all_parts for name, p in parts.items()):
        notes.add(
            "Per-head mixers (SSD, gated delta, Kimi delta, lightning) write through out_proj with their "
            "gates and output norm frozen at their forward values (where that norm spans heads, as "
            "lightning's, the split by head rests on its frozen scale); SSD's D·x_t is on token t's own edge."
        )
    if any(p.per_head is False for parts in all_parts for p in parts.values()):
        notes.add(
            "Mamba-1, RWKV, RG-LRU and short-conv mixers mix per channel: each is one component, its "
            "edges c_{t,s} block-level (no heads)."
        )
    return BlockTrace(
        st,
        tuple(all_parts),
        tuple(block_added),
        tuple(residual_in),
        tuple(mlp),
        tuple(problems),
        tuple(sorted(notes)),
    )


def _attention_part(
    lm: LoadedModel, calls: dict, module: Any, o_in: torch.Tensor | None, heads_out: dict, scale: float
) -> HeadPart:
    """A softmax attention branch: α from its captured Q, K (eager's order of operations), V per
    query head, W_O by head; a gate between the heads and W_O frozen as o_proj's input / Σ α v
    (the attention's own output in the forward, before the gate)."""
    name = lm.module_names.get(id(module), "")
    cap = calls.get(name)
    if cap is None or cap.value is None:
        raise Unsupported(f"its attention ({name}) was not captured with its values")
    heads = int(cap.query.shape[1])
    v = cap.value[0].float()
    d_head = int(v.shape[-1])  # MLA's value heads are not its query heads' size
    v = repeat_kv(v, query_group(heads, v.shape[0]), dim=0).contiguous()  # (heads, S, d_head)
    w = output_weight(lm.model, name, heads, d_head).to(v.device) * scale
    bias = output_bias(lm.model, name)

    def rows(targets: list[int], n_keys: int) -> torch.Tensor:
        """α of ``targets`` (T, heads, keys): one call per run of consecutive targets."""
        out, start = [], 0
        for i in range(1, len(targets) + 1):
            if i == len(targets) or targets[i] != targets[i - 1] + 1:
                run = slice(targets[start], targets[i - 1] + 1)
                out.append(probs_from_capture(cap, None, run)[:, :, :n_keys].permute(1, 0, 2))
                start = i
        return torch.cat(out).float()

    sigma = None
    if o_in is not None and name in heads_out:  # the forward's Σ α v: the gate is o_in's ratio to it
        z = heads_out[name].float()
        got = o_in.float().reshape(z.shape)
        if not torch.allclose(got, z, rtol=1e-4, atol=1e-5 * max(1.0, float(z.abs().max()))):
            sigma = torch.where(z != 0, got / z.where(z != 0, 1.0), 0.0)  # the gate, frozen
    elif o_in is not None:  # a gate between the heads and W_O: o_proj's input is not Σ α v there
        n = v.shape[1]
        probe = check_rows(n)
        got = o_in.float()[probe].reshape(len(probe), heads, d_head)
        z = torch.einsum("ths,hsd->thd", rows(probe, n), v)
        if not torch.allclose(got, z, rtol=1e-4, atol=1e-5 * max(1.0, float(z.abs().max()))):
            z = torch.cat(  # Σ_s α v by row blocks (T, heads, d_head), never (heads, N, N) at once
                [
                    torch.einsum("ths,hsd->thd", rows(list(range(r, min(n, r + Z_ROWS))), n), v)
                    for r in range(0, n, Z_ROWS)
                ]
            )
            got = o_in.float().reshape(z.shape)
            sigma = torch.where(z != 0, got / z.where(z != 0, 1.0), 0.0)  # the gate, frozen

    return HeadPart("attention", w, v, sigma, rows, None if bias is None else bias.float() * scale)


def _mixer_part(store: MixerStore, b: int, kind: str, scale: float) -> HeadPart | ChannelPart:
    """A mixer branch from its captured kernel inputs, after the store's self-check."""
    spec = MIXERS[kind]
    store.check(b, kind)
    rec = store.record(b, kind)
    if rec.out_weight is None:
        raise Unsupported(f"its {spec.display} mixer kept no output projection")
    parts = store.parts(b, kind)
    bias = None if rec.out_bias is None else rec.out_bias.double() * scale
    if not spec.per_head:
        assert spec.channel_terms is not None
        return ChannelPart(kind, rec.out_weight.double() * scale, spec.channel_terms(parts), bias)
    if rec.scale is None:
        raise Unsupported(f"its {spec.display} mixer kept no frozen path to its out_proj")
    v = parts[spec.values].float().permute(1, 0, 2).contiguous()  # (heads, S, d_head)
    heads, d_head = v.shape[0], v.shape[2]
    w = rec.out_weight.float().reshape(-1, heads, d_head).permute(1, 0, 2) * scale
    sigma = rec.scale[0].float().reshape(-1, heads, d_head).to(v.device)
    skip = parts[spec.skip].float() if spec.skip else None  # SSD's D_h: token t's own

    def rows(targets: list[int], n_keys: int) -> torch.Tensor:
        a = store.tensor(b, kind, rows=targets)[:, :, :n_keys].to(v.device)  # (heads, T, keys), checked
        if skip is not None:  # D_h x_t: on token t's own edge
            for i, t in enumerate(targets):
                if t < n_keys:
                    a[:, i, t] += skip.to(a.device)
        return a.permute(1, 0, 2)

    return HeadPart(kind, w.contiguous(), v, sigma, rows, None if bias is None else bias.float())


def _check(parts: dict, added: dict, dtype: torch.dtype, n: int) -> str:
    """ "" when every part's Σ_s c_{t,s} + rest is what it adds to the stream at the check rows."""
    rel = RELATIVE_TOLERANCE.get(dtype, HALF_RELATIVE_TOLERANCE)
    for name, part in parts.items():
        # a mixer's rows over the whole text are the store's self-check (at its check rows); here
        # the parts' assembly (out_proj by head, frozen scales, skip, multiplier) on the first tokens
        rows = check_rows(n if name == "attention" else min(n, ASSEMBLY_ROWS))
        sums = part.sums(rows)
        for i, t in enumerate(rows):
            want = added[name][t].float()
            got = sums[i].to(want.device) + part.rest(t).to(want.device)
            diff, scale = float((got - want).abs().max()), max(1.0, float(want.abs().max()))
            if not diff <= rel * scale:
                label = "attention" if name == "attention" else MIXERS[name].display
                return (
                    f"its {label} branch's edges Σ_s c_(t,s) miss what it adds to the stream at token {t} "
                    f"by {diff:.1e} (allowed {rel * scale:.1e}); its routes would not add up"
                )
    return ""
