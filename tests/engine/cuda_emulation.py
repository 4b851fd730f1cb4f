"""PyTorch's CUDA contract, emulated on the CPU and installed through the engine's one seam
(`attnviz.backend.use`): every CPU tensor then stands for a CUDA tensor, so each CUDA branch
of the engine (kernel choice, padding and slicing, bias buffers, fallbacks, memory sizing, the
benchmark's CUDA code) runs in `make test` on a machine without a GPU.

Each call honours what PyTorch's own sources say (pytorch/pytorch, read for this file):
- Schema (aten/src/ATen/native/native_functions.yaml; checked against the registered schema of
  the installed torch in tests/engine/test_cuda_contract.py):
  ``_scaled_dot_product_efficient_attention(Tensor query, Tensor key, Tensor value, Tensor?
  attn_bias, bool compute_log_sumexp, float dropout_p=0., bool is_causal=False, *, float?
  scale=None) -> (Tensor output, Tensor log_sumexp, Tensor philox_seed, Tensor philox_offset)``.
- aten/src/ATen/native/transformers/cuda/attention.cu (``_efficient_attention_forward``):
  inputs (B, H, M, K) / (B, H, N, K) / (B, H, N, Kv), same batch and heads, K of query == K of
  key, last dims contiguous; ``is_causal`` -> CausalFromTopLeft; ``launchKernel`` takes the first
  kernel with ``value.size(3) <= kMaxK && key.size(3) <= kMaxK`` whose alignment divides the head
  strides, else ``RuntimeError("cutlassF: no kernel found to launch!")``; attn_bias must have the
  query's dtype ("invalid dtype for bias - should match query's dtype"), a contiguous last dim,
  and is viewed as (B, H, M, N); log_sumexp is float32 (B, H, ceil(M / kAlignLSE) * kAlignLSE).
- .../cuda/mem_eff_attention/kernels/cutlassF.h: on sm80+ the f32, f16 and bf16 kernels are
  aligned only, kMaxK 64 and 128 keep the output in registers ("rf"), kMaxK 65536 accumulates
  it in global memory ("gmem").
- .../cuda/mem_eff_attention/kernel_forward.h: kAlignLSE = 32 and rows past M are written +inf;
  ``check_supported``: query/key strideM and strideH, and attn_bias strideB/H/M, multiples of
  kAlignmentQ ("... is not correctly aligned (strideM)"), pointers aligned.
- .../cuda/mem_eff_attention/epilogue/epilogue_rescale_output.h: a fully masked row's output is
  0 (its sum is taken as 1); its log-sum-exp is -inf (mi = -inf, log s' = -inf).
- aten/src/ATen/native/transformers/cuda/sdp_utils.cpp ``minimum_gemm_alignment``: 4 elements
  for fp32, 8 for half on sm80+ (128 bits).
- The CPU flash op takes no CUDA tensors (NotImplementedError "Could not run ... 'CUDA' backend").
- Memory: ``mem_get_info`` is the driver's view (allocator-reserved blocks count as used);
  ``memory_reserved`` / ``memory_allocated`` are the caching allocator's; ``empty_cache`` returns
  the cached blocks to the driver.
- fp32 ``matmul`` rounds its inputs to TF32 (10-bit mantissa) while TF32 is enabled.
Numerics: the emulation computes in float64 (the real fp32 kernel is 3xTF32): the tests check our
layout and bookkeeping, and parity to the dense oracle, not the GPU's rounding.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from attnviz import backend

GIB = 2**30
LSE_ALIGN = 32  # kernel_forward.h kAlignLSE
# cutlassF.h, sm80+: (name, kMaxK) in dispatch order; all "aligned" (128-bit) kernels
SM80 = (("aligned_64x64_rf", 64), ("aligned_64x128_rf", 128), ("aligned_32x128_gmem", 65536))


@dataclass
class EfficientCall:
    kernel: str
    query: tuple[int, ...]
    value: tuple[int, ...]
    bias: tuple[int, ...] | None
    causal: bool
    lse_rows: int
    key_storage: int  # data_ptr of the key's and the value's storage: one buffer or two
    value_storage: int


@dataclass
class Allocator:
    """The caching allocator and the driver, in bytes."""

    total: int = 80 * GIB
    others: int = 0  # used outside this process
    reserved: int = 0  # held by PyTorch's caching allocator
    allocated: int = 0  # in live tensors (<= reserved)
    peak: int = 0


@dataclass
class EmulatedCuda(backend.TorchDevice):
    """A CUDA device of compute capability ``capability`` whose memory is ``allocator``."""

    capability_: tuple[int, int] = (9, 0)
    allocator: Allocator = field(default_factory=Allocator)
    calls: list[EfficientCall] = field(default_factory=list)
    synced: list[torch.device] = field(default_factory=list)
    fail: BaseException | None = None  # raised by the next efficient call (OOM, a refusal, ...)
    refuse: str | None = None  # every efficient call raises RuntimeError(refuse)

    def kind(self, device: torch.device) -> backend.Kind:
        return "cuda" if device.type in ("cpu", "cuda") else "other"

    def available(self) -> bool:
        return True

    def device(self) -> torch.device:
        return torch.device("cpu")  # the emulated GPU: CPU tensors stand for CUDA ones

    def cpu_flash_attention(self, query, key, value, dropout_p, is_causal, *, attn_mask, scale):
        raise NotImplementedError(
            "Could not run 'aten::_scaled_dot_product_flash_attention_for_cpu' with arguments from the "
            "'CUDA' backend."
        )

    def capability(self, device: torch.device) -> tuple[int, int]:
        return self.capability_

    # --- the memory-efficient kernel ---------------------------------------------------------

    def _align(self, dtype: torch.dtype) -> int:
        half = dtype in (torch.float16, torch.bfloat16)
        if self.capability_[0] >= 8:
            return 128 // (16 if half else 32)
        return 1  # sm50-75 also build "notaligned" kernels (not emulated further)

    def _kernel(self, q_bmhk, k_bmhk, v_bmhk) -> str:
        a = self._align(q_bmhk.dtype)
        if q_bmhk.dtype == torch.bfloat16 and self.capability_[0] < 8:
            raise RuntimeError("cutlassF: no kernel found to launch!")
        for name, max_k in SM80:
            if v_bmhk.size(3) > max_k or k_bmhk.size(3) > max_k:
                continue
            if q_bmhk.stride(2) % a or k_bmhk.stride(2) % a:  # the head strides (v: alignment 1)
                continue
            return name
        raise RuntimeError("cutlassF: no kernel found to launch!")

    def _check_supported(self, q, k, bias4, a: int) -> None:
        """kernel_forward.h check_supported (strides of the BMHK views, pointers)."""
        for t, what in ((q, "query"), (k, "key")):
            if t.stride(1) % a:
                raise RuntimeError(f"{what} is not correctly aligned (strideM)")
            if t.size(2) > 1 and t.stride(2) % a:
                raise RuntimeError(f"{what} is not correctly aligned (strideH)")
            if t.storage_offset() % a:
                raise RuntimeError(f"{what} pointer is not correctly aligned")
        if bias4 is not None:
            b, h, m, _ = bias4.shape
            for dim, n, name in ((0, b, "strideB"), (1, h, "strideH"), (2, m, "strideM")):
                if n > 1 and bias4.stride(dim) % a:
                    raise RuntimeError(f"attn_bias is not correctly aligned ({name}).")
            if bias4.storage_offset() % a:
                raise RuntimeError("attn_bias pointer is not correctly aligned")

    def efficient_attention(self, query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0,
                            is_causal=False, *, scale=None):  # fmt: skip
        if self.fail is not None:
            err, self.fail = self.fail, None
            raise err
        if self.refuse is not None:
            raise RuntimeError(self.refuse)
        for t in (query, key, value):
            if t.dim() != 4:
                raise RuntimeError("query, key and value must be 4-D (B, H, M, K)")
            if t.stride(-1) != 1:
                raise RuntimeError("tensor must be contiguous in the last dimension")
        if not (query.dtype == key.dtype == value.dtype) or query.dtype not in (
            torch.float32, torch.float16, torch.bfloat16,
        ):  # fmt: skip
            raise RuntimeError(f"unsupported dtypes {query.dtype}, {key.dtype}, {value.dtype}")
        if dropout_p:
            raise AssertionError("the engine never asks for dropout (not emulated)")
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # BMHK, as attention.cu sees them
        B, M, H, K = q.shape
        N = k.shape[1]
        if k.shape[0] != B or v.shape[0] != B or k.shape[2] != H or v.shape[2] != H:
            raise RuntimeError("batch sizes and head counts of query, key and value must match")
        if k.shape[3] != K or v.shape[1] != N:
            raise RuntimeError("query/key head dims and key/value lengths must match")
        name = self._kernel(q, k, v)
        a = self._align(query.dtype)
        bias4 = None
        if attn_bias is not None:
            if attn_bias.dtype != query.dtype:
                raise RuntimeError("invalid dtype for bias - should match query's dtype")
            if attn_bias.stride(-1) != 1:
                raise RuntimeError("attn_bias: wrong alignment (last dimension must be contiguous)")
            bias4 = attn_bias.expand(B, H, M, N)  # get_bias_4d_view
        self._check_supported(q, k, bias4, a)
        scale = 1.0 / math.sqrt(K) if scale is None else scale
        s = torch.matmul(query.double(), key.double().transpose(-1, -2)) * scale  # (B, H, M, N)
        if bias4 is not None:
            s = s + bias4.double()
        if is_causal:  # CausalFromTopLeft
            s = s.masked_fill(torch.ones(M, N, dtype=torch.bool).triu(1), float("-inf"))
        lse = torch.logsumexp(s, -1)  # -inf on a fully masked row
        p = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # that row's output: 0
        out = torch.matmul(p, value.double()).to(query.dtype)
        rows = -(-M // LSE_ALIGN) * LSE_ALIGN if compute_log_sumexp else 0
        lse_out = torch.full((B, H, rows), float("inf"), dtype=torch.float32)
        if compute_log_sumexp:
            lse_out[..., :M] = lse.float()
        self.calls.append(
            EfficientCall(name, tuple(query.shape), tuple(value.shape),
                          None if attn_bias is None else tuple(attn_bias.shape), bool(is_causal), rows,
                          key.untyped_storage().data_ptr(), value.untyped_storage().data_ptr())
        )  # fmt: skip
        return out, lse_out, torch.empty((), dtype=torch.long), torch.empty((), dtype=torch.long)

    # --- matmuls: TF32 when enabled ------------------------------------------------------------

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if backend.tf32_enabled() and a.dtype == torch.float32 and b.dtype == torch.float32:
            a, b = tf32(a), tf32(b)
        return torch.matmul(a, b)

    # --- memory and synchronisation ------------------------------------------------------------

    def mem_get_info(self, device: torch.device) -> tuple[int, int]:
        m = self.allocator
        return m.total - m.others - m.reserved, m.total

    def memory_reserved(self, device: torch.device) -> int:
        return self.allocator.reserved

    def memory_allocated(self, device: torch.device) -> int:
        return self.allocator.allocated

    def max_memory_allocated(self, device: torch.device) -> int:
        return self.allocator.peak

    def reset_peak_memory_stats(self, device: torch.device) -> None:
        self.allocator.peak = self.allocator.allocated

    def synchronize(self, device: torch.device) -> None:
        self.synced.append(device)

    def empty_cache(self) -> None:
        self.allocator.reserved = self.allocator.allocated

    def device_name(self, device: torch.device) -> str:
        return f"emulated CUDA sm{self.capability_[0]}{self.capability_[1]} on the CPU"


def tf32(t: torch.Tensor) -> torch.Tensor:
    """float32 rounded to TF32 (10 explicit mantissa bits, round to nearest) as tensor cores read it."""
    bits = t.contiguous().view(torch.int32)
    rounded = (bits + 0x1000) & ~0x1FFF
    return rounded.view(torch.float32)


@contextlib.contextmanager
def emulate(**kw) -> Iterator[EmulatedCuda]:
    """Run a block as if every CPU tensor lived on a CUDA GPU (``EmulatedCuda(**kw)``)."""
    with backend.use(EmulatedCuda(**kw)) as cuda:
        yield cuda  # type: ignore[misc]
