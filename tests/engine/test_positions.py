"""A model's own position limit (issue 31): a model with a learned position table reads at most
that many positions; past it the engine says so up front (`TooManyPositions`, with the limit to
offer the text's first tokens) instead of the model's size-mismatch RuntimeError; models that
compute positions (rotary, relative buckets) have no limit."""

from __future__ import annotations

import pytest
import tiny
import transformers as tf
from cli_run import run_cli

import attnviz
from attnviz.errors import InputTooLong, TooManyPositions
from attnviz.inputs import position_limit

SMALL = dict(vocab_size=tiny.VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
             intermediate_size=32)  # fmt: skip


@pytest.mark.parametrize(
    ("arch", "limit"), [("bert", 512), ("gpt2", 512), ("bart", 512), ("llama-gqa", None), ("t5", None)]
)
def test_the_limit_is_the_position_table(arch, limit):
    assert position_limit(tiny.model(arch)) == limit


def test_tables_that_start_past_row_0():
    """OPT's table starts at row 2 (``offset``), RoBERTa's after its padding row: 16 positions
    each, not the table's 18 rows."""
    opt = tf.OPTForCausalLM(
        tf.OPTConfig(**SMALL, ffn_dim=32, word_embed_proj_dim=32, max_position_embeddings=16)
    )
    roberta = tf.RobertaModel(tf.RobertaConfig(**SMALL, max_position_embeddings=18, pad_token_id=1))
    assert position_limit(opt) == 16 and position_limit(roberta) == 16


def test_past_the_table_a_clear_error_not_the_models():
    lm = tiny.loaded("bert")
    ok = attnviz.extract(lm, "river bank " * 200)  # under 512 tokens: fine
    assert ok.n_tokens <= 512
    with pytest.raises(TooManyPositions) as err:
        attnviz.extract(lm, "river bank " * 300)
    assert isinstance(err.value, InputTooLong) and err.value.limit == 512
    msg = str(err.value)
    assert "reads at most 512 positions" in msg and "use its first 512 tokens" in msg, msg


def test_the_cli_says_it_in_one_line(tmp_path):
    folder = tmp_path / "bert"
    tiny.model("bert").save_pretrained(folder)
    tiny.tokenizer("encoder").save_pretrained(folder)
    r = run_cli(
        "extract", "--model", str(folder), "--text", "river bank " * 300, "--out", str(tmp_path / "a.npz")
    )
    assert r.returncode == 1, r
    assert "reads at most 512 positions" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_first_tokens_fits_the_limit_and_runs():
    from attnviz.inputs import first_tokens, tokenize

    lm = tiny.loaded("bert")
    text = "the river bank, and then the financial bank. " * 60
    cut = first_tokens(lm, text, 512)
    n = len(tokenize(lm, cut)[0])
    assert text.startswith(cut) and 500 <= n <= 512, n
    assert attnviz.extract(lm, cut).n_tokens == n
