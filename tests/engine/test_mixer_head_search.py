"""Head search over mixer heads on a Qwen3.5-shaped tiny hybrid: signed A and contribution size,
each against an oracle written with plain torch on transformers' own modules (autograd through
transformers' gated delta rule for A; the gated norm's frozen scale and out_proj by hand for
‖c_{t,s}‖), never through attnviz's mixer code."""

from __future__ import annotations

import hybrids_tiny
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3_5 import modeling_qwen3_5 as Q

import attnviz
from attnviz import AttnvizError
from attnviz.explain.search import CONTRIBUTION, SIGNED, search_mixer_heads

TEXT = "the bank and the river bank and the bank of the river"


@pytest.fixture(scope="module")
def qwen():
    lm = hybrids_tiny.loaded("qwen3_5_text")
    return lm, attnviz.extract(lm, TEXT)


def _oracle(model, ids: list[int], query: int, key: int) -> dict[tuple[int, int], tuple[float, float]]:
    """(block, head) -> (A[query, key], ‖c_{query,key}‖) for every gated delta head: A as the
    derivative of transformers' own delta rule output at ``query`` by the value at ``key`` (the
    rule is linear in v once q, k, g, β are fixed); c through the gated RMSNorm's frozen scale
    w · silu(z) / rms(y) and that head's columns of out_proj."""
    calls: list[dict] = []
    norms: list[tuple[torch.Tensor, torch.Tensor]] = []
    real = Q.torch_chunk_gated_delta_rule

    def spy(query_, key_, value, g, beta, **kw):
        calls.append({"q": query_, "k": key_, "v": value, "g": g, "beta": beta, **kw})
        return real(query_, key_, value, g=g, beta=beta, **kw)

    blocks = [b for b, layer in enumerate(model.model.layers) if hasattr(layer, "linear_attn")]
    hooks = [
        model.model.layers[b].linear_attn.norm.register_forward_pre_hook(
            lambda _m, args: norms.append((args[0].detach(), args[1].detach()))
        )
        for b in blocks
    ]
    Q.torch_chunk_gated_delta_rule = spy
    try:
        with torch.no_grad():
            model(torch.tensor([ids]))
    finally:
        Q.torch_chunk_gated_delta_rule = real
        for h in hooks:
            h.remove()
    out = {}
    for b, call, (y, z) in zip(blocks, calls, norms, strict=True):
        mixer = model.model.layers[b].linear_attn
        v = call["v"].detach().double().requires_grad_(True)
        y_all, _ = Q.torch_recurrent_gated_delta_rule(
            call["q"].double(),
            call["k"].double(),
            v,
            g=call["g"].double(),
            beta=call["beta"].double(),
            use_qk_l2norm_in_kernel=True,
        )  # (1, T, heads, d)
        n_heads, d = v.shape[2], v.shape[3]
        yq = y.double().reshape(len(ids), n_heads, d)[query]
        zq = z.double().reshape(len(ids), n_heads, d)[query]
        rms = (yq.pow(2).mean(-1, keepdim=True) + mixer.norm.variance_epsilon).sqrt()
        sigma = mixer.norm.weight.double() * F.silu(zq) / rms  # (heads, d)
        w = mixer.out_proj.weight.double()
        for h in range(n_heads):
            (grad,) = torch.autograd.grad(y_all[0, query, h, 0], v, retain_graph=True)
            a = float(grad[0, key, h, 0])
            c = w[:, h * d : (h + 1) * d] @ (sigma[h] * a * v[0, key, h].detach())
            out[(b, h)] = (a, float(c.detach().norm()))
    return out


def test_mixer_heads_are_scored_by_signed_a_and_by_contribution_size_against_the_oracle(qwen):
    lm, res = qwen
    q, k = res.n_tokens - 1, res.n_tokens - 2
    want = _oracle(lm.model, list(res.tokens.ids), q, k)
    signed = search_mixer_heads(res, q, k, by=SIGNED)
    size = search_mixer_heads(res, q, k, by=CONTRIBUTION)
    assert signed.by == "signed A" and signed.what.startswith("signed A from query")
    assert size.by == "contribution size" and size.what.startswith("contribution size from query")
    got_a = {
        (b, h): s
        for (b, kind, h), s in zip(signed.heads, signed.scores, strict=True)
        if kind == "gated_delta"
    }
    got_c = {
        (b, h): s for (b, kind, h), s in zip(size.heads, size.scores, strict=True) if kind == "gated_delta"
    }
    assert set(got_a) == set(got_c) == set(want)
    for bh, (a, c) in want.items():
        assert got_a[bh] == pytest.approx(a, abs=1e-7, rel=1e-4), bh
        assert got_c[bh] == pytest.approx(c, abs=1e-7, rel=1e-4), bh
    assert max(abs(a) for a, _ in want.values()) > 1e-4  # the oracle sees a real signal
    # the softmax blocks join the signed search with their α, and only it
    for (b, kind, h), s in zip(signed.heads, signed.scores, strict=True):
        if kind == "attention":
            assert s == pytest.approx(float(res.head(b, h, mixer="attention")[q, k]), abs=1e-6)
    assert {kind for _, kind, _ in size.heads} == {"gated_delta"}
    assert all("attention" in why for why in size.skipped) and not signed.skipped


def test_ranking_is_by_size_with_the_sign_kept(qwen):
    _, res = qwen
    found = search_mixer_heads(res, -1, -2, by=SIGNED)
    ranked = found.ranking()
    assert [abs(s) for *_, s in ranked] == sorted(np.abs(found.scores), reverse=True)
    assert sorted(s for *_, s in ranked) == sorted(found.scores)  # signs kept
    assert list(found.to_frame().columns) == ["block", "mixer", "head", "signed A"]
    assert len(found.ranking(3)) == 3


def test_bad_requests_and_per_channel_mixers_are_refused_with_the_reason(qwen):
    _, res = qwen
    with pytest.raises(AttnvizError, match="after query"):
        search_mixer_heads(res, 2, 5)
    with pytest.raises(AttnvizError, match="by must be"):
        search_mixer_heads(res, 5, 2, by="alpha")
    mamba = attnviz.extract(hybrids_tiny.loaded("mamba"), TEXT)
    with pytest.raises(AttnvizError, match="per channel, no signed A"):
        search_mixer_heads(mamba, -1, 2)
    sizes = search_mixer_heads(mamba, -1, 2, by=CONTRIBUTION)
    assert [kind for _, kind, _ in sizes.heads] == ["mamba"] * len(mamba.layout.mixers)


def test_the_head_level_refusal_on_a_hybrid_names_what_runs_and_is_true(qwen):
    """The old reason ("the per-head parts of these mixers are not built yet") was no longer true:
    block_attribution splits them by head, and head search and ablation run on them."""
    lm, _ = qwen
    with pytest.raises(attnviz.explain.Unsupported) as err:
        attnviz.explain.trace(lm, TEXT)
    said = str(err.value)
    assert "not built yet" not in said
    assert all(name in said for name in ("block_attribution", "ablate_mixer_heads", "search_mixer_heads"))
