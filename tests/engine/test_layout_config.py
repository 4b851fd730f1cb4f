"""Reading the attention layout from configs transformers 5 builds layer by layer, and the
architectures attnviz refuses from the config alone (before any weights are loaded).

Heterogeneous configs (``per_layer_config``: Gemma 4's wider full-attention heads, NeoMME's two
window sizes, Dots3's smaller sliding-layer heads) raise on a global read of a per-layer
attribute; the layout reads them layer by layer and refuses what one layout cannot hold.
"""

from __future__ import annotations

import archs
import pytest
import torch

import attnviz
from attnviz.errors import ModelHasNoAttention
from attnviz.loading import attention_layout


def test_per_layer_head_sizes_are_read_layer_by_layer():
    cfg = archs.tiny_config("gemma4_text")  # head_dim 8, 16 in the full-attention layers
    assert cfg.is_heterogeneous
    lay = attention_layout(cfg)
    assert (lay.n_heads, lay.n_kv_heads, lay.head_dim) == (4, 2, 16)  # the largest head size
    assert lay.layer_types == ("sliding_attention", "full_attention") * 2


def test_per_layer_windows_that_differ_give_no_single_window():
    neo = attention_layout(archs.tiny_config("neomme"))  # windows 4 and 8 among its sliding layers
    assert neo.sliding_window is None  # each layer's own mask is then checked, not assumed
    mistral = attention_layout(archs.tiny_config("mistral"))  # one window for every layer
    assert mistral.sliding_window == 4


def test_layers_with_different_head_counts_are_refused_with_the_counts():
    with pytest.raises(ModelHasNoAttention, match=r"different number of query heads .*\(2 / 4\)"):
        attention_layout(archs.tiny_config("dots3_note_text"))


@pytest.mark.parametrize(
    ("model_type", "words"),
    [
        ("blt", "patches of bytes"),
        ("funnel", "pools the sequence"),
        ("longformer", "sliding window"),
        ("gemma4_assistant", "does not run on text alone"),
        ("fnet", "no softmax attention"),
    ],
)
def test_architectures_that_cannot_be_shown_say_why(model_type, words):
    with pytest.raises(ModelHasNoAttention, match=words) as err:
        attention_layout(archs.tiny_config(model_type))
    assert repr(model_type) in str(err.value)


@pytest.mark.slow
def test_gemma4_kv_shared_layers_keep_every_query_row():
    """Gemma 4 runs its KV-shared layers on the kept logit positions only when ``logits_to_keep``
    is an int; attnviz must still see all N query rows of those layers, equal to eager's."""
    model, eager = archs.build("gemma4_text", "causal")
    assert model.config.num_kv_shared_layers == 2
    ids = [3 + (i * 37) % 300 for i in range(12)]
    lm = attnviz.wrap_model(model, archs.tokenizer(), spec="tiny-gemma4")
    res = attnviz.extract_ids(lm, ids)
    with torch.inference_mode():
        ref = eager(input_ids=torch.tensor([ids]), output_attentions=True, use_cache=False).attentions
    assert res.n_layers() == len(ref) == 4
    for layer, want in enumerate(ref):
        got = res.layer_tensor(layer).cpu()
        assert got.shape == (4, 12, 12), (layer, tuple(got.shape))
        assert float((got - want[0]).abs().max()) <= 1e-4, layer


def test_every_named_refusal_is_a_model_type_transformers_knows():
    from transformers import CONFIG_MAPPING

    from attnviz.loading import config

    assert set(config._CANNOT_SHOW) <= set(CONFIG_MAPPING), set(config._CANNOT_SHOW) - set(CONFIG_MAPPING)


def test_other_per_layer_attributes_never_raise_from_the_layout():
    """Any attribute may be per-layer in transformers 5: read globally it raises; the layout then
    takes it only when every layer agrees (soft-capping here, shown by `attnviz info`)."""
    from transformers import Gemma2Config

    small = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}
    same = Gemma2Config(**small, num_hidden_layers=2, attn_logit_softcapping=50.0)
    differ = Gemma2Config(
        **small, num_hidden_layers=2, per_layer_config={1: {"attn_logit_softcapping": 30.0}}
    )
    assert attention_layout(same).softcap == 50.0
    assert differ.is_heterogeneous
    assert attention_layout(differ).softcap is None


def test_fewer_key_value_heads_in_some_layers_are_refused():
    """Gemma 4 checkpoints with ``num_global_key_value_heads`` (26B-A4B: 2) group their query heads
    differently in the full-attention layers; one layout has one grouping, so attnviz says so."""
    like_26b = {**archs.EXTRA["gemma4_text"], "attention_k_eq_v": True, "num_global_key_value_heads": 1}
    cfg = archs._shrink(type(archs.tiny_config("gemma4_text")), like_26b)
    with pytest.raises(ModelHasNoAttention, match=r"different number of key/value heads .*\(1 / 2\)"):
        attention_layout(cfg)
