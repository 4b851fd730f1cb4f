"""The notebook views of the explanations are Plotly figures that show the engine's numbers."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import tiny_explain as TE

import attnviz
from attnviz.explain import trace


def test_every_view_is_a_figure_of_the_results_numbers():
    lm = TE.loaded("llama-gqa")
    tr = trace(lm, TE.TEXT)
    graph = attnviz.information_flow(lm, tr, threshold=0.02)
    fig = attnviz.flow_view(graph)
    assert isinstance(fig, go.Figure)
    handles = next(t for t in fig.data if t.name == "attention edge (click)")
    attention = [e for e in graph.edges if e.kind == "attention"]
    assert len(handles.customdata) == len(attention) > 0
    for data, e in zip(handles.customdata, attention, strict=True):
        assert list(data) == [e.layer, int(np.argmax(e.heads)), e.source.token, e.target.token]
    lens = attnviz.logit_lens(lm, tr, k=3)
    heat = attnviz.lens_view(lens).data[0]
    assert np.allclose(np.asarray(heat.z), lens.top_probs[:, :, 0])
    att = attnviz.logit_attribution(lm, tr)
    fig = attnviz.attribution_view(att, top=10)
    assert np.allclose(np.asarray(fig.data[0].z), att.heads)
    bars = fig.data[1]
    assert sorted(np.abs(bars.x)) == sorted(abs(p[3]) for p in att.ranking(10))
    # each bar's name, click data and length are one part's (caught: click data [head, layer])
    for name, (layer, head), x in zip(bars.y, bars.customdata, bars.x, strict=True):
        if name.startswith("L"):
            assert name == f"L{layer} H{head}" and x == att.heads[layer, head]
        elif name.startswith("MLP"):
            assert name == f"MLP {layer}" and head == -1 and x == att.mlps[layer]
        else:
            assert name == "embedding" and (layer, head) == (-1, -1) and x == att.embedding
    cells = np.asarray(fig.data[0].customdata)  # (layers, heads, 2): [layer, head] of each cell
    n_l, n_h = att.heads.shape
    assert (cells[..., 0] == np.arange(n_l)[:, None]).all() and (cells[..., 1] == np.arange(n_h)).all()
    ab = attnviz.ablate_heads(lm, tr, [(1, 2)])
    before = attnviz.ablation_view(ab).data[0]
    assert max(before.x) == ab.top_before[0][2]
    b = attnviz.rotary_bands(lm, tr, 1, 0)
    terms = next(t for t in attnviz.rotary_view(b).data if t.name == "term")
    assert sum(terms.y) == np.float64(b.pair_terms.sum() + b.rest_term).round(12) or np.isclose(
        sum(terms.y), b.score
    )


def test_every_route_line_is_at_least_the_minimum_visible_width():
    """Weak edges (a near-flat one spanning many columns) were drawn 1 px wide and vanished."""
    from attnviz.figures.explain import MIN_EDGE_WIDTH

    lm = TE.loaded("llama-gqa")
    graph = attnviz.information_flow(lm, trace(lm, TE.TEXT), threshold=0.0)
    lines = [t for t in attnviz.flow_view(graph).data if t.mode == "lines" and t.x and t.x[0] is not None]
    assert lines and min(t.line.width for t in lines) >= MIN_EDGE_WIDTH >= 2


def test_the_routes_legend_is_the_edges_own_traces_not_dummy_ones():
    """Issue 40: each trace is Plotly's fixed cost in the browser; three empty legend traces are
    gone. The legend names each kind drawn once, from its edges' own traces (a legend click
    hides the whole group), and every trace draws something."""
    lm = TE.loaded("llama-gqa")
    graph = attnviz.information_flow(lm, trace(lm, TE.TEXT), threshold=0.02)
    fig = attnviz.flow_view(graph)
    assert all(t.x and t.x[0] is not None for t in fig.data)  # no [None] placeholder
    legend = [t.name for t in fig.data if t.showlegend is not False]
    kinds = {e.kind for e in graph.edges}
    assert sorted(legend) == sorted(kinds), (legend, kinds)
    assert all(t.legendgroup == t.name for t in fig.data if t.name in kinds)


def test_a_routes_node_clicks_to_the_block_that_wrote_it():
    """The stream after layer l's attention is that attention's output; entering layer l > 0, the
    FFN of layer l - 1's; the embeddings (entering layer 0) are no block's."""
    lm = TE.loaded("llama-gqa")
    graph = attnviz.information_flow(lm, trace(lm, TE.TEXT), threshold=0.02)
    fig = attnviz.flow_view(graph)
    nodes = next(t for t in fig.data if t.name == "node (click)")
    want = sorted(
        [n.layer, -1, n.token, n.token, "attention"]
        if n.stage == "mid"
        else [n.layer - 1, -1, n.token, n.token, "ffn"]
        for n in graph.nodes
        if n.layer > 0 or n.stage == "mid"
    )
    assert sorted(list(d) for d in nodes.customdata) == want and any(d[4] == "ffn" for d in want)
