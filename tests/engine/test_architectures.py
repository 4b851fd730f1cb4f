"""Every text architecture transformers ships: exact attention or a clear refusal, never wrong.

One tiny random model per architecture (tests/archs.py), checked in two worker processes against a
SEPARATE eager load of the same weights, fp32, tolerance 1e-4; docs/architectures.md is the table
these rows render to.
"""

from __future__ import annotations

import functools

import archs
import pytest

from attnviz.extract import MIXERS_ONLY_METHOD

NAMES = sorted(archs.mapping_names())
EXACT = ("fast exact", "eager exact (one layer at a time)")
# Words that mark a message meant for developers, not for the person using attnviz.
INTERNAL = ("internal", "traceback", "please report", "captured ")


@functools.cache
def rows() -> dict[str, archs.Row]:
    return {r.model_type: r for r in archs.run_all(NAMES)}


@pytest.mark.slow
@pytest.mark.parametrize("model_type", NAMES)
def test_exact_or_refused_with_a_reason(model_type):
    row = rows()[model_type]
    assert row.status in (*EXACT, MIXERS_ONLY_METHOD, "refused", "skipped"), (
        f"{model_type}: {row.status}: {row.detail}"
    )
    if row.status == MIXERS_ONLY_METHOD:  # only a model with no softmax layer, and its mixers exact
        _assert_mixers_only(model_type, row)
    if row.status == "skipped":  # not a text model, or no tiny model ("not covered") - a test gap
        assert model_type in archs.NOT_TEXT, f"{model_type} not covered: {row.detail}"
    if row.status in EXACT:
        assert row.max_diff is not None and row.max_diff <= 1e-4, f"{model_type}: max |Δ| {row.max_diff}"
    if row.status == "refused":
        reason = row.detail
        assert model_type.replace("-", "_") in reason.replace("-", "_") or "model" in reason, reason
        assert len(reason.split()) >= 8, f"not a sentence: {reason!r}"
        assert not any(w in reason.lower() for w in INTERNAL), f"internal message: {reason!r}"


@pytest.mark.slow
def test_coverage_is_dozens_of_architectures_and_the_named_families():
    exact = {t for t, r in rows().items() if r.status in EXACT}
    assert len(exact) >= 150, f"only {len(exact)} architectures exact"
    named = {
        "llama", "gpt2", "bert", "t5", "bart", "falcon", "gpt_oss", "t5gemma", "gptj", "codegen",
        "bloom", "mpt", "deberta-v2", "mpnet", "xglm", "jamba", "bamba", "granitemoehybrid",
        "qwen3_next", "minimax", "lfm2", "recurrent_gemma", "nemotron_h", "convbert", "mobilebert",
    }  # fmt: skip
    assert named <= exact, f"not exact: {sorted(named - exact)}"
    for ssm in ("mamba", "rwkv", "falcon_mamba", "mamba2"):  # no attention: their mixers (issue 30)
        assert rows()[ssm].status == MIXERS_ONLY_METHOD, (ssm, rows()[ssm])
        _assert_mixers_only(ssm, rows()[ssm])


def _assert_mixers_only(model_type: str, row: archs.Row) -> None:
    """A row extracted as "mixers only": the model has no softmax layer (archs.py writes that
    prefix only when the layout has none) and every mixer kind in it is shown, self-checked."""
    assert row.detail.startswith("no softmax attention; "), f"{model_type} has softmax layers: {row.detail}"
    kinds = [k for k in row.detail.removeprefix("no softmax attention; ").split("; ") if " in blocks " in k]
    assert kinds, f"{model_type}: no mixers named: {row.detail}"
    assert all("self-checked" in k for k in kinds), f"{model_type}: a mixer not exact: {row.detail}"
    assert row.max_diff is not None and row.max_diff <= 1e-4, f"{model_type}: max |Δ| {row.max_diff}"


@pytest.mark.slow
def test_hybrids_show_attention_blocks_only():
    for model_type, blocks in {"jamba": "1, 3 of 4", "qwen3_next": "1, 3 of 4", "bamba": "1, 3 of 4"}.items():
        assert rows()[model_type].detail.startswith(f"attention in blocks {blocks}; "), rows()[model_type]
        assert "(exact per " in rows()[model_type].detail, rows()[model_type]


@pytest.mark.slow
def test_table_in_docs_matches_the_code():
    want = archs.render(list(rows().values()))
    have = archs.DOC.read_text(encoding="utf-8") if archs.DOC.exists() else ""
    assert have == want, "docs/architectures.md is stale: run `python tests/archs.py --write`"


def test_docs_prose_is_the_generators_header():
    """Fast: the prose above the table (hand-edited sections included) lives in
    tests/arch_configs.py's HEADER, else the slow table test fails after the next merge."""
    import transformers
    from arch_configs import HEADER

    have = archs.DOC.read_text(encoding="utf-8")
    assert have.startswith(HEADER.format(version=transformers.__version__)), (
        "docs/architectures.md's prose differs from tests/arch_configs.py HEADER: edit HEADER, then "
        "`python tests/archs.py --write`"
    )
