"""fla.ops.kda stand-in (Kimi delta attention; not exported from the package root, so
transformers reaches it through its internal path): ``chunk_kda`` and ``fused_recurrent_kda``."""

from __future__ import annotations

import torch
from standin_reference import CALLS, torch_reference, varlen


def _run(name, q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, l2norm):
    body = torch_reference("kimi_linear", name)
    if scale is not None and scale != q.shape[-1] ** -0.5:
        raise NotImplementedError("the stand-in computes with the reference's scale, 1/sqrt(d_k)")

    def one(q, k, v, g, beta, init):
        return body(q, k, v, g=g, beta=beta, initial_state=init, output_final_state=output_final_state,
                    use_qk_l2norm_in_kernel=l2norm)  # fmt: skip

    return varlen(one, (q, k, v, g, beta), 1, cu_seqlens, initial_state, output_final_state)


class ChunkKDAFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, l2norm):
        return _run("chunk_kimi_delta_attention", q, k, v, g, beta, scale, initial_state,
                    output_final_state, cu_seqlens, l2norm)  # fmt: skip


@torch.compiler.disable
def chunk_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    **kwargs,
):
    CALLS.append("fla.chunk_kda")
    return ChunkKDAFunction.apply(
        q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, use_qk_l2norm_in_kernel
    )


def fused_recurrent_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    **kwargs,
):
    CALLS.append("fla.fused_recurrent_kda")
    return _run("recurrent_kimi_delta_attention", q, k, v, g, beta, scale, initial_state,
                output_final_state, cu_seqlens, use_qk_l2norm_in_kernel)  # fmt: skip
