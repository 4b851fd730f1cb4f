"""The textbook MultiHeadAttention equals PyTorch's own attention, to float32 precision."""

import pytest
import torch
from torch.nn import functional as F

from attnviz.reference.textbook import (
    MultiHeadAttention,
    causal_mask,
    from_torch_multihead,
    scaled_dot_product_attention,
)

TOL = 1e-6  # float32: outputs of order 1 agree to a few ulp


def qkv(B=2, nh=4, T=7, S=7, hs=8, seed=0):
    """Random q (B, nh, T, hs), k and v (B, nh, S, hs); scaled by 2 for peaked softmax rows."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, nh, T, hs, generator=g) * 2
    return q, torch.randn(B, nh, S, hs, generator=g) * 2, torch.randn(B, nh, S, hs, generator=g)


def test_causal_mask_is_lower_triangle():
    m = causal_mask(4)
    assert m.dtype == torch.bool and m.shape == (4, 4)
    assert m.tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, True, True, False],
        [True, True, True, True],
    ]


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_matches_torch(causal):
    q, k, v = qkv()
    mask = causal_mask(q.shape[-2]) if causal else None
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert out.shape == (2, 4, 7, 8) and weights.shape == (2, 4, 7, 7)
    assert (out - ref).abs().max() < TOL
    assert torch.allclose(weights.sum(-1), torch.ones(2, 4, 7), atol=TOL)
    if causal:
        upper = ~causal_mask(7)
        assert (weights[..., upper] == 0).all()  # exactly 0, not just small


def test_sdpa_with_an_arbitrary_mask_and_cross_lengths():
    q, k, v = qkv(T=5, S=9, seed=1)
    mask = torch.rand(5, 9, generator=torch.Generator().manual_seed(3)) > 0.4
    mask[:, 0] = True  # every row may attend to something
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert (out - ref).abs().max() < TOL
    assert (weights[..., ~mask] == 0).all()
    assert torch.allclose(weights.sum(-1), torch.ones(2, 4, 5), atol=TOL)


def test_split_and_combine_heads_are_inverse():
    mha = MultiHeadAttention(32, 4)
    x = torch.randn(3, 6, 32)
    heads = mha.split_heads(x)
    assert heads.shape == (3, 4, 6, 8)
    assert torch.equal(heads[:, 1], x[..., 8:16])  # head 1 owns channels 8..15
    assert torch.equal(mha.combine_heads(heads), x)


def test_rejects_indivisible_heads():
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(30, 4)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_nn_multiheadattention(causal, bias):
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(32, 4, bias=bias, batch_first=True).eval()
    ours = from_torch_multihead(ref)
    x = torch.randn(2, 9, 32)
    # nn.MultiheadAttention's bool mask means "blocked"; ours means "may attend"
    out_ref, w_ref = ref(x, x, x, attn_mask=~causal_mask(9) if causal else None, average_attn_weights=False)
    out, w = ours(x, mask=causal_mask(9) if causal else None)
    assert out.shape == (2, 9, 32) and w.shape == (2, 4, 9, 9)
    assert (out - out_ref).abs().max() < TOL
    assert (w - w_ref).abs().max() < TOL


def test_cross_attention_matches_nn_multiheadattention():
    torch.manual_seed(1)
    ref = torch.nn.MultiheadAttention(16, 2, batch_first=True).eval()
    ours = from_torch_multihead(ref)
    q_in, kv_in = torch.randn(1, 4, 16), torch.randn(1, 11, 16)
    out_ref, w_ref = ref(q_in, kv_in, kv_in, average_attn_weights=False)
    out, w = ours(q_in, kv_in, kv_in)
    assert w.shape == (1, 2, 4, 11)
    assert (out - out_ref).abs().max() < TOL and (w - w_ref).abs().max() < TOL


def test_forward_by_hand_for_one_head():
    """Head h of the class is softmax(x Wq_h (x Wk_h)^T / sqrt(hs)) x Wv_h, written out."""
    torch.manual_seed(2)
    mha = MultiHeadAttention(12, 3, bias=False)
    x = torch.randn(1, 5, 12)
    _, w = mha(x)
    h, hs = 1, 4
    rows = slice(h * hs, (h + 1) * hs)
    q = x[0] @ mha.W_q.weight[rows].T
    k = x[0] @ mha.W_k.weight[rows].T
    expected = torch.softmax(q @ k.T / hs**0.5, dim=-1)
    assert (w[0, h] - expected).abs().max() < TOL
