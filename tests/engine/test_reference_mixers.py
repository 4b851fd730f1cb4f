"""The learners' walkthrough (attnviz.reference.mixers): one Gated DeltaNet and one Mamba-2 head
recomputed token by token and in closed form, both equal to the model's own kernel output."""

from __future__ import annotations

import hybrids_tiny
import pytest

import attnviz
from attnviz.reference import mixers as R

TEXT = "the bank of the river is where the fox jumps over the lazy dog"


@pytest.mark.parametrize(
    ("model_type", "kind", "block"), [("qwen3_5_text", "gated_delta", 2), ("bamba", "mamba2", 0)]
)
def test_recurrence_closed_form_and_model_agree(model_type, kind, block):
    lm = hybrids_tiny.loaded(model_type)
    res = attnviz.extract(lm, TEXT)
    rec, output = R.capture(lm, list(res.tokens.ids), block, kind)
    for head in (0, res.mixer_heads(block, kind) - 1):
        w = R.walkthrough(rec, output, head, res.head(block, head, mixer=kind))
        assert w.diffs["kernel re-run vs the forward (its kept rows)"] == 0
        scale = abs(w.model_output).max()
        assert scale > 1e-2  # a real output, not zeros
        assert w.diffs["recurrence vs model"] <= 1e-5 * scale
        assert w.diffs["closed form vs model"] <= 1e-5 * scale
        assert w.diffs["recurrence vs closed form"] <= 1e-12 * max(scale, 1)
        assert w.diffs["closed form vs attnviz's matrix"] <= 1e-6 * abs(w.closed_form).max()
        assert w.closed_form.shape == (res.n_tokens, res.n_tokens)
        assert (w.closed_form[~__import__("numpy").tri(res.n_tokens, dtype=bool)] == 0).all()  # causal
