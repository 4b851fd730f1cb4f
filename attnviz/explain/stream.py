"""The residual stream of any decoder, block by block, whatever mixes its tokens.

`read_stream(lm, ids)` runs the model once with plain forward hooks on every decoder block, on
each block's token-mixing branches (softmax attention, Mamba / Mamba-2, gated delta, short conv,
RWKV, ...) and its MLP / MoE, and on the final norm. It keeps, for every token:

- ``stream[b]``: what block b reads (``stream[n_blocks]``: what the final norm reads);
- ``added[b][part]``: what each branch of block b (``"attention"``, a mixer kind, ``"mlp"``) adds
  to the stream, each branch on its own where a block runs two side by side (Falcon-H1's attention
  ‖ Mamba-2). A μP-style scalar between a branch and the stream (Falcon-H1's
  ``ssm_out_multiplier``, ``attention_out_multiplier``) is read from the tensors: the one scalar
  per branch with ``stream[b+1] = stream[b] + Σ_part scale · output`` exactly, checked on every
  row; a block that is not such a sum keeps its boundaries and says why in ``problem[b]``. A branch
  that adds the residual inside its own module (Bloom's attention and MLP, MPT's MLP: a
  ``residual`` argument) adds its output minus that residual.

Nothing here needs the mixers' internals: the logit lens and patching over ``residual`` / ``blocks``
run on this stream for hybrids and pure state-space models alike.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import AttnvizError
from ..layout import AttentionLayout
from ..loading import Hook, LoadedModel
from ..tokens import Tokens
from .blocks import MLP_NAMES, Unsupported
from .norms import close

_BLOCK = re.compile(r"^(.*\.(\d+))\.([^.]+)")


def needs_stream(layout: AttentionLayout) -> bool:
    """Whether the explanations read this model by block boundaries (`stream`), not by heads
    (`attnviz.explain.trace`): hybrids and recurrent models."""
    return layout.has_mixers or bool(layout.attention_layers) or not layout.n_layers


@dataclass(frozen=True)
class BlockSites:
    """Each decoder block and, per part (``"attention"``, a mixer kind, ``"mlp"``), the block's
    child module that computes it (None where that block has no such part)."""

    blocks: list[Any]
    parts: tuple[str, ...]
    modules: dict[str, list[Any]]

    @property
    def n_blocks(self) -> int:
        return len(self.blocks)


def block_sites(lm: LoadedModel) -> BlockSites:
    """The decoder blocks of ``lm`` and their branches, from the modules attnviz captures (softmax
    attention sites and mixer sites), or `Unsupported` with the reason."""
    named: list[tuple[str, str]] = [(s.module_name, s.kind) for s in lm.mixer_sites]
    if lm.probe is not None:
        named += [(s.module_name, "attention") for s in lm.probe.sites.get("self", ())]
    blocks: dict[int, tuple[str, dict[str, str]]] = {}
    for name, kind in named:
        m = _BLOCK.match(name)
        if m is None:
            continue
        prefix, b, child = m.group(1), int(m.group(2)), m.group(3)
        blocks.setdefault(b, (prefix, {}))[1].setdefault(kind, f"{prefix}.{child}")
    n = lm.layout.n_blocks or lm.layout.n_layers
    if sorted(blocks) != list(range(n)):
        raise Unsupported(
            f"{lm.spec!r}: cannot find the module of each of its {n} blocks (found {sorted(blocks)}); "
            "its residual stream cannot be read block by block"
        )
    mods = dict(lm.model.named_modules())
    order = ["attention", *dict.fromkeys(k for _, k in named if k != "attention")]
    parts = [k for k in order if any(k in blocks[b][1] for b in range(n))]
    modules: dict[str, list[Any]] = {
        k: [mods[blocks[b][1][k]] if k in blocks[b][1] else None for b in range(n)] for k in parts
    }
    block_mods = [mods[blocks[b][0]] for b in range(n)]
    mlps = [next((c for name, c in blk.named_children() if name in MLP_NAMES), None) for blk in block_mods]
    if any(m is not None for m in mlps):
        parts.append("mlp")
        modules["mlp"] = mlps
    return BlockSites(block_mods, tuple(parts), modules)


@dataclass(frozen=True)
class Stream:
    """The residual stream at block boundaries of one forward (one sequence; rows are positions),
    and what each part of each block adds. Tensors in the model's dtype on its device."""

    model_name: str
    tokens: Tokens
    parts: tuple[str, ...]
    stream: tuple[torch.Tensor, ...]  # (N, d_model): entering each block, + what the final norm reads
    added: tuple[dict[str, torch.Tensor], ...]  # per block: part -> (N, d_model) it adds
    scales: tuple[dict[str, float], ...]  # per block: part -> the scalar between its output and the stream
    problem: tuple[str, ...]  # per block: "" when stream[b+1] = stream[b] + Σ added (checked), else why not
    logits: torch.Tensor  # (vocab,) float32: the model's own logits at the last position
    unembed_problem: str = ""
    # per block: a per-head mixer part -> (out_proj module, heads, its input (N, heads · d_head)):
    # gates and norms already applied at their forward values, so head h's write is its columns
    head_inputs: tuple[dict[str, tuple[Any, int, torch.Tensor]], ...] = ()

    @property
    def n_layers(self) -> int:
        """Block boundaries are read after each of these blocks (the lens' rows - 1)."""
        return len(self.stream) - 1

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        """Bytes the stream holds (for caches)."""
        tensors = [*self.stream, *(t for parts in self.added for t in parts.values())]
        return sum(t.numel() * t.element_size() for t in tensors)

    def position(self, token: int) -> int:
        n = self.n_tokens
        if not -n <= int(token) < n:
            raise AttnvizError(f"token {token} is out of range: this text has tokens 0..{n - 1}")
        return int(token) % n


def _first(x: Any) -> torch.Tensor | None:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, tuple | list) and x and isinstance(x[0], torch.Tensor):
        return x[0]
    return None


def _block_input(args: tuple, kwargs: dict) -> torch.Tensor | None:
    return _first(args[0]) if args else _first(kwargs.get("hidden_states"))


def split_block(
    pre: torch.Tensor, post: torch.Tensor, outputs: dict[str, torch.Tensor], dtype: torch.dtype
) -> tuple[dict[str, torch.Tensor], dict[str, float], str]:
    """(what each part adds, its scalar, "") with ``post = pre + Σ scale · output`` exactly, or
    ({}, {}, why not). One scalar per part, solved in float64 on every row and checked."""
    if not outputs:
        return {}, {}, "no branch output was seen"
    names = list(outputs)
    plain = pre + sum(outputs.values())  # the usual block: every scale 1, the model's own sum
    if close(plain, post, dtype):
        return {k: v for k, v in outputs.items()}, dict.fromkeys(names, 1.0), ""
    target = (post.double() - pre.double()).reshape(-1)
    cols = torch.stack([outputs[k].double().reshape(-1) for k in names], dim=1)  # (N·d, parts)
    scale = torch.linalg.lstsq(cols, target[:, None]).solution[:, 0]
    added = {k: (outputs[k].double() * scale[i]).to(post.dtype) for i, k in enumerate(names)}
    total = pre.double() + sum(a.double() for a in added.values())
    if not close(total.to(post.dtype), post, dtype):
        return (
            {},
            {},
            (
                f"its output is not its input + a scalar times each of {', '.join(names)} (a norm on "
                "the stream inside the block, as RWKV's pre_ln in block 0; a norm after a branch; a "
                "branch fed by more than the stream, as Zamba2's shared block; or another term)"
            ),
        )
    return added, {k: float(scale[i]) for i, k in enumerate(names)}, ""


HEAD_COUNTS = ("num_v_heads", "num_heads", "n_heads", "num_attention_heads")


def out_projection(module: Any, kind: str) -> tuple[Any, int] | None:
    """(out_proj, heads) of a per-head mixer module (SSD, gated delta, Kimi delta, lightning) whose
    output projection reads heads × d_head channels, head-major; None otherwise."""
    from ..mixers.kinds import PER_HEAD

    if module is None or kind not in PER_HEAD:
        return None
    proj = next((c for n, c in module.named_children() if n in ("out_proj", "o_proj")), None)
    heads = next(
        (int(getattr(module, a)) for a in HEAD_COUNTS if isinstance(getattr(module, a, None), int)), 0
    )
    if not isinstance(proj, torch.nn.Linear) or heads <= 0 or proj.in_features % heads:
        return None
    return proj, heads


def _residual_argument(module: Any) -> int | None:
    """The position of a ``residual`` parameter in ``module``'s forward (Bloom, MPT), or None."""
    try:
        names = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return None
    return names.index("residual") if "residual" in names else None


def _residual(args: tuple, kwargs: dict, at: int | None) -> torch.Tensor | None:
    if at is None:
        return None
    return (
        _first(kwargs.get("residual"))
        if "residual" in kwargs
        else _first(args[at])
        if at < len(args)
        else None
    )


def adds_residual_inside(lm: LoadedModel) -> bool:
    """Whether a branch of a block takes the stream as a ``residual`` argument and adds it inside
    its module (Bloom's attention and MLP, MPT's MLP): such blocks are read at block boundaries."""
    try:
        st = block_sites(lm)
    except Unsupported:
        return False
    return any(
        _residual_argument(m) is not None for mods in st.modules.values() for m in mods if m is not None
    )


def read_stream(lm: LoadedModel, ids: list[int], extra: Sequence[Hook] = ()) -> Stream:
    """One forward of ``ids`` keeping the residual stream at every block boundary and what each
    block's parts add (see the module docstring), through `LoadedModel.forward` (this thread's hooks;
    ``extra``: more hooks for the same forward, e.g. the QK split's)."""
    from .residual import final_norm, unembed

    if lm.layout.kind != "decoder":
        raise Unsupported(f"{lm.spec!r} is an {lm.layout.kind} model; the stream is read for decoders")
    st = block_sites(lm)
    _, norm = final_norm(lm)
    pre: list[torch.Tensor | None] = [None] * st.n_blocks
    post: list[torch.Tensor | None] = [None] * st.n_blocks
    outs: list[dict[str, torch.Tensor]] = [{} for _ in range(st.n_blocks)]
    final: list[torch.Tensor] = []

    def enter(b: int):
        def hook(_m, args, kwargs):
            x = _block_input(args, kwargs)
            pre[b] = None if x is None else x[0].detach().clone()

        return hook

    def leave(b: int):
        def hook(_m, _a, output):
            y = _first(output)
            post[b] = None if y is None else y[0].detach().clone()

        return hook

    def part(b: int, name: str, residual_at: int | None):
        def hook(_m, args, kwargs, output):
            y, r = _first(output), _residual(args, kwargs, residual_at)
            if y is not None:
                outs[b][name] = (y[0] if r is None else y[0] - r[0]).detach().clone()

        return hook

    heads_in: list[dict[str, tuple[Any, int, torch.Tensor]]] = [{} for _ in range(st.n_blocks)]

    def head_input(b: int, name: str, proj: Any, n_heads: int):
        def hook(_m, args):
            heads_in[b][name] = (proj, n_heads, args[0][0].detach().clone())

        return hook

    hooks: list[Hook] = []
    for b, blk in enumerate(st.blocks):
        for name in st.parts:
            found = out_projection(st.modules[name][b], name)
            if found is not None:
                hooks.append(Hook(found[0], head_input(b, name, *found), "before"))
        hooks += [Hook(blk, enter(b), "before", with_kwargs=True), Hook(blk, leave(b))]
        for name in st.parts:
            mod = st.modules[name][b]
            if mod is not None:
                hooks.append(Hook(mod, part(b, name, _residual_argument(mod)), with_kwargs=True))
    hooks.append(Hook(norm, lambda _m, args: final.append(args[0][0].detach().clone()), "before"))
    hooks += list(extra)
    out = lm.forward(ids, hooks=hooks, logits_at="last")
    if any(p is None for p in pre) or not final:
        raise Unsupported(f"{lm.spec!r}: the forward did not pass each block and the final norm once")
    dtype = next(lm.model.parameters()).dtype
    added, scales, problems = [], [], []
    for b in range(st.n_blocks):
        before, after = pre[b], post[b]
        nxt = pre[b + 1] if b + 1 < st.n_blocks else after
        a: dict[str, torch.Tensor] = {}
        s: dict[str, float] = {}
        if before is None or after is None:
            why = "its input or output is not one (1, tokens, d_model) tensor"
        else:
            a, s, why = split_block(before, after, outs[b], dtype)
            if not why and nxt is not None and not close(nxt, after, dtype):
                why = "something between it and the next block changes the stream"
        added.append(a)
        scales.append(s)
        problems.append(f"block {b}: {why}" if why else "")
    logits = out.logits[0, -1].float()
    stream = (*[p for p in pre if p is not None], final[0])
    with torch.inference_mode():
        mine = unembed(lm, stream[-1][-1:])[0]
    problem = (
        ""
        if close(mine, logits, dtype)
        else (
            f"{lm.spec!r}'s logits are not its LM head of its final norm (with the config's logit "
            "multiplier); the logit lens would not match its prediction"
        )
    )
    return Stream(
        model_name=lm.spec,
        tokens=Tokens.build(lm.tokenizer, ids),
        parts=st.parts,
        stream=stream,
        added=tuple(added),
        scales=tuple(scales),
        problem=tuple(problems),
        logits=logits,
        unembed_problem=problem,
        head_inputs=tuple(heads_in),
    )


def stream(lm: LoadedModel, text: str | list[int], *, chat: bool = False, max_tokens: int = 8192) -> Stream:
    """`read_stream` of a text (or token ids): the front door the logit lens and pages use on
    hybrids and recurrent models."""
    from ..inputs import admit_ids, tokenize

    ids = tokenize(lm, text, chat=chat)[0] if isinstance(text, str) else [int(i) for i in text]
    if not ids:
        raise AttnvizError("an empty text; type a few words")
    admit_ids(lm, ids, max_tokens=max_tokens, memory=False).check()  # the cap and the position table
    return read_stream(lm, ids)
