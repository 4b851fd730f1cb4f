"""Every block of every tiny hybrid in the notebook: `block_view` and `head_view` either draw it or
say in one line why not (a softmax-only block, a block that mixes no tokens), never a plotly or
unpacking traceback. GLM-5-Next's 16 Kimi-delta heads and Nemotron-H's 32 Mamba-2 heads once broke
the grid's spacing; Nemotron-H's MLP-only blocks once failed to unpack their (no) mixers."""

from __future__ import annotations

import archs
import hybrids_tiny
import plotly.graph_objects as go
import pytest
import tiny
import torch
import transformers as tf

import attnviz
from attnviz.errors import AttnvizError
from attnviz.figures import mixers as M
from attnviz.figures import notebook as NB

IDS = [3 + (i * 37) % 300 for i in range(20)]
# Built from tests/archs.py's configs (not in hybrids_tiny): many heads, MLP-only blocks.
FROM_ARCHS = {"glm5_next": tf.AutoModelForImageTextToText, "nemotron_h": tf.AutoModelForCausalLM}
SLOW = {"qwen3_next", "zamba2", "glm5_next"}  # seconds each (a VLM, MoE, shared blocks)


def _result(model_type: str):
    if model_type in FROM_ARCHS:
        torch.manual_seed(0)
        model = FROM_ARCHS[model_type].from_config(archs.tiny_config(model_type)).eval()
        lm = attnviz.wrap_model(model, tiny.tokenizer(), spec=f"tiny-{model_type}")
    else:
        lm = hybrids_tiny.loaded(model_type)
    return attnviz.extract_ids(lm, IDS)


def _says_why(err: Exception, block: int) -> None:
    text = str(err)
    assert "\n" not in text and f"block {block}" in text and len(text.split()) >= 6, repr(text)


@pytest.mark.parametrize(
    "model_type",
    [
        pytest.param(t, marks=pytest.mark.slow) if t in SLOW else t
        for t in [*FROM_ARCHS, *sorted(hybrids_tiny.SHAPES)]
    ],
)
def test_every_block_draws_or_says_why(model_type):
    res = _result(model_type)
    for block, kinds in enumerate(res.layout.mixers):
        try:
            fig = M.block_view(res, block)
        except (AttnvizError, ValueError) as err:
            assert not kinds or kinds == ("attention",), f"block {block} {kinds}: {err}"
            _says_why(err, block)
        else:
            assert isinstance(fig, go.Figure) and fig.data, (model_type, block)
        for kind in kinds:
            fig = NB.head_view(res, layer=block, mixer=kind)
            assert isinstance(fig, go.Figure) and fig.data, (model_type, block, kind)
