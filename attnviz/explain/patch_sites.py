"""Where activation patching reads and writes a model: its sites (each block, its attention module
and its MLP), the hooks that record one run's activations there, and the patched forward that
writes them back (`attnviz.explain.patching` builds the grid of cells on top; the module docstring
there says what each site is), and the pairing of the two prompts' positions (`pair`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import torch

from ..analysis.align import align_tokens
from ..capture.hook import editing
from ..errors import AttnvizError
from ..loading import Hook, LoadedModel
from ..loading.forward import grad_mode
from ..tokens import Tokens
from .blocks import MLP_NAMES, Unsupported
from .residual import _decoder_layers
from .stream import block_sites, needs_stream, out_projection

Over = Literal["heads", "heads_by_position", "residual", "blocks"]
OVERS: tuple[str, ...] = get_args(Over)
Direction = Literal["denoise", "noise"]
DIRECTIONS: tuple[str, ...] = get_args(Direction)
Site = str  # "head", "residual", or a "blocks" part: "attention", "mlp", a mixer kind
PARTS: tuple[Site, ...] = ("attention", "mlp")  # the "blocks" sites, in this order
Progress = Callable[[int, int], None]  # (cells done, cells in all); raising cancels


@dataclass(frozen=True)
class Pairing:
    """Which positions of the patched (target) run take the activation of which source position."""

    target: tuple[int, ...]
    source: tuple[int, ...]
    unpatched: tuple[int, ...]  # target positions with no partner in the source run
    differing: tuple[int, ...]  # target positions whose token differs from its partner's
    # positions 0 .. shared-1 hold the same tokens in both prompts and pair with themselves: a causal
    # model computes the very same activations there in both runs, so copying them changes nothing
    shared: int = 0

    def pairs(self) -> list[tuple[int, int]]:
        return list(zip(self.target, self.source, strict=True))

    def source_of(self, position: int) -> int:
        return self.source[self.target.index(position)]


def pair(target: Tokens, source: Tokens) -> Pairing:
    """Target position -> source position: the identity for prompts of one length; otherwise the
    token alignment's matching blocks plus each gap of equal length on both sides, position by
    position (those are the replaced tokens). Refuses when nothing pairs."""
    t_ids, s_ids = list(target.ids), list(source.ids)
    if len(t_ids) == len(s_ids):
        pt, ps = list(range(len(t_ids))), list(range(len(s_ids)))
    else:
        # one alignment for both directions (difflib breaks ties by the order of its arguments)
        swap = (len(t_ids), t_ids) > (len(s_ids), s_ids)
        al = align_tokens(source, target, by="ids") if swap else align_tokens(target, source, by="ids")
        matched = [(b, a) for a, b in al.pairs()] if swap else al.pairs()
        pt, ps = [], []
        prev_t, prev_s = -1, -1
        for a, b in [*matched, (len(t_ids), len(s_ids))]:
            if a - prev_t == b - prev_s:  # a replaced run of equal length: pair it position by position
                pt.extend(range(prev_t + 1, a))
                ps.extend(range(prev_s + 1, b))
            if a < len(t_ids):
                pt.append(a)
                ps.append(b)
            prev_t, prev_s = a, b
    if not pt:
        raise AttnvizError("the two prompts share no aligned positions; nothing can be patched")
    unpatched = tuple(sorted(set(range(len(t_ids))) - set(pt)))
    differing = tuple(a for a, b in zip(pt, ps, strict=True) if t_ids[a] != s_ids[b])
    shared = 0
    while shared < len(pt) and pt[shared] == ps[shared] == shared and t_ids[shared] == s_ids[shared]:
        shared += 1
    return Pairing(
        target=tuple(pt), source=tuple(ps), unpatched=unpatched, differing=differing, shared=shared
    )


def pairing_of(clean: Tokens, corrupted: Tokens, direction: str) -> Pairing:
    """The pairing of a run: "denoise" patches the corrupted run (target) from the clean one."""
    return pair(corrupted, clean) if direction == "denoise" else pair(clean, corrupted)


@dataclass(frozen=True)
class Patch:
    """One patched component: ``site`` of ``layer`` (``head`` for a head), at ``position`` of the
    patched run (None: every aligned position)."""

    site: Site
    layer: int
    head: int = -1
    position: int | None = None


# -- the model's sites ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Sites:
    """The modules patching hooks: each block, its attention module (and name) and its MLP; and
    the "blocks" parts in order with each part's module per block (None: that block has none).
    A hybrid's parts name its mixers ("attention", "gated_delta", "mamba2", ..., "mlp")."""

    blocks: list[Any]
    attn: list[Any]
    names: list[str]
    mlps: list[Any]
    parts: tuple[str, ...] = PARTS
    modules: dict[str, list[Any]] = field(default_factory=dict)
    cacheable: bool = True  # a shared prefix may run once into the model's KV cache
    # hybrids: per block, the out_proj of its per-head mixer and that mixer's head count (None:
    # its heads, if any, are softmax heads read inside attnviz's attention function)
    mixer_heads: list[Any] = field(default_factory=list)
    head_counts: tuple[int, ...] = ()  # heads per block (empty: lm.layout.n_heads everywhere)

    @property
    def n_heads(self) -> int:
        return max(self.head_counts, default=0)

    @property
    def n_layers(self) -> int:
        return len(self.blocks)

    def module(self, part: str, layer: int) -> Any:
        """The module of ``part`` in block ``layer`` (None where the block has no such part)."""
        if part in self.modules:
            return self.modules[part][layer]
        return (self.attn if part == "attention" else self.mlps)[layer]


def sites(lm: LoadedModel, over: str) -> Sites:
    """The patching sites of ``lm``, or `Unsupported` with the reason."""
    lay = lm.layout
    if needs_stream(lay):  # hybrids, Mamba, RWKV
        bs = block_sites(lm)
        attn = bs.modules.get("attention", [None] * bs.n_blocks)
        names = [lm.module_names.get(id(m), "") if m is not None else "" for m in attn]
        mlps = bs.modules.get("mlp", [None] * bs.n_blocks)
        mixer_heads: list[Any] = []
        counts: list[int] = []
        for b in range(bs.n_blocks):
            mixers = [k for k in bs.parts if k not in ("attention", "mlp")]
            found: list[tuple[Any, int]] = [
                f for f in (out_projection(bs.modules[k][b], k) for k in mixers) if f is not None
            ]
            branches = len(found) + (attn[b] is not None)
            per_channel = [
                k for k in bs.parts if k not in ("attention", "mlp") and bs.modules[k][b] is not None
            ]
            if over.startswith("heads") and (branches > 1 or (per_channel and not found)):
                why = (
                    "runs two head-bearing branches side by side"
                    if branches > 1
                    else (f"mixes per channel ({per_channel[0]}): it has no heads")
                )
                raise Unsupported(
                    f"{lm.spec!r}: block {b} {why}; patch it over='blocks' (each branch on its own) "
                    "or over='residual'"
                )
            mixer_heads.append(found[0] if found else None)
            counts.append(found[0][1] if found else lay.n_heads if attn[b] is not None else 0)
        if over.startswith("heads") and not lm.supports_capture and any(a is not None for a in attn):
            raise Unsupported(f"{lm.spec!r}'s softmax heads run outside attnviz's attention function")
        # the recurrent state is not one the patched rows can share as a KV cache
        return Sites(
            bs.blocks, attn, names, mlps, parts=bs.parts, modules=bs.modules, cacheable=False,
            mixer_heads=mixer_heads, head_counts=tuple(counts),
        )  # fmt: skip
    blocks, attn, names = _decoder_layers(lm)
    if over.startswith("heads") and not lm.supports_capture:
        raise Unsupported(
            f"{lm.spec!r} computes its attention outside attnviz's attention function, so its heads' "
            "outputs cannot be patched; use over='residual' or 'blocks'"
        )
    mlps = []
    for i, block in enumerate(blocks):
        mlp = next((c for n, c in block.named_children() if n in MLP_NAMES), None)
        if mlp is None and over == "blocks":
            raise Unsupported(f"block {i} of {lm.spec!r} has no MLP child named {'/'.join(MLP_NAMES)}")
        mlps.append(mlp)
    return Sites(blocks, attn, names, mlps)


def _first(x: Any) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else x[0]


def _with_first(x: Any, new: torch.Tensor) -> Any:
    return new if isinstance(x, torch.Tensor) else (new, *x[1:])


# -- one run's activations -----------------------------------------------------------------------


@dataclass
class Activations:
    """What one forward kept per site and layer (batch row 0): the stream entering each block
    (N, d_model), each part's output (N, d_model), each head's output (N, heads, d_head); only the
    sites asked for, and only the layers that have them."""

    kept: dict[str, dict[int, torch.Tensor]] = field(default_factory=dict)

    def of(self, site: Site) -> dict[int, torch.Tensor]:
        return self.kept.setdefault(site, {})

    def put(self, site: Site, layer: int, x: torch.Tensor) -> None:
        self.of(site)[layer] = x


def site_names(over: str, parts: tuple[str, ...] = PARTS) -> tuple[Site, ...]:
    if over in ("heads", "heads_by_position"):
        return ("head",)
    return ("residual",) if over == "residual" else parts


@contextlib.contextmanager
def hooked(
    lm: LoadedModel,
    st: Sites,
    change: Callable[[Site, int, torch.Tensor], torch.Tensor],
    wanted: Sequence[Site],
) -> Iterator[list[Hook]]:
    """Every site in ``wanted`` passes through ``change(site, layer, tensor)`` (batch-first
    tensors; what it returns replaces the activation): yields the block and module hooks for
    `LoadedModel.forward` (which registers them for its forward only); the heads' outputs are
    edited in the attention function while the block lasts (this thread only)."""
    hooks: list[Hook] = []
    layer_of = {name: i for i, name in enumerate(st.names)}

    def pre(i: int):
        def hook(_module, args, kwargs):
            if args:
                return (change("residual", i, args[0]), *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": change("residual", i, kwargs["hidden_states"])}

        return hook

    def post(site: Site, i: int):
        def hook(_module, _args, output):
            return _with_first(output, change(site, i, _first(output)))

        return hook

    def mixer_heads(i: int, n_heads: int):
        def hook(_module, args):  # out_proj's input, gates and norm applied: (B, N, heads · d_head)
            x = args[0]
            heads = change("head", i, x.unflatten(-1, (n_heads, -1)))  # (B, N, heads, d_head)
            return (heads.flatten(-2), *args[1:])

        return hook

    def edit(module: torch.nn.Module, out: torch.Tensor) -> torch.Tensor:
        i = layer_of.get(lm.module_names.get(id(module), ""))
        return out if i is None else change("head", i, out)

    for i in range(st.n_layers):
        if "residual" in wanted:
            hooks.append(Hook(st.blocks[i], pre(i), "before", with_kwargs=True))
        if "head" in wanted and st.mixer_heads and st.mixer_heads[i] is not None:
            proj, n_heads = st.mixer_heads[i]
            hooks.append(Hook(proj, mixer_heads(i, n_heads), "before"))
        for part in wanted:
            if part not in ("residual", "head") and st.module(part, i) is not None:
                hooks.append(Hook(st.module(part, i), post(part, i)))
    with editing(edit) if "head" in wanted else contextlib.nullcontext():
        yield hooks


def run_ids(
    lm: LoadedModel, ids: torch.Tensor, hooks: Sequence[Hook] = (), *, grad: bool = False
) -> torch.Tensor:
    """The model's logits at the last position of each row of ``ids`` (B, N): float32 (B, vocab)
    (``grad``: with their graph, for attribution patching's backward)."""
    out = lm.forward(ids, hooks=hooks, logits_at="last", grad=grad)
    with grad_mode(grad):
        return out.logits[:, -1].float()


def capture(
    lm: LoadedModel, st: Sites, ids: list[int], wanted: Sequence[Site]
) -> tuple[Activations, torch.Tensor]:
    """One forward of ``ids`` keeping the ``wanted`` sites: (activations, last logits (vocab,))."""
    acts = Activations()

    def keep(site: Site, layer: int, x: torch.Tensor) -> torch.Tensor:
        acts.put(site, layer, x[0].detach().clone())
        return x

    with hooked(lm, st, keep, wanted) as hooks:
        logits = run_ids(lm, torch.tensor([ids], device=lm.device), hooks)[0]
    return acts, logits


Capture = Callable[[Sites, list[int], Sequence[Site]], tuple[Activations, torch.Tensor]]


def patched_run(
    lm: LoadedModel,
    st: Sites,
    ids: list[int],
    source: Activations,
    pairing: Pairing,
    batch: Sequence[Sequence[Patch]],
    *,
    prefix: int = 0,
) -> torch.Tensor:
    """Row b runs ``ids`` with every patch of ``batch[b]`` applied at once (the source's activation
    at the paired positions): the last position's logits, float32 (len(batch), vocab).

    ``prefix`` > 0 (every patch at or after it): the first ``prefix`` positions, which no patch
    can change in a causal model, run once, unpatched, into a KV cache that every row continues
    from (the model's own cached forward, as in generation)."""
    plan: dict[tuple[Site, int], list[tuple[int, int, torch.Tensor, torch.Tensor]]] = {}
    for b, patches in enumerate(batch):
        for p in patches:
            if p.position is None:  # every paired position after the shared prefix (the same there)
                kept = [(t, u) for t, u in pairing.pairs() if t >= pairing.shared] or pairing.pairs()[-1:]
                tgt, src = [t for t, _ in kept], [u for _, u in kept]
            else:
                tgt, src = [p.position], [pairing.source_of(p.position)]
            if min(tgt) < prefix:
                raise AttnvizError(f"a patch at position {min(tgt)} lies inside the cached prefix ({prefix})")
            dev = source.of(p.site)[p.layer].device
            tgt = [t - prefix for t in tgt]  # positions of the rows that run
            plan.setdefault((p.site, p.layer), []).append(
                (b, p.head, torch.tensor(tgt, device=dev), torch.tensor(src, device=dev))
            )

    def change(site: Site, layer: int, x: torch.Tensor) -> torch.Tensor:
        todo = plan.get((site, layer))
        if not todo:
            return x
        x = x.clone()
        src = source.of(site)[layer].to(x.dtype)
        for b, head, tgt, spos in todo:
            if site == "head":
                x[b, tgt, head] = src[spos, head]  # (positions, d_head)
            else:
                x[b, tgt] = src[spos]  # (positions, d_model)
        return x

    ids_t = torch.tensor([ids], device=lm.device).expand(len(batch), -1)
    wanted = sorted({site for site, _ in plan})
    cache = None
    if prefix > 0:  # the prefix's keys and values only: its logits are not needed
        cache = lm.forward(ids_t[:1, :prefix], logits_at="none", use_cache=True).past_key_values
        cache.batch_repeat_interleave(len(batch))
    with hooked(lm, st, change, wanted) as hooks:  # type: ignore[arg-type]
        if cache is None:
            return run_ids(lm, ids_t, hooks)
        out = lm.forward(
            ids_t[:, prefix:], hooks=hooks, logits_at="last", use_cache=True, past_key_values=cache
        )
        return out.logits[:, -1].float()
