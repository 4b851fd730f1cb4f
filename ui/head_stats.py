"""Head statistics on the pages: their display names and the cached `attnviz.metrics.head_metrics`
of a result (with the induction probe on request)."""

from __future__ import annotations

from attnviz import AttentionResult
from attnviz.layout import Stack
from ui import models

METRIC_NAMES = {
    "entropy": "entropy (0 = one key, 1 = uniform)",
    "sink": "sink (weight on the first token)",
    "previous_token": "previous token",
    "diagonal": "self (diagonal)",
    "distance": "mean distance (tokens)",
    "induction": "induction (repeated random tokens)",
    "gqa_coherence": "GQA coherence (KV group agreement)",
}


def head_metrics(
    lm, res: AttentionResult, key: tuple, stack: Stack, *, induction: bool, token: str | None = None
):
    """`attnviz.metrics.head_metrics` of a result, cached; ``induction`` adds the probe (one more
    model run on 2 x 50 random tokens, cached per model). Returns (metrics, note)."""
    from attnviz import metrics

    probe, note = None, ""
    if induction and stack != "cross":
        try:
            probe = models.cached(
                "probe",
                (lm.spec, models.token_key(token)),
                lambda: metrics.induction_probe(lm),
                nbytes=lambda p: p.result.nbytes,
            )
        except Exception as err:  # noqa: BLE001 - the other metrics still show
            note = f"Induction scores are not available for this model ({err})."
    elif induction:
        note = "Induction is defined on self-attention; pick the encoder or decoder stack."
    hm = models.cached(
        "metrics",
        (key, stack, probe is not None),
        lambda: metrics.head_metrics(res, stack=stack, induction=probe),
        nbytes=lambda m: 8 * 8 * m.entropy.size,
    )
    return hm, note
