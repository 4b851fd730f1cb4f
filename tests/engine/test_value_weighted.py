"""Value-weighted attention ‖α_ij · W_O^h v_j^h‖ against a direct computation from the layer's own
weights (the step-by-step walkthrough's values and W_O), float32 on CPU."""

import numpy as np
import pytest
import tiny
import torch

import attnviz
from attnviz.analysis import value_weighted as VW
from attnviz.capture import projections
from attnviz.errors import AttnvizError
from attnviz.reference import layer_walkthrough
from attnviz.reference.walkthrough import layer_weights

TEXT = "the financial bank is located on river bank"
REL_TOL = 1e-5  # float32: relative to the largest norm of the layer


def direct(wt, w_o: np.ndarray, n_heads: int) -> tuple[np.ndarray, np.ndarray]:
    """(norms (heads, q, k), summed vectors (q, d_model)) from the full (h, q, k, d_model) tensor."""
    probs, v = wt.probs.astype(np.float64), wt.v.astype(np.float64)  # (h, q, k), (kv, k, d_head)
    d_head = v.shape[-1]
    group = n_heads // v.shape[0]
    w = w_o.astype(np.float64).reshape(w_o.shape[0], n_heads, d_head)  # (d_model, h, d_head)
    contrib = np.stack(
        [probs[h][:, :, None] * (v[h // group] @ w[:, h, :].T)[None] for h in range(n_heads)]
    )  # (h, q, k, d_model) = α_ij · W_O^h v_j
    return np.linalg.norm(contrib, axis=-1), contrib.sum(axis=(0, 2))


@pytest.mark.parametrize("arch", ["llama-gqa", "gpt2", "bert"])
def test_norms_equal_direct_computation(arch):
    lm = tiny.loaded(arch)
    res = attnviz.extract(lm, TEXT)
    for layer in range(lm.layout.n_layers):
        wt = layer_walkthrough(lm, TEXT, layer, counterfactuals=False)
        w = layer_weights(lm, layer)
        norms, summed = direct(wt, w.o.numpy(), lm.layout.n_heads)
        bias = 0.0 if w.bo is None else w.bo.numpy()
        # the oracle itself: its vectors summed over heads and keys, plus b_O, are the layer output
        assert np.abs(summed + bias - wt.output).max() <= 1e-4
        got = VW.value_weighted(lm, res, layer)
        assert got.shape == norms.shape
        assert np.abs(got - norms).max() <= REL_TOL * norms.max(), (arch, layer)
        # not the raw weights: the per-key norms differ across keys
        assert np.abs(got - wt.probs).max() > 1e-2


def test_heads_rows_and_reductions():
    lm = tiny.loaded("llama-gqa")
    res = attnviz.extract(lm, TEXT)
    full = VW.value_weighted(lm, res, 1)
    part = VW.value_weighted(lm, res, 1, heads=[3, 1], rows=slice(2, 5))
    np.testing.assert_allclose(part, full[[3, 1], 2:5], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(VW.reduce_heads(full, "mean"), full.mean(0), rtol=1e-6)
    np.testing.assert_allclose(VW.layer_value_weighted(lm, res, 1, "max"), full.max(0), rtol=1e-6)
    with pytest.raises(AttnvizError, match="unknown reduction"):
        VW.reduce_heads(full, "median")  # type: ignore[arg-type]
    # GQA: heads 0 and 1 share KV head 0, so their key norms are computed from the same values
    norms = VW.key_norms(lm, res, 1).numpy()
    assert norms.shape == (4, len(res.tokens))
    assert not np.allclose(norms[0], norms[1])  # different W_O columns


def test_eager_result_is_refused_with_a_reason():
    lm = tiny.loaded("gpt2")
    res = attnviz.extract(lm, TEXT, path="eager")
    with pytest.raises(AttnvizError, match="fast path"):
        VW.value_weighted(lm, res, 0)


def test_unknown_output_projection_is_refused():
    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = torch.nn.Module()
            self.attn.weird = torch.nn.Linear(4, 4)

    with pytest.raises(AttnvizError, match="cannot find the output projection"):
        projections.output_weight(Odd(), "attn", 2, 2)


def test_value_weighted_result_wrapper():
    lm = tiny.loaded("gpt2")
    res = attnviz.extract(lm, TEXT)
    vw = VW.value_weighted(lm, res, 2)
    absolute = VW.ValueWeighted(lm, res, relative=False)
    np.testing.assert_allclose(absolute.layer(2), vw, rtol=1e-6)
    rel = VW.ValueWeighted(lm, res)
    norms = VW.key_norms(lm, res, 2).numpy()
    np.testing.assert_allclose(rel.head(2, 1, rows=slice(3, 6)), vw[1, 3:6] / norms.max(), rtol=1e-5)
    assert rel.layer(2).max() <= 1.0 and rel.n_tokens == res.n_tokens and rel.tokens is res.tokens
