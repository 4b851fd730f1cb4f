"""Statistics whose log-sum-exp and expectations come from the model's own forward.

`extract(statistics=True)` runs each eligible layer as one widened CPU flash call
(attnviz.exact.statistics). Checked here: the widened kernel's L, E_p[k], E_p[key_pos] and output
against a dense softmax; statistics from the forward == the dense definitions (1e-4, float32) on
tiny Llama-GQA, Qwen3, Mistral (sliding window), GPT-2, BERT, BART and the built-in smollm2
(slow); Gemma 2 (soft-capping) and T5 (position bias) keep the dense path and say so; bf16 keeps
the second pass; the model's logits with statistics on equal a plain run to float32 rounding
(measured, often bit for bit); plain extract keeps nothing extra.
"""

from __future__ import annotations

import numpy as np
import pytest
import tiny
import torch
from product_checks import TOL
from sharp_models import TEXT, assert_same, sharp

import attnviz
from attnviz import metrics as M
from attnviz.analysis import rollout as R
from attnviz.capture.hook import recording
from attnviz.exact import lse
from attnviz.exact import statistics as FS

FORWARD = {"llama-gqa", "qwen3", "mistral-sliding", "gpt2", "bert", "bart"}
BIDIRECTIONAL = {("bert", "self"), ("bart", "encoder"), ("bart", "cross")}


def _dense(q, k, v, allowed, scale):
    """L, E_p[k], E_p[key_pos], E_p[v] by the textbook softmax (GQA expanded), float64."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1).double(), v.repeat_interleave(g, 1).double()
    s = (q.double() @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s, -1)
    pos = torch.arange(k.shape[2], dtype=torch.float64)
    return torch.logsumexp(s, -1)[0], (p @ k)[0], (p @ pos)[0], (p @ v)[0]


@pytest.mark.parametrize("case", ["causal", "bool window", "additive window", "bidirectional"])
@pytest.mark.parametrize("n", [7, 33, 70])
def test_widened_flash_call_equals_a_dense_softmax(case, n):
    torch.manual_seed(n)
    h, n_kv, d, d_v, scale = 6, 2, 8, 5, 0.4  # GQA, and a value head size unlike the key's
    q, k = torch.randn(1, h, n, d) * 2, torch.randn(1, n_kv, n, d)
    v = torch.randn(1, n_kv, n, d_v)
    i = torch.arange(n)
    causal = i[None, :] <= i[:, None]
    window = causal & (i[None, :] > i[:, None] - 4)
    mask, is_causal, allowed = None, False, torch.ones(n, n, dtype=torch.bool)
    if case == "causal":
        is_causal, allowed = True, causal
    elif case == "bool window":
        mask, allowed = window[None, None], window
    elif case == "additive window":
        mask = torch.zeros(1, 1, n, n).masked_fill(~window, torch.finfo(torch.float32).min)
        allowed = window
    out, st = FS.forward_with_stats(q, k, v, mask, scale, is_causal)
    want_l, want_k, want_pos, want_v = _dense(q, k, v, allowed, scale)
    assert out.shape == (1, n, h, d_v)
    assert torch.allclose(out[0].transpose(0, 1).double(), want_v, atol=1e-5)
    assert torch.allclose(st.lse.double(), want_l, atol=1e-5)
    assert torch.allclose(st.e_pos.double(), want_pos, atol=1e-5 * n)
    want_cross = FS.cross_terms(q[0].double(), want_k, scale, h // n_kv)
    assert torch.allclose(st.cross.double(), want_cross, atol=1e-4)
    # cross[a, own] is scale * q_a . E_pa[k]; cross[a, b] uses the b-th query of a's group
    assert torch.allclose(st.cross[4, 1].double(), scale * (q[0, 4].double() * want_k[4]).sum(-1), atol=1e-4)
    assert torch.allclose(st.cross[3, 2].double(), scale * (q[0, 5].double() * want_k[3]).sum(-1), atol=1e-4)
    # and the same output as transformers' plain SDPA call on these inputs (its math kernel here:
    # flash wants d_v == d, so `fusable` leaves such a layer alone)
    assert not FS.fusable(None, q, k, v, mask, 0.0, scale, is_causal, {})
    k3, v3 = k.repeat_interleave(3, 1), v.repeat_interleave(3, 1)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q, k3, v3, attn_mask=mask, is_causal=is_causal, scale=scale
    ).transpose(1, 2)
    assert (out - sdpa).abs().max() < 1e-5


def test_only_cpu_float32_flash_calls_are_widened():
    q, k = torch.randn(1, 4, 10, 8), torch.randn(1, 2, 10, 8)
    args = dict(module=None, dropout=0.0, scaling=None, is_causal=True, kwargs={})
    assert FS.fusable(query=q, key=k, value=k, mask=None, **args)
    assert not FS.fusable(query=q.bfloat16(), key=k.bfloat16(), value=k.bfloat16(), mask=None, **args)
    assert not FS.fusable(query=q[:, :, :4], key=k, value=k, mask=None, **args)  # not the square prefill
    assert not FS.fusable(query=q, key=k, value=k, mask=torch.ones(1, 4, 10, 10, dtype=torch.bool), **args)
    assert not FS.fusable(query=q, key=k, value=k, mask=None, **{**args, "dropout": 0.1})
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):  # SDPA would not run flash
        assert not FS.fusable(query=q, key=k, value=k, mask=None, **args)


def test_a_widened_call_that_would_not_fit_keeps_the_plain_forward(monkeypatch):
    monkeypatch.setattr(FS, "free_bytes", lambda device: 10_000)
    res = attnviz.extract(sharp("llama-gqa"), TEXT, statistics=True)
    assert all(c.forward is None for c in res._captured["self"])
    assert M.head_metrics(res).paths == ("fused",) * 3


@pytest.mark.parametrize("arch", tiny.ARCHS)
def test_statistics_from_the_forward_equal_the_definitions(arch):
    lm = sharp(arch)
    res = attnviz.extract(lm, TEXT, statistics=True)
    plain = attnviz.extract(lm, TEXT)
    for stack in res.stacks:
        caps = res._captured[stack]
        assert all(c.forward is None for c in plain._captured[stack])  # plain extract keeps nothing more
        fast = M.head_metrics(res, stack=stack)
        dense = M.head_metrics(res, stack=stack, computation="dense")
        errs = assert_same(fast, dense, 1e-4)
        if arch in FORWARD:
            want = "forward + causal pass" if (arch, stack) in BIDIRECTIONAL else "forward"
            assert fast.paths == (want,) * res.n_layers(stack), fast.paths
            assert all(c.forward is not None for c in caps)
            # the second pass (plain result) gives the same numbers
            second = M.head_metrics(plain, stack=stack)
            assert set(second.paths) == {"fused"}
            assert_same(fast, second, 1e-4)
        elif arch == "gemma2":
            assert set(fast.paths) == {"dense: soft-capping"} and all(c.forward is None for c in caps)
        elif arch == "t5":
            assert set(fast.paths) == {"dense: position bias"} and all(c.forward is None for c in caps)
        print(arch, stack, fast.paths[0], f"max |fast - dense| {max(errs.values()):.1e}")


def _logits(lm, ids, statistics):
    with torch.inference_mode(), recording(lm.module_names, statistics=statistics) as rec:
        out = lm.model(input_ids=torch.tensor([ids]), use_cache=False)
    return out.logits[0], rec.calls


@pytest.mark.parametrize("arch", ["llama-gqa", "mistral-sliding", "gpt2"])
def test_the_model_output_with_statistics_equals_a_plain_run(arch):
    """Measured max |Δ| of the logits over lengths that take different GEMM paths: 0 for most,
    ≤ 1e-6 elsewhere (the wider product is summed in another order); bound 1e-5."""
    lm = sharp(arch)
    worst = 0.0
    for n in (7, 33, 65, 120):
        ids = [3 + (i * 37) % 300 for i in range(n)]
        plain, plain_calls = _logits(lm, ids, False)
        with_stats, calls = _logits(lm, ids, True)
        assert all(c.forward is not None for c in calls) and all(c.forward is None for c in plain_calls)
        diff = float((plain - with_stats).abs().max())
        assert diff <= 1e-5 * max(1.0, float(plain.abs().max())), (n, diff)
        worst = max(worst, diff)
    print(arch, f"max |logits with statistics - plain| {worst:.1e}")


def test_bf16_keeps_the_second_pass():
    lm0 = sharp("llama-gqa")
    import copy

    lm = attnviz.wrap_model(copy.deepcopy(lm0.model).to(torch.bfloat16), lm0.tokenizer, spec="tiny-bf16")
    res = attnviz.extract(lm, TEXT, statistics=True)
    assert all(c.forward is None for c in res._captured["self"])
    assert M.head_metrics(res).paths == ("fused",) * 3


def test_rollout_and_induction_use_the_forwards_lse():
    lm = sharp("llama-gqa")
    res = attnviz.extract(lm, TEXT, statistics=True)
    cap = lse.captured(res, "self", 1)
    assert lse.layer_lse(cap, lse.MaskSpec(True)) is cap.forward.lse
    roll = R.token_rollout(res)
    want = R.token_rollout(res, computation="dense")
    assert np.abs(roll.sources - want.sources).max() < 1e-5


@pytest.mark.slow
def test_smollm2_statistics_from_the_forward(smollm):
    lm = smollm  # the CPU float32 fixture: what this asserts (device="auto" is CUDA bf16 on a GPU)
    res = attnviz.extract(lm, TEXT * 3, statistics=True)
    fast = M.head_metrics(res)
    assert fast.paths == ("forward",) * 30
    errs = assert_same(fast, M.head_metrics(res, computation="dense"), 1e-4)
    print("smollm2 float32 forward statistics max |fast - dense|:", {k: f"{v:.1e}" for k, v in errs.items()})
    ids = res.tokens.ids if hasattr(res.tokens, "ids") else lm.tokenizer(TEXT * 3)["input_ids"]
    plain, _ = _logits(lm, list(ids), False)
    with_stats, _ = _logits(lm, list(ids), True)
    diff = float((plain - with_stats).abs().max())
    print(f"smollm2 max |logits with statistics - plain| {diff:.1e}")
    assert diff <= 1e-4


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_smollm2_statistics_on_cuda_bf16():
    """On CUDA the forward keeps its own SDPA call (no widened CPU flash): statistics=True changes
    nothing there, and the second fused pass equals the dense definitions within bf16 drift."""
    lm = attnviz.load_model("smollm2-135m", device="cuda", dtype="bfloat16")
    res = attnviz.extract(lm, TEXT * 3, statistics=True)
    assert all(res.captured(i).forward is None for i in range(res.n_layers()))
    fast = M.head_metrics(res)
    assert fast.paths == ("fused",) * 30
    errs = assert_same(fast, M.head_metrics(res, computation="dense"), TOL[torch.bfloat16][0])
    print("smollm2 CUDA bf16 max |fast - dense|:", {k: f"{v:.1e}" for k, v in errs.items()})
