"""The CUDA contract on the CPU: the emulation (tests/engine/cuda_emulation.py) honours PyTorch's own
contract, and the engine's CUDA branches, run through it, do what PyTorch needs and record what
ran. Each test here failed on the defect it guards (planted once, seen to fail, removed)."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from cuda_emulation import GIB, Allocator, emulate, tf32
from sharp_models import TEXT, sharp

import attnviz
from attnviz import backend, limits
from attnviz import metrics as M
from attnviz.analysis import pooling
from attnviz.analysis import rollout as R
from attnviz.exact import fused, lse
from attnviz.exact import statistics as FS
from attnviz.exact.masks import MaskSpec
from attnviz.loading import load

# --- the emulation honours PyTorch's contract ----------------------------------------------


def test_the_seam_and_the_emulation_follow_the_registered_schemas():
    schema = torch.ops.aten._scaled_dot_product_efficient_attention.default._schema
    names = [a.name for a in schema.arguments]
    assert names == [
        "query",
        "key",
        "value",
        "attn_bias",
        "compute_log_sumexp",
        "dropout_p",
        "is_causal",
        "scale",
    ]
    assert [r.name for r in schema.returns] == ["output", "log_sumexp", "philox_seed", "philox_offset"]
    assert [a.kwarg_only for a in schema.arguments][-1] and not any(
        a.kwarg_only for a in schema.arguments[:-1]
    )
    from cuda_emulation import EmulatedCuda

    assert [a.default_value for a in schema.arguments[5:]] == [0.0, False, None]
    for impl in (backend.TorchDevice.efficient_attention, EmulatedCuda.efficient_attention):
        params = list(inspect.signature(impl).parameters.values())[1:]
        assert [p.name for p in params] == names and params[-1].kind is inspect.Parameter.KEYWORD_ONLY
        assert [p.default for p in params[5:]] == [0.0, False, None]
    cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default._schema
    assert [a.name for a in cpu.arguments][:5] == ["query", "key", "value", "dropout_p", "is_causal"]
    for impl in (backend.TorchDevice.cpu_flash_attention, EmulatedCuda.cpu_flash_attention):
        assert list(inspect.signature(impl).parameters)[1:6] == [a.name for a in cpu.arguments][:5]
    assert {a.name for a in cpu.arguments if a.kwarg_only} == {"attn_mask", "scale"}


def test_emulated_efficient_kernel_matches_pytorch_math():
    """Output, L (float32, padded to 32 rows with +inf), top-left causal, bias, masked rows."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 40, 8), torch.randn(2, 3, 50, 8), torch.randn(2, 3, 50, 12)
    bias = torch.randn(1, 3, 40, 52)[..., :50]  # its rows 4-aligned, as SDPA pads them
    bias[0, 1, 7] = float("-inf")  # one fully masked row
    with emulate() as cuda:
        out, lse_, *_ = backend.backend().efficient_attention(q, k, v, bias, True, 0.0, True, scale=0.3)
    s = (q.double() @ k.double().transpose(-1, -2)) * 0.3 + bias.double()
    s = s.masked_fill(torch.ones(40, 50, dtype=torch.bool).triu(1), float("-inf"))  # from the top left
    want = torch.logsumexp(s, -1)
    assert out.shape == (2, 3, 40, 12) and out.dtype == q.dtype
    assert (
        lse_.shape == (2, 3, 64)
        and lse_.dtype == torch.float32
        and torch.isinf(lse_[..., 40:]).all()
        and (lse_[..., 40:] > 0).all()
    )
    assert torch.allclose(
        lse_[..., :40].double()[torch.isfinite(want)], want[torch.isfinite(want)], atol=1e-5
    )
    assert lse_[0, 1, 7] == float("-inf") and (out[:, 1, 7] == 0).all()
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=bias.masked_fill(torch.ones(40, 50, dtype=torch.bool).triu(1), float("-inf")),
        scale=0.3,
    )
    ok = torch.isfinite(want)[..., None].expand_as(out)
    assert torch.allclose(out[ok], sdpa[ok], atol=1e-5)
    assert cuda.calls[0].kernel == "aligned_64x64_rf" and cuda.calls[0].lse_rows == 64


def test_emulated_kernel_choice_alignment_and_refusals():
    e = dict(compute_log_sumexp=True)
    with emulate() as cuda:
        run = backend.backend().efficient_attention
        for width, kernel in (
            (64, "aligned_64x64_rf"),
            (128, "aligned_64x128_rf"),
            (132, "aligned_32x128_gmem"),
        ):
            run(
                torch.zeros(1, 2, 4, width),
                torch.zeros(1, 2, 4, width),
                torch.zeros(1, 2, 4, width),
                None,
                **e,
            )
            assert cuda.calls[-1].kernel == kernel
        with pytest.raises(RuntimeError, match="no kernel found to launch"):  # head stride 387: none fits
            t = torch.zeros(1, 2, 3, 129)
            run(t, t, t, None, **e)
        with pytest.raises(RuntimeError, match="query is not correctly aligned"):  # a kernel, then strideM
            t = torch.zeros(1, 2, 4, 129)
            run(t, t, t, None, **e)
        with pytest.raises(RuntimeError, match="not correctly aligned"):
            t = torch.zeros(1, 1, 4, 130)[..., :8]  # strideM 130 % 4
            run(t, t, t, None, **e)
        with pytest.raises(RuntimeError, match="dtype for bias"):
            t = torch.zeros(1, 2, 4, 8)
            run(t, t, t, torch.zeros(1, 2, 4, 4, dtype=torch.bfloat16), **e)
        with pytest.raises(RuntimeError, match="attn_bias is not correctly aligned"):
            run(t, t, t, torch.zeros(1, 2, 4, 6)[..., :4], **e)  # strideM 6
        with pytest.raises(NotImplementedError, match="'CUDA' backend"):
            backend.backend().cpu_flash_attention(t, t, t, 0.0, False, attn_mask=None, scale=1.0)
    with emulate(capability_=(7, 5)), pytest.raises(RuntimeError, match="no kernel"):
        t = torch.zeros(1, 2, 4, 8, dtype=torch.bfloat16)
        backend.backend().efficient_attention(t, t, t, None, True)
    assert backend.efficient_kernel(torch.float32, (9, 0), 128, 129) == "32x128_gmem"
    assert backend.efficient_kernel(torch.bfloat16, (7, 0), 64, 64) is None
    assert backend.alignment(torch.float32, (9, 0)) == 4 and backend.alignment(torch.bfloat16, (8, 0)) == 8
    assert backend.alignment(torch.float16, (7, 0)) == 8 and backend.alignment(torch.float32, (7, 0)) == 1


def test_emulated_memory_and_tf32_contracts():
    with emulate(
        allocator=Allocator(total=80 * GIB, others=5 * GIB, reserved=30 * GIB, allocated=10 * GIB)
    ) as cuda:
        assert cuda.mem_get_info(torch.device("cpu")) == (45 * GIB, 80 * GIB)  # reserved counts as used
        cuda.empty_cache()
        assert cuda.mem_get_info(torch.device("cpu"))[0] == 65 * GIB
        cuda.reset_peak_memory_stats(torch.device("cpu"))
        assert cuda.max_memory_allocated(torch.device("cpu")) == 10 * GIB
    x = torch.tensor([1.0 + 2**-12, 1.0 + 2**-11, -(1.0 + 2**-11), 3.0])
    assert tf32(x).tolist() == [1.0, 1.0 + 2**-10, -(1.0 + 2**-10), 3.0]  # 10 bits, nearest, ties away


# --- the engine's CUDA branches -------------------------------------------------------------


def _qkv(d: int, n: int = 70, h: int = 3, width: int | None = None):
    torch.manual_seed(d)
    w = width or d
    q, k = torch.randn(h, n, w), torch.randn(h, n, w)
    q[..., d:] = 0
    return q, k


@pytest.mark.parametrize("spec", [MaskSpec(True), MaskSpec(False), MaskSpec(True, 5)], ids=str)
def test_head_dim_128_features_take_register_file_kernels_from_one_buffer(spec):
    """d = 128 plus a position column: V is split so every call keeps its output in registers (the
    general kernel is slow), K and V are views of one buffer (padded once), L is sliced to M rows."""
    q, kv = _qkv(128, width=132)  # as `lse._features` lays it out on CUDA: [k, key_pos, 0, 0, 0]
    ref = fused.attend(q, kv, kv, scale=0.1, spec=spec)
    with emulate() as cuda:
        got = fused.attend(q, kv, kv, scale=0.1, spec=spec, score_dim=128)
    assert got.path == "fused" and got.lse.shape == (3, 70)
    assert torch.allclose(got.lse, ref.lse, atol=1e-5) and torch.allclose(got.out, ref.out, atol=1e-5)
    assert {c.kernel for c in cuda.calls} == {"aligned_64x128_rf"}
    assert sum(c.lse_rows > 0 for c in cuda.calls) == len(cuda.calls) // 2  # L once per pass
    assert all(c.key_storage == c.value_storage == kv.untyped_storage().data_ptr() for c in cuda.calls)
    with emulate() as one:
        fused.SPLIT_VALUES = False
        try:
            fused.attend(q, kv, kv, scale=0.1, spec=spec, score_dim=128)
        finally:
            fused.SPLIT_VALUES = True
    assert {c.kernel for c in one.calls} == {"aligned_32x128_gmem"}


def test_a_llama_3b_shaped_layer_keeps_one_aligned_buffer_and_rf_kernels():
    """Head dim 128 with GQA (Llama-3.2-3B's attention, 6 heads / 2 KV heads here), bf16 like the
    model: the features are one buffer whose width is 4-aligned, every call of the statistics, the
    LSE and the rollout keys takes a register-file kernel, and the numbers equal the CPU's."""
    from attnviz.records import CapturedAttention

    torch.manual_seed(3)
    n = 45
    cap = CapturedAttention(
        module_name="model.layers.0.self_attn",
        query=(torch.randn(1, 6, n, 128) * 0.3).bfloat16(),
        key=(torch.randn(1, 2, n, 128) * 0.3).bfloat16(),
        mask=None, is_causal=True, scaling=128**-0.5,
    )  # fmt: skip
    ref = lse.layer_pass(cap, MaskSpec(True))
    with emulate() as cuda:
        got = lse.layer_pass(cap, MaskSpec(True))
        lse_rest, path = lse.lse_without_first(cap, MaskSpec(True))
    assert got.source == path == "fused" and {c.kernel for c in cuda.calls} == {"aligned_64x128_rf"}
    assert all(c.key_storage == c.value_storage for c in cuda.calls)  # K and V: views of one buffer
    for a, b in ((got.lse, ref.lse), (got.cross, ref.cross), (got.e_pos, ref.e_pos)):
        assert torch.allclose(a, b, atol=1e-4)
    assert torch.isfinite(lse_rest[:, 1:]).all() and (lse_rest[:, 0] == float("-inf")).all()


def test_unaligned_head_dims_bias_buffers_and_offset_rows_on_cuda():
    q, k = _qkv(6, n=41)  # head dim 6: not a multiple of 4, padded once (K is Q's copy when k is q)
    kb = torch.randn(3, 41)
    for spec, offset in (
        (MaskSpec(True), 0),
        (MaskSpec(True, 4), 0),
        (MaskSpec(True), -1),
        (MaskSpec(False), 0),
    ):
        ref = fused.attend(q, k, k, scale=0.4, spec=spec, q_offset=offset, key_bias=kb)
        want = fused.blocked(q, k, k, 0.4, spec, offset, kb)
        with emulate() as cuda:
            got = fused.attend(q, k, k, scale=0.4, spec=spec, q_offset=offset, key_bias=kb)
        assert got.path == "fused", got.path
        assert torch.allclose(got.lse, want[1], atol=1e-5) and torch.allclose(got.out, want[0], atol=1e-5)
        seen = torch.isfinite(want[1])  # the CPU kernel reports L = 0 on a row that sees no key
        assert torch.allclose(got.lse[seen], ref.lse[seen], atol=1e-5)
        assert all(
            c.bias is not None and c.bias[-2:] in ((41, 41), (c.query[2], c.value[2])) for c in cuda.calls
        )


def test_only_documented_refusals_fall_back_and_the_fallback_is_recorded():
    q, k = _qkv(8)
    with emulate(fail=RuntimeError("cutlassF: no kernel found to launch!")):
        got = fused.attend(q, k, k, scale=0.2, spec=MaskSpec(True))
    assert got.path == "blocked: no efficient kernel for this head size"
    assert torch.allclose(got.lse, fused.attend(q, k, k, scale=0.2, spec=MaskSpec(True)).lse, atol=1e-5)
    for err in (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                RuntimeError("shape '[3, 70, 9]' is invalid for input of size 100")):  # fmt: skip
        with emulate(fail=err), pytest.raises(type(err)):
            fused.attend(q, k, k, scale=0.2, spec=MaskSpec(True))
    res = attnviz.extract(sharp("bart"), TEXT)
    with emulate(refuse="attn_bias is not correctly aligned (strideM)"):
        hm = M.head_metrics(res, stack="encoder")
        roll = R.token_rollout(res, stack="encoder", sink_aware=True)
        pv = pooling.pooled(attnviz.extract(sharp("llama-gqa"), TEXT), 1, cells=8)
    why = "blocked: inputs not aligned for the efficient kernel"
    assert set(hm.paths) == {why} and set(roll.paths) == {why} and pv.path == why
    dense = M.head_metrics(res, stack="encoder", computation="dense")
    assert np.abs(hm.entropy - dense.entropy).max() < 1e-4  # exact, just slower
    with emulate():
        assert set(M.head_metrics(res, stack="encoder").paths) == {"fused"}


def test_free_cuda_memory_counts_the_allocators_cache():
    lay = sharp("llama-gqa").layout
    with emulate(allocator=Allocator(total=80 * GIB, reserved=40 * GIB, allocated=8 * GIB)) as cuda:
        dev = torch.device("cpu")  # stands for the GPU
        assert limits.free_bytes(dev) == 72 * GIB  # driver free 40 + cached 32
        budget = limits.token_budget(lay, dev, torch.bfloat16)
        limits.require(int(50 * GIB), dev, what="a pass", hint="less")  # 50 <= 0.8 * 72
        cuda.allocator.allocated = 40 * GIB  # the cache is in use now
        assert limits.free_bytes(dev) == 40 * GIB and limits.token_budget(lay, dev, torch.bfloat16) < budget
        with pytest.raises(attnviz.errors.OutOfMemory, match="40 GiB free"):
            limits.require(int(50 * GIB), dev, what="a pass", hint="less")


def test_scores_and_cross_terms_stay_ieee_fp32_when_the_user_enables_tf32():
    torch.manual_seed(0)
    q, k = torch.randn(2, 30, 64) * 3, torch.randn(2, 30, 64) * 3
    want = (q.double() @ k.double().transpose(-1, -2)) * 0.125
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        with emulate() as cuda:
            assert (
                cuda.matmul(q, k.transpose(-1, -2)).double() * 0.125 - want
            ).abs().max() > 1e-3  # TF32 is on
            s = fused.scores_tile(q, k, 0.125, MaskSpec(False), 0, 0)
            c = FS.cross_terms(q, k, 0.125, 2)
        assert torch.backends.cuda.matmul.allow_tf32  # restored
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    assert (s.double() - want).abs().max() < 1e-4
    want_c = FS.cross_terms(q.double(), k.double(), 0.125, 2)
    assert (c.double() - want_c).abs().max() < 1e-4


@pytest.mark.slow
def test_ieee_guard_with_the_new_precision_api():
    """A user who set ``fp32_precision = "tf32"`` (the new API, which forbids reading the legacy
    flag afterwards) gets IEEE inside the guard and their setting back after (own process)."""
    code = (  # the seam module alone (it imports only torch): a fresh process in a few seconds
        "import importlib.util, torch\n"
        f"spec = importlib.util.spec_from_file_location('backend', {backend.__file__!r})\n"
        "backend = importlib.util.module_from_spec(spec); spec.loader.exec_module(backend)\n"
        "torch.backends.cuda.matmul.fp32_precision = 'tf32'\n"
        "with backend.ieee_fp32():\n    assert torch.backends.cuda.matmul.fp32_precision == 'ieee'\n"
        "assert torch.backends.cuda.matmul.fp32_precision == 'tf32' and backend.tf32_enabled()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_extract_times_the_work_not_its_queueing():
    lm = sharp("gpt2")
    with emulate() as cuda:
        slow = cuda.synchronize

        def sync(device):  # the queued kernels finish only now
            time.sleep(0.3)
            slow(device)

        cuda.synchronize = sync  # type: ignore[method-assign]
        res = attnviz.extract(lm, TEXT)
    assert cuda.synced == [lm.device] and res.seconds >= 0.3


def test_the_forwards_flash_call_stays_on_the_cpu():
    """On CUDA the layer keeps its own SDPA call; the statistics take the second (efficient) pass."""
    with emulate() as cuda:
        res = attnviz.extract(sharp("llama-gqa"), TEXT, statistics=True)
        assert all(lse.captured(res, "self", i).forward is None for i in range(res.n_layers()))
        assert M.head_metrics(res).paths == ("fused",) * 3 and cuda.calls


def test_rollout_moves_r_to_each_layers_device(monkeypatch):
    """Layers on different GPUs (device_map="auto"): r must follow each layer's device. Layer 1 is
    put on the "meta" device; the stub raises as CUDA does when r is elsewhere."""
    res = attnviz.extract(sharp("llama-gqa"), TEXT)
    caps = [lse.captured(res, "self", i) for i in range(3)]
    moved = [c if i != 1 else dataclasses.replace(c, query=c.query.to("meta")) for i, c in enumerate(caps)]
    monkeypatch.setattr(R, "captured", lambda result, stack, layer: moved[layer])
    seen = []

    def transposed(cap, spec, r, residual, sink_aware):
        if r.device != cap.query.device:
            raise RuntimeError(
                f"Expected all tensors to be on the same device, {r.device} and {cap.query.device}"
            )
        seen.append(r.device.type)
        n = r.shape[0]
        return torch.full((n,), 1.0 / n), torch.full((n,), 1.0 / n), "fused"

    monkeypatch.setattr(R, "_transposed", transposed)
    roll = R.token_rollout(res)
    assert seen == ["cpu", "meta", "cpu"] and roll.sources.shape == (3, res.n_tokens)


def test_an_explicit_cuda_index_pins_the_whole_model(monkeypatch, tmp_path):
    assert load.device_map(torch.device("cuda")) == "auto"
    assert load.device_map(torch.device("cuda", 1)) == {"": 1}
    import transformers as tf

    tf.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                   num_attention_heads=2).save_pretrained(tmp_path)  # fmt: skip
    monkeypatch.setattr(load, "resolve_device", lambda device: torch.device("cuda", 1))
    monkeypatch.setattr(load, "resolve_dtype", lambda dtype, dev: torch.bfloat16)
    seen = {}

    class Auto:
        @staticmethod
        def from_pretrained(where, **kwargs):
            seen.update(kwargs)
            raise RuntimeError("stop here")

    monkeypatch.setattr(load, "auto_class", lambda kind, config: Auto)
    with pytest.raises(attnviz.errors.AttnvizError):
        load.load_model(str(tmp_path), device="cuda:1")
    assert seen["device_map"] == {"": 1}
