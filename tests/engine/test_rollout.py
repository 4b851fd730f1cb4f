"""One token's rollout at O(N·d) memory equals the dense rollout (the oracle), layer by layer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from product_checks import TOL
from sharp_models import TEXT, sharp

import attnviz
from attnviz.analysis import rollout as R
from attnviz.errors import AttnvizError


def _dense_sources(res, token, stack, residual=0.5, sink_aware=False):
    """e_t^T A_last ... A_l for every l from the full dense A matrices (attention_rollout's steps)."""
    n = len(res.axes(stack)[0])
    steps = []
    for layer in range(res.n_layers(stack)):
        mean = R._head_mean(res, layer, stack, R.CHUNK_ELEMENTS, sink_aware)
        steps.append(R.rollout_step(None, mean, residual=residual).double())
    row = torch.zeros(n, dtype=torch.float64)
    row[token] = 1.0
    out = []
    for a in reversed(steps):
        row = row @ a
        out.append(row.numpy())
    return np.stack(out[::-1])


@pytest.mark.parametrize(
    "arch", ["llama-gqa", "qwen3", "mistral-sliding", "gpt2", "bert", "bart", "gemma2", "t5"]
)
@pytest.mark.parametrize("sink_aware", [False, True])
def test_token_rollout_equals_dense(arch, sink_aware):
    res = attnviz.extract(sharp(arch), TEXT)
    stack = res.stacks[0]
    n = len(res.axes(stack)[0])
    for token in (n - 1, n // 2):
        fast = R.token_rollout(res, token, stack=stack, sink_aware=sink_aware)
        want = _dense_sources(res, token, stack, sink_aware=sink_aware)
        assert fast.sources.shape == (res.n_layers(stack), n)
        assert np.abs(fast.sources - want).max() < 1e-5, (token, np.abs(fast.sources - want).max())
        assert fast.sources.sum(-1) == pytest.approx(np.ones(res.n_layers(stack)), abs=1e-5)
        dense = R.token_rollout(res, token, stack=stack, sink_aware=sink_aware, computation="dense")
        assert np.abs(dense.sources - want).max() < 1e-6
    expected = {"gemma2": "dense: soft-capping", "t5": "dense: position bias"}.get(arch, "fused")
    assert set(fast.paths) == {expected}
    if res.layout.kind == "decoder":
        assert (fast.sources[:, n // 2 + 1 :] == 0).all() if token == n // 2 else True


def test_row_zero_is_the_full_rollout_row_and_sink_aware_moves_mass():
    res = attnviz.extract(sharp("llama-gqa"), TEXT)
    full = R.attention_rollout(res)
    plain = R.token_rollout(res)
    assert plain.token == res.n_tokens - 1
    assert np.abs(plain.rollout - full[-1]).max() < 1e-5
    sinkless = R.token_rollout(res, sink_aware=True)
    full_sinkless = R.attention_rollout(res, sink_aware=True)
    assert np.abs(sinkless.rollout - full_sinkless[-1]).max() < 1e-5
    assert sinkless.rollout[0] < plain.rollout[0]  # the first token loses what heads parked on it
    assert np.abs(sinkless.rollout - plain.rollout).max() > 1e-3


def test_token_rollout_rejects_bad_input():
    res = attnviz.extract(sharp("gpt2"), TEXT)
    with pytest.raises(AttnvizError):
        R.token_rollout(res, res.n_tokens)
    with pytest.raises(AttnvizError):
        R.token_rollout(res, residual=1.5)
    with pytest.raises(AttnvizError):
        R.token_rollout(attnviz.extract(sharp("bart"), TEXT), stack="cross")


@pytest.mark.slow
def test_smollm2_token_rollout_equals_dense(smollm):
    lm = smollm  # the CPU float32 fixture: what this asserts (device="auto" is CUDA bf16 on a GPU)
    res = attnviz.extract(lm, TEXT * 3)
    for sink_aware in (False, True):
        fast = R.token_rollout(res, sink_aware=sink_aware)
        dense = R.token_rollout(res, sink_aware=sink_aware, computation="dense")
        assert fast.paths == ("fused",) * 30
        err = np.abs(fast.sources - dense.sources).max()
        print(f"smollm2 rollout sink_aware={sink_aware}: max |fast - dense| {err:.1e}")
        assert err < 1e-5


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_smollm2_token_rollout_on_cuda_bf16():
    lm = attnviz.load_model("smollm2-135m")  # auto on a GPU machine: CUDA, bf16
    res = attnviz.extract(lm, TEXT * 3)
    for sink_aware in (False, True):
        fast = R.token_rollout(res, sink_aware=sink_aware)
        dense = R.token_rollout(res, sink_aware=sink_aware, computation="dense")
        assert fast.paths == ("fused",) * 30
        err = np.abs(fast.sources - dense.sources).max()
        print(f"smollm2 CUDA bf16 rollout sink_aware={sink_aware}: max |fast - dense| {err:.1e}")
        assert err < TOL[torch.bfloat16][1]
