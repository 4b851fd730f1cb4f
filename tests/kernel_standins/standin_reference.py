"""What the stand-in kernel packages compute with: transformers' own torch fallbacks (the body
under the ``use_kernel_func_from_hub_with_fallback`` wrapper), run one packed sequence at a time
when the caller passes varlen ``cu_seqlens`` / ``seq_idx``. Test code only (tests/kernel_standins
is put on sys.path by a fixture; nothing here is importable from attnviz)."""

from __future__ import annotations

import importlib
import inspect
import itertools

import torch

CALLS: list[str] = []  # every stand-in call, by its real name (the tests read which kernels ran)


def torch_reference(model: str, name: str):
    """The undecorated torch body of ``name`` in transformers' ``modeling_<model>``."""
    module = importlib.import_module(f"transformers.models.{model}.modeling_{model}")
    return inspect.unwrap(getattr(module, name))


def segments(cu_seqlens: torch.Tensor | None, n: int) -> list[tuple[int, int]]:
    """The packed sequences' [start, end) along the time axis (one when not packed)."""
    if cu_seqlens is None:
        return [(0, n)]
    bounds = [int(b) for b in cu_seqlens.tolist()]
    if bounds[0] != 0 or bounds[-1] != n or any(b < a for a, b in itertools.pairwise(bounds)):
        raise ValueError(f"cu_seqlens {bounds} does not cover {n} tokens")
    return list(itertools.pairwise(bounds))


def cu_from_seq_idx(seq_idx: torch.Tensor | None) -> torch.Tensor | None:
    """mamba_ssm's per-token sequence index (1, T) as cu_seqlens."""
    if seq_idx is None:
        return None
    ids = seq_idx[0]
    starts = [0] + [i for i in range(1, ids.numel()) if ids[i] != ids[i - 1]]
    return torch.tensor([*starts, ids.numel()])


def varlen(run, tensors: tuple, time_axis: int, cu_seqlens, initial_state, output_final_state: bool):
    """``run(*pieces, initial_state)`` -> (out, state) over each packed sequence, joined (batch 1)."""
    n = tensors[0].shape[time_axis]
    spans = segments(cu_seqlens, n)
    if cu_seqlens is not None and tensors[0].shape[0] != 1:
        raise ValueError("varlen inputs are packed in a batch of 1")
    outs, states = [], []
    for i, (a, b) in enumerate(spans):
        pieces = tuple(t.narrow(time_axis, a, b - a) for t in tensors)
        init = (
            None
            if initial_state is None
            else initial_state[i : i + 1]
            if cu_seqlens is not None
            else initial_state
        )
        o, s = run(*pieces, init)
        outs.append(o)
        states.append(s)
    out = torch.cat(outs, dim=time_axis)
    if not output_final_state or states[0] is None:
        return out, None
    return out, torch.cat(states, dim=0)
