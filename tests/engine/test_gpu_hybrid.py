"""`make gpu-check`'s hybrid rows (attnviz/bench/gpu_hybrid.py): each row names the kernel that
transformers bound behind every mixer (read here through the stand-in packages of
tests/kernel_standins), checks the mixers in bf16, and the rows skip cleanly without CUDA."""

from __future__ import annotations

import kernel_path
import pytest
import torch
from cuda_emulation import emulate

from attnviz.bench import gpu_hybrid

N = 40


def test_without_cuda_no_row_runs_and_the_report_says_why():
    found, why = gpu_hybrid.rows()  # the real seam: this machine has no CUDA
    assert found == [] and "no CUDA GPU" in why
    assert gpu_hybrid.markdown(found, why) == "Hybrid rows: no CUDA GPU: the hybrid rows were not run."


@pytest.fixture(scope="module")
def kernels():
    with kernel_path.kernel_packages("qwen3_5", "bamba") as modules:
        yield modules


@pytest.mark.parametrize(
    ("model_type", "bound"),
    [
        ("qwen3_5_text", {"torch_chunk_gated_delta_rule": "fla.ops.gated_delta_rule.chunk_gated_delta_rule",
                          "torch_recurrent_gated_delta_rule":
                          "fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule"}),
        ("bamba", {"mamba2_chunk_scan": "mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined",
                   "mamba2_selective_state_update":
                   "mamba_ssm.ops.triton.selective_state_update.selective_state_update"}),
    ],
)  # fmt: skip
def test_a_row_names_the_kernels_that_ran_and_checks_the_mixers_in_bf16(kernels, model_type, bound):
    model = kernel_path.tiny_model(kernels, model_type, torch.bfloat16)
    lm = gpu_hybrid.wrap_model(model, kernel_path.tiny.tokenizer(), spec=f"kernels-{model_type}")
    row = gpu_hybrid.row(model_type, lm, N, repeats=1)
    assert row.kernels == bound and not row.failures, row.failures
    assert row.checks and row.floor_s > 0 and row.extract_s > 0
    kind = "gated_delta" if model_type == "qwen3_5_text" else "mamba2"
    assert row.decode_s > 0 and row.decode_checks
    assert all(c.startswith(f"{kind}: ") for c in row.decode_checks)
    text = gpu_hybrid.markdown([row])
    assert all(f"{f} → {k}" in text for f, k in bound.items()) and "torch body" not in text


def test_a_torch_body_is_noted_and_a_failed_row_is_a_failure():
    ok = gpu_hybrid.HybridRow("Qwen3.5-shaped", 1024, 0.1, 0.12, {"torch_chunk_gated_delta_rule": ""}, ["x"])
    bad = gpu_hybrid.HybridRow("Bamba-shaped", 1024, failures=["Bamba-shaped 1024: MixerCheckFailed: ..."])
    text = gpu_hybrid.markdown([ok, bad])
    assert "torch_chunk_gated_delta_rule → torch body" in text and "install flash-linear-attention" in text
    assert "- FAILURE: Bamba-shaped 1024: MixerCheckFailed" in text
    assert gpu_hybrid.failures([ok, bad]) == ["Bamba-shaped 1024: MixerCheckFailed: ..."]


@pytest.mark.slow
def test_the_rows_on_the_emulated_device():
    """The real-size Qwen3.5- and Bamba-shaped bf16 models through `rows`, at 32 tokens."""
    with emulate():
        found, why = gpu_hybrid.rows((32,), repeats=1)
    assert not why and [r.model for r in found] == list(gpu_hybrid.MODELS)
    assert not gpu_hybrid.failures(found) and all(r.checks for r in found)
