"""The core contract: fast == eager on every architecture, plus the invariants of attention."""

import subprocess
import sys

import numpy as np
import pytest
import tiny

import attnviz

TEXT = "the financial bank is located on river bank, a quick brown fox jumps over the lazy dog"
ALL = tiny.ARCHS


def _max_diff(a: attnviz.AttentionResult, b: attnviz.AttentionResult) -> float:
    return max(
        float(np.abs(a.layer(i, stack=s) - b.layer(i, stack=s)).max())
        for s in a.stacks
        for i in range(a.n_layers(s))
    )


@pytest.fixture(scope="module", params=ALL)
def pair(request):
    lm = tiny.loaded(request.param)
    return request.param, lm, attnviz.extract(lm, TEXT), attnviz.extract(lm, TEXT, path="eager")


def test_fast_path_equals_eager(pair):
    arch, lm, fast, eager = pair
    assert lm.supports_capture, f"{arch} should run the capture path"
    assert fast.path == "fast" and eager.path == "eager"
    assert _max_diff(fast, eager) <= 1e-5


def test_invariants(pair):
    _arch, lm, fast, _ = pair
    n = len(fast.tokens)
    assert n == len(lm.tokenizer(TEXT)["input_ids"])  # exactly tokenizer(text)
    for stack in fast.stacks:
        q_tokens, k_tokens = fast.axes(stack)
        for i in range(fast.n_layers(stack)):
            p = fast.layer(i, stack=stack)
            assert p.dtype == np.float32
            assert p.shape == (lm.layout.n_heads, len(q_tokens), len(k_tokens))
            np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)
            assert (p >= 0).all()
            causal = lm.layout.kind == "decoder" or stack == "decoder"
            if causal:
                assert (np.triu(p, k=1) == 0).all(), "causal upper triangle must be exactly 0"
            else:
                assert (np.triu(p, k=1) > 0).any()


def test_head_is_a_slice_of_layer(pair):
    _, _lm, fast, _ = pair
    layer = fast.layer(1)
    np.testing.assert_array_equal(fast.head(1, 2), layer[2])
    np.testing.assert_array_equal(fast.layer(1, rows=slice(3, 7)), layer[:, 3:7])


def test_any_rows_and_heads_equal_the_full_layers_rows(pair):
    """Property: whatever rows (the first one alone included) and heads are asked, the answer is
    those rows of the full layer - on every stack, the causal mask included."""
    _, lm, fast, _ = pair
    rng = np.random.default_rng(0)
    for stack in fast.stacks:
        n_q = len(fast.axes(stack)[0])
        cases = [slice(0, 1), slice(1, 2), slice(n_q - 1, n_q), slice(-1, None), slice(0, 0), slice(None)]
        cases += [
            slice(int(a), int(a) + int(w))
            for a, w in zip(rng.integers(0, n_q, 6), rng.integers(1, 5, 6), strict=True)
        ]
        for i in range(fast.n_layers(stack)):
            full = fast.layer(i, stack=stack)
            for rows in cases:
                heads = sorted(
                    rng.choice(
                        lm.layout.n_heads, size=int(rng.integers(1, lm.layout.n_heads + 1)), replace=False
                    ).tolist()
                )
                got = fast.layer_tensor(i, heads=heads, stack=stack, rows=rows).cpu().numpy()
                np.testing.assert_allclose(
                    got, full[heads][:, rows], atol=1e-5, err_msg=f"{stack} {i} {rows} {heads}"
                )


def test_sliding_window_masks_far_keys():
    lm = tiny.loaded("mistral-sliding")
    window = lm.layout.sliding_window
    res = attnviz.extract(lm, TEXT)
    n = res.n_tokens
    assert n > 2 * window
    p = res.layer(0)
    q, k = np.indices((n, n))
    assert (p[:, q - k >= window] == 0).all()
    assert (p[:, (q - k < window) & (q >= k)] > 0).all()


def test_gemma2_alternates_sliding_and_full_layers():
    lm = tiny.loaded("gemma2")
    assert set(lm.layout.layer_types) == {"sliding_attention", "full_attention"}
    assert lm.layout.softcap == 5.0
    res = attnviz.extract(lm, TEXT)
    n, w = res.n_tokens, lm.layout.sliding_window
    for i, kind in enumerate(lm.layout.layer_types):
        far = res.layer(i)[:, n - 1, : n - w]
        assert (far == 0).all() if kind == "sliding_attention" else (far > 0).all()


def test_gqa_layout_and_sharing():
    lm = tiny.loaded("llama-gqa")
    lay = lm.layout
    assert (lay.n_heads, lay.n_kv_heads, lay.group_size) == (4, 2, 2)
    assert [lay.kv_head_of(h) for h in range(4)] == [0, 0, 1, 1]


LONG = " ".join([TEXT] * 10)  # ~200 tokens: dense (H, N, N) per layer dwarfs Q/K/V per token


def test_fast_path_keeps_only_queries_keys_and_values():
    """The fast path holds Q, K and V per layer (+ at most one N x N mask), never the dense
    (heads, N, N) probabilities eager keeps: on ~200 tokens that is 4x+ apart."""
    lm = tiny.loaded("llama-gqa")
    res = attnviz.extract(lm, LONG)
    n, lay = res.n_tokens, lm.layout
    assert res.path == "fast" and n >= 160
    dense = lay.n_layers * lay.n_heads * n * n * 4  # what eager keeps, float32
    qkv = lay.n_layers * n * (lay.n_heads + 2 * lay.n_kv_heads) * lay.head_dim * 4
    assert res.nbytes <= qkv + n * n
    assert res.nbytes * 4 < dense
    eager = attnviz.extract(lm, LONG, path="eager")
    assert eager.nbytes >= dense  # the bound above is not vacuous: eager really holds that much


def test_fast_path_never_runs_eager_attention(monkeypatch):
    """The fast forward never calls the model's eager attention (the function that materialises
    softmax(QK^T) per layer); the eager path calls it once per layer."""
    from transformers.models.llama import modeling_llama

    lm = tiny.loaded("llama-gqa")  # loading probes the capture against eager once: not counted
    calls: list[tuple[int, ...]] = []
    real = modeling_llama.eager_attention_forward

    def counting(module, query, *args, **kwargs):
        calls.append(tuple(query.shape))
        return real(module, query, *args, **kwargs)

    monkeypatch.setattr(modeling_llama, "eager_attention_forward", counting)
    fast = attnviz.extract(lm, LONG)
    assert fast.path == "fast" and calls == []
    attnviz.extract(lm, LONG, path="eager")
    assert len(calls) == lm.layout.n_layers  # the spy sees eager attention when it does run
    fast.layer(1)  # probabilities are computed on demand, still without eager attention
    assert len(calls) == lm.layout.n_layers


def test_encoder_decoder_stacks():
    lm = tiny.loaded("bart")
    res = attnviz.extract(lm, TEXT)
    assert res.stacks == ("encoder", "decoder", "cross")
    q, k = res.axes("cross")
    assert res.layer(0, stack="cross").shape == (4, len(q), len(k))
    with pytest.raises(attnviz.BadIndex):
        res.layer(0, stack="self")


def test_out_of_range_indices_are_clear():
    res = attnviz.extract(tiny.loaded("gpt2"), TEXT)
    with pytest.raises(attnviz.BadIndex, match=r"layers 0\.\.2"):
        res.layer(3)
    with pytest.raises(attnviz.BadIndex, match=r"heads 0\.\.3"):
        res.head(0, 4)


def test_too_long_is_refused_not_truncated():
    lm = tiny.loaded("llama-gqa")
    with pytest.raises(attnviz.InputTooLong, match="limit is 5"):
        attnviz.extract(lm, TEXT, max_tokens=5)
    with pytest.raises(attnviz.EmptyInput):
        attnviz.extract(lm, "   \n ")


def test_chat_template_marks_template_tokens():
    lm = tiny.loaded("llama-gqa")
    res = attnviz.extract(lm, "river bank", chat=True)
    user = [i for i, t in zip(res.tokens.ids, res.tokens.template, strict=True) if not t]
    assert user == lm.tokenizer("river bank", add_special_tokens=False)["input_ids"]
    assert lm.tokenizer.decode(user) == "river bank"
    assert res.tokens.template[0] and res.tokens.template[-1]
    assert not all(res.tokens.template)
    assert res.tokens.raw[0] == "<|im_start|>" and res.tokens.special[0]


def test_generation_appends_and_flags_tokens():
    lm = tiny.loaded("llama-gqa")
    res = attnviz.extract(lm, "river bank", generate=4)
    n_prompt = len(lm.tokenizer("river bank")["input_ids"])
    assert res.n_tokens == n_prompt + 4
    assert res.tokens.generated == (False,) * n_prompt + (True,) * 4
    eager = attnviz.extract_ids(lm, list(res.tokens.ids), path="eager")
    assert np.abs(res.layer(2) - eager.layer(2)).max() <= 1e-5


def test_display_tokens_are_clean_text():
    lm = tiny.loaded("llama-gqa")
    res = attnviz.extract(lm, "a <b>x</b>\tline\nnext\x00")
    assert "<b" in "".join(res.tokens.display)  # kept literally: escaping is the UI's job
    assert not any("Ġ" in d or "\x00" in d or "\n" in d for d in res.tokens.display)
    assert res.tokens.labels[0].startswith("(0) ")


def test_package_source_never_imports_streamlit():
    """No module of the package imports Streamlit (read from the source: no interpreter start)."""
    import ast
    from pathlib import Path

    root = Path(attnviz.__file__).parent
    for py in root.rglob("*.py"):
        tree = ast.parse(py.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(name.split(".")[0] == "streamlit" for name in names), py


@pytest.mark.slow  # a fresh interpreter (~5 s): also catches an import through another package
def test_package_never_imports_streamlit():
    code = "import attnviz, attnviz.metrics, attnviz.cli, sys; assert 'streamlit' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_progress_hears_every_attention_layer_and_can_stop_the_forward():
    """`progress(done, total)` is told each attention layer of the fast forward as it finishes; an
    exception it raises stops the forward (a UI's Cancel), and the model serves the next request."""
    lm = tiny.loaded("llama-gqa")
    heard: list[tuple[int, int]] = []
    res = attnviz.extract(lm, TEXT, progress=lambda done, total: heard.append((done, total)))
    n = lm.layout.n_layers
    assert heard == [(i, n) for i in range(1, n + 1)]
    assert res.n_layers() == n

    class Stop(Exception):
        pass

    def stop_after_one(done: int, total: int) -> None:
        if done == 1:
            raise Stop

    with pytest.raises(Stop):
        attnviz.extract(lm, TEXT, progress=stop_after_one)
    again = attnviz.extract(lm, TEXT)  # the lock was released: the next run works and is exact
    np.testing.assert_allclose(again.layer(1), res.layer(1), atol=1e-6)


def test_a_padding_mask_of_one_row_serves_any_rows_slice():
    """A model that hands its attention a padding mask (1, 1, 1, key_pos) - one row for every query
    (LayoutLM builds one from the attention mask) - answers any rows slice with those rows of the
    full layer (rows 1:2 once asked that mask for its missing second row and crashed)."""
    import archs

    model, _ = archs.build("layoutlm", "masked")
    lm = attnviz.wrap_model(model, archs.tokenizer(), spec="tiny-layoutlm")
    res = attnviz.extract_ids(lm, [3 + (i * 37) % 300 for i in range(12)])
    cap_mask = res.captured(0).mask
    assert res.method == "fast exact" and cap_mask is not None and tuple(cap_mask.shape) == (1, 1, 1, 12)
    full = res.layer(1)
    for rows in (slice(0, 1), slice(1, 2), slice(5, 9), slice(11, 12)):
        np.testing.assert_allclose(res.layer(1, rows=rows), full[:, rows], atol=1e-6)
