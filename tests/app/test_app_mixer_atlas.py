"""The Head atlas on hybrids and pure recurrent models: every non-softmax mixer head ranked over
the corpus's texts by the statistics that apply (distance back, self share, negative share), each
the mean over the texts of its definition written here with numpy on the dense effective attention."""

from __future__ import annotations

import hybrids_tiny
import numpy as np
import pytest
from apptest import new_app

import attnviz
from attnviz import atlas as AT
from attnviz.mixers import MIXERS

hybrids_tiny.register()
PAGE = "pages/5_Head_atlas.py"


def _by_definition(res: attnviz.AttentionResult, block: int, kind: str, head: int) -> list[float]:
    a = res.layer(block, mixer=kind)[head].astype(np.float64)
    mag = np.abs(a)
    t, s = np.indices(a.shape)
    total = mag.sum()
    negative = mag[a < 0].sum() / total if MIXERS[kind].per_head else np.nan
    return [(mag * (t - s)).sum() / total, np.trace(mag) / total, negative]


@pytest.mark.parametrize("model_type", ["qwen3_5_text", "mamba"])
def test_the_atlas_ranks_mixer_heads_by_the_statistics_that_apply(env, model_type):
    at = new_app(PAGE, model=f"hybrid:{model_type}", ntexts=3).run(timeout=120)
    assert not at.exception, [e.value for e in at.exception]
    frames = [d.value for d in at.dataframe if "self share" in d.value.columns]
    assert len(frames) == 1
    table = frames[0]
    lm = hybrids_tiny.loaded(model_type)
    results = [attnviz.extract(lm, text) for text in AT.builtin_corpus()[:3]]
    names = {MIXERS[k].display: k for kinds in lm.layout.mixers for k in kinds if k != "attention"}
    blocks = [(b, k) for b, kinds in enumerate(lm.layout.mixers) for k in kinds if k != "attention"]
    assert len(table) == sum(results[0].mixer_heads(b, k) for b, k in blocks)
    for _, row in table.iterrows():
        kind = names[row["mixer"]]
        want = np.mean(
            [_by_definition(r, int(row["block"]), kind, int(row["head"])) for r in results], axis=0
        )
        got = [row[c] for c in ("distance back (tokens)", "self share", "negative share")]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert list(table["distance back (tokens)"]) == sorted(table["distance back (tokens)"], reverse=True)
