"""Explorer on tiny hybrids (tests/hybrids_tiny.py, served as ``hybrid:<model_type>``): the block
picker lists every block with its mixer, a non-attention block draws its exact effective
attention (signed, centred at 0) and its self-check line, a parallel block both branches."""

from __future__ import annotations

import hybrids_tiny
import numpy as np
from apptest import TEXT, heatmaps, new_app, ok, specs, titled, z_of

import attnviz
from ui.mixers import BLOCK_KEY, HEAD_KEY

hybrids_tiny.register()
QWEN = "hybrid:qwen3_5_text"


def _engine(model_type: str) -> attnviz.AttentionResult:
    return attnviz.extract(hybrids_tiny.loaded(model_type), TEXT)


def test_picker_lists_every_block_with_its_mixer_and_draws_the_delta_rule_head(env):
    at = new_app(model=QWEN, text=TEXT).run()
    ok(at)
    picker = at.selectbox(key=BLOCK_KEY)
    assert picker.options == [
        "block 0 · Gated DeltaNet",
        "block 1 · softmax attention",
        "block 2 · Gated DeltaNet",
        "block 3 · softmax attention",
    ]
    picker.set_value(2).run()
    ok(at)
    big = titled(at, "block 2 · head 0<br>Gated DeltaNet<br>effective attention (signed, not probabilities)")
    trace = heatmaps(big)[0]
    want = _engine("qwen3_5_text").head(2, 0, mixer="gated_delta")
    np.testing.assert_allclose(z_of(trace), want, atol=1e-7)
    ax = big["layout"]["coloraxis"]
    assert ax["cmid"] == 0 and ax["cmin"] == -ax["cmax"]
    exact = [c.value for c in at.caption if c.value.startswith("Exact: gated_delta block 2 checked")]
    assert exact and "max |Δ|" in exact[0]
    bars = [s for s in specs(at) if s["data"][0]["type"] == "bar"]
    assert bars and "each source token's weight" in bars[0]["layout"]["title"]["text"]
    # another head: the big view is that head's matrix (caught: the big view always head 0)
    at.selectbox(key=HEAD_KEY).set_value(1).run()
    ok(at)
    big = titled(at, "block 2 · head 1<br>Gated DeltaNet")
    want = _engine("qwen3_5_text").head(2, 1, mixer="gated_delta")
    np.testing.assert_allclose(z_of(heatmaps(big)[0]), want, atol=1e-7)


def test_an_attention_block_hands_over_to_the_attention_layer_view(env):
    at = new_app(model=QWEN, text=TEXT).run()
    at.selectbox(key=BLOCK_KEY).set_value(3).run()
    ok(at)
    head = titled(at, "head 0 ")
    trace = heatmaps(head)[0]
    np.testing.assert_allclose(z_of(trace), _engine("qwen3_5_text").head(1, 0), atol=1e-6)  # layer 1
    assert np.allclose(z_of(trace).sum(-1), 1.0, atol=1e-5)


def test_parallel_block_shows_both_branches_and_their_shares(env):
    at = new_app(model="hybrid:falcon_h1", text=TEXT).run()
    ok(at)
    assert at.selectbox(key=BLOCK_KEY).options[0] == "block 0 · softmax attention + Mamba-2 (SSD)"
    both = titled(at, "parallel branches")
    assert len(heatmaps(both)) == 2
    names = [a["text"] for a in both["layout"]["annotations"]]
    assert "of the block's output" in names[0] and "signed, not probabilities" in names[1]
    assert any("2 branches" in i.value for i in at.info)


def test_overview_covers_every_block_and_says_what_does_not_apply(env):
    at = new_app("pages/1_Model_overview.py", model=QWEN, text=TEXT).run()
    ok(at)
    table = at.dataframe[0].value
    assert sorted(set(table["block"])) == [0, 1, 2, 3]
    delta = table[table["mixer"] == "Gated DeltaNet"]
    assert len(delta) == 2 * 4  # two blocks x four value heads
    assert set(delta["entropy"]) == {"not applicable: signed, unnormalised"}
    assert delta["mean |A| distance"].notna().all()
    assert set(table[table["mixer"] == "softmax attention"]["entropy"]) == {
        "see the attention statistics below"
    }


def test_from_scratch_recomputes_a_delta_rule_head_three_ways(env):
    at = new_app("pages/2_From_scratch.py", model=QWEN, text=TEXT).run()
    ok(at)
    at.selectbox(key="_attnviz_scratch_mixer").set_value("block 2 · Gated DeltaNet").run()
    ok(at)
    shown = {m.label: m.value for m in at.metric}
    for name in ("recurrence vs model", "closed form vs model", "recurrence vs closed form"):
        value = shown[f"max |Δ| {name}"]
        assert value.endswith("✓") and float(value.split()[0]) < 1e-6, (name, value)
    closed = titled(at, "block 2 · head 0 · closed form")
    want = _engine("qwen3_5_text").head(2, 0, mixer="gated_delta")
    np.testing.assert_allclose(z_of(heatmaps(closed)[0]), want, atol=1e-6)
    assert "S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1}" in at.code[0].value
    table = at.dataframe[0].value
    np.testing.assert_allclose(table["recurrence o_t"], table["model (kernel)"], atol=1e-6)


def test_a_long_text_draws_pooled_heads_and_exact_rows(env, monkeypatch):
    import ui.mixers

    monkeypatch.setattr(ui.mixers, "MAX_ROWS", 6)  # the tiny text is "long" past 6 tokens
    monkeypatch.setattr(ui.mixers, "HEAD_CELLS", 3)
    at = new_app(model=QWEN, text=TEXT).run()
    at.selectbox(key=BLOCK_KEY).set_value(0).run()
    ok(at)
    res = _engine("qwen3_5_text")
    big = titled(at, "block 0 · head 0 (mean over blocks of")
    pooled = res.mixer_pooled(0, "gated_delta", 0, cells=3).mean
    np.testing.assert_allclose(z_of(heatmaps(big)[0]), pooled, atol=1e-7)
    bars = next(s for s in specs(at) if s["data"][0]["type"] == "bar")
    from apptest import vals

    np.testing.assert_allclose(vals(bars["data"][0]["y"]), res.head(0, 0, mixer="gated_delta")[-1], atol=1e-7)


def test_a_link_to_an_attention_layer_opens_its_block(env):
    at = new_app(model=QWEN, text=TEXT, layer=1).run()
    ok(at)
    assert at.selectbox(key=BLOCK_KEY).value == 3  # attention layer 1 is block 3
    fresh = new_app(model=QWEN, text=TEXT).run()
    assert fresh.selectbox(key=BLOCK_KEY).value == 0  # no link: the first block


def test_a_pure_mamba_model_opens_in_the_explorer_and_the_overview(env):
    at = new_app(model="hybrid:mamba", text=TEXT).run()
    ok(at)
    assert at.selectbox(key=BLOCK_KEY).options == ["block 0 · Mamba-1", "block 1 · Mamba-1"]
    big = titled(at, "block 0 · head 0")
    assert "token contribution norms" in big["layout"]["title"]["text"]
    np.testing.assert_allclose(z_of(heatmaps(big)[0]), _engine("mamba").head(0, 0, mixer="mamba"), atol=1e-6)
    over = new_app("pages/1_Model_overview.py", model="hybrid:mamba", text=TEXT).run()
    ok(over)
    assert list(over.dataframe[0].value["head"]) == ["all channels", "all channels"]


def test_a_block_that_fails_its_check_shows_the_reason_and_no_matrix(env, monkeypatch):
    from attnviz.errors import MixerCheckFailed
    from attnviz.mixers.store import MixerStore

    real = MixerStore.check

    def failing(self, block, kind):
        if block == 0:
            raise MixerCheckFailed(f"block {block}'s {kind} mixer: its effective attention misses the kernel")
        return real(self, block, kind)

    monkeypatch.setattr(MixerStore, "check", failing)
    at = new_app(model=QWEN, text=TEXT).run()
    assert not at.exception
    assert any("misses the kernel" in e.value for e in at.error)
    assert not [s for s in specs(at) if "block 0" in (s["layout"].get("title") or {}).get("text", "")]


def test_contribution_bars_are_the_value_weighted_norms(env):
    from apptest import vals

    at = new_app(model=QWEN, text=TEXT).run()
    at.radio(key="_attnviz_mixer_bars").set_value(
        "contribution ‖c_{t,s}‖ (through the output projection)"
    ).run()
    ok(at)
    bars = next(s for s in specs(at) if s["data"][0]["type"] == "bar")
    want = _engine("qwen3_5_text").mixer_contributions(0, "gated_delta", heads=[0])[0, -1]
    np.testing.assert_allclose(vals(bars["data"][0]["y"]), want, rtol=1e-6, atol=1e-9)
    assert (
        "contribution" in bars["layout"]["title"]["text"]
        and "not probabilities" in bars["layout"]["title"]["text"]
    )


def test_attention_with_a_short_conv_says_what_its_maps_do_not_show(env):
    at = new_app(model="hybrid:zaya", text=TEXT, layer=1).run()
    ok(at)
    conv = [c.value for c in at.caption if "short convolution" in c.value]
    assert conv == [
        "Block 1: its attention also mixes neighbouring tokens through a short convolution on q/k (and "
        "half of v comes from the previous token), which this map does not show."
    ]
    plain = new_app(model=QWEN, text=TEXT, layer=1).run()  # plain softmax attention: no such line
    assert not [c.value for c in plain.caption if "short convolution" in c.value]


def test_the_share_link_keeps_the_chosen_block(env):
    at = new_app(model=QWEN, text=TEXT).run()
    at.selectbox(key=BLOCK_KEY).set_value(2).run()
    ok(at)
    assert at.query_params["block"] == "2"
    again = new_app(model=QWEN, text=TEXT, block=2).run()  # the link opens that block again
    ok(again)
    assert again.selectbox(key=BLOCK_KEY).value == 2
    assert titled(again, "block 2 · head 0")
    far = new_app(model=QWEN, text=TEXT, block=9).run()  # past the last block: said, and the last
    assert not far.exception and far.selectbox(key=BLOCK_KEY).value == 3
    assert [w.value for w in far.warning] == ["Block 9 is out of range (0–3); showing block 3."]


def test_the_summary_sentence_counts_a_hybrids_blocks(env):
    """Issue 40: the one-sentence summary said "1 layers of 4 heads" of a hybrid; it counts blocks."""
    at = new_app(model=QWEN, text=TEXT).run()
    ok(at)
    first = at.markdown[0].value
    res = _engine(QWEN.split(":")[1])
    n_blocks, n_attn = len(res.layout.mixers), res.layout.n_layers
    assert f"through {n_blocks} blocks, {n_attn} softmax attention layer" in first, first
    assert "1 layers" not in first
