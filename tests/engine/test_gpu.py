"""CUDA checks: fp32 parity on the GPU, device_map placement. Skipped without CUDA (bf16: test_bf16.py)."""

import numpy as np
import pytest
import tiny
import torch

import attnviz

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

TEXT = "the financial bank is located on river bank, a quick brown fox jumps over the lazy dog"


def _on_cuda(arch: str, dtype: torch.dtype) -> attnviz.LoadedModel:
    model = tiny.model(arch).to("cuda", dtype)
    try:
        return attnviz.wrap_model(model, tiny.tokenizer(tiny.tokenizer_kind(arch)), spec=f"tiny-{arch}")
    finally:
        tiny.model.cache_clear()  # the cached CPU copy was moved; rebuild it for other tests


def _diff(a, b) -> float:
    return max(
        float(np.abs(a.layer(i, stack=s) - b.layer(i, stack=s)).max())
        for s in a.stacks
        for i in range(a.n_layers(s))
    )


@pytest.mark.parametrize("arch", tiny.ARCHS)
def test_cuda_parity_fp32(arch):
    lm = _on_cuda(arch, torch.float32)
    fast, eager = attnviz.extract(lm, TEXT), attnviz.extract(lm, TEXT, path="eager")
    assert fast.layer_tensor(0).device.type == "cuda"
    tol = 1e-3 if torch.backends.cuda.matmul.allow_tf32 else 1e-5  # TF32 matmuls round to 10 bits
    assert _diff(fast, eager) <= tol


# bfloat16 parity (CPU and CUDA, tolerances from measured drift) lives in test_bf16.py.


@pytest.mark.slow
def test_builtin_on_cuda_auto_device():
    lm = attnviz.load_model("smollm2-135m")  # device="auto" -> CUDA, bf16, device_map="auto"
    assert lm.device.type == "cuda" and lm.dtype == torch.bfloat16
    res = attnviz.extract(lm, TEXT)
    eager = attnviz.extract(lm, TEXT, path="eager")
    assert _diff(res, eager) <= 2e-2
    lm32 = attnviz.load_model("smollm2-135m", dtype="float32")
    ids = lm32.tokenizer(" ".join([TEXT] * 120))["input_ids"][:2048]
    fast32, eager32 = attnviz.extract_ids(lm32, ids), attnviz.extract_ids(lm32, ids, path="eager")
    assert _diff(fast32, eager32) <= 5e-4
