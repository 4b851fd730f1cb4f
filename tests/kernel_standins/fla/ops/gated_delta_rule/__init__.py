"""fla.ops.gated_delta_rule stand-in: ``chunk_gated_delta_rule`` (an autograd Function behind
``torch.compiler.disable``, as fla's) and ``fused_recurrent_gated_delta_rule``."""

from __future__ import annotations

import torch
from standin_reference import CALLS, torch_reference, varlen


def _run(name: str, q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, l2norm):
    body = torch_reference("qwen3_next", name)
    if scale is not None and scale != q.shape[-1] ** -0.5:
        raise NotImplementedError("the stand-in computes with the reference's scale, 1/sqrt(d_k)")

    def one(q, k, v, g, beta, init):
        return body(q, k, v, g, beta, initial_state=init, output_final_state=output_final_state,
                    use_qk_l2norm_in_kernel=l2norm)  # fmt: skip

    return varlen(one, (q, k, v, g, beta), 1, cu_seqlens, initial_state, output_final_state)


class ChunkGatedDeltaRuleFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, l2norm):
        return _run("torch_chunk_gated_delta_rule", q, k, v, g, beta, scale, initial_state,
                    output_final_state, cu_seqlens, l2norm)  # fmt: skip


@torch.compiler.disable
def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    **kwargs,
):
    CALLS.append("fla.chunk_gated_delta_rule")
    return ChunkGatedDeltaRuleFunction.apply(
        q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, use_qk_l2norm_in_kernel
    )


def fused_recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
):
    CALLS.append("fla.fused_recurrent_gated_delta_rule")
    if g is None:
        g = torch.zeros(q.shape[:3], dtype=torch.float32, device=q.device)
    if beta is None:
        beta = torch.ones(q.shape[:3], dtype=q.dtype, device=q.device)
    return _run("torch_recurrent_gated_delta_rule", q, k, v, g, beta, scale, initial_state,
                output_final_state, cu_seqlens, use_qk_l2norm_in_kernel)  # fmt: skip
