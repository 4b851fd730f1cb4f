"""Head atlas over a corpus: exact per-text statistics, ranking, examples, progress, cancel, cache,
export."""

import threading

import numpy as np
import pandas as pd
import pytest
import tiny

import attnviz
from attnviz import atlas as AT
from attnviz.errors import AttnvizError
from attnviz.metrics import head_metrics


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path))
    return tmp_path


def test_builtin_corpus_is_varied():
    texts = AT.builtin_corpus()
    assert len(texts) >= 50 and len(set(texts)) == len(texts)
    assert any("\n" in t for t in texts)  # code / letters keep their line breaks
    assert any(not t.isascii() for t in texts)  # other scripts
    assert not any(t.startswith("#") for t in texts)


def test_parse_texts_lines_paragraphs_and_limits():
    assert AT.parse_texts("a\n# note\nb\n\n") == ["a", "b"]
    assert AT.parse_texts("one\ntwo\n\nthree") == ["one\ntwo", "three"]
    assert AT.parse_texts("x\\ny", lines=True) == ["x\ny"]
    with pytest.raises(AttnvizError, match="no texts"):
        AT.parse_texts("# only a comment\n")
    with pytest.raises(AttnvizError, match="up to"):
        AT.parse_texts("\n".join(["t"] * (AT.MAX_TEXTS + 1)))


def test_statistics_are_exact_per_text_and_across_texts():
    lm = tiny.loaded("llama-gqa")
    texts = ["the bank is by the river bank", "a quick brown fox jumps over the lazy dog", "1, 2, 3, 1, 2, 3"]
    at = AT.run_atlas(lm, texts, use_cache=False)
    assert at.values["sink"].shape == (3, 3, 4) and at.links.shape == (3, 3, 4, 3)
    for t, text in enumerate(texts):
        res = attnviz.extract(lm, text)
        hm = head_metrics(res)
        for s in AT.STATISTICS:
            np.testing.assert_array_equal(at.values[s][t], hm.values(s))
        for layer in range(3):
            p = res.layer(layer).astype(np.float64)  # (heads, N, N)
            n = p.shape[-1]
            # direct: sink = mean of P[i, 0], previous = mean of P[i, i-1], over rows i >= 1
            np.testing.assert_allclose(at.values["sink"][t, layer], p[:, 1:, 0].mean(-1), atol=1e-6)
            prev = np.mean([p[:, i, i - 1] for i in range(1, n)], axis=0)
            np.testing.assert_allclose(at.values["previous_token"][t, layer], prev, atol=1e-6)
            inner = p[:, 1:, 1:].reshape(4, -1)
            best = inner.argmax(-1)
            np.testing.assert_array_equal(at.links[t, layer, :, 0], best // (n - 1) + 1)
            np.testing.assert_array_equal(at.links[t, layer, :, 1], best % (n - 1) + 1)
            np.testing.assert_allclose(at.links[t, layer, :, 2], inner.max(-1), atol=1e-7)
    mean = at.values["previous_token"].mean(0)
    ranked = at.ranking("previous_token")
    assert len(ranked) == 12 and ranked[0][2] == pytest.approx(mean.max())
    assert [r[2] for r in ranked] == sorted((r[2] for r in ranked), reverse=True)
    ex = at.example("entropy", 1, 2)
    assert ex.text_index == int(np.argmax(at.values["entropy"][:, 1, 2]))
    assert f"[{at.tokens[ex.text_index][ex.query]}]" in ex.snippet
    with pytest.raises(AttnvizError, match="unknown statistic"):
        at.mean("nope")


@pytest.mark.slow  # 50 forwards: ~5-20 s on a shared 2-core machine
def test_fifty_corpus_texts_with_progress_then_cache(cache_in_tmp):
    lm = tiny.loaded("gpt2")
    texts = AT.builtin_corpus()[:50]
    seen: list[tuple[int, int]] = []
    at = AT.run_atlas(lm, texts, progress=lambda d, t, note: seen.append((d, t)))
    assert at.n_texts == 50 and not at.cancelled and not at.from_cache
    assert (at.computed, at.reused) == (50, 0)
    assert seen == [(i, 50) for i in range(51)]  # before each text, then done
    files = list((cache_in_tmp / "atlas").rglob("*.entry"))
    assert len(files) == 50  # one entry per text, written as it finished
    again = AT.run_atlas(lm, texts)
    assert again.from_cache and (again.computed, again.reused) == (0, 50)
    assert again.texts == at.texts and again.tokens == at.tokens
    for s in AT.STATISTICS:
        np.testing.assert_array_equal(again.values[s], at.values[s])
    np.testing.assert_array_equal(again.links, at.links)
    fewer = AT.run_atlas(lm, texts[:-1])
    assert (fewer.computed, fewer.reused) == (0, 49)
    other = AT.run_atlas(tiny.loaded("llama-gqa"), texts[:5])  # another model: its own namespace
    assert (other.computed, other.reused) == (5, 0)
    assert AT.cached_count(lm, [*texts, "a new text"]) == (50, 51)


def test_cancel_keeps_what_finished_and_the_next_run_resumes(cache_in_tmp):
    lm = tiny.loaded("gpt2")
    texts = AT.builtin_corpus()[:10]
    stop = threading.Event()

    def progress(done, total, note):
        if done == 3:
            stop.set()

    at = AT.run_atlas(lm, texts, progress=progress, cancel=stop)
    assert at.cancelled and at.n_texts == 3 and at.texts == tuple(texts[:3])
    assert len(list((cache_in_tmp / "atlas").rglob("*.entry"))) == 3  # finished texts are saved
    at2 = AT.run_atlas(lm, texts, progress=lambda d, t, n: d < 5)
    assert at2.cancelled and at2.n_texts == 5 and (at2.computed, at2.reused) == (2, 3)
    full = AT.run_atlas(lm, texts)
    assert not full.cancelled and (full.computed, full.reused) == (5, 5)
    fresh = AT.run_atlas(lm, texts, use_cache=False)
    for s in AT.STATISTICS:
        np.testing.assert_array_equal(full.values[s], fresh.values[s])


def test_long_texts_are_skipped_with_a_reason():
    lm = tiny.loaded("gpt2")
    at = AT.run_atlas(lm, ["short text", "word " * 200], max_tokens=64, use_cache=False)
    assert at.n_texts == 1 and at.skipped[0][0] == 1 and "over the atlas limit of 64" in at.skipped[0][1]


def test_export_csv_and_parquet(tmp_path):
    lm = tiny.loaded("gpt2")
    at = AT.run_atlas(lm, ["the bank is by the river", "<b>bold</b> & more"], use_cache=False)
    df = at.to_frame()
    assert len(df) == 12 and {"layer", "head", "sink_mean", "sink_max", "sink_example"} <= set(df.columns)
    row = df[(df["layer"] == 2) & (df["head"] == 1)].iloc[0]
    assert row["sink_mean"] == pytest.approx(at.values["sink"][:, 2, 1].mean())
    df.to_csv(tmp_path / "a.csv", index=False)
    df.to_parquet(tmp_path / "a.parquet")
    back = pd.read_parquet(tmp_path / "a.parquet")
    pd.testing.assert_frame_equal(back, df)
    assert pd.read_csv(tmp_path / "a.csv")["sink_mean"].tolist() == pytest.approx(df["sink_mean"].tolist())


def test_snippet_windows():
    toks = [f"t{i}" for i in range(30)]
    assert AT.snippet(toks, 5, 4, context=1) == "… t3 [t4] [t5] t6 …"
    assert AT.snippet(toks, 20, 2, context=1) == "… t1 [t2] t3 … ⇢ … t19 [t20] t21 …"
