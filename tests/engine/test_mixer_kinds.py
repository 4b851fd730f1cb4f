"""The registry of mixer kinds (attnviz.mixers.kinds.MIXERS): every record holds what the store,
the capture and the figures ask of it, a new kind is one new record (nothing branches on a kind's
name), and the per-channel kinds' one contribution helper gives the norms of the very vectors that
sum to the mixer's output."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_mixers import N, _model, _records

from attnviz.figures import mixers as M
from attnviz.mixers import (
    MIXER_KINDS,
    MIXERS,
    PER_HEAD,
    SHOWN,
    MixerStore,
    conv,
    meaning,
    rglru,
    selective,
    wkv,
)
from attnviz.mixers.pooling import mixer_pooled


def test_every_record_holds_what_is_asked_of_its_kind():
    classes = [c for m in MIXERS.values() for c in m.classes]
    assert len(classes) == len(set(classes))  # a module class is one kind
    assert tuple(MIXERS) == MIXER_KINDS and all(m.name == k for k, m in MIXERS.items())
    assert {"mamba2", "gated_delta", "kimi_delta", "lightning"} == PER_HEAD
    for kind, m in MIXERS.items():
        with pytest.raises(dataclasses.FrozenInstanceError):
            m.display = "x"  # type: ignore[misc]
        assert m.display and m.label and meaning(kind) == m.label and M.kind_name(kind) == m.display
        if not m.shown:
            continue
        assert kind in SHOWN and m.parts and m.reference and m.against and m.classes
        assert m.core_functions or m.taps  # captured by its core function or by its hooks
        if m.per_head:
            assert m.rows and m.values and m.oracle and m.against_mixer and m.drawn_as == "signed"
        else:
            assert m.contributions and m.mixer_output and m.against_mixer and m.drawn_as == "norms"
    assert MIXERS["attention"].drawn_as == "probabilities" and not MIXERS["attention"].shown
    assert not MIXERS["mlstm"].shown and "not implemented" in meaning("mlstm")


def test_a_new_kind_is_one_new_record(monkeypatch):
    """A kind the store has never heard of ("toy", Mamba-2's formulas under another name) is
    shown, checked, pooled, weighed and named from its record alone (caught: a store that picks
    the formulas by the kind's name)."""
    records = _records(_model("bamba"))
    toy = dataclasses.replace(MIXERS["mamba2"], name="toy", display="Toy SSD", classes=("ToyMixer",))
    monkeypatch.setitem(MIXERS, "toy", toy)
    renamed = [dataclasses.replace(r, kind="toy") for r in records]
    real, new = MixerStore(records, torch.float32), MixerStore(renamed, torch.float32)
    block = records[0].block
    assert new.n_heads(block, "toy") == real.n_heads(block, "mamba2") == 4
    assert torch.equal(new.tensor(block, "toy"), real.tensor(block, "mamba2"))
    assert torch.equal(new.contributions(block, "toy"), real.contributions(block, "mamba2"))
    got, want = new.check(block, "toy"), real.check(block, "mamba2")
    assert got.max_abs_diff == want.max_abs_diff and got.against == want.against and got.mixer == "toy"
    pooled = mixer_pooled(new, block, "toy", 1, cells=5)
    assert (pooled.mean == mixer_pooled(real, block, "mamba2", 1, cells=5).mean).all()
    assert M.kind_name("toy") == "Toy SSD" and M.what_it_is("toy") == M.SIGNED


# Per-channel kinds: (model, formula module, the values A weighs, the frozen output gate, what the
# mixer adds beside Σ_s c_{t,s} before its projection: Mamba-1's D·x_t, the conv's C_t·bias).
CHANNELS = {
    "mamba": (
        "mamba", selective, lambda p: selective._cat(p, "x"), lambda p: selective._cat(p, "gate"),
        lambda p, t: selective._cat(p, "D") * selective._cat(p, "x")[t] * selective._cat(p, "gate")[t],
    ),
    "short_conv": (
        "lfm2_moe", conv, lambda p: p["x"], lambda p: torch.ones_like(p["x"]),
        lambda p, t: p["C"][t] * p["bias"],
    ),
    "rwkv": ("rwkv", wkv, lambda p: p["v"], lambda p: p["gate"], lambda p, t: 0),
    "rglru": ("recurrent_gemma", rglru, lambda p: p["x"], lambda p: p["gate"], lambda p, t: 0),
}  # fmt: skip


@pytest.mark.parametrize("kind", list(CHANNELS))
def test_per_channel_rows_are_the_norms_of_the_vectors_that_sum_to_the_mixer_output(kind):
    """c_{t,s} = W_out (g_t ⊙ A[:, t, s] ⊙ v_s), built here from the kind's own per-channel rows:
    Σ_s c_{t,s} (+ skip, biases) is the mixer's captured output, and the store's row is ‖c_{t,s}‖
    (caught: the shared helper fed another part than the values A weighs)."""
    model_type, module, values, gate, beside = CHANNELS[kind]
    (rec, *_) = [r for r in _records(_model(model_type)) if r.kind == kind]
    store = MixerStore([rec], torch.float32)
    parts = store.parts(rec.block, kind)
    rows_of = getattr(module, "channel_band", None) or module.channel_rows
    w = rec.out_weight.double()
    norms = store.tensor(rec.block, kind).double()[0]  # (T, S)
    assert norms.shape == (N, N)
    for i, t in enumerate(rec.output_rows):
        a = rows_of(parts, t)[:, : t + 1]  # (ch, t + 1)
        vectors = (a.T * values(parts)[: t + 1] * gate(parts)[t]) @ w.T  # (t + 1, hidden)
        assert torch.allclose(norms[t, : t + 1], vectors.norm(dim=-1), rtol=1e-5, atol=1e-9)
        assert (norms[t, t + 1 :] == 0).all()
        total = vectors.sum(0) + w @ (beside(parts, t) + torch.zeros(w.shape[1], dtype=w.dtype))
        if rec.out_bias is not None:
            total = total + rec.out_bias.double()
        want = rec.out_out[0, i].double()  # the mixer's own output, captured
        assert (total - want).abs().max() <= 1e-5 * want.abs().max()
