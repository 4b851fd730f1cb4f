"""Limits are messages: size an allocation before making it, and a token budget from free memory.

`require(need, device, what=..., hint=...)` raises `OutOfMemory` with "needs X GiB, Y GiB free
on cpu — try …" instead of letting torch fail on a raw allocation. `token_budget(layout, device,
dtype)` is the most tokens the fast path (captured Q/K/V of every layer, the forward's own
activations and one layer's statistics pass) fits into the device's free memory; callers take
``min(settings().max_tokens, token_budget(...))`` so the demo cap still applies.
"""

from __future__ import annotations

import logging

import psutil
import torch

from . import backend
from .errors import OutOfMemory
from .layout import AttentionLayout

log = logging.getLogger(__name__)

# Share of the free memory one allocation may claim: the rest is for the allocator's own slack,
# other requests and the UI.
USABLE = 0.8
GIB = 2**30


def free_bytes(device: torch.device | str) -> int:
    """Free memory on ``device``, otherwise the host's available RAM. On CUDA: the driver's free
    bytes plus what PyTorch's caching allocator holds reserved but unused (``mem_get_info``
    counts those blocks as used, yet our next tensors reuse them first)."""
    dev = torch.device(device)
    if backend.on_cuda(dev):
        cuda = backend.backend()
        free, _ = cuda.mem_get_info(dev)
        cached = cuda.memory_reserved(dev) - cuda.memory_allocated(dev)
        return int(free) + max(0, int(cached))
    return int(psutil.virtual_memory().available)


def gib(n: float) -> str:
    return f"{n / GIB:.2f}" if n < 10 * GIB else f"{n / GIB:.0f}"


def require(
    need: int,
    device: torch.device | str,
    *,
    what: str,
    hint: str,
    free: int | None = None,
) -> None:
    """Raise `OutOfMemory` ("<what> needs X GiB, Y GiB free on <device> — try <hint>") when ``need``
    bytes exceed the usable share of the free memory; otherwise return."""
    free = free_bytes(device) if free is None else int(free)
    if need > USABLE * free:
        raise OutOfMemory(f"{what} needs {gib(need)} GiB, {gib(free)} GiB free on {device} — try {hint}")
    log.debug("%s: %d bytes of %d free", what, need, free)


def bytes_per_element(dtype: torch.dtype) -> int:
    """Bytes of one element of ``dtype`` (2 for bf16 / fp16, 4 for fp32 and integer masks)."""
    return torch.finfo(dtype).bits // 8 if dtype.is_floating_point else 4


def capture_bytes(layout: AttentionLayout, n: int, dtype: torch.dtype) -> int:
    """What the fast path keeps for ``n`` tokens: each layer's query, key and value (bytes)."""
    elem = bytes_per_element(dtype)
    layers = layout.n_layers + 2 * layout.n_decoder_layers  # encoder-decoder: decoder self + cross
    per_layer = (layout.n_heads + 2 * layout.n_kv_heads) * layout.head_dim * n * elem
    return layers * per_layer


def forward_bytes(layout: AttentionLayout, n: int, dtype: torch.dtype) -> int:
    """A rough bound on one forward pass's live activations (hidden states, MLP, one attention)."""
    return 16 * layout.d_model * n * bytes_per_element(dtype)


# What backward keeps per token of a block, as a multiple of its projections' widths (Σ in + out of
# every weight matrix) in the model's dtype: measured with saved_tensors_hooks (every saved tensor,
# parameters excluded) at 2.2x (Bamba's Mamba-2), 2.7x (Qwen3.5-0.8B's shape: 3 Gated DeltaNet : 1
# gated attention) and 3.1x (a tiny Qwen3.5), so 3.5x is an upper bound within about 1.5x.
BACKWARD_PER_WIDTH = 3.5
MIXER_CHUNK = 64  # chunked scans (Gated DeltaNet's torch reference, SSD) pad the text to whole chunks


def block_width(block: torch.nn.Module, experts_per_token: int = 1) -> int:
    """Σ (in + out) over ``block``'s weight matrices: a stacked-experts tensor (E, out, in) counts
    ``experts_per_token`` experts (each token runs through that many); convolutions' kernels are not
    projections and do not count."""
    width = 0
    for module in block.modules():
        if isinstance(module, torch.nn.modules.conv._ConvNd):
            continue
        for p in module.parameters(recurse=False):
            if p.dim() == 2:
                width += int(p.shape[0] + p.shape[1])
            elif p.dim() == 3:
                width += int(p.shape[1] + p.shape[2]) * max(1, experts_per_token)
    return width


def backward_bytes(
    blocks: list[torch.nn.Module],
    layout: AttentionLayout,
    n: int,
    dtype: torch.dtype,
    *,
    experts_per_token: int = 1,
) -> int:
    """An upper bound on what a forward of ``n`` tokens keeps for its backward: every block's
    activations (`BACKWARD_PER_WIDTH` × its projections' widths per token, the text padded to
    `MIXER_CHUNK` for chunked mixers), each softmax attention layer's probabilities ((heads, n, n)
    float32 and in the model's dtype, as eager attention keeps them) and the embedding and head
    (`forward_bytes`). Every block counts, attention or not: a hybrid's recurrent blocks keep as
    much as its attention blocks."""
    padded = -(-n // MIXER_CHUNK) * MIXER_CHUNK
    widths = sum(block_width(b, experts_per_token) for b in blocks)
    per_block = int(BACKWARD_PER_WIDTH * widths * padded * bytes_per_element(dtype))
    scores = layout.n_layers * layout.n_heads * n * n * (4 + bytes_per_element(dtype))
    return per_block + scores + forward_bytes(layout, n, dtype)


def stats_pass_bytes(layout: AttentionLayout, n: int) -> int:
    """One layer's statistics pass: float32 query, key, value with one extra feature, its output
    and the gathers (about 6 (heads, n, head_dim + 8) float32 buffers)."""
    return 6 * layout.n_heads * n * (layout.head_dim + 8) * 4


def dense_layer_bytes(layout: AttentionLayout, n_q: int, n_k: int | None = None) -> int:
    """One layer's full (heads, query_pos, key_pos) float32 probabilities."""
    return layout.n_heads * n_q * (n_q if n_k is None else n_k) * 4


def token_budget(
    layout: AttentionLayout,
    device: torch.device | str,
    dtype: torch.dtype,
    *,
    free: int | None = None,
) -> int:
    """The most tokens whose fast-path extraction and statistics fit the free memory of ``device``.

    Everything the fast path holds grows linearly in N (no N×N tensor), so the budget is
    ``usable free bytes / bytes per token``. The model's weights are already loaded, so they are
    not in the free memory any more.
    """
    free = free_bytes(device) if free is None else int(free)
    per_token = (
        capture_bytes(layout, 1, dtype) + forward_bytes(layout, 1, dtype) + stats_pass_bytes(layout, 1)
    )
    return max(1, int(USABLE * free) // max(1, per_token))


def check_tokens(
    n: int,
    layout: AttentionLayout,
    device: torch.device | str,
    dtype: torch.dtype,
    *,
    free: int | None = None,
) -> None:
    """Raise `OutOfMemory` when ``n`` tokens cannot be extracted on ``device`` (a message, not a crash)."""
    free = free_bytes(device) if free is None else int(free)
    budget = token_budget(layout, device, dtype, free=free)
    if n > budget:
        need = n * (
            capture_bytes(layout, 1, dtype) + forward_bytes(layout, 1, dtype) + stats_pass_bytes(layout, 1)
        )
        raise OutOfMemory(
            f"{n} tokens need {gib(need)} GiB, {gib(free)} GiB free on {device} — try at most {budget} tokens"
        )


# A download the app builds in memory and sends through the browser: past this size the command
# line or Python is the right tool, not a button.
DOWNLOAD_LIMIT = 128 * 2**20
_CELL_BYTES = {"npz": 4, "csv": 11}  # float32; CSV writes "%.6g," per cell


def download_refusal(rows: int, cols: int, fmt: str) -> str | None:
    """None when a ``rows × cols`` matrix as ``fmt`` ("npz" or "csv") fits `DOWNLOAD_LIMIT`;
    otherwise the sentence to show instead of a download that would exhaust the server."""
    size = int(rows) * int(cols) * _CELL_BYTES[fmt]
    if size <= DOWNLOAD_LIMIT:
        return None
    return (
        f"the {fmt.upper()} of {rows:,} × {cols:,} weights would be about {size / 2**20:,.0f} MiB "
        f"(downloads here go up to {DOWNLOAD_LIMIT // 2**20} MiB): save it from Python, "
        "`numpy.save(path, attnviz.extract(model, text).head(layer, head))`"
    )
