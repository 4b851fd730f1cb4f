"""The one admission rule for a text (`attnviz.inputs.admit`), tested at the engine's door:
`extract`, `extract_ids` and `admit` enforce the token cap, the model's position table and the
free memory, prompt and tokens to generate together, with the reason and what fits."""

from __future__ import annotations

import functools

import pytest
import tiny
import torch
import transformers as tf

import attnviz
from attnviz import limits
from attnviz.errors import InputTooLong, OutOfMemory, TooManyPositions
from attnviz.inputs import admit, admit_ids, token_limit, tokenize

TEXT = "the financial bank is located on river bank and the quick brown fox jumps over the lazy dog"


@functools.cache
def short_gpt2():
    """GPT-2 with a 16-row position table: the table is the smallest limit."""
    torch.manual_seed(0)
    cfg = tf.GPT2Config(vocab_size=tiny.VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=16)
    return tf.GPT2LMHeadModel(cfg).eval()


def short():
    return attnviz.wrap_model(short_gpt2(), tiny.tokenizer(), spec="tiny-gpt2-16")


def n_of(lm, text: str = TEXT) -> int:
    return len(tokenize(lm, text)[0])


@pytest.mark.parametrize("generate", [0, 3])
def test_the_token_cap_at_extract(generate):
    lm = tiny.loaded("llama-gqa")
    n = n_of(lm)
    with pytest.raises(
        InputTooLong,
        match=rf"has {n} tokens.*; the limit is {n + generate - 1}\. Shorten the text or use its first",
    ):
        attnviz.extract(lm, TEXT, max_tokens=n + generate - 1, generate=generate)
    res = attnviz.extract(lm, TEXT, max_tokens=n + generate, generate=generate)  # exactly at the cap
    assert res.n_tokens == n + generate
    ids = list(res.tokens.ids[:n])
    with pytest.raises(InputTooLong, match="the limit is"):
        attnviz.extract_ids(lm, ids, max_tokens=n + generate - 1, generate=generate)


@pytest.mark.parametrize("generate", [0, 4])
def test_the_position_table_at_extract(generate):
    """16 positions: a text of 17 - generate tokens is refused naming the table and the tokens
    that fit beside those generated; one token fewer runs (the model itself would fail past 16)."""
    lm = short()
    assert token_limit(lm) == (16, "positions")
    words = TEXT.split()
    text = next(
        " ".join(words[:k]) for k in range(1, len(words)) if n_of(lm, " ".join(words[:k])) > 16 - generate
    )
    n = n_of(lm, text)
    with pytest.raises(TooManyPositions, match=rf"reads at most 16 positions .* has {n} tokens") as err:
        attnviz.extract(lm, text, generate=generate)
    assert err.value.limit == 16 and f"first {16 - generate} tokens" in str(err.value)
    adm = admit(lm, text, generate=generate)
    assert adm.limit == "positions" and adm.fits == 16 - generate
    assert adm.first is not None and n_of(lm, adm.first) <= adm.fits and text.startswith(adm.first)
    res = attnviz.extract(lm, adm.first, generate=generate)
    assert res.n_tokens <= 16


@pytest.mark.parametrize("generate", [0, 3])
def test_free_memory_at_extract(monkeypatch, generate):
    """Room for n - 1 tokens: refused with the memory's sentence and what fits; with room for n the
    text runs."""
    lm = tiny.loaded("llama-gqa")
    n = n_of(lm) + generate
    lay = lm.layout
    per_token = (
        limits.capture_bytes(lay, 1, lm.dtype)
        + limits.forward_bytes(lay, 1, lm.dtype)
        + limits.stats_pass_bytes(lay, 1)
    )
    monkeypatch.setattr(limits, "free_bytes", lambda device: int((n - 1) * per_token / limits.USABLE) + 1)
    assert token_limit(lm) == (n - 1, "memory")
    with pytest.raises(
        OutOfMemory, match=rf"^{n} tokens need .* GiB free on cpu — try at most {n - 1} tokens"
    ):
        attnviz.extract(lm, TEXT, generate=generate)
    adm = admit(lm, TEXT, generate=generate)
    assert adm.limit == "memory" and adm.fits == n - 1 - generate and adm.first is not None  # the offer
    monkeypatch.setattr(limits, "free_bytes", lambda device: int(n * per_token / limits.USABLE) + 1)
    assert attnviz.extract(lm, TEXT, generate=generate).n_tokens == n


def test_the_generation_budget():
    """Tokens to generate count against every limit; all of it to generate leaves no prompt: no
    cut text is offered, and the sentence says to generate fewer."""
    lm = short()
    adm = admit(lm, "the bank", generate=16)
    assert not adm.admitted and adm.fits == 0 and adm.first is None
    assert "ask for fewer than 16 tokens to generate" in adm.refusal
    with pytest.raises(TooManyPositions):
        attnviz.extract(lm, "the bank", generate=16)
    with pytest.raises(attnviz.AttnvizError, match="generate must be 0 or more"):
        attnviz.extract(lm, "the bank", generate=-1)
    cap = admit(tiny.loaded("llama-gqa"), "the bank", generate=8, max_tokens=8)
    assert cap.limit == "cap" and "ask for fewer than 8 tokens to generate" in cap.refusal


def test_the_smallest_limit_is_named_and_ties_name_the_table():
    lm = short()
    assert token_limit(lm, max_tokens=16) == (16, "positions")
    assert token_limit(lm, max_tokens=15) == (15, "cap")
    assert token_limit(lm, max_tokens=15, memory=False) == (15, "cap")
    assert admit_ids(lm, [5] * 15, max_tokens=15).admitted
    assert not admit_ids(lm, [5] * 15, max_tokens=15, generate=1).admitted


def test_the_explanations_read_the_same_rule():
    """`trace` (and the hybrids' `stream`) refuse past the cap and past the position table with
    the engine's sentence (the table: a crash inside the model before); memory is their own
    estimate (`attnviz.limits.require`)."""
    import hybrids_tiny

    from attnviz.explain import trace
    from attnviz.explain.stream import stream

    lm = tiny.loaded("llama-gqa")
    n = n_of(lm)
    with pytest.raises(InputTooLong, match=rf"has {n} tokens; the limit is {n - 1}\. Shorten the text"):
        trace(lm, TEXT, max_tokens=n - 1)
    assert trace(lm, TEXT, max_tokens=n).n_tokens == n
    with pytest.raises(TooManyPositions, match="reads at most 16 positions"):
        trace(short(), TEXT)
    mamba = hybrids_tiny.loaded("mamba")
    with pytest.raises(InputTooLong, match=rf"the limit is {n - 1}\."):
        stream(mamba, TEXT, max_tokens=n - 1)
