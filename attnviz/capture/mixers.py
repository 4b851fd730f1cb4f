"""Capture for non-softmax token mixers: one pass-through wrapper per module-level core function.

Each mixer of transformers 5.23.0 calls its core function by its global name
(``transformers.models.qwen3_next.modeling_qwen3_next.torch_chunk_gated_delta_rule``, ...), so
replacing that name with a wrapper sees the kernel's arguments and output whichever
implementation runs (hub kernel, ``fla`` / ``mamba_ssm``, or the torch body). The wrapper and the
mixer modules' hooks record only while this thread's `Recorder` is active (a ContextVar, as the
attention hook): outside a `recording` block, and in every other thread, they pass through.
What to wrap and hook for each kind comes from its record in `attnviz.mixers.kinds.MIXERS`.

A block whose token mixing runs in parallel branches (Falcon-H1, Zamba2's hybrid blocks) also
gets a hook on each branch: the size of what each branch writes per token is kept on the block's
mixer record during this same forward (`attnviz.mixers.branches`: their shares).
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..mixers import steps
from ..mixers.kinds import MIXERS, check_rows, mixer_kind
from ..records import CapturedMixer
from .hook import active_recorder

_BLOCK = re.compile(r"\.(\d+)(?:\.|$)")
_OUT_PROJ = ("out_proj", "o_proj", "output", "linear_out")  # RWKV: "output"; RG-LRU: "linear_out"
_HOOKED = "_attnviz_mixer_hooks"


@dataclass(frozen=True)
class MixerSite:
    """One non-softmax token mixer of a model: its block, kind and module name."""

    block: int
    kind: str
    module_name: str


def find_mixers(model: torch.nn.Module) -> tuple[MixerSite, ...]:
    """Every non-softmax token mixer of ``model``, in block order."""
    found = []
    for name, module in model.named_modules():
        kind = mixer_kind(module)
        m = _BLOCK.search(name)
        if kind is not None and m is not None:
            found.append(MixerSite(int(m.group(1)), kind, name))
    return tuple(sorted(found, key=lambda s: s.block))


def install(model: torch.nn.Module) -> tuple[MixerSite, ...]:
    """Wrap the core functions of ``model``'s mixers and hook its mixer modules (idempotent);
    returns the mixers found."""
    sites = find_mixers(model)
    modules = dict(model.named_modules())
    for site in sites:
        module, spec = modules[site.module_name], MIXERS[site.kind]
        modeling = sys.modules[type(module).__module__]
        _wrap_core_functions(modeling, spec.core_functions)
        _wrap_core_functions(modeling, spec.step_functions)  # the cached decode step's kernel
        if spec.core_method is not None:  # a method of a submodule's class (RG-LRU's _rnn_scan)
            attr, method = spec.core_method
            sub = getattr(module, attr, None)
            if sub is not None:
                _wrap_core_functions(type(sub), (method,))
        if getattr(module, _HOOKED, False):
            continue
        module.register_forward_pre_hook(_enter(site))
        module.register_forward_hook(_leave(site))
        parallel = _parallel_block(modules, site)
        if parallel is not None:  # what each branch writes, for their shares
            owner, block = parallel
            module.register_forward_hook(_branch(site, site.kind, owner, block, block.mixer_multiplier))
            attention = getattr(owner, block.attention)
            attention.register_forward_hook(
                _branch(site, "attention", owner, block, block.attention_multiplier)
            )
        out = next(
            (getattr(module, n) for n in _OUT_PROJ if isinstance(getattr(module, n, None), torch.nn.Linear)),
            None,
        )
        if out is not None:  # the token-contribution view through the output projection
            out.register_forward_hook(_projection(site))
        for attr, where, key in spec.taps:
            sub = getattr(module, attr, None)
            if isinstance(sub, torch.nn.Module):
                sub.register_forward_hook(_tap(site, where, key))
        setattr(module, _HOOKED, True)
    return sites


def _wrap_core_functions(modeling: Any, names: tuple[str, ...]) -> None:
    for fname in names:
        fn = getattr(modeling, fname, None)
        if fn is not None and not getattr(fn, "_attnviz_core", False):
            setattr(modeling, fname, _recording_core(fn, fname))


def kernel_behind(fn: Callable) -> str:
    """The package function (``fla``, ``mamba_ssm``, ``causal_conv1d``) that transformers'
    ``use_kernel_func_from_hub_with_fallback`` bound behind ``fn`` when its module was imported,
    as "module.name"; "" when ``fn`` runs its own torch body (or is not such a wrapper)."""
    seen: Any = fn
    while seen is not None:  # the wrapper may itself be wrapped (functools.wraps chains)
        code, closure = getattr(seen, "__code__", None), getattr(seen, "__closure__", None)
        if code is not None and closure:
            cells = dict(zip(code.co_freevars, closure, strict=True))
            if "implementation" in cells and "torch_function" in cells:
                impl, body = cells["implementation"].cell_contents, cells["torch_function"].cell_contents
                return "" if impl is body else f"{impl.__module__}.{impl.__qualname__}"
        seen = getattr(seen, "__wrapped__", None)
    return ""


def _recording_core(fn: Callable, fname: str) -> Callable:
    signature = inspect.signature(fn)
    implementation = kernel_behind(fn)  # bound once, at the modeling module's import

    @functools.wraps(fn)
    def core(*args, **kwargs):
        out = fn(*args, **kwargs)
        rec = active_recorder()
        if rec is not None and rec.mixer_stack:
            kind, name, block = rec.mixer_stack[-1]
            bound = signature.bind_partial(*args, **kwargs).arguments
            extra = bound.pop("kwargs", {}) or {}
            bound.pop("self", None)
            given = {**bound, **extra}
            # a state from earlier tokens (a decode step's cache, updated in place): not kept,
            # the step's record joins the forward it continues (attnviz.mixers.steps)
            started = [given.pop(k, None) for k in steps.STATE_ARGUMENTS]
            inputs = {k: _detach(v) for k, v in given.items()}
            output = (out[0] if isinstance(out, tuple) else out).detach()
            inputs[steps.CONTINUES] = any(s is not None for s in started)
            step = MIXERS[kind].step_inputs
            if step is not None and fname in MIXERS[kind].step_functions:  # to the prefill layout
                try:
                    inputs, output = step(inputs, output)
                except ValueError as err:  # a layout the prefill form has no place for
                    inputs = {"refused": str(err)}
                inputs[steps.CONTINUES] = True
            last = _record_of(rec, name)
            if last is None or last.function:  # a second call in one module call (Zamba's per-head
                last = CapturedMixer(kind, name, block, "", {}, _EMPTY)  # scans): the store refuses it
                rec.mixers.append(last)
            last.function, last.implementation = fname, implementation
            last.inputs.update(inputs)
            _keep_output(last, output)
        return out

    core._attnviz_core = True  # type: ignore[attr-defined]
    return core


_EMPTY = torch.empty(0)


def _keep_output(record: CapturedMixer, output: torch.Tensor) -> None:
    """Keep the core output only at the self-check's rows (never the whole (N, ...) tensor)."""
    spec = MIXERS[record.kind]
    axis = 2 if spec.channels_first else 1
    n = int(output.shape[axis])
    rows = check_rows(n)
    record.output = output.index_select(axis, torch.tensor(rows, device=output.device))
    record.n_tokens, record.output_rows = n, tuple(rows)
    if spec.per_head:  # until out_proj runs: its input over this gives the scales
        record.full_output = output


def _record_of(rec, module_name: str) -> CapturedMixer | None:
    """The latest record of ``module_name`` in this forward."""
    return next((r for r in reversed(rec.mixers) if r.module_name == module_name), None)


def _detach(v: Any) -> Any:
    return v.detach() if isinstance(v, torch.Tensor) else v


def _enter(site: MixerSite):
    def hook(module, _args):
        rec = active_recorder()
        if rec is not None:
            rec.mixer_stack.append((site.kind, site.module_name, site.block))
            # the record this call fills: the core function's arguments, the taps, the projection
            no_core = not MIXERS[site.kind].core_functions  # named by its module; its taps fill it
            inputs = {k: _detach(v) for k, v in module.named_buffers(recurse=False)} if no_core else {}
            name = type(module).__name__ if no_core else ""
            rec.mixers.append(CapturedMixer(site.kind, site.module_name, site.block, name, inputs, _EMPTY))

    return hook


def _leave(site: MixerSite):
    def hook(_module, _args, _output):
        rec = active_recorder()
        if rec is not None and rec.mixer_stack and rec.mixer_stack[-1][1] == site.module_name:
            rec.mixer_stack.pop()

    return hook


def _tap(site: MixerSite, where: str, key: str):
    def hook(_module, args, output):
        rec = active_recorder()
        if rec is None or not rec.mixer_stack or rec.mixer_stack[-1][1] != site.module_name:
            return
        last = _record_of(rec, site.module_name)
        if last is None:
            return
        value = (args[0] if where == "input" else output).detach()
        if key == "output":
            _keep_output(last, value)
        else:
            last.inputs.setdefault(key, value)

    return hook


def _projection(site: MixerSite):
    def hook(module, args, output):
        rec = active_recorder()
        last = None if rec is None else _record_of(rec, site.module_name)
        if last is not None and last.out_out is None and isinstance(output, torch.Tensor):
            last.out_out = output.detach()[:, check_rows(output.shape[1])]
            last.out_weight = module.weight.detach()
            last.out_bias = None if module.bias is None else module.bias.detach()
            full, last.full_output = last.full_output, None
            if full is not None:  # per head: everything between the core and out_proj is per
                # channel once its per-token norm scales and gates are fixed (read from the code
                # of every per-head mixer): frozen, it is out_proj's input over the core output
                inner = args[0].detach().float()
                if full.numel() == inner.numel():
                    core = full.detach().float().reshape(inner.shape)
                    last.scale = torch.where(core != 0, inner / core.where(core != 0, 1.0), 0.0)

    return hook


@dataclass(frozen=True)
class ParallelBlock:
    """A block module whose token mixing runs in two branches added into the stream."""

    marks: tuple[str, ...]  # attributes that identify the block module
    attention: str  # the attention branch's submodule (its output is that branch's write)
    attention_multiplier: str  # the block's attribute scaling that write ("": 1)
    mixer_multiplier: str  # the same for the non-softmax mixer's output
    how: str  # what is measured, for the shares' caption


PARALLEL_BLOCKS = (
    ParallelBlock(  # Falcon-H1: attention and Mamba-2 side by side on the same normed input
        ("self_attn", "ssm_out_multiplier"),
        "self_attn",
        "attn_out_multiplier",
        "ssm_out_multiplier",
        "each branch's output times its multiplier, as the block adds them",
    ),
    ParallelBlock(  # Zamba2's hybrid block: the shared attention block's write, then Mamba-2
        ("shared_transformer", "linear"),
        "linear",
        "",
        "",
        "the shared attention block's write (through its linear) and the Mamba-2 mixer's output",
    ),
)


def _parallel_block(modules: dict[str, torch.nn.Module], site: MixerSite):
    """(the block module, its `ParallelBlock`) when the site's block runs parallel branches."""
    parts = site.module_name.split(".")
    owner = next(
        (modules[".".join(parts[: i + 1])] for i in range(len(parts) - 1, 0, -1) if parts[i - 1] == "layers"),
        None,
    )
    if owner is None:
        return None
    found = next((p for p in PARALLEL_BLOCKS if all(hasattr(owner, m) for m in p.marks)), None)
    return None if found is None else (owner, found)


def _branch(site: MixerSite, kind: str, owner: torch.nn.Module, block: ParallelBlock, multiplier: str):
    """Keep ‖o_t‖ of one branch's output (times the block's multiplier, read at that forward)."""

    def hook(_module, _args, output):
        rec = active_recorder()
        if rec is None:
            return
        out = output[0] if isinstance(output, tuple) else output
        mult = float(getattr(owner, multiplier, 1.0)) if multiplier else 1.0
        pending = rec.branch_norms.setdefault(site.block, {})
        pending[kind] = (out.detach().double()[0] * mult).norm(dim=-1).cpu()
        last = _record_of(rec, site.module_name)
        if len(pending) == 2 and last is not None:  # both branches ran: the block's record keeps them
            last.branches, last.branch_how = rec.branch_norms.pop(site.block), block.how
        # (Zamba2's attention writes before its Mamba-2 record exists: the mixer's hook settles it)

    return hook
