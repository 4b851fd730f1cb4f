"""attnviz.metrics and attnviz.analysis.rollout: hand-made patterns with known answers, then tiny models."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tiny
import torch

import attnviz
from attnviz import metrics as M
from attnviz.analysis import rollout as R
from attnviz.errors import AttnvizError

TEXT = "the financial bank is located on river bank and a quick brown fox jumps"
N = 7


def causal_uniform(n: int = N) -> np.ndarray:
    p = np.tril(np.ones((n, n)))
    return p / p.sum(-1, keepdims=True)


def previous_token(n: int = N) -> np.ndarray:
    p = np.eye(n, k=-1)
    p[0, 0] = 1.0
    return p


def bos_sink(n: int = N) -> np.ndarray:
    p = np.zeros((n, n))
    p[:, 0] = 1.0
    return p


# --- hand-made patterns --------------------------------------------------------------------------


def test_previous_token_pattern_scores_one():
    heads = np.stack([previous_token(), causal_uniform()])  # (head, query_pos, key_pos)
    assert M.previous_token_score(heads) == pytest.approx([1.0, np.mean([1 / (i + 1) for i in range(1, N)])])
    assert M.diagonal_score(heads)[0] == 0.0
    assert M.mean_distance(heads)[0] == pytest.approx(1.0)
    assert M.entropy(heads)[0] == pytest.approx(0.0, abs=1e-7)


def test_uniform_pattern_has_entropy_one():
    assert M.entropy(causal_uniform()) == pytest.approx(1.0, abs=1e-6)  # causal inferred
    assert M.entropy(causal_uniform(), causal=True) == pytest.approx(1.0, abs=1e-6)
    full = np.full((3, N, N), 1.0 / N)
    assert M.entropy(full) == pytest.approx([1.0] * 3, abs=1e-6)
    # Normalising by the full row length instead of the allowed keys would give less than 1.
    assert M.entropy(causal_uniform(), causal=False) < 0.9


def test_sliding_window_uniform_has_entropy_one():
    w = 3
    p = np.zeros((N, N))
    for i in range(N):
        p[i, max(0, i - w + 1) : i + 1] = 1.0 / min(i + 1, w)
    assert M.entropy(p, causal=True, window=w) == pytest.approx(1.0, abs=1e-6)
    counts = M.key_counts(torch.arange(N), N, causal=True, window=w)
    assert counts.tolist() == [1, 2, 3, 3, 3, 3, 3]


def test_bos_sink_has_sink_mass_one():
    p = bos_sink()
    assert M.sink_mass(p) == pytest.approx(1.0)
    assert M.entropy(p) == pytest.approx(0.0, abs=1e-7)
    # Row 0 (one allowed key) is left out: mean distance over rows 1..N-1 is the mean of 1..N-1.
    assert M.mean_distance(p) == pytest.approx(np.mean(np.arange(1, N)))
    assert M.sink_mass(causal_uniform()) == pytest.approx(np.mean([1 / (i + 1) for i in range(1, N)]))


def test_identity_pattern_has_diagonal_one_and_distance_zero():
    p = np.eye(N)
    assert M.diagonal_score(p) == pytest.approx(1.0)
    assert M.mean_distance(p) == pytest.approx(0.0)
    assert M.previous_token_score(p) == pytest.approx(0.0)
    assert M.diagonal_score(p, causal=False) == pytest.approx(1.0)


def test_scores_keep_leading_dims_and_accept_torch():
    p = torch.tensor(np.stack([[np.eye(N), bos_sink()]] * 2), dtype=torch.float32)  # (2, 2, N, N)
    assert M.diagonal_score(p).shape == (2, 2)
    assert M.diagonal_score(p)[:, 0] == pytest.approx([1.0, 1.0])
    assert M.sink_mass(p)[:, 1] == pytest.approx([1.0, 1.0])


def test_single_token_scores_zero_not_nan():
    p = np.ones((2, 1, 1))
    for fn in (M.entropy, M.sink_mass, M.previous_token_score, M.diagonal_score, M.mean_distance):
        out = fn(p)
        assert np.isfinite(out).all() and (out == 0).all()


def test_group_coherence_identical_heads_one_disjoint_zero():
    a = causal_uniform()
    b = np.eye(N)
    heads = np.stack([a, a, b, b])  # group_size 2: KV head 0 = (a, a), KV head 1 = (b, b)
    assert M.group_coherence(heads, 2) == pytest.approx([1.0, 1.0], abs=1e-6)
    disjoint = np.stack([np.eye(N), previous_token()])
    assert M.group_coherence(disjoint, 2) == pytest.approx([0.0], abs=1e-6)


def test_group_coherence_matches_symmetric_kl_by_hand():
    p = np.array([[0.8, 0.2], [0.3, 0.7]])
    q = np.array([[0.5, 0.5], [0.5, 0.5]])  # bidirectional, 2 rows

    def kl(x, y):
        return np.sum(x * np.log(x / y), -1)

    expected = np.mean(np.exp(-(kl(p, q) + kl(q, p)) / 2))
    assert M.group_coherence(np.stack([p, q]), 2, causal=False) == pytest.approx([expected], abs=1e-6)
    assert expected == pytest.approx(0.8655, abs=1e-3)
    # A key one head never sees makes KL infinite: coherence 0, never NaN.
    one_hot = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert M.group_coherence(np.stack([one_hot, q]), 2, causal=False) == pytest.approx([0.0])


def test_group_coherence_rejects_bad_group():
    with pytest.raises(AttnvizError):
        M.group_coherence(np.stack([np.eye(3)] * 3), 2)


def test_induction_score_on_hand_built_pattern():
    length, start = 5, 1  # BOS + 5 random tokens + the same 5 again
    n = start + 2 * length
    p = bos_sink(n)
    for i in range(start + length, n):
        p[i] = 0.0
        p[i, i - length + 1] = 1.0  # the token after the earlier occurrence
    assert M.induction_score(p, length, start=start) == pytest.approx(1.0)
    assert M.induction_score(previous_token(n), length, start=start) == pytest.approx(0.0)
    with pytest.raises(AttnvizError):
        M.induction_score(np.eye(4), 5)


# --- drop and renormalise, rollout ---------------------------------------------------------------


def test_drop_and_renormalize_numbers():
    p = causal_uniform(4)  # rows: [1], [.5 .5], [1/3]*3, [.25]*4
    out = R.drop_and_renormalize(p, np.array([True, False, False, False]))
    assert isinstance(out, np.ndarray) and out.shape == (4, 3)
    assert not np.isnan(out).any()
    assert out[0].tolist() == [0.0, 0.0, 0.0]  # all its attention was on the dropped key
    assert out[1] == pytest.approx([1.0, 0.0, 0.0])
    assert out[3] == pytest.approx([1 / 3] * 3)
    assert out[1:].sum(-1) == pytest.approx([1.0] * 3)


def test_drop_queries_and_torch_in_torch_out():
    hidden = np.array([True, False, False, True])  # e.g. tokens.hidden: BOS and a template token
    p = torch.tensor(np.stack([causal_uniform(4), np.eye(4)]), dtype=torch.float32)
    out = R.drop_and_renormalize(p, hidden, hidden)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 2, 2)
    np.testing.assert_allclose(out[0].numpy(), [[1.0, 0.0], [0.5, 0.5]])
    assert out[1].tolist() == [[1.0, 0.0], [0.0, 1.0]]
    with pytest.raises(AttnvizError):
        R.drop_and_renormalize(p, np.zeros(3, dtype=bool))


def test_without_sink():
    p = np.stack([bos_sink(), causal_uniform()])
    out = R.without_sink(p)
    assert out.shape == (2, N, N - 1)
    assert (out[0] == 0).all()  # a pure sink has nothing left
    assert out[1, 1:].sum(-1) == pytest.approx([1.0] * (N - 1))
    assert R.without_sink(p, drop_query=True).shape == (2, N - 1, N - 1)


def test_rollout_step_identity_and_hand_numbers():
    eye = torch.eye(N).expand(3, N, N)
    rolled = None
    for _ in range(4):
        rolled = R.rollout_step(rolled, eye)
    assert torch.allclose(rolled, torch.eye(N))
    # One layer of a 2-token causal uniform pattern: A = 0.5 * [[1, 0], [.5, .5]] + 0.5 * I.
    a = R.rollout_step(None, torch.tensor([[[1.0, 0.0], [0.5, 0.5]]]))
    np.testing.assert_allclose(a.numpy(), [[1.0, 0.0], [0.25, 0.75]])
    two = R.rollout_step(a, torch.tensor([[[1.0, 0.0], [0.5, 0.5]]]))
    np.testing.assert_allclose(two.numpy(), [[1.0, 0.0], [0.25 + 0.75 * 0.25, 0.75 * 0.75]])


# --- tiny models ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gqa_result():
    return attnviz.extract(tiny.loaded("llama-gqa"), TEXT)


def _full(res, stack):
    return np.stack([res.layer(i, stack=stack) for i in range(res.n_layers(stack))])


def test_head_metrics_shapes_ranges_and_rows(gqa_result):
    hm = M.head_metrics(gqa_result)
    shape = (3, 4)
    for name in ("entropy", "sink", "previous_token", "diagonal", "gqa_coherence"):
        vals = hm.values(name)
        assert vals.shape == shape and vals.dtype == np.float64
        assert ((vals >= 0) & (vals <= 1 + 1e-6)).all(), name
    assert ((hm.distance >= 0) & (hm.distance <= gqa_result.n_tokens - 1)).all()
    assert hm.induction is None and hm.group_size == 2
    kv = hm.kv_coherence()
    assert kv.shape == (3, 2) and np.array_equal(hm.gqa_coherence[:, 1], kv[:, 0])
    rows = hm.to_rows()
    assert len(rows) == 12 and rows[5] == {
        "layer": 1,
        "head": 1,
        "kv_head": 0,
        **{m: pytest.approx(float(hm.values(m)[1, 1])) for m in hm.metrics},
    }
    best = max(rows, key=lambda r: r["previous_token"])
    assert hm.top("previous_token", 1)[0][:2] == (best["layer"], best["head"])
    with pytest.raises(AttnvizError):
        hm.values("induction")


@pytest.mark.parametrize("computation", ["auto", "dense"])
def test_head_metrics_equal_the_per_tensor_functions(gqa_result, computation):
    hm = M.head_metrics(gqa_result, computation=computation)
    full = _full(gqa_result, "self")  # (layer, head, query_pos, key_pos)
    assert hm.entropy == pytest.approx(M.entropy(full, causal=True), abs=1e-5)
    assert hm.sink == pytest.approx(M.sink_mass(full), abs=1e-6)
    assert hm.previous_token == pytest.approx(M.previous_token_score(full), abs=1e-6)
    assert hm.diagonal == pytest.approx(M.diagonal_score(full), abs=1e-6)
    assert hm.distance == pytest.approx(M.mean_distance(full), abs=1e-4)
    coherence = M.group_coherence(full, 2)
    assert hm.kv_coherence() == pytest.approx(coherence, abs=1e-5)


def test_layer_batches_and_row_chunks_agree_and_stay_small(gqa_result, monkeypatch):
    whole = M.head_metrics(gqa_result, batch_layers=3)
    calls: list[tuple[int, int]] = []
    original = type(gqa_result).layer_tensor

    def spy(self, layer, **kw):
        t = original(self, layer, **kw)
        calls.append((layer, t.shape[1]))
        return t

    monkeypatch.setattr(type(gqa_result), "layer_tensor", spy)  # the result itself is frozen
    chunked = M.head_metrics(
        gqa_result, batch_layers=1, chunk_elements=4 * 5 * gqa_result.n_tokens, computation="dense"
    )
    for m in whole.metrics:
        assert chunked.values(m) == pytest.approx(whole.values(m), abs=1e-5), m
    assert max(rows for _, rows in calls) == 5  # never a whole (head, N, N) layer at once
    assert sorted({layer for layer, _ in calls}) == [0, 1, 2]


@pytest.mark.parametrize("arch", ["mistral-sliding", "gemma2", "bert", "bart", "t5"])
def test_layout_masks_match_where_probabilities_are_nonzero(arch):
    res = attnviz.extract(tiny.loaded(arch), TEXT)
    for stack in res.stacks:
        for layer in range(res.n_layers(stack)):
            p = res.layer(layer, stack=stack)
            causal, window = M.mask_of(res.layout, layer, stack)
            counts = M.key_counts(torch.arange(p.shape[1]), p.shape[2], causal=causal, window=window)
            assert ((p > 0).any(0).sum(-1) == counts.numpy()).all(), (stack, layer)
        hm = M.head_metrics(res, stack=stack)
        assert hm.entropy.shape == (res.n_layers(stack), 4)
        assert ((hm.entropy >= 0) & (hm.entropy <= 1)).all()


def test_eager_and_fast_paths_give_the_same_metrics():
    lm = tiny.loaded("qwen3")
    fast = M.head_metrics(attnviz.extract(lm, TEXT, path="fast"))
    eager = M.head_metrics(attnviz.extract(lm, TEXT, path="eager"))
    for m in fast.metrics:
        assert fast.values(m) == pytest.approx(eager.values(m), abs=1e-4), m


def test_induction_probe_builds_repeated_ids():
    lm = tiny.loaded("llama-gqa")
    probe = M.induction_probe(lm, length=12, seed=3)
    ids = probe.result.tokens.ids
    bos = lm.tokenizer.bos_token_id
    assert ids[0] == bos and len(ids) == 1 + 24
    assert ids[1:13] == ids[13:25] == probe.random_ids
    assert len(set(probe.random_ids)) == 12  # drawn without replacement
    special = set(lm.tokenizer.all_special_ids)
    assert not special & set(probe.random_ids)
    assert M.induction_probe(lm, length=12, seed=3).random_ids == probe.random_ids
    scores = M.head_induction(probe)
    assert scores.shape == (3, 4) and ((scores >= 0) & (scores <= 1)).all()
    full = _full(probe.result, "self")
    assert scores == pytest.approx(M.induction_score(full, 12, start=1), abs=1e-6)
    hm = M.head_metrics(probe.result, induction=probe)
    assert np.array_equal(hm.induction, scores) and "induction" in hm.to_rows()[0]


def test_one_induction_definition_for_the_probe_and_the_head_search():
    """The head search's induction heads (`previous_occurrence_heads(offset=1)`, any text) and the
    probe's induction score (`head_induction`, by index) are one definition: on a probe they read
    the same (query_pos, key_pos) cells, the second copy's i -> i - length + 1, and score every head
    the same. Guards a drift of either (an offset or a copy boundary changed in one of them)."""
    from attnviz.explain.search import previous_occurrence_heads

    probe = M.induction_probe(tiny.loaded("llama-gqa"), length=12, seed=3)
    ids = probe.result.tokens.ids  # <s>, copy, copy
    pairs = M.definitions.previous_occurrences(ids, offset=1)
    assert pairs == [(i, i - 12 + 1) for i in range(13, 25)]
    found = previous_occurrence_heads(probe.result, offset=1)
    assert found.rows == tuple(pairs)
    assert found.scores == pytest.approx(M.head_induction(probe), abs=1e-6)
    assert found.scores == pytest.approx(
        M.induction_score(_full(probe.result, "self"), 12, start=1), abs=1e-6
    )


def test_induction_probe_on_encoder_decoder_stacks():
    probe = M.induction_probe(tiny.loaded("bart"), length=8)
    for stack in ("encoder", "decoder"):
        assert M.head_induction(probe, stack=stack).shape == (2, 4)
    with pytest.raises(AttnvizError):
        M.head_induction(probe, stack="cross")


def test_rollout_on_tiny_models():
    res = attnviz.extract(tiny.loaded("gpt2"), TEXT)
    rolled = R.attention_rollout(res)
    n = res.n_tokens
    assert rolled.shape == (n, n) and rolled.dtype == np.float32
    assert rolled.sum(-1) == pytest.approx(np.ones(n), abs=1e-5)
    assert np.triu(rolled, 1).max() == 0.0  # causal all the way through
    steps = R.attention_rollout(res, per_layer=True, chunk_elements=4 * 3 * n)
    assert steps.shape == (3, n, n) and np.allclose(steps[-1], rolled, atol=1e-6)
    a0 = 0.5 * res.layer(0).mean(0) + 0.5 * np.eye(n)
    assert steps[0] == pytest.approx(a0 / a0.sum(-1, keepdims=True), abs=1e-6)
    with pytest.raises(AttnvizError):
        R.attention_rollout(attnviz.extract(tiny.loaded("bart"), TEXT), stack="cross")


# --- a real model --------------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_has_induction_heads_and_late_sinks():
    lm = attnviz.load_model("smollm2-135m")
    t0 = time.perf_counter()
    probe = M.induction_probe(lm, length=50, seed=0)
    hm = M.head_metrics(probe.result, induction=probe)
    seconds = time.perf_counter() - t0
    top = hm.top("induction", 5)
    print(f"smollm2 probe + head_metrics {seconds:.2f}s; top induction heads {top}")
    assert hm.induction.shape == (30, 9)
    assert top[0][2] > 0.5  # measured 0.91-0.94 (layer 18 head 6) over seeds 0-2
    assert (hm.induction > 0.3).sum() >= 3  # measured 8-12 heads
    sink = M.head_metrics(attnviz.extract(lm, TEXT)).sink
    print(f"sink: layers 15-29 mean {sink[15:].mean():.2f}, share > 0.5 {(sink[15:] > 0.5).mean():.2f}")
    assert (sink[15:] > 0.5).mean() > 0.6  # measured 0.75-0.90 on several texts
    assert sink[15:].mean() > sink[:2].mean() + 0.3
