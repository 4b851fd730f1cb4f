"""The one seam to the device: every call whose behaviour differs on CUDA goes through here.

The fused kernels it reaches compute E_p[v] and L of the readable reference
`attnviz.reference.attention.attention_probabilities` (`attnviz.exact.fused` states the identity;
tests/engine/test_reference_attention.py checks it through the CPU kernel).

The engine never calls ``torch.cuda`` or an aten attention op directly; it asks `backend()`:
the fused attention ops with their log-sum-exp (`Device.efficient_attention` on CUDA,
`Device.cpu_flash_attention` on the CPU), the caching allocator's memory queries, synchronisation,
and fp32 matmuls (TF32 or IEEE). `TorchDevice` is PyTorch itself; the test suite installs an
emulation of the same contract with `use` (tests/engine/cuda_emulation.py), so every CUDA branch of the
engine runs on a CPU in CI.

The contract, as PyTorch's sources state it (pytorch/pytorch):
- ``aten::_scaled_dot_product_efficient_attention(Tensor query, Tensor key, Tensor value,
  Tensor? attn_bias, bool compute_log_sumexp, float dropout_p=0., bool is_causal=False, *,
  float? scale=None) -> (Tensor output, Tensor log_sumexp, Tensor philox_seed, Tensor
  philox_offset)`` (native_functions.yaml). Inputs (B, H, M, K), (B, H, N, K), (B, H, N, Kv);
  output (B, H, M, Kv) in the query's dtype; log_sumexp float32 (B, H, ceil(M / 32) * 32), rows
  M.. padded with +inf (kernel_forward.h: kAlignLSE = 32); ``is_causal`` is CausalFromTopLeft
  (attention.cu); a row with no allowed key gives output 0 and L = -inf
  (epilogue_rescale_output.h).
- Kernel choice (attention.cu ``launchKernel``, kernels/cutlassF.h): the first of the kernels
  listed for the dtype and compute capability whose kMaxK >= max(K, Kv) and whose alignment
  divides the strides; on sm80+ only aligned kernels exist, alignment 128 bits (4 fp32, 8 half)
  (sdp_utils.cpp ``minimum_gemm_alignment``). None fits: RuntimeError "cutlassF: no kernel found
  to launch!". kMaxK <= 128 kernels keep the output in registers ("rf"); the kMaxK 65536 one
  ("gmem") accumulates it in global memory with 32-query blocks: the slow general kernel.
- ``attn_bias``: the query's dtype, last dim contiguous, its other strides multiples of the
  alignment (check_supported: "attn_bias is not correctly aligned"); SDPA itself pads the last dim
  and slices it back (attention.cpp ``preprocess_mask``).
- ``torch.cuda.mem_get_info`` counts blocks the caching allocator reserved but freed as used;
  ``memory_reserved() - memory_allocated()`` is that cached, reusable memory.
- fp32 matmuls honour the TF32 flags on CUDA (10-bit mantissa inputs); the efficient kernel's
  own fp32 GEMMs are 3xTF32 whatever the flags. `ieee_fp32` turns TF32 off for a block.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Literal

import torch

Kind = Literal["cpu", "cuda", "other"]
LSE_ROWS = 32  # the efficient kernel's log_sumexp rows come padded to a multiple of this
RF_MAX = 128  # the widest head a register-file ("rf") efficient kernel takes
BIAS_ALIGN = 16  # last dim of an attn_bias buffer, as SDPA pads it (elements)

# (name, kMaxK) of the efficient kernels PyTorch builds for sm80+ in dispatch order (cutlassF.h).
EFFICIENT_KERNELS: tuple[tuple[str, int], ...] = (
    ("64x64_rf", 64),
    ("64x128_rf", 128),
    ("32x128_gmem", 65536),
)

# RuntimeError texts that mean "this kernel takes no such inputs here" (a fallback, not a bug).
NO_KERNEL = {
    "cutlassF: no kernel found to launch": "no efficient kernel for this head size",
    "is not correctly aligned": "inputs not aligned for the efficient kernel",
    "was not enabled for build": "this PyTorch build has no fused attention",
    "does not have enough shared-memory": "not enough shared memory on this GPU",
    "Could not run 'aten::": "no fused attention kernel on this device",
}


class TorchDevice:
    """PyTorch's own calls: what runs outside the tests."""

    def kind(self, device: torch.device) -> Kind:
        return device.type if device.type in ("cpu", "cuda") else "other"  # type: ignore[return-value]

    def available(self) -> bool:
        """Whether this machine has a CUDA device PyTorch can use."""
        return torch.cuda.is_available()

    def device(self) -> torch.device:
        """The CUDA device a run without an explicit choice uses."""
        return torch.device("cuda")

    def cpu_flash_attention(self, query, key, value, dropout_p: float, is_causal: bool, *, attn_mask, scale):
        """aten::_scaled_dot_product_flash_attention_for_cpu -> (output, logsumexp)."""
        out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
        )
        return out[0], out[1]

    def efficient_attention(self, query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0,
                            is_causal=False, *, scale=None):  # fmt: skip
        """aten::_scaled_dot_product_efficient_attention, argument for argument (its schema's names)."""
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, attn_bias, compute_log_sumexp, dropout_p, is_causal, scale=scale
        )

    def capability(self, device: torch.device) -> tuple[int, int]:
        return torch.cuda.get_device_capability(device)

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)

    def mem_get_info(self, device: torch.device) -> tuple[int, int]:
        return torch.cuda.mem_get_info(device)

    def memory_reserved(self, device: torch.device) -> int:
        return torch.cuda.memory_reserved(device)

    def memory_allocated(self, device: torch.device) -> int:
        return torch.cuda.memory_allocated(device)

    def max_memory_allocated(self, device: torch.device) -> int:
        return torch.cuda.max_memory_allocated(device)

    def reset_peak_memory_stats(self, device: torch.device) -> None:
        torch.cuda.reset_peak_memory_stats(device)

    def synchronize(self, device: torch.device) -> None:
        torch.cuda.synchronize(device)

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def device_name(self, device: torch.device) -> str:
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"


_BACKEND: TorchDevice = TorchDevice()


def backend() -> TorchDevice:
    """The contract in force: PyTorch, or the emulation a test installed."""
    return _BACKEND


@contextlib.contextmanager
def use(emulation: TorchDevice) -> Iterator[TorchDevice]:
    """Install another implementation of the contract for a block (tests: the CUDA emulation)."""
    global _BACKEND
    old, _BACKEND = _BACKEND, emulation
    try:
        yield emulation
    finally:
        _BACKEND = old


def kind(device: torch.device | str) -> Kind:
    return _BACKEND.kind(torch.device(device))


def on_cuda(device: torch.device | str) -> bool:
    return kind(device) == "cuda"


def synchronize(device: torch.device | str) -> None:
    """Wait for the device's queued work (no-op off CUDA): timings and peaks need it."""
    if on_cuda(device):
        _BACKEND.synchronize(torch.device(device))


def alignment(dtype: torch.dtype, capability: tuple[int, int]) -> int:
    """Elements the efficient kernel's strides must be multiples of (minimum_gemm_alignment)."""
    half = dtype in (torch.float16, torch.bfloat16)
    if capability[0] >= 8:
        return 8 if half else 4
    return 8 if half and capability[0] >= 7 else 1


def efficient_kernel(dtype: torch.dtype, capability: tuple[int, int], k_dim: int, v_dim: int) -> str | None:
    """The efficient kernel PyTorch picks for these head sizes (aligned inputs), or None."""
    if dtype == torch.bfloat16 and capability[0] < 8:
        return None
    for name, max_k in EFFICIENT_KERNELS:
        if max(k_dim, v_dim) <= max_k:
            return name
    return None


def no_kernel_reason(err: BaseException) -> str | None:
    """Why a fused call refused these inputs (then an exact fallback is right), or None when the
    error is real (out of memory, a shape bug) and must propagate."""
    if isinstance(err, torch.OutOfMemoryError | MemoryError):
        return None
    if isinstance(err, RuntimeError | NotImplementedError):
        text = str(err)
        for needle, why in NO_KERNEL.items():
            if needle in text:
                return why
    return None


# --- fp32 matmul precision ------------------------------------------------------------------

_TF32_LOCK = threading.Lock()
_tf32_depth = 0
_tf32_saved: tuple[str, object] | None = None


def _tf32_state() -> tuple[str, object]:
    """("legacy", allow_tf32) or ("new", fp32_precision): PyTorch refuses to mix the two APIs."""
    m = torch.backends.cuda.matmul
    try:
        return "legacy", bool(m.allow_tf32)
    except RuntimeError:  # the new API was used: reading the legacy flag raises
        return "new", m.fp32_precision


def tf32_enabled() -> bool:
    """Whether CUDA fp32 matmuls may round their inputs to TF32 right now."""
    api, value = _tf32_state()
    return bool(value) if api == "legacy" else value == "tf32"


def _set_tf32(api: str, value: object) -> None:
    if api == "legacy":
        torch.backends.cuda.matmul.allow_tf32 = bool(value)
    else:
        torch.backends.cuda.matmul.fp32_precision = str(value)


@contextlib.contextmanager
def ieee_fp32() -> Iterator[None]:
    """fp32 matmuls in IEEE precision inside the block (TF32 off, restored after; nesting and
    threads share one switch). Scores and cross terms are subtracted from a 3xTF32 log-sum-exp:
    TF32's 10-bit inputs would leave errors near 1e-3 in probabilities. Other threads' matmuls
    run in IEEE meanwhile: slower, never less exact."""
    global _tf32_depth, _tf32_saved
    with _TF32_LOCK:
        if _tf32_depth == 0:
            _tf32_saved = _tf32_state() if tf32_enabled() else None
            if _tf32_saved is not None:
                _set_tf32(_tf32_saved[0], False if _tf32_saved[0] == "legacy" else "ieee")
        _tf32_depth += 1
    try:
        yield
    finally:
        with _TF32_LOCK:
            _tf32_depth -= 1
            if _tf32_depth == 0 and _tf32_saved is not None:
                _set_tf32(*_tf32_saved)
                _tf32_saved = None


def matmul_ieee(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with fp32 inputs in IEEE precision on every device (TF32 off for the call)."""
    with ieee_fp32():
        return _BACKEND.matmul(a, b)
