"""The delta rule's chunked scan (`attnviz.mixers.delta.chunked_rows`, and the plain backward
scan `scan_rows`) against the token-by-token reference (`attnviz.reference.mixers`: the UT
closed form, itself held to the recurrence), over generated shapes, chunk sizes and rows, with
N across chunk boundaries. No model: the parts (q, k, decays, β) are drawn."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st
from property_settings import examples

from attnviz.mixers.delta import chunked_rows, scan_rows
from attnviz.reference.mixers import gdn_closed_form, gdn_recurrence


@st.composite
def delta_problems(draw):
    n = draw(st.integers(1, 40))
    heads = draw(st.integers(1, 3))
    d = draw(st.integers(1, 6))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    q = torch.randn(n, heads, d, generator=g, dtype=torch.float64)
    k = torch.nn.functional.normalize(torch.randn(n, heads, d, generator=g, dtype=torch.float64), dim=-1)
    # slow decays (0.9..1): a row still reads keys many chunks back
    alpha = 0.9 + 0.1 * torch.rand(n, heads, generator=g, dtype=torch.float64)
    beta = torch.rand(n, heads, generator=g, dtype=torch.float64)
    parts = {"q": q, "k": k, "a": alpha[..., None].expand(n, heads, d), "beta": beta}
    rows = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True).map(sorted))
    chunk = draw(st.integers(1, 12))
    return parts, alpha, torch.tensor(rows), chunk


@examples(80)
@given(problem=delta_problems())
def test_chunked_scan_rows_equal_the_token_by_token_reference(problem):
    """Property: for any N, heads, head size, chunk size and set of rows, the chunked scan's rows
    and the plain scan's rows equal the reference matrix's rows (float64, 1e-10), and the
    reference's matrix reproduces the recurrence's outputs. Regime: slow decays (α in 0.9..1,
    so keys many chunks back weigh), chunks of 1..12 tokens so N up to 40 crosses many chunk
    boundaries and ends mid-chunk."""
    parts, alpha, rows, chunk = problem
    q, k, beta = parts["q"], parts["k"], parts["beta"]
    heads = list(range(q.shape[1]))
    chunked = chunked_rows(parts, heads, rows, chunk=chunk)
    plain = scan_rows(parts, heads, rows)
    for h in heads:
        ref = gdn_closed_form(q[:, h], k[:, h], alpha[:, h], beta[:, h])
        torch.testing.assert_close(chunked[h], ref[rows], atol=1e-10, rtol=1e-9)
        torch.testing.assert_close(plain[h], ref[rows], atol=1e-10, rtol=1e-9)
        v = torch.eye(q.shape[0], dtype=torch.float64)[:, : min(4, q.shape[0])]
        out, _ = gdn_recurrence(q[:, h], k[:, h], v, alpha[:, h], beta[:, h])
        torch.testing.assert_close(ref @ v, out, atol=1e-10, rtol=1e-9)
