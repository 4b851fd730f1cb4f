"""The GPU suite's product checks (product_checks.check_product, run by test_gpu.py) on the CPU under the CUDA
emulation: every log-sum-exp entry point takes the CUDA branches (efficient-kernel calls, aligned
feature buffers, split values, bias buffers, L slicing) and equals the dense oracle; no layer falls
back. The fast tier runs a representative set; the rest is marked slow."""

from __future__ import annotations

import pytest
import tiny
import torch
from cuda_emulation import emulate
from product_checks import check_product, family_model, on, text_ids
from sharp_models import sharp

FAST = {("llama-gqa", torch.float32), ("mistral-sliding", torch.float32), ("bart", torch.float32),
        ("llama-gqa", torch.bfloat16)}  # fmt: skip


def _cases():
    for arch in (*tiny.ARCHS, "falcon-alibi", "gpt_oss"):
        for dtype in (torch.float32, torch.bfloat16):
            fast = (arch, dtype) in FAST or (arch == "falcon-alibi" and dtype == torch.float32)
            marks = () if fast else (pytest.mark.slow,)
            yield pytest.param(arch, dtype, marks=marks, id=f"{arch}-{str(dtype)[6:]}")


@pytest.mark.parametrize(("arch", "dtype"), _cases())
def test_every_entry_point_on_emulated_cuda(arch, dtype):
    base = sharp(arch) if arch in tiny.ARCHS else family_model(arch)
    with emulate() as cuda:
        lm = on(base, cuda.device(), dtype)
        ids = text_ids(lm) if arch in tiny.ARCHS else [3 + (i * 37) % 300 for i in range(60)]
        errs = check_product(lm, ids, arch, induction=arch in tiny.ARCHS)
    if arch not in ("gemma2", "t5", "gpt_oss"):  # standard scores: the efficient kernel ran
        assert cuda.calls and all(c.kernel.endswith("_rf") for c in cuda.calls), cuda.calls[:3]
    print(arch, dtype, {k: f"{v:.1e}" for k, v in errs.items()})
