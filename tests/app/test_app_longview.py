"""Views at any length and limits as messages (issue 12, items 3 and 4), through the app.

A text of ~1800 tokens on the tiny model is larger than the payload budget: the explorer's grid
and head view and the overview's mosaic draw `attnviz.analysis.pooling.pooled` (device, from Q/K), which
equals dense pooling of the layer within 1e-5 (float32); a zoomed region is `res.head` exactly;
an over-budget text gets "needs X GiB, Y GiB free — try …" and the app keeps serving.
"""

from __future__ import annotations

import numpy as np
import pytest
from apptest import TINY, engine, heatmaps, labels, new_app, ok, specs, titled, z_of

from attnviz import figures as F
from attnviz import limits
from attnviz.analysis import pooling
from attnviz.errors import OutOfMemory
from attnviz.inputs import admit_ids
from attnviz.server import specs as engine_specs
from attnviz.server.settings import Settings

LONG = " ".join(["the bank of the river", "a quick brown fox jumps over the lazy dog"] * 110)
LAYER, HEAD = 1, 2


def payload(at) -> int:
    return sum(len(e.proto.spec) for e in at.get("plotly_chart"))


def dense_pooled(res, layer: int, heads, side: int, how: str) -> np.ndarray:
    """The oracle: the layer's dense (heads, N, N) probabilities pooled on the host, on the
    device view's bins (one width, at most ``side``: `pooling.equal_edges`)."""
    edges = pooling.equal_edges(res.n_tokens, side)
    dense = np.asarray(res.layer(layer), dtype=np.float32)[heads]
    return F.pool(dense, edges, edges, how)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["max", "mean"])
def test_long_text_grid_and_head_are_pooled_on_the_device(env, how):
    at = new_app(model=TINY, text=LONG, layer=LAYER, head=HEAD, scale="linear", pool=how).run()
    ok(at)
    res = engine(LONG)
    n = res.n_tokens
    assert 1500 <= n <= 3000, n
    assert payload(at) < F.PAYLOAD_LIMIT, payload(at)
    assert not [s for s in at.get("slider") if s.key == "row0"]  # no row window: the whole head

    side = F.grid_side(res.n_heads, n_tokens=n)
    edges = pooling.equal_edges(n, side)
    pv = pooling.pooled(res, LAYER, None, row_edges=edges, col_edges=edges)
    assert pv.path == "fused"
    want = pv.values(how)
    grid = heatmaps(specs(at)[0])
    assert len(grid) == res.n_heads
    drawn = np.stack([z_of(t) for t in grid])
    assert drawn.shape == want.shape == (res.n_heads, len(edges), len(edges))
    assert np.allclose(drawn, want, rtol=0, atol=1e-7)  # what pooling.pooled gives
    dense = dense_pooled(res, LAYER, list(range(res.n_heads)), side, how)
    assert np.abs(drawn - dense).max() <= 1e-5  # = dense pooling of res.layer
    assert any(
        f"{how}-pooled to {len(edges)}×{len(edges)} on the device from q/k" in m.value.lower()
        for m in [*at.markdown, *at.caption]  # the grid's caption says how it was drawn
    )

    head = heatmaps(titled(at, f"layer {LAYER} · head {HEAD} "))[0]
    z = z_of(head)
    side1 = int(np.sqrt(F.SINGLE_MAX_CELLS))
    assert z.shape == (len(pooling.equal_edges(n, side1)),) * 2
    dense1 = dense_pooled(res, LAYER, [HEAD], side1, how)[0]
    assert np.abs(z - dense1).max() <= 1e-5
    assert head["y"][0].startswith("(0–")  # bins of tokens, labelled by their range


@pytest.mark.slow
def test_zoom_draws_the_region_at_full_resolution(env):
    q0, k0, side = 700, 300, 120
    at = new_app(model=TINY, text=LONG, layer=LAYER, head=HEAD, scale="linear", zoom=1, zq=q0, zk=k0, zn=side)
    at.run()
    ok(at)
    res = engine(LONG)
    head = heatmaps(titled(at, f"layer {LAYER} · head {HEAD} "))[0]
    want = np.asarray(res.head(LAYER, HEAD), dtype=np.float32)[q0 : q0 + side, k0 : k0 + side]
    z = z_of(head)
    assert z.shape == want.shape
    # exp(s - L) on the device against the result's softmax rows: float32 rounding only (1.6e-9)
    assert np.abs(z - want).max() <= 1e-8, np.abs(z - want).max()
    assert head["y"] == labels(LONG)[q0 : q0 + side] and head["x"] == labels(LONG)[k0 : k0 + side]
    assert payload(at) < F.PAYLOAD_LIMIT
    assert any("at full resolution" in c.value for c in at.caption)


@pytest.mark.slow
def test_hidden_tokens_keep_the_exact_row_path_and_say_so(env):
    at = new_app(model=TINY, text=LONG, hide=1).run()
    ok(at)
    assert [s for s in at.get("slider") if s.key == "row0"]  # the row window of exact rows
    assert any("cannot do: pooled on the server from exact rows" in c.value for c in at.caption)
    assert payload(at) < F.PAYLOAD_LIMIT


@pytest.mark.slow
def test_overview_mosaic_is_pooled_on_the_device(env):
    at = new_app("pages/1_Model_overview.py", model=TINY, text=LONG, pool="mean", induction=0).run()
    ok(at)
    res = engine(LONG)
    n_l, n_h = res.n_layers(), res.n_heads
    side = F.mosaic_side(n_l, n_h)
    bins = len(pooling.equal_edges(res.n_tokens, side))  # tiles of bins x bins, one apart
    tiles = heatmaps(specs(at)[0])  # log colour (auto past LONG_TEXT_TOKENS): log10, clipped
    for layer in range(n_l):
        want = dense_pooled(res, layer, list(range(n_h)), side, "mean")
        want = np.clip(np.log10(np.maximum(want, 10.0**F.LOG_FLOOR_EXP)), F.LOG_FLOOR_EXP, 0.0)
        for h in range(n_h):  # heads down, layers across (for every model: the page's caption)
            tile = z_of(tiles[h * n_l + layer])
            assert tile.shape == (bins, bins)
            assert np.abs(tile - want[h]).max() <= 1e-4, (layer, h)  # log10 of a 1e-5 match
    assert payload(at) < F.PAYLOAD_LIMIT


def per_token(lm) -> int:
    """Bytes per token of the fast path (what `limits.token_budget` divides the free memory by)."""
    lay = lm.layout
    return (
        limits.capture_bytes(lay, 1, lm.dtype)
        + limits.forward_bytes(lay, 1, lm.dtype)
        + limits.stats_pass_bytes(lay, 1)
    )


def test_token_cap_follows_free_memory_and_keeps_the_configured_cap(monkeypatch):
    import tiny

    lm = tiny.loaded("llama-gqa")
    full = Settings(demo=False, allowed_models=(), max_tokens=8192)
    demo = Settings(demo=True, allowed_models=(), max_tokens=512)
    monkeypatch.setattr(limits, "free_bytes", lambda device: 2**40)
    assert engine_specs.token_cap(lm, full) == 8192 and engine_specs.token_cap(lm, demo) == 512
    monkeypatch.setattr(limits, "free_bytes", lambda device: int(per_token(lm) * 1000 / limits.USABLE))
    assert 990 <= engine_specs.token_cap(lm, full) <= 1000
    assert engine_specs.token_cap(lm, demo) == 512
    with pytest.raises(
        OutOfMemory,
        match=r"^2000 tokens need [0-9.]+ GiB, [0-9.]+ GiB free on cpu — try at most [0-9]+ tokens$",
    ):
        admit_ids(lm, [5] * 2000, max_tokens=full.max_tokens).check()
    with pytest.raises(OutOfMemory, match=r"^2000 tokens need"):  # exactly at the cap: still checked
        admit_ids(lm, [5] * 2000, max_tokens=2000).check()
    with pytest.raises(OutOfMemory, match=r"^9000 tokens need"):  # over the cap too: the smaller limit
        admit_ids(lm, [5] * 9000, max_tokens=full.max_tokens).check()


@pytest.mark.slow
def test_over_budget_text_gets_the_limit_message_and_the_app_keeps_serving(env):
    import tiny

    lm = tiny.loaded("llama-gqa")
    small = int(per_token(lm) * 1000 / limits.USABLE)  # room for about 1000 tokens
    env.setattr(limits, "free_bytes", lambda device: small)
    at = new_app(model=TINY, text=LONG).run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "tokens need" in errors[0] and "GiB free on cpu — try at most" in errors[0]
    cap = engine_specs.token_cap(lm)
    assert any(f"Up to {cap} tokens (the free memory on cpu)" in c.value for c in at.sidebar.caption)
    at.sidebar.text_area(key="text").set_value("the bank of the river").run()
    ok(at)
    assert heatmaps(titled(at, "layer 0 · head 0 "))


@pytest.mark.slow
def test_zoom_without_the_sink_is_the_renormalised_rows(env):
    q0, k0, side = 900, 10, 64
    at = new_app(model=TINY, text=LONG, scale="linear", nosink=1, zoom=1, zq=q0, zk=k0, zn=side).run()
    ok(at)
    res = engine(LONG)
    rows = np.asarray(res.head(0, 0), dtype=np.float32)[q0 : q0 + side, 1:]  # key 0 dropped
    want = (rows / rows.sum(-1, keepdims=True))[:, k0 : k0 + side]  # shown keys k0.. (positions k0+1..)
    head = heatmaps(titled(at, "layer 0 · head 0 "))[0]
    assert np.abs(z_of(head) - want).max() <= 1e-6
    assert head["x"] == labels(LONG)[k0 + 1 : k0 + 1 + side]


@pytest.mark.slow
def test_a_view_past_the_free_memory_is_a_message(env):
    at = new_app(model=TINY, text=LONG, layer=0).run()
    ok(at)
    env.setattr(limits, "free_bytes", lambda device: 2**20)  # 1 MiB free from now on
    at.slider(key="layer").set_value(LAYER).run()  # the result is cached; the pooled view is new
    assert not at.exception, [e.value for e in at.exception]
    errors = [e.value for e in at.error]
    assert errors and all(
        "a pooled view needs" in e and "GiB free on cpu — try fewer cells" in e for e in errors
    )
    env.setattr(limits, "free_bytes", lambda device: 2**40)
    at.slider(key="layer").set_value(0).run()  # the app keeps serving
    ok(at)


def test_a_row_window_fills_the_payload_budget_at_the_drawn_key_width():
    """The head's row window holds as many query rows as the single-view budget allows at the
    width the heatmap draws (keys past `SINGLE_MAX_KEYS` are pooled to that many columns), and
    every row when the whole head fits. Caught: the window sized by every key, not the drawn
    columns (a 4,000-token head showed 100 rows at a time instead of 390)."""
    from ui import shown

    for n_q, n_k in [(10, 10), (4000, 4000), (3000, 700), (600, 5000)]:
        rows = shown.window_rows(n_q, n_k)
        if n_q * n_k <= F.SINGLE_MAX_CELLS:
            assert rows == n_q
            continue
        width = min(n_k, F.SINGLE_MAX_KEYS)
        assert rows * width <= F.SINGLE_MAX_CELLS < (rows + 1) * width or rows == 16


def test_when_free_memory_is_the_limit_the_page_offers_the_first_tokens(env):
    """The engine's admission names the memory and the page offers the start that fits (it never
    did when memory, not the cap or the position table, was the limit)."""
    import tiny

    lm = tiny.loaded("llama-gqa")
    small = int(per_token(lm) * 40 / limits.USABLE) + 1  # room for 40 tokens
    env.setattr(limits, "free_bytes", lambda device: small)
    text = "the bank of the river " * 12
    at = new_app(model=TINY, text=text).run()
    assert not at.exception
    (error,) = [e.value for e in at.error]
    assert "tokens need" in error and "GiB free on cpu — try at most 40 tokens" in error
    assert any("Up to 40 tokens (the free memory on cpu)" in c.value for c in at.sidebar.caption)
    next(b for b in at.button if b.label == "Use the first 40 tokens").click().run()
    ok(at)
    assert 0 < len(at.dataframe[0].value["token"]) <= 40 and heatmaps(titled(at, "layer 0 · head 0 "))


def test_the_cap_caption_and_the_refusal_read_one_admission(env):
    """Issue 38: the sidebar's caption, the cut offer and the extraction read one admission. Free
    memory that moves between two measurements (here: room for 40 tokens, then for 80) must not
    give a caption of one limit and a refusal of another."""
    import re

    import tiny

    lm = tiny.loaded("llama-gqa")
    rooms = iter([40] + [80] * 50)
    env.setattr(limits, "free_bytes", lambda device: int(per_token(lm) * next(rooms) / limits.USABLE) + 1)
    at = new_app(model=TINY, text="the bank of the river " * 24).run()
    assert not at.exception
    (error,) = [e.value for e in at.error]
    refused = re.search(r"try at most (\d+) tokens", error)
    shown = [re.search(r"Up to (\d+) tokens \(the free memory", c.value) for c in at.sidebar.caption]
    captions = [m.group(1) for m in shown if m]
    assert refused and captions == [refused.group(1)], (captions, error)
