"""Hybrid models (attention in only some blocks): result layer i is the i-th attention layer,
labelled with the model's own block index; the other blocks are named as having no map."""

from __future__ import annotations

import archs
import numpy as np
import pytest
import torch
import transformers as tf

import attnviz

IDS = [3 + (i * 37) % 300 for i in range(12)]


def _loaded(model_type: str):
    model, eager = archs.build(model_type, "causal")
    tok = tf.PreTrainedTokenizerFast(tokenizer_object=archs._tokenizer(), pad_token="<pad>")
    return attnviz.wrap_model(model, tok, spec=f"tiny-{model_type}"), eager


@pytest.mark.parametrize(
    ("model_type", "blocks", "n_blocks"),
    [("jamba", (1, 3), 4), ("qwen3_next", (1, 3), 4), ("bamba", (1, 3), 4), ("zamba2", (1, 3), 4)],
)
def test_attention_layers_keep_their_block_index(model_type, blocks, n_blocks):
    lm, eager = _loaded(model_type)
    lay = lm.layout
    assert lay.attention_layers == blocks and lay.n_blocks == n_blocks and lay.n_layers == len(blocks)
    assert [lay.layer_label(i) for i in range(lay.n_layers)] == [f"layer {b}" for b in blocks]
    assert lay.blocks_without_attention == tuple(b for b in range(n_blocks) if b not in blocks)
    res = attnviz.extract_ids(lm, IDS, verify=True)
    assert res.n_layers() == len(blocks) and res.method == "fast exact"
    with torch.inference_mode():
        out = eager(input_ids=torch.tensor([IDS]), output_attentions=True, use_cache=False)
    ref = [a[0].numpy() for a in out.attentions if a is not None]
    assert len(ref) == len(blocks)
    for i in range(len(blocks)):
        assert np.abs(res.layer(i) - ref[i]).max() <= 1e-5
    with pytest.raises(attnviz.errors.BadIndex):
        res.layer(len(blocks))


def test_dense_models_have_no_gaps():
    lm, _ = _loaded("llama")
    assert lm.layout.attention_layers == () and lm.layout.blocks_without_attention == ()
    assert lm.layout.layer_label(1) == "layer 1"


@pytest.mark.parametrize("model_type", ["mamba", "rwkv", "falcon_mamba"])
def test_pure_state_space_models_have_no_attention_layers_but_are_not_refused(model_type):
    """Their blocks are mixers (attnviz.mixers; tests/engine/test_mixers.py shows them)."""
    lay = attnviz.loading.attention_layout(archs.tiny_config(model_type))
    assert lay.n_layers == 0 and lay.n_blocks == 2


def test_models_without_any_token_mixer_attnviz_knows_are_refused_with_a_reason():
    with pytest.raises(attnviz.errors.ModelHasNoAttention, match="no softmax attention"):
        attnviz.loading.attention_layout(archs.tiny_config("fnet"))


def test_vision_language_models_load_their_language_model():
    cfg = archs.tiny_config("llava")
    assert attnviz.loading.model_kind(cfg) == "decoder"
    assert attnviz.loading.auto_class("decoder", cfg) is tf.AutoModelForImageTextToText
    for encoder in ("nomic_bert", "convbert", "mobilebert"):
        cfg = archs.tiny_config(encoder)
        assert attnviz.loading.model_kind(cfg) == "encoder", encoder
        assert attnviz.loading.auto_class("encoder", cfg) is tf.AutoModel


def test_the_app_says_which_blocks_have_no_attention_map():
    from ui import models

    lm, _ = _loaded("jamba")
    line = models.describe_layout(lm.layout)
    assert (
        "4 blocks: Mamba-1 in blocks 0, 2; softmax attention in blocks 1, 3 · "
        "softmax attention: 2 layers × 4 heads" in line
    )
    assert "recurrent / state-space" not in line  # each block's mixer named, not a catch-all


@pytest.mark.parametrize(
    ("model_type", "named"), [("mamba", "Mamba-1"), ("rwkv", "RWKV-4"), ("falcon_mamba", "Mamba-1")]
)
def test_the_model_line_of_a_pure_recurrent_model_names_its_mixers_not_zero_heads(model_type, named):
    from ui import models

    lm, _ = _loaded(model_type)
    line = models.describe_layout(lm.layout)
    assert f"2 blocks, no softmax attention ({named} in blocks 0, 1)" in line
    assert "0 layers" not in line and "head_dim 0" not in line


def test_explain_refuses_a_pure_recurrent_model_naming_its_mixers():
    from attnviz.explain import residual
    from attnviz.explain.blocks import Unsupported

    lm, _ = _loaded("mamba")
    with pytest.raises(Unsupported, match=r"no softmax attention: its token mixers are mamba in blocks 0, 1"):
        residual.trace(lm, IDS)
