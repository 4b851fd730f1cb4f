"""mamba_ssm.ops.triton.selective_state_update stand-in (one decode step; state updated in
place): (B, D) per channel (Mamba-1) or (B, H, P) per head (Mamba-2)."""

from __future__ import annotations

from standin_reference import CALLS, torch_reference


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                           state_batch_indices=None):  # fmt: skip
    CALLS.append("mamba_ssm.selective_state_update")
    if state_batch_indices is not None:
        raise NotImplementedError("stand-in: state_batch_indices are not modelled")
    body = torch_reference(*(("mamba", "mamba_selective_state_update") if x.dim() == 2
                             else ("mamba2", "mamba2_selective_state_update")))  # fmt: skip
    return body(state, x, dt, A, B, C, D=D, dt_bias=dt_bias, dt_softplus=dt_softplus, z=z)
