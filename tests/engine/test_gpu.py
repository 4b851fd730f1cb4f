"""The product on a CUDA GPU: every log-sum-exp entry point against the dense oracle.

Every head's statistics, token rollout (plain and sink-aware), pooled views and zoomed regions,
induction, value-weighted attention and the token views, on tiny architectures (GQA, sliding
window, soft-capping, ALiBi, learned sinks, encoder-only, encoder-decoder, T5's position bias)
and the built-in model, in float32 and bfloat16, each against the dense definitions and the
model's own eager attention. Any "blocked" path (a fused kernel that refused) fails; layers
whose scores are not standard must say "dense: <why>". Models are copies moved to the GPU
(the cached CPU tiny models are never moved in place).

The checks (`product_checks.check_product`, with their tolerances) are shared:
test_cuda_contract_product.py runs them on the CPU under the CUDA emulation (cuda_emulation.py),
so they run in every `make test`; here they run on the real device (`make test` on a GPU machine,
`make gpu-check`).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import tiny
import torch
from product_checks import check_product, family_model, on, text_ids
from sharp_models import TEXT, sharp

import attnviz
from attnviz.analysis import rollout as R

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("arch", tiny.ARCHS)
def test_every_entry_point_on_cuda(arch, dtype):
    lm = on(sharp(arch), "cuda", dtype)
    assert lm.device.type == "cuda" and tiny.model(arch).device.type == "cpu"  # the cached copy stayed
    print(arch, dtype, {k: f"{v:.1e}" for k, v in check_product(lm, text_ids(lm), arch).items()})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", ["falcon-alibi", "gpt_oss"])
def test_alibi_and_sinks_on_cuda(family, dtype):
    lm = on(family_model(family), "cuda", dtype)
    ids = [3 + (i * 37) % 300 for i in range(60)]
    print(family, dtype, {k: f"{v:.1e}" for k, v in check_product(lm, ids, family, induction=False).items()})


def test_explicit_device_and_multi_gpu_rollout():
    """device="cuda:N" keeps the whole model on GPU N; with two GPUs, a model split over both
    (device_map="auto" style) still rolls out: r follows each layer's device."""
    lm = attnviz.load_model("smollm2-135m", device=f"cuda:{torch.cuda.device_count() - 1}", dtype="float32")
    assert {p.device for p in lm.model.parameters()} == {torch.device("cuda", torch.cuda.device_count() - 1)}
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU: the split-model rollout needs two")
    from accelerate import dispatch_model

    base = copy.deepcopy(tiny.model("llama-gqa"))
    dmap = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.norm": 1, "lm_head": 1}
    dmap |= {f"model.layers.{i}": i % 2 for i in range(len(base.model.layers))}
    split = attnviz.wrap_model(
        dispatch_model(base, device_map=dmap), tiny.tokenizer("decoder"), spec="tiny-split"
    )
    res = attnviz.extract(split, TEXT)
    roll, oracle = R.token_rollout(res), R.token_rollout(res, computation="dense")
    assert np.abs(roll.sources - oracle.sources).max() < 1e-5 and set(roll.paths) == {"fused"}


@pytest.mark.slow
def test_builtin_on_cuda_bf16_and_fp32():
    """The built-in model as `load_model` gives it on a GPU (auto: CUDA, bf16), and in fp32."""
    lm = attnviz.load_model("smollm2-135m")
    assert lm.device.type == "cuda" and lm.dtype == torch.bfloat16
    ids = list(lm.tokenizer(TEXT * 3)["input_ids"])
    print("smollm2 bf16", {k: f"{v:.1e}" for k, v in check_product(lm, ids, "llama").items()})
    lm32 = attnviz.load_model("smollm2-135m", dtype="float32")
    print("smollm2 fp32", {k: f"{v:.1e}" for k, v in check_product(lm32, ids, "llama").items()})
