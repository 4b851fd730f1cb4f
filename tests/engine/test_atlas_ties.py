"""Every atlas number tied to the right (layer, head), and the cache decoder's own checks.

The ranking, the example text, the per-head table and the per-text table are read back on an
atlas whose every (text, layer, head) value is distinct and whose layers and heads differ in
number (3 × 4), so a swapped or shifted index gives another head's value. The decoder gets
entries whose checksum is right but whose content is wrong (key, statistics, shapes, NaN)."""

from __future__ import annotations

import hashlib
import io
import json

import numpy as np
import pytest

from attnviz.atlas import Atlas
from attnviz.atlas import cache as C
from attnviz.atlas.ranking import STATISTICS

N_T, N_L, N_H = 2, 3, 4


def atlas() -> Atlas:
    rng = np.random.default_rng(7)
    values = {s: rng.permutation(N_T * N_L * N_H).reshape(N_T, N_L, N_H) / 10.0 for s in STATISTICS}
    links = np.zeros((N_T, N_L, N_H, 3))
    links[..., 0] = 5  # query
    links[..., 1] = np.arange(N_L)[None, :, None]  # key = the layer: a swapped index shows
    links[..., 2] = np.arange(N_H)[None, None, :] / 10  # weight = head / 10
    tokens = tuple(tuple(f"t{t}w{i}" for i in range(8)) for t in range(N_T))
    return Atlas(
        "m", "self", ("a", "b"), tokens, values, links, indices=(0, 1), keys=("ka", "kb"), computed=N_T
    )


def test_ranking_names_the_head_each_mean_belongs_to():
    """Caught: layer and head swapped in the flat index (i % layers, i // layers)."""
    at = atlas()
    v = at.values["sink"]
    ranked = at.ranking("sink")
    assert sorted((layer, head) for layer, head, _ in ranked) == [
        (a, b) for a in range(N_L) for b in range(N_H)
    ]
    for layer, head, mean in ranked:
        assert mean == pytest.approx(v[:, layer, head].mean(), abs=1e-12), (layer, head)
    top = max(((a, b) for a in range(N_L) for b in range(N_H)), key=lambda p: v[:, p[0], p[1]].mean())
    assert ranked[0][:2] == top and at.ranking("sink", k=2) == ranked[:2]


def test_examples_and_tables_read_each_heads_own_values():
    """Caught: the example's link read at another layer; the table's mean over a whole layer."""
    at = atlas()
    for layer in range(N_L):
        for head in range(N_H):
            v = at.values["entropy"][:, layer, head]
            ex = at.example("entropy", layer, head)
            assert (ex.text_index, ex.value) == (int(v.argmax()), float(v.max()))
            assert (ex.key, ex.weight) == (layer, pytest.approx(head / 10))
    rows = {(r["layer"], r["head"]): r for r in at.to_rows()}
    for (layer, head), r in rows.items():
        for s in STATISTICS:
            assert r[f"{s}_mean"] == pytest.approx(at.values[s][:, layer, head].mean())
            assert r[f"{s}_max"] == pytest.approx(at.values[s][:, layer, head].max())
    df = at.texts_frame()
    for row in df.itertuples():
        t = at.indices.index(row.text_index)
        assert row.key == at.keys[t]
        assert row.distance == at.values["distance"][t, row.layer, row.head]
        assert (row.link_key, row.link_weight) == (row.layer, pytest.approx(row.head / 10))


def sealed(meta: dict, **arrays) -> bytes:
    """An entry file with a correct checksum over whatever it holds."""
    buf = io.BytesIO()
    np.savez(buf, meta=np.array(json.dumps(meta)), **arrays)
    body = buf.getvalue()
    return C.MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n" + body


def test_the_decoder_refuses_well_sealed_entries_with_wrong_content():
    """Caught: the shape check dropped, the finiteness check dropped (no earlier test had either
    damage), the key check dropped."""
    key = "ab" * 16
    values = np.random.default_rng(0).random((len(STATISTICS), N_L, N_H))
    links = np.random.default_rng(1).random((N_L, N_H, 3))
    meta = {
        "key": key,
        "tokens": ["a"],
        "error": "",
        "fingerprint": "f",
        "layer_labels": [],
        "stack": "self",
        "final": True,
        "statistics": list(STATISTICS),
    }
    assert C.decode(sealed(meta, values=values, links=links), key).ok  # the helper makes good ones
    nan = values.copy()
    nan[2, 1, 3] = np.nan
    inf = values.copy()
    inf[0, 0, 0] = np.inf
    damages = {
        "another key": (sealed({**meta, "key": "cd" * 16}, values=values, links=links), "holds key"),
        "other statistics": (
            sealed({**meta, "statistics": ["sink"]}, values=values, links=links),
            "other statistics",
        ),
        "a statistic missing": (sealed(meta, values=values[:-1], links=links), "wrong shape"),
        "values flat": (sealed(meta, values=values.reshape(len(STATISTICS), -1), links=links), "wrong shape"),
        "no values": (sealed(meta, links=links), "missing"),
        "links of other heads": (
            sealed(meta, values=values, links=links[:, :-1]),
            "links of the wrong shape",
        ),
        "links without weight": (
            sealed(meta, values=values, links=links[..., :2]),
            "links of the wrong shape",
        ),
        "NaN statistic": (sealed(meta, values=nan, links=links), "not finite"),
        "infinite statistic": (sealed(meta, values=inf, links=links), "not finite"),
    }
    for what, (data, says) in damages.items():
        try:
            C.decode(data, key)
        except C.DamagedEntry as err:
            assert says in str(err), what
        else:
            pytest.fail(f"{what}: decoded as good")
