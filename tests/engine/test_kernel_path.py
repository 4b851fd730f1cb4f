"""The hybrids' kernel path (issue 39 item 4): with ``fla``, ``mamba_ssm`` and ``causal_conv1d``
importable, transformers 5.23 binds their functions behind each mixer's core function at import.
The stand-ins of tests/kernel_standins (real signatures, layouts and varlen arguments, computing
with transformers' torch fallbacks) take that same path on CPU: capture must see each kernel
call, name the kernel that ran, and the mixer views must check exact, in float32 and bfloat16."""

from __future__ import annotations

import kernel_path
import pytest
import torch

import attnviz
from attnviz.capture import mixers as mixer_capture
from attnviz.capture.hook import recording

IDS = [3 + (i * 37) % 300 for i in range(40)]  # past every chunk (16) and both kernels' blocks
MODELS = ("qwen3_5", "qwen3_next", "bamba", "falcon_h1", "zamba2", "mamba", "kimi_linear", "lfm2")
# model_type -> (mixer kind, the transformers core function, the package kernel behind it, and
# the package kernels one prefill calls)
BOUND = {
    "qwen3_5_text": ("gated_delta", "torch_chunk_gated_delta_rule",
                     "fla.ops.gated_delta_rule.chunk_gated_delta_rule",
                     {"fla.chunk_gated_delta_rule", "causal_conv1d.causal_conv1d_fn"}),
    "qwen3_next": ("gated_delta", "torch_chunk_gated_delta_rule",
                   "fla.ops.gated_delta_rule.chunk_gated_delta_rule",
                   {"fla.chunk_gated_delta_rule", "causal_conv1d.causal_conv1d_fn"}),
    **{mt: ("mamba2", "mamba2_chunk_scan", "mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined",
            {"mamba_ssm.mamba_chunk_scan_combined", "causal_conv1d.causal_conv1d_fn"})
       for mt in ("bamba", "falcon_h1", "zamba2")},
    "mamba": ("mamba", "mamba_selective_scan", "mamba_ssm.ops.selective_scan_interface.selective_scan_fn",
              {"mamba_ssm.selective_scan_fn", "causal_conv1d.causal_conv1d_fn"}),
    "kimi_linear": ("kimi_delta", "chunk_kimi_delta_attention", "fla.ops.kda.chunk_kda",
                    {"fla.chunk_kda", "causal_conv1d.causal_conv1d_fn"}),
    "lfm2": ("short_conv", "causal_conv1d_fn", "causal_conv1d.causal_conv1d_fn",
             {"causal_conv1d.causal_conv1d_fn"}),
}  # fmt: skip


def test_without_the_packages_the_torch_body_runs_and_is_named_so():
    """(First in this file: the module's stand-ins are not imported yet.)"""
    import sys

    import hybrids_tiny

    assert "fla" not in sys.modules
    res = attnviz.extract_ids(hybrids_tiny.loaded("qwen3_5_text"), IDS, verify=True)
    (check,) = [c for c in res.checks if c.mixer == "gated_delta"]
    assert "→" not in check.against and "torch_chunk_gated_delta_rule" in check.against


def test_leaving_the_kernel_path_leaves_earlier_models_their_attention_maps():
    """(Before the module's fixture enters.) A model built from the original modeling module, then
    a model built under the stand-ins, then the way out: the first model still returns its
    attention probabilities (transformers' output-recording registry is keyed by class name, and
    the fresh class had taken the original's entry: 12 later hybrid tests failed so)."""
    import importlib

    original = {"bamba": importlib.import_module(kernel_path.modeling("bamba"))}
    model = kernel_path.tiny_model(original, "bamba")
    model.set_attn_implementation("eager")
    with kernel_path.kernel_packages("bamba") as modules:
        kernel_path.tiny_model(modules, "bamba")
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([IDS[:8]]), output_attentions=True)
    attentions = [a for a in out.attentions or () if a is not None]
    assert attentions and all(a.shape[-1] == 8 for a in attentions)


@pytest.fixture(scope="module")
def kernels():
    with kernel_path.kernel_packages(*MODELS) as modules:
        yield modules


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("model_type", list(BOUND))
def test_capture_sees_each_kernel_and_the_mixers_check_exact(kernels, model_type, dtype):
    kind, function, kernel, called = BOUND[model_type]
    model = kernel_path.tiny_model(kernels, model_type, dtype)
    lm = attnviz.wrap_model(model, kernel_path.tiny.tokenizer(), spec=f"kernels-{model_type}")
    before = len(kernel_path.calls())
    res = attnviz.extract_ids(lm, IDS, verify=True)  # the self-check runs before anything is drawn
    assert set(kernel_path.calls()[before:]) == called  # the package path ran, nothing else
    checks = [c for c in res.checks if c.mixer == kind]
    assert checks and all(c.scale > 1e-3 for c in checks)
    assert all(f"{function} → {kernel}" in c.against for c in checks), checks[0].against
    mixer_capture.install(model)
    with recording({}) as rec, torch.inference_mode():
        model(input_ids=torch.tensor([IDS]), use_cache=False)
    assert rec.mixers and {(r.function, r.implementation) for r in rec.mixers} == {(function, kernel)}
    blocks = [b for b, kinds in enumerate(lm.layout.mixers) if kind in kinds]
    m = res.layer(blocks[0], mixer=kind)
    assert m.shape[-2:] == (len(IDS), len(IDS)) and torch.isfinite(torch.as_tensor(m)).all()


def test_the_decode_kernels_run_and_the_recurrent_step_is_captured(kernels):
    """A cached decode step reaches fused_recurrent_gated_delta_rule and causal_conv1d_update."""
    model = kernel_path.tiny_model(kernels, "qwen3_5_text")
    mixer_capture.install(model)
    ids = torch.tensor([IDS[:20]])
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True)
        before = len(kernel_path.calls())
        with recording({}) as rec:
            step = model(input_ids=torch.tensor([[7]]), past_key_values=out.past_key_values, use_cache=True)
        decode = set(kernel_path.calls()[before:])
        full = model(input_ids=torch.cat([ids, torch.tensor([[7]])], 1), use_cache=False).logits[0, -1]
    assert decode == {
        "fla.fused_recurrent_gated_delta_rule",
        "causal_conv1d.causal_conv1d_update",
    }
    assert {r.implementation for r in rec.mixers} == {
        "fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule"
    }
    assert (step.logits[0, -1] - full).abs().max() < 1e-4


STEP_KERNEL = "mamba_ssm.ops.triton.selective_state_update.selective_state_update"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    ("model_type", "kind", "step"),
    [("mamba", "mamba", "mamba_selective_state_update"), ("bamba", "mamba2", "mamba2_selective_state_update"),
     ("falcon_h1", "mamba2", "mamba2_selective_state_update")],
)  # fmt: skip
def test_the_mamba_decode_step_kernel_is_captured_and_its_rows_check_exact(
    kernels, model_type, kind, step, dtype
):
    """Cached steps reach mamba_ssm's selective_state_update (and causal_conv1d_update); each
    step's record joins the prefill's and its row reproduces what the step kernel returned."""
    from attnviz.mixers import MixerStore

    model = kernel_path.tiny_model(kernels, model_type, dtype)
    mixer_capture.install(model)
    ids = IDS[:20]
    with recording({}) as rec, torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), use_cache=True)
        cache = {k: getattr(out, k) for k in ("cache_params", "past_key_values") if getattr(out, k, None)}
        before = len(kernel_path.calls())
        for i, token in enumerate((7, 9)):
            n = len(ids) + i
            at = {"cache_position": torch.tensor([n]), "position_ids": torch.tensor([[n]])}
            model(input_ids=torch.tensor([[token]]), use_cache=True, **at, **cache)
        decode = set(kernel_path.calls()[before:])
    assert decode == {"mamba_ssm.selective_state_update", "causal_conv1d.causal_conv1d_update"}
    steps = [r for r in rec.mixers if r.function == step]
    assert steps and {r.implementation for r in steps} == {STEP_KERNEL}
    store = MixerStore(rec.mixers, dtype)
    for block in store.blocks(kind):
        check = store.check(block, kind)
        assert f"+ 2 × {step} → " in check.against and STEP_KERNEL in check.against, check.against
        assert store.record(block, kind).output_rows[-2:] == (20, 21)


def test_the_varlen_standins_keep_packed_sequences_apart(kernels):
    """cu_seqlens (fla) and seq_idx (mamba_ssm, causal_conv1d): a packed batch of two equals
    the two sequences run one by one (what the real kernels guarantee)."""
    import sys

    fla = sys.modules["fla"]
    ssd = sys.modules["mamba_ssm.ops.triton.ssd_combined"]
    conv = sys.modules["causal_conv1d"]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 12, 2, 4, generator=g) for _ in range(3))
    gate, beta = -torch.rand(1, 12, 2, generator=g), torch.rand(1, 12, 2, generator=g)
    packed, _ = fla.chunk_gated_delta_rule(q, k, v, gate, beta, cu_seqlens=torch.tensor([0, 5, 12]),
                                           use_qk_l2norm_in_kernel=True)  # fmt: skip
    for a, b in ((0, 5), (5, 12)):
        alone, _ = fla.chunk_gated_delta_rule(*(t[:, a:b] for t in (q, k, v, gate, beta)),
                                              use_qk_l2norm_in_kernel=True)  # fmt: skip
        assert (packed[:, a:b] - alone).abs().max() < 1e-6
    x, dt = torch.randn(1, 12, 2, 4, generator=g), torch.rand(1, 12, 2, generator=g)
    B, C = torch.randn(1, 12, 1, 3, generator=g), torch.randn(1, 12, 1, 3, generator=g)
    A, seq_idx = -torch.rand(2, generator=g), torch.tensor([[0] * 5 + [1] * 7])
    packed = ssd.mamba_chunk_scan_combined(x, dt, A, B, C, 4, seq_idx=seq_idx)
    alone = ssd.mamba_chunk_scan_combined(*(t[:, 5:] for t in (x, dt)), A, B[:, 5:], C[:, 5:], 4)
    assert (packed[:, 5:] - alone).abs().max() < 1e-5
    xc, w = torch.randn(1, 3, 12, generator=g), torch.randn(3, 4, generator=g)
    packed = conv.causal_conv1d_fn(xc, w, seq_idx=seq_idx.int(), activation="silu")
    assert (packed[..., 5:] - conv.causal_conv1d_fn(xc[..., 5:], w, activation="silu")).abs().max() < 1e-6
