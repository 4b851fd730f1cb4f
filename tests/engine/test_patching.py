"""Activation patching against hand-written patched runs on tiny models of each residual layout.

The oracle hooks the model's own modules directly, written independently of the engine: a head's
output is the slice [h·d_head, (h+1)·d_head) of what the output projection reads; the stream is
what a block receives; a block part is what the attention module / the MLP returns.
"""

from __future__ import annotations

import numpy as np
import pytest
import tiny_explain as TE
import torch

import attnviz
from attnviz import AttnvizError
from attnviz.explain.patch_sites import Patch, pair, patched_run
from attnviz.explain.patching import patch, planned_grid, setup
from attnviz.tokens import Tokens

CLEAN = "the financial bank is located on river bank"
CORRUPT = "the financial fox is located on river bank"  # one token differs (position 3)
LONGER = "the big financial fox is located on river bank"  # three tokens more
LAYOUTS = ("llama-gqa", "gpt_neox-parallel", "olmo2")  # pre-norm, parallel, post-norm
OUT_PROJ = ("o_proj", "dense", "c_proj", "out_proj")
MLPS = ("mlp", "feed_forward")
ATOL = 1e-4  # fp32: patched logit differences against the hand-written run


def modules(lm, layer: int):
    """(block, attention module, its output projection, MLP) of one layer."""
    name = lm.probe.sites["self"][layer].module_name
    attn = lm.model.get_submodule(name)
    block = lm.model.get_submodule(name.rsplit(".", 1)[0])
    proj = next(getattr(attn, n) for n in OUT_PROJ if hasattr(attn, n))
    mlp = next(getattr(block, n) for n in MLPS if hasattr(block, n))
    return block, attn, proj, mlp


def hand_run(lm, ids, record=None, replace=None):
    """Run ``ids`` once. ``record``: {(kind, layer): None} filled with the activation (N, ...);
    ``replace``: {(kind, layer): (target positions, values, head)}: kinds "head", "residual",
    "attention", "mlp". Returns the last position's logits (vocab,)."""
    record, replace = record if record is not None else {}, replace or {}
    handles = []
    d_head = lm.layout.head_dim
    for layer in range(lm.layout.n_layers):
        block, attn, proj, mlp = modules(lm, layer)

        def on_head(_m, args, layer=layer):
            x = args[0]
            if ("head", layer) in record:
                record[("head", layer)] = x[0].detach().clone().view(x.shape[1], -1, d_head)
            if ("head", layer) in replace:
                pos, val, h = replace[("head", layer)]
                x = x.clone()
                x[0, pos, h * d_head : (h + 1) * d_head] = val
                return (x,)
            return None

        def on_block(_m, args, kwargs, layer=layer):
            x = args[0] if args else kwargs["hidden_states"]
            if ("residual", layer) in record:
                record[("residual", layer)] = x[0].detach().clone()
            if ("residual", layer) in replace:
                pos, val, _ = replace[("residual", layer)]
                x = x.clone()
                x[0, pos] = val
                return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": x})
            return None

        def on_out(kind, layer=layer):
            def hook(_m, _a, out):
                y = out if isinstance(out, torch.Tensor) else out[0]
                if (kind, layer) in record:
                    record[(kind, layer)] = y[0].detach().clone()
                if (kind, layer) in replace:
                    pos, val, _ = replace[(kind, layer)]
                    y = y.clone()
                    y[0, pos] = val
                    return y if isinstance(out, torch.Tensor) else (y, *out[1:])
                return None

            return hook

        handles += [
            proj.register_forward_pre_hook(on_head),
            block.register_forward_pre_hook(on_block, with_kwargs=True),
            attn.register_forward_hook(on_out("attention")),
            mlp.register_forward_hook(on_out("mlp")),
        ]
    try:
        with torch.inference_mode():
            return lm.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float()
    finally:
        for h in handles:
            h.remove()


def ids_of(lm, text):
    return attnviz.tokenize(lm, text)[0]


def hand_grid(lm, res, source_ids, target_ids, cells):
    """The raw logit difference of each (kind, layer, head, target positions, source positions)."""
    kinds = {c[0] for c in cells}
    rec = {(k, layer): None for k in kinds for layer in range(lm.layout.n_layers)}
    hand_run(lm, source_ids, record=rec)
    out = []
    for kind, layer, head, tpos, spos in cells:
        src = rec[(kind, layer)]
        val = src[spos, head] if kind == "head" else src[spos]
        logits = hand_run(lm, target_ids, replace={(kind, layer): (tpos, val, head)})
        out.append(float(logits[res.answer] - logits[res.wrong]))
    return np.array(out)


@pytest.mark.parametrize("name", LAYOUTS)
def test_patching_equals_hand_written_patched_runs(name):
    """Every cell of each grid equals the oracle's patched run (fp32, ≤ 1e-4), denoising."""
    lm = TE.loaded(name)
    clean, corrupt = ids_of(lm, CLEAN), ids_of(lm, CORRUPT)
    n, L, H = len(clean), lm.layout.n_layers, lm.layout.n_heads
    allp = list(range(n))
    res = patch(lm, CLEAN, CORRUPT, over="heads_by_position", batch=7)
    want = hand_grid(
        lm,
        res,
        clean,
        corrupt,
        [("head", la, h, [p], [p]) for la in range(L) for h in range(H) for p in range(n)],
    )
    assert np.allclose(res.raw.ravel(), want, atol=ATOL)
    res = patch(lm, CLEAN, CORRUPT, over="heads", batch=3)
    want = hand_grid(
        lm, res, clean, corrupt, [("head", la, h, allp, allp) for la in range(L) for h in range(H)]
    )
    assert np.allclose(res.raw.ravel(), want, atol=ATOL)
    res = patch(lm, CLEAN, CORRUPT, over="residual")
    want = hand_grid(
        lm, res, clean, corrupt, [("residual", la, -1, [p], [p]) for la in range(L) for p in range(n)]
    )
    assert np.allclose(res.raw.ravel(), want, atol=ATOL)
    res = patch(lm, CLEAN, CORRUPT, over="blocks")
    cells = [(k, la, -1, [p], [p]) for la in range(L) for k in ("attention", "mlp") for p in range(n)]
    assert np.allclose(res.raw.ravel(), hand_grid(lm, res, clean, corrupt, cells), atol=ATOL)
    # the normalisation: 0 = corrupted, 1 = clean
    want_norm = (res.raw - res.corrupted_diff) / (res.clean_diff - res.corrupted_diff)
    assert np.allclose(res.values, want_norm)
    frame = res.to_frame()
    assert len(frame) == L * 2 * n and set(frame.columns) >= {
        "layer",
        "part",
        "position",
        "value",
        "logit_diff",
    }


@pytest.mark.parametrize("name", LAYOUTS)
@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_embedding_patch_at_the_differing_token_is_the_other_run(name, direction):
    """The stream entering block 0 at the one differing position carries the whole difference:
    denoising there gives the clean run (1), noising the corrupted run (0); patching a position
    whose token is the same changes nothing (0 denoising, 1 noising)."""
    res = patch(TE.loaded(name), CLEAN, CORRUPT, over="residual", direction=direction)
    assert res.pairing.differing == (3,)
    row = res.values[0]
    hit, rest = (1.0, 0.0) if direction == "denoise" else (0.0, 1.0)
    assert abs(row[3] - hit) < 1e-4
    assert np.allclose(np.delete(row, 3), rest, atol=1e-4)


@pytest.mark.parametrize("name", LAYOUTS)
def test_patching_every_head_of_a_layer_reproduces_the_clean_attention_output(name):
    """All heads of layer l at every position at once: the attention module then returns exactly
    what it returned in the clean run (every head replaced, GQA groups included)."""
    lm = TE.loaded(name)
    s = setup(lm, CLEAN, CORRUPT, None, None, "heads", "denoise")
    layer = lm.layout.n_layers - 1
    clean_rec = {("attention", layer): None}
    hand_run(lm, ids_of(lm, CLEAN), record=clean_rec)
    _, attn, _, _ = modules(lm, layer)
    seen = []
    h = attn.register_forward_hook(lambda _m, _a, out: seen.append(out[0][0].detach().clone()))
    try:
        patched_run(
            lm,
            s.st,
            s.target_ids,
            s.source,
            s.pairing,
            [[Patch("head", layer, k) for k in range(lm.layout.n_heads)]],
        )
    finally:
        h.remove()
    assert torch.allclose(seen[-1], clean_rec[("attention", layer)], atol=1e-5)
    # and the whole stream entering any block, at every position, gives the clean logits
    s = setup(lm, CLEAN, CORRUPT, None, None, "residual", "denoise")
    full = patched_run(lm, s.st, s.target_ids, s.source, s.pairing, [[Patch("residual", layer)]])[0]
    assert torch.allclose(full, hand_run(lm, ids_of(lm, CLEAN)), atol=1e-4)


def test_batched_rows_patch_only_their_own_cell():
    """One row per cell: a batch of 36 equals 36 single runs."""
    lm = TE.loaded("llama-gqa")
    one = patch(lm, CLEAN, CORRUPT, over="heads_by_position", batch=1)
    many = patch(lm, CLEAN, CORRUPT, over="heads_by_position", batch=36)
    assert np.allclose(one.raw, many.raw, atol=1e-5)


def test_prompts_of_different_lengths_patch_aligned_positions():
    """The longer corrupted prompt: its inserted tokens are left out and said so, the replaced
    token pairs with the clean one, and each patch reads the source's aligned position."""
    lm = TE.loaded("llama-gqa")
    clean, longer = ids_of(lm, CLEAN), ids_of(lm, LONGER)
    res = patch(lm, CLEAN, LONGER, over="residual")
    # <s> the | b i g | financial fox is located on river bank  vs  <s> the financial bank ...
    assert res.pairing.unpatched == (2, 3, 4)
    assert res.pairing.target == (0, 1, 5, 6, 7, 8, 9, 10, 11)
    assert res.pairing.source == tuple(range(9)) and res.pairing.differing == (6,)
    assert res.pairing.shared == 2  # <s> the
    cells = [("residual", la, -1, [t], [s]) for la in range(2) for t, s in res.pairing.pairs()]
    assert np.allclose(res.raw.ravel(), hand_grid(lm, res, clean, longer, cells), atol=ATOL)
    frame = res.to_frame()
    assert list(frame["position"][:3]) == [0, 1, 5] and list(frame["source_position"][:3]) == [0, 1, 2]
    # a head at one position: the patch lands on the aligned target position, not on the axis
    # index (caught: Patch(..., index[2]) patched positions 0..8 of the longer prompt)
    res = patch(lm, CLEAN, LONGER, over="heads_by_position")
    H = lm.layout.n_heads
    cells = [("head", la, h, [t], [s]) for la in range(2) for h in range(H) for t, s in res.pairing.pairs()]
    assert np.allclose(res.raw.ravel(), hand_grid(lm, res, clean, longer, cells), atol=ATOL)
    # the grid a page counts before running (its forward guard) is the grid that ran
    tokens = (Tokens.build(lm.tokenizer, clean), Tokens.build(lm.tokenizer, longer))
    assert planned_grid(lm, *tokens, "heads_by_position", "denoise") == res.values.shape == (2, H, 9)
    assert (
        planned_grid(lm, *tokens, "blocks", "noise")
        == patch(lm, CLEAN, LONGER, over="blocks", direction="noise").values.shape
    )


def test_ranking_orders_cells_by_their_distance_from_the_unpatched_run():
    """Denoising starts from the corrupted run (0), noising from the clean run (1): the cells that
    move the metric most are those farthest from that. Caught: the two baselines swapped."""
    lm = TE.loaded("llama-gqa")
    for direction, base in (("denoise", 0.0), ("noise", 1.0)):
        res = patch(lm, CLEAN, CORRUPT, over="heads", direction=direction)
        cells = list(np.ndindex(*res.values.shape))
        want = sorted(cells, key=lambda i: -abs(float(res.values[i]) - base))
        assert [i for i, _ in res.ranking()] == want
        assert [i for i, _ in res.ranking(3)] == want[:3]


def test_unpairable_prompts_and_bad_arguments_are_refused():
    lm = TE.loaded("llama-gqa")
    with pytest.raises(AttnvizError, match="share no aligned positions"):
        pair(
            attnviz.Tokens.build(lm.tokenizer, [5, 6, 7]), attnviz.Tokens.build(lm.tokenizer, [8, 9, 10, 11])
        )
    with pytest.raises(AttnvizError, match="unknown over"):
        patch(lm, CLEAN, CORRUPT, over="neurons")  # type: ignore[arg-type]
    with pytest.raises(AttnvizError, match="same on both prompts"):
        patch(lm, CLEAN, CLEAN, over="heads")
    with pytest.raises(AttnvizError, match="same token"):
        patch(lm, CLEAN, CORRUPT, answer=5, wrong=5)


def test_progress_hears_every_batch_and_cancels():
    lm = TE.loaded("llama-gqa")
    heard = []
    patch(lm, CLEAN, CORRUPT, over="heads", batch=3, progress=lambda d, t: heard.append((d, t)))
    assert heard == [(0, 8), (3, 8), (6, 8), (8, 8)]

    class Stop(Exception):
        pass

    def cancel(done, total):
        if done:
            raise Stop

    with pytest.raises(Stop):
        patch(lm, CLEAN, CORRUPT, over="heads", batch=3, progress=cancel)


def test_patching_needs_no_decomposition_and_runs_over_a_hybrids_heads():
    """A residual multiplier (Granite) breaks the explanations' sums, not patching: its grid still
    equals the hand-written runs. A hybrid's mixer heads are patched too (their oracles:
    tests/engine/test_hybrid_stream.py)."""
    lm = TE.build("granite", residual_multiplier=0.5)
    clean, corrupt = ids_of(lm, CLEAN), ids_of(lm, CORRUPT)
    res = patch(lm, CLEAN, CORRUPT, over="residual")
    cells = [("residual", la, -1, [p], [p]) for la in range(lm.layout.n_layers) for p in range(len(clean))]
    assert np.allclose(res.raw.ravel(), hand_grid(lm, res, clean, corrupt, cells), atol=ATOL)
    hybrid = patch(TE.build("qwen3_next"), CLEAN, CORRUPT)  # gated delta heads and softmax heads
    assert hybrid.values.shape[0] == 4 and np.isfinite(hybrid.values[0]).all()


@pytest.mark.parametrize("name", [*LAYOUTS, "mistral-sliding", "gemma2", "gpt2"])
def test_a_cached_unpatched_prefix_gives_the_same_cells(name, monkeypatch):
    """Cells from position p on run positions < p once into a KV cache: the same numbers as the
    hand-written full runs (fp32), sliding windows and soft-capping included."""
    import attnviz.explain.patching as P

    monkeypatch.setattr(P, "PREFIX_MIN", 1)
    lm = TE.loaded(name)
    clean, corrupt = ids_of(lm, CLEAN), ids_of(lm, CORRUPT)
    L, H, n = lm.layout.n_layers, lm.layout.n_heads, len(clean)
    res = patch(lm, CLEAN, CORRUPT, over="heads_by_position", batch=5)
    cells = [("head", la, h, [p], [p]) for la in range(L) for h in range(H) for p in range(n)]
    assert np.allclose(res.raw.ravel(), hand_grid(lm, res, clean, corrupt, cells), atol=ATOL)
    res = patch(lm, CLEAN, CORRUPT, over="blocks", batch=4)
    cells = [(k, la, -1, [p], [p]) for la in range(L) for k in ("attention", "mlp") for p in range(n)]
    assert np.allclose(res.raw.ravel(), hand_grid(lm, res, clean, corrupt, cells), atol=ATOL)
    # a head at every position: the shared prefix (<s> the financial) is the same in both runs
    res = patch(lm, CLEAN, CORRUPT, over="heads", batch=3)
    assert res.pairing.shared == 3
    every = list(range(n))
    cells = [("head", la, h, every, every) for la in range(L) for h in range(H)]
    assert np.allclose(res.raw.ravel(), hand_grid(lm, res, clean, corrupt, cells), atol=ATOL)
    with pytest.raises(AttnvizError, match="inside the cached prefix"):
        s = P.setup(lm, CLEAN, CORRUPT, None, None, "residual", "denoise")
        P.patched_run(
            lm, s.st, s.target_ids, s.source, s.pairing, [[P.Patch("residual", 0, -1, 2)]], prefix=3
        )
