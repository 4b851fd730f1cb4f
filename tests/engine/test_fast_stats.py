"""The fast per-head statistics (log-sum-exp from the fused kernels) equal the dense definitions.

Every architecture of tests/tiny.py in float32 (1e-4), which path ran per layer, the single
non-standard predicate (soft-capping, position bias, an unknown captured extra, an odd mask),
the induction probe, bf16 inputs (difference measured), and the built-in smollm2 (slow).
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import tiny
import torch
from product_checks import TOL
from sharp_models import FUSED, TEXT, assert_same, sharp

import attnviz
from attnviz import metrics as M
from attnviz.exact import fused, lse
from attnviz.records import CapturedAttention


@pytest.mark.parametrize("arch", tiny.ARCHS)
def test_fast_equals_dense_on_every_architecture(arch):
    res = attnviz.extract(sharp(arch), TEXT)
    assert res.n_tokens > 40
    for stack in res.stacks:
        fast = M.head_metrics(res, stack=stack)
        dense = M.head_metrics(res, stack=stack, computation="dense")
        assert_same(fast, dense, 1e-4)
        assert len(fast.paths) == res.n_layers(stack)
        assert all(p.startswith("dense: asked") for p in dense.paths)
        if arch in FUSED:
            assert fast.paths == ("fused",) * res.n_layers(stack), fast.paths
        elif arch == "gemma2":
            assert set(fast.paths) == {"dense: soft-capping"}
        elif arch == "t5":
            assert set(fast.paths) == {"dense: position bias"}


def test_the_statistics_are_not_trivial_on_the_tiny_model():
    """Parity would mean little on constant numbers: the heads differ and span a range."""
    res = attnviz.extract(sharp("llama-gqa"), TEXT)
    hm = M.head_metrics(res)
    for m in ("entropy", "sink", "previous_token", "diagonal", "gqa_coherence"):
        vals = hm.values(m)
        assert vals.max() - vals.min() > (0.01 if m == "gqa_coherence" else 0.05), m
        assert vals.min() > 0 and vals.max() < 1, m
    assert hm.distance.min() > 0.5 and hm.distance.max() < res.n_tokens


def test_bidirectional_distance_uses_keys_on_both_sides():
    res = attnviz.extract(sharp("bert"), TEXT)
    fast, dense = M.head_metrics(res), M.head_metrics(res, computation="dense")
    assert np.abs(fast.distance - dense.distance).max() < 1e-4
    # i - E[key_pos] (the causal formula) would be far off where keys after the query count.
    cap = lse.captured(res, "self", 0)
    lp = lse.layer_pass(cap, lse.MaskSpec(causal=False))
    one_sided = (torch.arange(res.n_tokens) - lp.e_pos)[:, 1:].mean(-1)
    assert np.abs(one_sided.numpy() - dense.distance[0]).max() > 1.0


def test_fused_kernel_lse_and_expectations_equal_a_dense_softmax():
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 70, 9) for _ in range(3))
    for spec in (lse.MaskSpec(True), lse.MaskSpec(False), lse.MaskSpec(True, 5), lse.MaskSpec(False, 7)):
        s = lse.scores_tile(q, k, 0.3, spec, 0, 0)
        want_l = torch.logsumexp(s, -1)
        want_o = torch.softmax(s, -1) @ v
        out, got_l, path = lse.attend(q, k, v, scale=0.3, spec=spec)
        assert path == "fused"
        assert torch.allclose(got_l, want_l, atol=1e-5), spec
        assert torch.allclose(out, want_o, atol=1e-5), spec
        out_b, l_b = fused.blocked(q, k, v, 0.3, spec, 0)
        assert torch.allclose(l_b, want_l, atol=1e-5) and torch.allclose(out_b, want_o, atol=1e-5)
    # rows of a rectangular causal block at an offset
    out, got_l, _ = lse.attend(q[:, 40:], k, v, scale=0.3, spec=lse.MaskSpec(True), q_offset=40)
    want_l = torch.logsumexp(lse.scores_tile(q[:, 40:], k, 0.3, lse.MaskSpec(True), 40, 0), -1)
    assert torch.allclose(got_l, want_l, atol=1e-5)


@dataclasses.dataclass
class _WithExtra(CapturedAttention):
    future_bias: torch.Tensor | None = None  # a term a future capture might record


def test_any_unknown_captured_extra_falls_back_to_dense():
    res = attnviz.extract(sharp("llama-gqa"), TEXT)
    caps = [res.captured(i) for i in range(res.n_layers())]
    spec, why = lse.layer_spec(caps[1], res.layout, 1, "self")
    assert spec == lse.MaskSpec(True) and why == "fused"
    fields = {f.name: getattr(caps[1], f.name) for f in dataclasses.fields(CapturedAttention)}
    hm = M.head_metrics(res.with_capture(1, _WithExtra(**fields, future_bias=torch.zeros(4))))
    assert hm.paths == ("fused", "dense: captured future_bias", "fused")
    sinks = res.with_capture(1, dataclasses.replace(caps[1], sinks=torch.zeros(4)))
    assert M.head_metrics(sinks).paths[1].startswith("dense")  # learned sinks: exact dense path
    unset = res.with_capture(1, _WithExtra(**fields, future_bias=None))
    assert M.head_metrics(unset).paths == ("fused",) * 3  # an extra that is not set changes nothing


def test_an_odd_mask_falls_back_and_a_matching_one_does_not():
    res = attnviz.extract(sharp("llama-gqa"), TEXT)
    cap = res.captured(0)
    n = res.n_tokens
    causal = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
    assert lse.layer_spec(dataclasses.replace(cap, mask=causal), res.layout, 0, "self")[0] == lse.MaskSpec(
        True
    )
    additive = torch.zeros(1, 1, n, n).masked_fill(~causal, torch.finfo(torch.float32).min)
    assert lse.layer_spec(dataclasses.replace(cap, mask=additive), res.layout, 0, "self")[0] is not None
    alibi_like = additive.clone()
    alibi_like[..., 5, 2] = -0.5  # a bias, not a mask: scores are no longer scale * q.k
    assert lse.layer_spec(dataclasses.replace(cap, mask=alibi_like), res.layout, 0, "self") == (None, "mask")
    hole = causal.clone()
    hole[..., 7, 3] = False
    assert lse.layer_spec(dataclasses.replace(cap, mask=hole), res.layout, 0, "self") == (None, "mask")
    res = res.with_capture(0, dataclasses.replace(cap, mask=hole))
    fast, dense = M.head_metrics(res), M.head_metrics(res, computation="dense")
    assert fast.paths[0] == "dense: mask"
    assert_same(fast, dense, 1e-4)


def test_eager_results_use_the_dense_definitions():
    res = attnviz.extract(tiny.loaded("qwen3"), TEXT, path="eager")
    assert set(M.head_metrics(res).paths) == {"dense: eager result"}


@pytest.mark.parametrize("arch", ["llama-gqa", "mistral-sliding", "bart"])
def test_induction_fast_equals_dense(arch):
    probe = M.induction_probe(sharp(arch), length=30, seed=1)
    for stack in probe.result.layout.stacks:
        if stack == "cross":
            continue
        fast = M.head_induction(probe, stack=stack)
        dense = M.head_induction(probe, stack=stack, dense=True)
        assert np.abs(fast - dense).max() < 1e-5
        if arch == "mistral-sliding":  # a window of 4 keys never reaches the first copy
            assert fast.max() == 0.0
        else:
            assert fast.max() > 0.01


def test_bf16_inputs_differences_are_measured():
    """bf16 Q/K: the fast path works in float32 from the bf16 values; the dense path rounds each
    score to bf16 before its float32 softmax. The gap is that rounding, not a bug: measured
    ~4e-4 (entropy, probabilities), 0.01 tokens (distance) on the tiny model; bound 4e-3."""
    lm0 = sharp("llama-gqa")
    model = copy.deepcopy(lm0.model).to(torch.bfloat16)
    lm = attnviz.wrap_model(model, lm0.tokenizer, spec="tiny-llama-bf16")
    res = attnviz.extract(lm, TEXT)
    assert res.captured(0).query.dtype == torch.bfloat16
    fast, dense = M.head_metrics(res), M.head_metrics(res, computation="dense")
    assert fast.paths == ("fused",) * 3
    errs = assert_same(fast, dense, 4e-3)
    print("bf16 max |fast - dense|:", {k: f"{v:.1e}" for k, v in errs.items()})


@pytest.mark.slow
def test_smollm2_fast_equals_dense(smollm):
    lm = smollm  # the CPU float32 fixture: what this asserts (device="auto" is CUDA bf16 on a GPU)
    res = attnviz.extract(lm, TEXT * 3)
    fast = M.head_metrics(res)
    dense = M.head_metrics(res, computation="dense")
    assert fast.paths == ("fused",) * 30
    errs = assert_same(fast, dense, 1e-4)
    print("smollm2 float32 max |fast - dense|:", {k: f"{v:.1e}" for k, v in errs.items()})
    probe = M.induction_probe(lm, length=50)
    assert np.abs(M.head_induction(probe) - M.head_induction(probe, dense=True)).max() < 1e-4


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_smollm2_fast_equals_dense_on_cuda_bf16():
    """The built-in model as a GPU machine loads it (CUDA, bf16): bf16 tolerances (product_checks.py)."""
    lm = attnviz.load_model("smollm2-135m")
    assert lm.device.type == "cuda" and lm.dtype == torch.bfloat16
    res = attnviz.extract(lm, TEXT * 3)
    fast, dense = M.head_metrics(res), M.head_metrics(res, computation="dense")
    assert fast.paths == ("fused",) * 30
    errs = assert_same(fast, dense, TOL[torch.bfloat16][0])
    print("smollm2 CUDA bf16 max |fast - dense|:", {k: f"{v:.1e}" for k, v in errs.items()})
    probe = M.induction_probe(lm, length=50)
    assert (
        np.abs(M.head_induction(probe) - M.head_induction(probe, dense=True)).max() < TOL[torch.bfloat16][2]
    )


@pytest.mark.parametrize("model_type", ["gpt_oss", "falcon", "jamba", "gemma3_text", "phi3", "olmo2", "gptj"])
def test_fast_equals_dense_on_more_families(model_type):
    """Families from tests/archs.py: learned sinks (GPT-OSS) must fall back, hybrids keep their
    attention layers, everything else equals the dense definitions (statistics and rollout)."""
    import archs
    import transformers as tf

    from attnviz.analysis import rollout as R

    kind = archs.mapping_names().get(model_type, "causal")
    model, _ = archs.build(model_type, kind)
    tok = tf.PreTrainedTokenizerFast(tokenizer_object=archs._tokenizer(), pad_token="<pad>")
    lm = attnviz.wrap_model(model, tok, spec=f"tiny-{model_type}")
    res = attnviz.extract_ids(lm, [3 + (i * 37) % 300 for i in range(40)])
    fast, dense = M.head_metrics(res), M.head_metrics(res, computation="dense")
    assert_same(fast, dense, 1e-4)
    roll = R.token_rollout(res, sink_aware=True)
    want = R.token_rollout(res, sink_aware=True, computation="dense")
    assert np.abs(roll.sources - want.sources).max() < 1e-5
    if model_type == "gpt_oss":
        assert set(fast.paths) == {"dense: captured sinks"} and set(roll.paths) == {"dense: captured sinks"}
    print(model_type, res.path if hasattr(res, "path") else "", sorted(set(fast.paths)))
