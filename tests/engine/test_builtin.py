"""The two built-in real models: offline loading, layout, parity at length."""

import numpy as np
import pytest

import attnviz

pytestmark = pytest.mark.slow

TEXT = "the financial bank is located on river bank"


def test_smollm_layout(smollm):
    lay = smollm.layout
    assert (lay.model_type, lay.kind) == ("llama", "decoder")
    assert (lay.n_layers, lay.n_heads, lay.n_kv_heads, lay.head_dim, lay.d_model) == (30, 9, 3, 64, 576)
    assert smollm.supports_capture and smollm.has_chat_template
    assert attnviz.loading.cache_dir().joinpath("smollm2-135m", "model.safetensors").exists()


def test_minilm_layout(minilm):
    lay = minilm.layout
    assert (lay.model_type, lay.kind, lay.n_layers, lay.n_heads) == ("bert", "encoder", 6, 12)


def test_smollm_tokens_and_parity_short(smollm):
    fast = attnviz.extract(smollm, TEXT)
    eager = attnviz.extract(smollm, TEXT, path="eager")
    assert fast.tokens.display == ("the", "financial", "bank", "is", "located", "on", "river", "bank")
    diff = max(np.abs(fast.layer(i) - eager.layer(i)).max() for i in range(30))
    assert diff <= 1e-5


def test_minilm_parity_and_special_tokens(minilm):
    fast = attnviz.extract(minilm, TEXT)
    eager = attnviz.extract(minilm, TEXT, path="eager")
    assert fast.tokens.raw[0] == "[CLS]" and fast.tokens.raw[-1] == "[SEP]"
    assert fast.tokens.special[0] and not fast.tokens.special[1]
    diff = max(np.abs(fast.layer(i) - eager.layer(i)).max() for i in range(6))
    assert diff <= 1e-5


def test_smollm_chat_template(smollm):
    res = attnviz.extract(smollm, TEXT, chat=True)
    user = [d for d, t in zip(res.tokens.display, res.tokens.template, strict=True) if not t]
    assert user == ["the", "financial", "bank", "is", "located", "on", "river", "bank"]
    assert res.tokens.raw[0] == "<|im_start|>"


def test_smollm_parity_at_2048_tokens(smollm):
    rng = np.random.default_rng(0)
    words = ["bank", "river", "money", "water", "loan", "fish", "stream", "account", "shore", "deposit"]
    text = " ".join(rng.choice(words, size=4000))
    ids = smollm.tokenizer(text)["input_ids"][:2048]
    fast = attnviz.extract_ids(smollm, ids)
    eager = attnviz.extract_ids(smollm, ids, path="eager")
    diff = max(float(np.abs(fast.layer(i) - eager.layer(i)).max()) for i in range(30))
    assert diff <= 5e-4
    # and the fast result is small: Q/K only, not 30 x 9 x N x N
    assert fast.nbytes * 10 < eager.nbytes
