"""mamba_ssm.ops.triton.ssd_combined stand-in: ``mamba_chunk_scan_combined`` over
(B, L, H, P) with varlen ``seq_idx`` / ``cu_seqlens``, and the training-only fused
``mamba_split_conv1d_scan_combined``."""

from __future__ import annotations

import torch
from standin_reference import CALLS, cu_from_seq_idx, torch_reference, varlen


class MambaChunkScanCombinedFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dt, A, B, C, chunk_size, D, dt_bias, initial_states, cu_seqlens, dt_softplus,
                dt_limit, return_final_states):  # fmt: skip
        body = torch_reference("bamba", "mamba2_chunk_scan")

        def one(x, dt, B, C, init):
            got = body(x, dt, A, B, C, chunk_size, D=D, dt_bias=dt_bias, initial_states=init,
                       dt_softplus=dt_softplus, dt_limit=dt_limit, return_final_states=True)  # fmt: skip
            return got

        out, state = varlen(one, (x, dt, B, C), 1, cu_seqlens, initial_states, return_final_states)
        return (out, state) if return_final_states else out


def mamba_chunk_scan_combined(
    x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
    chunk_indices=None, chunk_offsets=None, cu_seqlens=None, dt_softplus=False,
    dt_limit=(0.0, float("inf")), return_final_states=False, return_varlen_states=False,
):  # fmt: skip
    CALLS.append("mamba_ssm.mamba_chunk_scan_combined")
    if z is not None or return_varlen_states:
        raise NotImplementedError("stand-in: z inside the scan and varlen states are not modelled")
    if cu_seqlens is None:
        cu_seqlens = cu_from_seq_idx(seq_idx)
    return MambaChunkScanCombinedFn.apply(x, dt, A, B, C, chunk_size, D, dt_bias, initial_states, cu_seqlens,
                                          dt_softplus, dt_limit, return_final_states)  # fmt: skip


def mamba_split_conv1d_scan_combined(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
                                     initial_states=None, seq_idx=None, dt_limit=(0.0, float("inf")),
                                     return_final_states=False, activation="silu", rmsnorm_weight=None,
                                     rmsnorm_eps=1e-6, outproj_weight=None, outproj_bias=None, headdim=None,
                                     ngroups=1, norm_before_gate=True):  # fmt: skip
    """Training only in transformers (``self.training and cache_params is None``)."""
    CALLS.append("mamba_ssm.mamba_split_conv1d_scan_combined")
    raise NotImplementedError("stand-in: the fused training path is not modelled")
