"""Compare on hybrids and pure recurrent models: every non-softmax mixer head of text A beside
text B by the statistics that apply to a signed matrix (distance back, self share, negative
share), each equal to its definition written here with numpy on the dense effective attention."""

from __future__ import annotations

import hybrids_tiny
import numpy as np
import pytest
from apptest import TEXT, new_app

import attnviz
from attnviz.mixers import MIXERS

hybrids_tiny.register()
TEXT_B = "one two three one two three four five"


def _by_definition(res: attnviz.AttentionResult, block: int, kind: str, head: int) -> tuple[float, ...]:
    a = res.layer(block, mixer=kind)[head].astype(np.float64)  # (T, S)
    mag = np.abs(a)
    t, s = np.indices(a.shape)
    total = mag.sum()
    negative = mag[a < 0].sum() / total if MIXERS[kind].per_head else np.nan
    return (mag * (t - s)).sum() / total, np.trace(mag) / total, negative


@pytest.mark.parametrize("model_type", ["qwen3_5_text", "mamba"])
def test_compare_shows_every_mixer_head_by_the_statistics_that_apply(env, model_type):
    spec = f"hybrid:{model_type}"
    at = new_app("pages/3_Compare.py", model=spec, text=TEXT, text2=TEXT_B).run()
    assert not at.exception, [e.value for e in at.exception]
    frames = [d.value for d in at.dataframe if "self share A" in d.value.columns]
    assert len(frames) == 1
    table = frames[0]
    lm = hybrids_tiny.loaded(model_type)
    res_a, res_b = attnviz.extract(lm, TEXT), attnviz.extract(lm, TEXT_B)
    blocks = [(b, k) for b, kinds in enumerate(res_a.layout.mixers) for k in kinds if k != "attention"]
    assert len(table) == sum(res_a.mixer_heads(b, k) for b, k in blocks)
    names = {MIXERS[k].display: k for _, k in blocks}
    for _, row in table.iterrows():
        kind = names[row["mixer"]]
        for side, res in (("A", res_a), ("B", res_b)):
            want = _by_definition(res, int(row["block"]), kind, int(row["head"]))
            got = [row[f"{c} {side}"] for c in ("distance back (tokens)", "self share", "negative share")]
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    said = [m.value for m in at.info if "has no softmax attention" in m.value]
    assert len(said) == (1 if model_type == "mamba" else 0)  # the α comparison still needs softmax heads
