"""Device and dtype choice, and telling an out-of-memory failure from other errors."""

from __future__ import annotations

import torch

from ..errors import AttnvizError


def resolve_device(device: str = "auto") -> torch.device:
    """ "auto" picks CUDA, then Apple MPS, then CPU. A named device that is not there is an
    error (AttnvizError), never a silent fallback to another device and dtype."""
    if device != "auto":
        return _named_device(device)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def _named_device(device: str) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda", "mps"):
        raise AttnvizError(f"unknown device {device!r}; use auto, cpu, cuda, cuda:N or mps")
    mps = getattr(torch.backends, "mps", None)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise AttnvizError(f"device {device!r}: CUDA is not available on this machine; use cpu or auto")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise AttnvizError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if dev.type == "mps" and not (mps and mps.is_available()):
        raise AttnvizError(f"device {device!r}: Apple MPS is not available on this machine; use cpu or auto")
    return dev


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """ "auto": bfloat16 on CUDA (float16 where bf16 is missing), float32 elsewhere."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    try:
        return {
            "float32": torch.float32,
            "fp32": torch.float32,
            "bfloat16": torch.bfloat16,
            "bf16": torch.bfloat16,
            "float16": torch.float16,
            "fp16": torch.float16,
        }[dtype]
    except KeyError:
        raise AttnvizError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16") from None


def is_out_of_memory(err: BaseException) -> bool:
    """torch.OutOfMemoryError on GPUs; on CPU a failed allocation is a plain RuntimeError."""
    if isinstance(err, torch.OutOfMemoryError | MemoryError):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and (
        "can't allocate memory" in text or "out of memory" in text.lower()
    )
