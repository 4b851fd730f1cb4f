"""The NumPy forward/backward: gradients against finite differences and torch autograd."""

import dataclasses

import numpy as np
import pytest
import torch

from attnviz.reference.numpy_mha import (
    MHAParams,
    causal_mask,
    init_params,
    mha_backward,
    mha_forward,
    param_names,
    softmax,
)
from attnviz.reference.textbook import MultiHeadAttention

B, T, C, NH = 2, 5, 8, 2


def setup(seed=0, bias=True):
    rng = np.random.default_rng(seed)
    params = init_params(C, NH, rng, bias=bias)
    x = rng.standard_normal((B, T, C))
    d_out = rng.standard_normal((B, T, C))  # loss L = sum(out * d_out), so dL/d out = d_out
    return params, x, d_out


def loss(params, x, d_out, mask):
    out, _ = mha_forward(x, params, mask)
    return float(np.sum(out * d_out))


def numeric_grad(f, array, eps=1e-6):
    """Central differences of f() with respect to every entry of ``array`` (changed in place)."""
    grad = np.zeros_like(array)
    it = np.nditer(array, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = array[i]
        array[i] = old + eps
        up = f()
        array[i] = old - eps
        down = f()
        array[i] = old
        grad[i] = (up - down) / (2 * eps)
    return grad


def test_softmax_rows_and_masked_zero():
    s = np.array([[1.0, 2.0, -np.inf], [0.0, 0.0, 0.0]])
    p = softmax(s)
    assert np.allclose(p.sum(-1), 1.0)
    assert p[0, 2] == 0.0


def test_forward_shapes_and_weights():
    params, x, _ = setup()
    out, cache = mha_forward(x, params, causal_mask(T))
    assert out.shape == (B, T, C)
    assert cache.weights.shape == (B, NH, T, T)
    assert np.allclose(cache.weights.sum(-1), 1.0)
    assert (cache.weights[..., ~causal_mask(T)] == 0).all()


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_gradients_match_central_differences(masked, bias):
    params, x, d_out = setup(bias=bias)
    mask = causal_mask(T) if masked else None
    _, cache = mha_forward(x, params, mask)
    grads = mha_backward(d_out, cache)
    for name in [*param_names(params), "x"]:
        array = x if name == "x" else getattr(params, name)
        num = numeric_grad(lambda: loss(params, x, d_out, mask), array)
        got = getattr(grads, name)
        assert got.shape == array.shape, name
        assert np.abs(got - num).max() < 1e-7, name
    if not bias:
        assert grads.b_q is None and grads.b_o is None


def to_textbook(params: MHAParams) -> MultiHeadAttention:
    """The same weights in the torch class (nn.Linear keeps W transposed: (out, in))."""
    m = MultiHeadAttention(C, params.num_heads, bias=params.b_q is not None).double()
    with torch.no_grad():
        for s in "qkvo":
            lin = getattr(m, f"W_{s}")
            lin.weight.copy_(torch.from_numpy(getattr(params, f"W_{s}").T))
            if lin.bias is not None:
                lin.bias.copy_(torch.from_numpy(getattr(params, f"b_{s}")))
    return m


@pytest.mark.parametrize("masked", [False, True])
def test_forward_and_gradients_match_torch_autograd(masked):
    params, x, d_out = setup(seed=1)
    mask = causal_mask(T) if masked else None
    out, cache = mha_forward(x, params, mask)
    grads = mha_backward(d_out, cache)

    m = to_textbook(params)
    xt = torch.from_numpy(x).requires_grad_(True)
    out_t, w_t = m(xt, mask=torch.from_numpy(mask) if masked else None)
    (out_t * torch.from_numpy(d_out)).sum().backward()

    assert np.abs(out - out_t.detach().numpy()).max() < 1e-12
    assert np.abs(cache.weights - w_t.detach().numpy()).max() < 1e-12
    assert np.abs(grads.x - xt.grad.numpy()).max() < 1e-12
    for s in "qkvo":
        lin = getattr(m, f"W_{s}")
        assert np.abs(getattr(grads, f"W_{s}") - lin.weight.grad.numpy().T).max() < 1e-12, s
        assert np.abs(getattr(grads, f"b_{s}") - lin.bias.grad.numpy()).max() < 1e-12, s


def test_params_are_frozen():
    params, _, _ = setup()
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.W_q = params.W_k  # type: ignore[misc]
