"""The Explain page on tiny hybrids and recurrent models (tests/hybrids_tiny.py): the logit lens
draws from the stream at block boundaries (the engine's numbers), the views that split blocks into
softmax heads refuse with a true reason, and patching runs over the blocks' mixers."""

from __future__ import annotations

import hybrids_tiny
import numpy as np
import pytest
from apptest import TEXT, new_app, ok, prepare, specs, z_of

import attnviz

PAGE = "pages/6_Explain.py"
hybrids_tiny.register()


@pytest.fixture
def env(monkeypatch):
    return prepare(monkeypatch)


def _lens_spec(at) -> dict:
    return next(
        s for s in specs(at) if (s["layout"].get("title") or {}).get("text", "").startswith("Logit lens")
    )


@pytest.mark.parametrize("model_type", ["qwen3_5_text", "mamba"])
def test_the_logit_lens_draws_on_a_hybrid_and_a_pure_state_space_model(env, model_type):
    at = new_app(PAGE, model=f"hybrid:{model_type}", text=TEXT, view="logit lens").run()
    ok(at)
    z = np.asarray(z_of(_lens_spec(at)["data"][0]), dtype=float)
    n = len(attnviz.tokenize(hybrids_tiny.loaded(model_type), TEXT)[0])
    lens = attnviz.logit_lens(hybrids_tiny.loaded(model_type), TEXT, positions=range(n - z.shape[1], n))
    assert z.shape[0] == lens.n_rows == hybrids_tiny.loaded(model_type).layout.n_blocks + 1
    np.testing.assert_allclose(z, lens.top_probs[..., 0], atol=1e-6)  # the engine's numbers
    assert any("block boundaries" in c.value for c in at.caption)


def test_the_head_views_on_a_hybrid_say_what_is_missing(env):
    at = new_app(PAGE, model="hybrid:qwen3_5_text", text=TEXT, view="ablation").run()
    assert not at.exception
    said = " ".join(m.value for m in [*at.warning, *at.info, *at.error])
    assert "per-head parts of these mixers" in said and "per-token parts" not in said


def test_the_attribution_view_on_a_hybrid_is_the_block_parts_table(env):
    at = new_app(PAGE, model="hybrid:falcon_h1", text=TEXT, view="attribution").run()
    ok(at)
    frame = at.dataframe[0].value
    want = attnviz.explain.block_attribution(hybrids_tiny.loaded("falcon_h1"), TEXT).to_frame()
    assert list(frame["part"]) == list(want["part"])
    np.testing.assert_allclose(frame["contribution"], want["contribution"].round(4), atol=1e-9)
    assert any("sum to it within" in c.value for c in at.caption)
    heads = at.dataframe[1].value  # the Mamba-2 branch split by head
    assert set(heads["part"]) == {"mamba2"} and len(heads) == 2 * 4


def test_the_attribution_view_on_rwkv_refuses_with_the_reason(env):
    at = new_app(PAGE, model="hybrid:rwkv", text=TEXT, view="attribution").run()
    assert not at.exception
    said = " ".join(m.value for m in [*at.warning, *at.info, *at.error])
    assert "pre_ln" in said


def _routes_spec(at) -> dict:
    return next(s for s in specs(at) if (s["layout"].get("title") or {}).get("text", "").startswith("Routes"))


@pytest.mark.parametrize(("model_type", "branch"), [("qwen3_5_text", "gated_delta"), ("mamba", "mamba")])
def test_routes_draw_mixer_edges_on_a_hybrid_and_a_pure_ssm(env, model_type, branch):
    """The routes view on a hybrid (Qwen3.5-shaped) and a pure Mamba: the engine's graph, mixer
    edges green, and a click on a mixer edge's dot shows what that branch (or head) writes."""
    at = new_app(PAGE, model=f"hybrid:{model_type}", text=TEXT, view="routes", thr="0.01").run()
    ok(at)
    lm = hybrids_tiny.loaded(model_type)
    graph = attnviz.information_flow(lm, TEXT, threshold=0.01)
    assert any(e.kind == "mixer" and e.part == branch for e in graph.edges)
    assert any(f"{len(graph.edges)} edges" in c.value and "green: a mixer" in c.value for c in at.caption)
    spec = _routes_spec(at)
    dots = next(t for t in spec["data"] if t.get("name") == "attention edge (click)")
    mixer = next(d for d in dots["customdata"] if len(d) == 5 and d[4] == branch)
    at.session_state["routes_chart"] = {
        "selection": {"points": [{"customdata": mixer}], "point_indices": [0]}
    }
    at.run()
    ok(at)
    layer, head, _src, dst, part = mixer
    want = attnviz.explain.node_writes(
        lm, attnviz.explain.block_trace(lm, TEXT), layer, dst, part=part, head=head
    )
    assert any(f"What {want.name} writes" in m.value for m in at.markdown)
    frames = {d.value.columns[0]: d.value for d in at.dataframe}
    assert list(frames["Promoted"]["Promoted"]) == [t for t, _, _ in want.promoted]
    assert "routes_open" not in [b.key for b in at.button]  # a hybrid's block is not an explorer layer


def test_routes_on_zamba2_refuse_naming_its_shared_block(env):
    at = new_app(PAGE, model="hybrid:zamba2", text=TEXT, view="routes").run()
    assert not at.exception
    said = " ".join(m.value for m in [*at.warning, *at.info, *at.error])
    assert "shared attention block" in said and "MLP" in said
