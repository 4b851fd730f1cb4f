"""Every mixer kind of `attnviz.mixers.kinds.MIXERS` that attnviz rebuilds (``rows`` per head or
``contributions`` per channel) against its token-by-token form, over generated shapes (heads,
d_head, state size, channels, N up to 40), chunk sizes where the kind streams by chunks, and rows.

No model: each test draws the record's ``parts`` dict (float64) directly (RG-LRU's from the
kernel's inputs through its ``parts``, whose cumulative log-decay is the thing to test). Regime:
**slow decays** (per-step decay factors in 0.9..1, or log-decays of at most ~0.1 per step), so a
row still reads keys 40 tokens back and a wrong exponent, a wrong boundary or a wrong last chunk
changes numbers that are not zero.

Two properties per kind:
- its rows (or per-channel contribution norms) equal the oracle's matrix rows (float64, 1e-10);
- the self-check's side, ``reference(parts, rows)``, equals the output of the recurrence run
  token by token (state carried from token to token, skip terms and gates added as the kernel
  does), within the self-check's own tolerance (`RELATIVE_TOLERANCE[float64]` x the output's
  scale); per-channel kinds' ``mixer_output`` (Σ_s c_{t,s} + skip + bias through W_out) too.

Not covered, by design: ``attention`` (softmax; its probabilities are captured, not rebuilt, and
held to eager attention by `attnviz.verify`), ``mlstm`` (not shown: no parts, rows or reference).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from property_settings import examples

from attnviz.mixers.kinds import MIXERS
from attnviz.mixers.store import RELATIVE_TOLERANCE
from attnviz.reference.mixers import ssd_recurrence

F64 = torch.float64
PER_HEAD = ("mamba2", "gated_delta", "kimi_delta", "lightning")
PER_CHANNEL = ("mamba", "rwkv", "rglru", "short_conv")
NOT_REBUILT = {"attention": "softmax, captured not rebuilt", "mlstm": "not shown"}


def _within_self_check(got: torch.Tensor, want: torch.Tensor) -> None:
    """The self-check's rule (`MixerStore`): max |Δ| ≤ rel · max(scale, 1e-6), float64's rel."""
    diff, scale = float((got - want).abs().max()), float(want.abs().max())
    allowed = RELATIVE_TOLERANCE[F64] * max(scale, 1e-6)
    assert diff <= allowed, f"max |Δ| {diff:.2e} > allowed {allowed:.2e} (scale {scale:.2e})"


@st.composite
def shapes(draw, max_d: int = 5):
    """(n, heads, d, seed, rows): N up to 40, rows a sorted unique subset that may include N-1."""
    n = draw(st.integers(1, 40))
    heads = draw(st.integers(1, 3))
    d = draw(st.integers(1, max_d))
    seed = draw(st.integers(0, 2**16))
    rows = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=8, unique=True).map(sorted))
    return n, heads, d, torch.Generator().manual_seed(seed), torch.tensor(rows)


def _rand(g, *shape):
    return torch.randn(*shape, generator=g, dtype=F64)


def _uniform(g, lo, hi, *shape):
    return lo + (hi - lo) * torch.rand(*shape, generator=g, dtype=F64)


# ---- per head -------------------------------------------------------------------------------


def _delta_recurrence(parts: dict, h: int) -> torch.Tensor:
    """o_t = S_tᵀ q_t with S_t = (I − β_t k_t k_tᵀ) Diag(a_t) S_{t−1} + β_t k_t v_tᵀ, token by token."""
    q, k, a, beta, v = (parts[n][:, h] for n in ("q", "k", "a", "beta", "v"))
    state = torch.zeros(k.shape[1], v.shape[1], dtype=F64)
    out = []
    for t in range(q.shape[0]):
        state = a[t][:, None] * state
        state = state - beta[t] * torch.outer(k[t], k[t] @ state) + beta[t] * torch.outer(k[t], v[t])
        out.append(state.T @ q[t])
    return torch.stack(out)


def _lightning_recurrence(parts: dict, h: int) -> torch.Tensor:
    """o_t = S_tᵀ q_t with S_t = e^{-λ_h} S_{t−1} + k_t v_tᵀ."""
    q, k, v = (parts[n][:, h] for n in ("q", "k", "v"))
    state = torch.zeros(k.shape[1], v.shape[1], dtype=F64)
    out = []
    for t in range(q.shape[0]):
        state = torch.exp(-parts["slope"][h]) * state + torch.outer(k[t], v[t])
        out.append(state.T @ q[t])
    return torch.stack(out)


def _per_head_parts(kind: str, n: int, heads: int, d: int, g) -> tuple[dict, object]:
    """The record's parts for ``kind`` and its token-by-token output per head, (parts, h) -> (N, hs)."""
    if kind == "mamba2":
        state = d + 1
        a_h = _uniform(g, -0.1, -0.01, heads)  # A_h Δ in -0.1..-0.001: slow
        dt = _uniform(g, 0.1, 1.0, n, heads)
        parts = {
            "x": _rand(g, n, heads, d),
            "dt": dt,
            "cum": torch.cumsum(a_h * dt, 0),
            "B": _rand(g, n, heads, state),
            "C": _rand(g, n, heads, state),
            "D": _rand(g, heads),
        }

        def ssd(p, h):
            return ssd_recurrence(
                p["x"][:, h], p["B"][:, h], p["C"][:, h], p["dt"][:, h], a_h[h] * p["dt"][:, h], p["D"][h]
            )[0]

        return parts, ssd
    if kind == "lightning":
        parts = {
            "q": _rand(g, n, heads, d),
            "k": _rand(g, n, heads, d),
            "v": _rand(g, n, heads, d),
            "slope": _uniform(g, 0.0, 0.1, heads),
        }
        return parts, _lightning_recurrence
    # the delta rule: GDN one decay per head, KDA one per key channel; keys L2-normalised
    a_shape = (n, heads, 1) if kind == "gated_delta" else (n, heads, d)
    parts = {
        "q": _rand(g, n, heads, d) * d**-0.5,
        "k": torch.nn.functional.normalize(_rand(g, n, heads, d), dim=-1),
        "a": _uniform(g, 0.9, 1.0, *a_shape).expand(n, heads, d),
        "beta": torch.rand(n, heads, generator=g, dtype=F64),
        "v": _rand(g, n, heads, d + 1),
    }
    return parts, _delta_recurrence


@pytest.mark.parametrize("kind", PER_HEAD)
@examples(10)
@given(shape=shapes(), chunk=st.integers(1, 12))
def test_per_head_rows_equal_the_token_by_token_oracle(kind, shape, chunk):
    """Property: for every per-head kind, any N ≤ 40, heads, d_head, state size and rows,
    ``rows(parts, heads, rows)`` (and ``stream_rows`` by chunks of 1..12 tokens, emitted block by
    block, where the kind has one) equal the oracle's rows (float64, 1e-10), and the self-check's
    ``reference`` equals the recurrence's output token by token (A @ values + the skip term)
    within the self-check's tolerance. Regime: slow decays; N across many chunk boundaries."""
    n, heads, d, g, rows = shape
    spec = MIXERS[kind]
    parts, recurrence = _per_head_parts(kind, n, heads, d, g)
    hs = list(range(heads))
    oracle = spec.oracle(parts)[:, rows]  # (nh, T, S)
    torch.testing.assert_close(spec.rows(parts, hs, rows), oracle, atol=1e-10, rtol=1e-9)
    if spec.stream_rows is not None:
        streamed = torch.zeros(heads, len(rows), n, dtype=F64)  # s > t: never emitted, 0

        def emit(idx, lo, hi, block):
            streamed[:, idx, lo:hi] = block

        spec.stream_rows(parts, hs, rows, chunk=chunk, emit=emit)
        torch.testing.assert_close(streamed, oracle, atol=1e-10, rtol=1e-9)
    want = torch.stack([recurrence(parts, h)[rows] for h in hs], dim=1)  # (T, nh, hs)
    _within_self_check(spec.reference(parts, rows), want)
    with_skip = oracle @ parts[spec.values].transpose(0, 1)  # (nh, T, hs)
    if spec.skip:
        with_skip = with_skip + parts[spec.skip][:, None, None] * parts[spec.values][rows].transpose(0, 1)
    _within_self_check(with_skip.transpose(0, 1), want)


# ---- per channel ----------------------------------------------------------------------------


def _per_channel_case(kind: str, n: int, ch: int, d: int, g):
    """(parts, values (S, ch), gate (T, ch), scan, core, inner) where ``scan(v)`` runs the kind's
    recurrence token by token over a batch of value sequences (b, S, ch) -> Σ_s A^c[t,s] v_s,
    ``core`` is the self-check's output rebuilt token by token and ``inner`` what W_out reads."""
    gate = _uniform(g, 0.2, 1.5, n, ch)
    if kind == "mamba":
        parts = {
            "x": _rand(g, n, ch),
            "dt": _uniform(g, 0.1, 1.0, n, ch),
            "A": _uniform(g, -0.1, -0.01, ch, d),
            "B": _rand(g, n, d),
            "C": _rand(g, n, d),
            "D": _rand(g, ch),
            "gate": gate,
        }
        parts["cum"] = torch.cumsum(parts["dt"], 0)

        def scan(v):
            state = torch.zeros(v.shape[0], ch, d, dtype=F64)
            out = []
            for t in range(n):
                dt = parts["dt"][t][:, None]
                state = torch.exp(parts["A"] * dt) * state + dt * parts["B"][t] * v[:, t, :, None]
                out.append(state @ parts["C"][t])
            return torch.stack(out, dim=1)

        y = scan(parts["x"][None])[0] + parts["D"] * parts["x"]
        return parts, parts["x"], gate, scan, y * gate, y * gate
    if kind == "rwkv":
        parts = {
            "k": _rand(g, n, ch),
            "v": _rand(g, n, ch),
            "decay": _uniform(g, 0.0, 0.1, ch),
            "u": _rand(g, ch),
            "gate": gate,
        }

        def scan(v):  # the WKV recurrence: running numerator and denominator
            num = torch.zeros(v.shape[0], ch, dtype=F64)
            den = torch.zeros(ch, dtype=F64)
            out = []
            for t in range(n):
                bonus = torch.exp(parts["u"] + parts["k"][t])
                out.append((num + bonus * v[:, t]) / (den + bonus))
                num = torch.exp(-parts["decay"]) * num + torch.exp(parts["k"][t]) * v[:, t]
                den = torch.exp(-parts["decay"]) * den + torch.exp(parts["k"][t])
            return torch.stack(out, dim=1)

        y = scan(parts["v"][None])[0]
        return parts, parts["v"], gate, scan, y, y * gate
    if kind == "rglru":
        a = _uniform(g, 0.9, 1.0, n, ch)
        x = _rand(g, n, ch)
        parts = MIXERS["rglru"].parts(
            {"hidden_states": x[None], "recurrent_gate": a[None], "gate": gate[None]}
        )

        def scan(v):  # h_t = a_t h_{t-1} + x̃_t, h_{-1} = 0
            state = torch.zeros(v.shape[0], ch, dtype=F64)
            out = []
            for t in range(n):
                state = a[t] * state + v[:, t]
                out.append(state)
            return torch.stack(out, dim=1)

        y = scan(x[None])[0]
        return parts, x, gate, scan, y, y * gate
    # short_conv: kernel size d (1..5); A^c[t,s] = C_t w_{K-1-(t-s)} B_s
    parts = {
        "B": _rand(g, n, ch),
        "C": _rand(g, n, ch),
        "x": _rand(g, n, ch),
        "w": _rand(g, ch, d),
        "bias": _rand(g, ch),
    }

    def conv(v):  # the causal depthwise conv over B ⊙ v, token by token (no bias)
        out = torch.zeros_like(v)
        for t in range(n):
            for lag in range(min(d, t + 1)):
                out[:, t] += parts["w"][:, d - 1 - lag] * parts["B"][t - lag] * v[:, t - lag]
        return out

    u = conv(parts["x"][None])[0] + parts["bias"]
    return parts, parts["x"], torch.ones(n, 1, dtype=F64), lambda v: parts["C"] * conv(v), u, parts["C"] * u


@pytest.mark.parametrize("kind", PER_CHANNEL)
@examples(12)
@given(shape=shapes(), ch=st.integers(1, 6), bias=st.booleans())
def test_per_channel_contributions_equal_the_token_by_token_oracle(kind, shape, ch, bias):
    """Property: for every per-channel kind, any N ≤ 40, channels, state size (Mamba) or kernel
    size (short conv) and rows, ``contributions`` equal ‖W_out (g_t ⊙ A[:, t, s] ⊙ v_s)‖ with A
    read off the recurrence run token by token on one-hot value sequences (float64, 1e-10); the
    self-check's ``reference`` equals the recurrence's output and ``mixer_output`` equals
    W_out (that output, gates and skip included) + bias, within the self-check's tolerance.
    Regime: slow decays (RG-LRU a in 0.9..1, RWKV e^w ≤ 0.1, Mamba AΔ ≥ -0.1)."""
    n, _, d, g, rows = shape
    spec = MIXERS[kind]
    parts, values, gate, scan, core, inner = _per_channel_case(kind, n, ch, d, g)
    hidden = 3
    weight, out_bias = _rand(g, hidden, ch), (_rand(g, hidden) if bias else None)
    impulses = torch.eye(n, dtype=F64)[:, :, None] * values[None]  # (s, S, ch): v_s at s only
    each_source = scan(impulses)  # (s, t, ch): A^c[t,s] v_s
    want = torch.linalg.vector_norm((each_source * gate[None]) @ weight.T, dim=-1).T  # (T, S)
    got = spec.contributions(parts, weight, rows.tolist(), n)
    torch.testing.assert_close(got, want[rows], atol=1e-10, rtol=1e-9)
    _within_self_check(spec.reference(parts, rows).reshape(len(rows), -1), core[rows])
    for t in rows.tolist():
        expected = weight @ inner[t] + (0 if out_bias is None else out_bias)
        _within_self_check(spec.mixer_output(parts, weight, out_bias, t), expected)


def test_every_rebuilt_kind_has_a_property():
    """Every kind with rows or contributions is drawn above; the rest are the stated exceptions."""
    rebuilt = {k for k, m in MIXERS.items() if m.rows is not None or m.contributions is not None}
    assert rebuilt == set(PER_HEAD) | set(PER_CHANNEL)
    assert set(MIXERS) - rebuilt == set(NOT_REBUILT)
