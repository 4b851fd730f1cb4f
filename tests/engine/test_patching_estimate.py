"""Attribution patching: the first-order formula against a hand-written gradient, exact where the
metric is linear in the activation, verified cells equal to real patches, labelled an estimate."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import tiny
import tiny_explain as TE
import torch
from test_patching import CLEAN, CORRUPT, hand_run, ids_of, modules

import attnviz
from attnviz.explain.attribution_patching import attribution_patch
from attnviz.explain.blocks import Unsupported
from attnviz.explain.patching import patch


def hand_first_order(lm, target_ids, source_ids, answer, wrong, kind):
    """(a' − a) · ∂m/∂a per layer and position (heads: per head), written with plain hooks: the
    gradient with respect to the output projection's input (heads) or the block's input."""
    src = {(kind, layer): None for layer in range(lm.layout.n_layers)}
    hand_run(lm, source_ids, record=src)
    acts, handles = {}, []
    for layer in range(lm.layout.n_layers):
        block, _, proj, _ = modules(lm, layer)

        def grab(_m, args, kwargs=None, layer=layer):
            acts[layer] = args[0] if args else kwargs["hidden_states"]  # a tensor of the graph

        if kind == "head":
            handles.append(proj.register_forward_pre_hook(grab))
        else:
            handles.append(block.register_forward_pre_hook(grab, with_kwargs=True))
    try:
        with torch.enable_grad():
            logits = lm.model(input_ids=torch.tensor([target_ids]), use_cache=False).logits[0, -1]
            grads = torch.autograd.grad(logits[answer] - logits[wrong], [acts[i] for i in sorted(acts)])
    finally:
        for h in handles:
            h.remove()
    out = []
    for layer, g in enumerate(grads):
        a, a2 = acts[layer][0].detach(), src[(kind, layer)]
        if kind == "head":
            d = lm.layout.head_dim
            a = a.view(a.shape[0], -1, d)
            out.append(((a2 - a) * g[0].view(a.shape)).sum(-1).T.double().numpy())  # (heads, positions)
        else:
            out.append(((a2 - a) * g[0]).sum(-1).double().numpy())  # (positions,)
    return np.stack(out)


@pytest.mark.parametrize("name", ["llama-gqa", "gpt_neox-parallel", "olmo2"])
def test_estimate_is_the_first_order_term_written_by_hand(name):
    lm = TE.loaded(name)
    clean, corrupt = ids_of(lm, CLEAN), ids_of(lm, CORRUPT)
    est = attribution_patch(lm, CLEAN, CORRUPT, over="heads_by_position", verify=0)
    want = hand_first_order(lm, corrupt, clean, est.answer, est.wrong, "head")
    assert np.allclose(est.raw - est.corrupted_diff, want, atol=1e-4)
    est = attribution_patch(lm, CLEAN, CORRUPT, over="residual", verify=0, direction="noise")
    want = hand_first_order(lm, clean, corrupt, est.answer, est.wrong, "residual")
    assert np.allclose(est.raw - est.clean_diff, want, atol=1e-4)
    heads = attribution_patch(lm, CLEAN, CORRUPT, over="heads", verify=0)
    by_pos = attribution_patch(lm, CLEAN, CORRUPT, over="heads_by_position", verify=0)
    assert np.allclose(heads.raw - heads.corrupted_diff, (by_pos.raw - by_pos.corrupted_diff).sum(-1))


def linear_toy() -> attnviz.LoadedModel:
    """llama-gqa with its final norm removed and its last MLP zeroed: the metric is then linear
    in the last layer's heads' outputs (W_O, then the unembedding)."""
    model = copy.deepcopy(TE._model("llama-gqa"))
    model.model.norm = torch.nn.Identity()
    with torch.no_grad():
        model.model.layers[-1].mlp.down_proj.weight.zero_()
    return attnviz.wrap_model(model, tiny.tokenizer("decoder"), spec="tiny-linear-toy")


def test_estimate_equals_the_real_patch_where_the_metric_is_linear():
    lm = linear_toy()
    last = lm.layout.n_layers - 1
    est = attribution_patch(lm, CLEAN, CORRUPT, over="heads_by_position", verify=0)
    real = patch(lm, CLEAN, CORRUPT, over="heads_by_position")
    assert np.allclose(est.values[last], real.values[last], atol=1e-4)
    assert np.allclose(est.values[last, :, :-1], 0.0, atol=1e-6)  # other positions cannot reach it
    assert np.abs(real.values[last, :, -1]).max() > 1e-3  # and the last position does
    # earlier layers pass through softmax and norms: there it is only an estimate
    assert not np.allclose(est.values[0], real.values[0], atol=1e-3)


def test_verified_cells_are_real_patches_and_the_estimate_is_labelled():
    lm = TE.loaded("llama-gqa")
    est = attribution_patch(lm, CLEAN, CORRUPT, over="heads_by_position", verify=6, batch=4)
    real = patch(lm, CLEAN, CORRUPT, over="heads_by_position")
    assert len(est.verified) == 6 and est.estimate and "estimate" in est.method
    ranked = [idx for idx, _ in est.ranking(6)]
    assert list(est.verified) == ranked
    for idx, (e, r) in est.verified.items():
        assert e == est.values[idx] and abs(r - real.values[idx]) < 1e-4
    frame = est.to_frame()
    assert frame["estimate"].all() and frame["real"].notna().sum() == 6
    cmp = est.comparison()
    assert np.allclose(cmp["difference"], cmp["estimate"] - cmp["real"])
    assert not real.estimate and not real.to_frame()["estimate"].any()


def test_gradients_run_inside_a_callers_inference_mode_and_softcap_is_refused():
    lm = TE.loaded("llama-gqa")
    with torch.inference_mode():
        inside = attribution_patch(lm, CLEAN, CORRUPT, over="residual", verify=0)
    outside = attribution_patch(lm, CLEAN, CORRUPT, over="residual", verify=0)
    assert np.array_equal(inside.values, outside.values)
    with pytest.raises(Unsupported, match="attribution patching needs gradients"):
        attribution_patch(TE.loaded("gemma2"), CLEAN, CORRUPT, over="heads", verify=0)
