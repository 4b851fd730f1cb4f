"""Information-flow routes equal the dense definition on tiny models of every block structure."""

from __future__ import annotations

import pytest
import tiny_explain as TE

from attnviz import AttnvizError
from attnviz.explain import Unsupported, information_flow, routes, trace
from attnviz.explain.routes import Node


def as_dict(graph) -> dict:
    return {
        (
            e.layer,
            e.kind,
            (e.source.layer, e.source.token, e.source.stage),
            (e.target.layer, e.target.token, e.target.stage),
        ): (
            e.weight,
            e.heads,
        )
        for e in graph.edges
    }


# The fast tier covers each block structure once (GQA pre-norm, post-norm + soft-cap, parallel
# residual through the hook and through an adapter); the rest run with the slow tier.
FAST = ("llama-gqa", "gemma2", "gpt_neox-parallel", "gptj")  # + gemma3, olmo2, falcon, ... slow


@pytest.mark.parametrize(
    "name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in TE.MODELS]
)
def test_routes_equal_the_dense_decomposition(name, monkeypatch):
    """Every kept edge, its weight and its heads' shares equal the dense definition (1e-5), from
    the last token at the default threshold and from a middle token at 0.01; the second run
    searches only 4 components per part for sign flips, so the full fallback runs too."""
    lm = TE.loaded(name)
    tr = trace(lm, TE.TEXT)
    assert tr.residual == ("sequential" if name in TE.SEQUENTIAL else "parallel")
    for token, threshold, flip_dims in ((-1, 0.04, 64), (tr.n_tokens // 2, 0.01, 4)):
        monkeypatch.setattr(routes, "FLIP_DIMS", flip_dims)
        graph = information_flow(lm, tr, token=token, threshold=threshold)
        ours, dense = as_dict(graph), TE.dense_graph(lm, tr, tr.position(token), threshold)
        assert ours.keys() == dense.keys(), (name, set(ours) ^ set(dense))
        assert len(ours) > tr.n_layers  # more than a single residual chain: attention edges exist
        for key, (weight, heads) in dense.items():
            assert abs(ours[key][0] - weight) <= 1e-5, key
            assert len(ours[key][1]) == len(heads)
            assert all(abs(a - b) <= 1e-5 for a, b in zip(ours[key][1], heads, strict=True)), key
        assert Node(tr.n_layers, tr.position(token)) in graph.nodes


def test_models_it_cannot_decompose_exactly_are_refused_with_the_reason():
    """An encoder and a gate on the heads (planted: the output projection reads half of what the
    heads made) stop with a sentence that names the reason, never a graph."""
    import tiny

    with pytest.raises(Unsupported, match="encoder"):
        trace(tiny.loaded("bert"), TE.TEXT)
    lm = TE.loaded("llama-gqa")
    proj = lm.model.get_submodule(lm.probe.sites["self"][1].module_name).o_proj
    hook = proj.register_forward_pre_hook(lambda _m, args: (args[0] * 0.5,))
    try:
        tr = trace(lm, TE.TEXT)
    finally:
        hook.remove()
    assert "layer 1's attention output is not" in tr.heads_problem
    with pytest.raises(AttnvizError, match="gate"):
        information_flow(lm, tr)


@pytest.mark.slow
def test_residual_multipliers_and_hybrids_are_refused_with_the_reason():
    with pytest.raises(Unsupported, match="residual multiplier"):
        trace(TE.build("granite", residual_multiplier=0.5), TE.TEXT)
    with pytest.raises(Unsupported, match="hybrid"):
        trace(TE.build("qwen3_next"), TE.TEXT)
