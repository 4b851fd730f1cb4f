"""The routes' score of a signed part (`attnviz.explain.route_parts.signed_importances`) equals the
literal max(‖w‖₁ − ‖w − p‖₁, 0) for any whole and parts: the cheap s · p where no component of p
can flip a sign of w, the part made in full where one may (zeros in w, parts larger than w, mixed
signs: a mixer's A is signed). No model: random float64 vectors, scored in float32."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st
from property_settings import examples

from attnviz.explain.route_parts import signed_importances


@examples(120)
@given(
    seed=st.integers(0, 2**31 - 1),
    n_targets=st.integers(1, 4),
    n_parts=st.integers(1, 12),
    d=st.integers(1, 24),
    part_scale=st.sampled_from([1e-3, 0.1, 1.0, 10.0]),
    zeros=st.integers(0, 3),
)
def test_the_score_is_the_literal_definition(seed, n_targets, n_parts, d, part_scale, zeros):
    g = torch.Generator().manual_seed(seed)
    whole = torch.randn(n_targets, d, generator=g)
    whole[:, :zeros] = 0.0  # a zero component: any part "flips" it
    parts = torch.randn(n_targets, n_parts, d, generator=g) * part_scale
    sign = torch.where(whole >= 0, 1.0, -1.0)
    lin = (parts * sign[:, None]).sum(-1)  # s · p
    bound = parts.abs().amax(-1) * (1 + 1e-5)
    made = []

    def make(t, p):
        made.append(len(t))
        return parts[t, p]

    got = signed_importances(whole, lin, bound, make)
    literal = (whole.abs().sum(-1)[:, None] - (whole[:, None] - parts).abs().sum(-1)).clamp(min=0)
    torch.testing.assert_close(got, literal, atol=1e-5 * d, rtol=1e-5)
    # only parts that may flip a sign are made: none when every part is below every |w_i|
    small = bound < whole.abs().amin(-1, keepdim=True)
    assert sum(made) == int((~small).sum())
