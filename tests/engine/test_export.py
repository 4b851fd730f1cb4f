"""The compact export (captured queries, keys, values) reads back as a result whose every head is
the live result's, bit for bit; the dense export keeps the documented keys; `auto` picks by size."""

from __future__ import annotations

import copy
import io

import numpy as np
import pytest
import tiny
import torch

import attnviz
from attnviz import export

TEXT = tiny.CORPUS[0]


def round_trip(res: attnviz.AttentionResult, fmt: str) -> tuple[attnviz.AttentionResult, bytes]:
    buf = io.BytesIO()
    assert attnviz.save_npz(res, buf, format=fmt) == fmt
    data = buf.getvalue()
    return attnviz.load_npz(io.BytesIO(data)), data


def assert_same_heads(live: attnviz.AttentionResult, back: attnviz.AttentionResult) -> None:
    assert back.stacks == live.stacks and back.layout == live.layout
    assert back.tokens == live.tokens and back.decoder_tokens == live.decoder_tokens
    for stack in live.stacks:
        for layer in range(live.n_layers(stack)):
            for head in range(live.n_heads):
                ours, theirs = live.head(layer, head, stack=stack), back.head(layer, head, stack=stack)
                assert np.array_equal(ours, theirs), (stack, layer, head)


@pytest.mark.parametrize("arch", tiny.ARCHS)
def test_compact_file_recomputes_every_head_exactly(arch):
    """GQA, q/k norm, a sliding-window mask, soft-capping, GPT-2, BERT, BART (three stacks) and
    T5's position bias: the file's heads are the live result's, bit for bit."""
    live = attnviz.extract(tiny.loaded(arch), TEXT)
    back, data = round_trip(live, "compact")
    assert_same_heads(live, back)
    assert back.nbytes == live.nbytes  # Q, K, V (and masks / biases), each stored once
    assert back.method == live.method == "fast exact" and back.model_name == live.model_name
    files = set(np.load(io.BytesIO(data)).files)
    assert {"tokens", "raw_tokens", "input_ids", "special", "format", "meta"} <= files
    assert not {f for f in files if f.endswith("attentions")}  # no (heads, N, N) in a compact file


def test_compact_keeps_bfloat16_bits():
    model = copy.deepcopy(tiny.model("llama-gqa")).to(torch.bfloat16)
    lm = attnviz.wrap_model(model, tiny.tokenizer("decoder"), spec="tiny-llama-bf16")
    live = attnviz.extract(lm, TEXT)
    back, _ = round_trip(live, "compact")
    cap, got = live.captured(1), back.captured(1)
    assert cap is not None and got is not None and got.query.dtype == torch.bfloat16
    assert torch.equal(cap.query, got.query) and torch.equal(cap.key, got.key)
    assert_same_heads(live, back)


def test_a_shared_mask_is_stored_once():
    live = attnviz.extract(tiny.loaded("mistral-sliding"), TEXT)
    masks = {id(live.captured(i).mask) for i in range(live.n_layers())}  # type: ignore[union-attr]
    _, data = round_trip(live, "compact")
    stored = [f for f in np.load(io.BytesIO(data)).files if f.endswith(".mask")]
    assert None not in masks and len(stored) == len(masks)


@pytest.mark.parametrize("arch", ["llama-gqa", "bart"])
def test_dense_file_keys_and_reading_back(arch):
    live = attnviz.extract(tiny.loaded(arch), TEXT)
    back, data = round_trip(live, "dense")
    assert_same_heads(live, back)
    files = np.load(io.BytesIO(data))
    n = len(live.tokens)
    assert list(files["tokens"]) == list(live.tokens.display) and files["input_ids"].dtype == np.int64
    if arch == "bart":
        assert files["cross_attentions"].shape == (2, 4, len(files["decoder_tokens"]), n)
        assert list(files["decoder_input_ids"]) == list(live.decoder_tokens.ids)  # type: ignore[union-attr]
    else:
        assert files["attentions"].shape == (live.n_layers(), live.n_heads, n, n)


def test_eager_results_have_no_compact_form():
    live = attnviz.extract(tiny.loaded("llama-gqa"), TEXT, path="eager")
    with pytest.raises(attnviz.AttnvizError, match="use the dense format"):
        attnviz.save_npz(live, io.BytesIO(), format="compact")
    assert export.choose_format(live, "auto") == "dense"


def test_auto_is_dense_for_short_inputs_and_compact_past_the_budget(monkeypatch):
    live = attnviz.extract(tiny.loaded("llama-gqa"), TEXT)
    n = len(live.tokens)
    assert export.dense_nbytes(live) == 3 * 4 * n * n * 4
    assert export.choose_format(live) == "dense"
    monkeypatch.setattr(export.npz, "DENSE_AUTO_BYTES", export.dense_nbytes(live) - 1)
    assert export.choose_format(live) == "compact"


def test_a_foreign_npz_is_refused_with_what_to_do():
    buf = io.BytesIO()
    np.savez(buf, attentions=np.zeros((1, 1, 2, 2), np.float32))
    buf.seek(0)
    with pytest.raises(attnviz.AttnvizError, match=r"read its arrays with numpy\.load"):
        attnviz.load_npz(buf)


def test_saving_to_a_path_never_leaves_half_a_file(tmp_path, monkeypatch):
    """A write that fails half-way (here: a full disk after the first bytes) keeps the old file
    whole and says what happened in one line; no temporary is left beside it."""
    import errno

    from attnviz.errors import CannotWrite

    live = attnviz.extract(tiny.loaded("llama-gqa"), TEXT)
    path = tmp_path / "attn.npz"
    attnviz.save_npz(live, path, format="compact")
    before = path.read_bytes()

    def full(file, **arrays):
        file.write(b"PK\x03\x04 half a zip")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "savez", full)
    with pytest.raises(CannotWrite, match=r"cannot write 'attn.npz' to .*: the disk is full"):
        attnviz.save_npz(live, path, format="compact")
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["attn.npz"]
    assert_same_heads(live, attnviz.load_npz(path))
