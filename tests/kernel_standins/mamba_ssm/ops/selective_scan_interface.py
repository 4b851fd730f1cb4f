"""mamba_ssm.ops.selective_scan_interface stand-in: ``selective_scan_fn`` over (B, D, L)
(an autograd Function, as the real one) and the training-only fused ``mamba_inner_fn``."""

from __future__ import annotations

import torch
from standin_reference import CALLS, torch_reference


class SelectiveScanFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state):
        body = torch_reference("mamba", "mamba_selective_scan")
        return body(u, delta, A, B, C, D=D, z=z, delta_bias=delta_bias, delta_softplus=delta_softplus,
                    return_last_state=return_last_state)  # fmt: skip


def selective_scan_fn(
    u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, return_last_state=False
):
    CALLS.append("mamba_ssm.selective_scan_fn")
    return SelectiveScanFn.apply(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state)


def mamba_inner_fn(xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight, out_proj_weight,
                   out_proj_bias, A, B=None, C=None, D=None, delta_bias=None, B_proj_bias=None,
                   C_proj_bias=None, delta_softplus=True, checkpoint_lvl=1, b_rms_weight=None,
                   c_rms_weight=None, dt_rms_weight=None, b_c_dt_rms_eps=1e-6):  # fmt: skip
    """Training only in transformers (``self.training and cache_params is None``)."""
    CALLS.append("mamba_ssm.mamba_inner_fn")
    raise NotImplementedError(
        "stand-in: the fused training path (conv, scan and out_proj in one) is not modelled"
    )
