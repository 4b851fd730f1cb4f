"""Per-head summary numbers of attention: the dense definitions and the fast computation.

- `definitions`: each statistic on a probability tensor (the test oracle);
- `fast`: the same numbers from the fused kernels' log-sum-exp, no N×N tensor;
- `heads`: `head_metrics(result)` for every layer and head, fast where exact, dense elsewhere;
- `probe`: the induction probe (random tokens repeated twice).
"""

from ..exact.lse import mask_of
from .definitions import (
    METRICS,
    ROW_METRICS,
    Metric,
    diagonal_score,
    entropy,
    group_coherence,
    induction_score,
    key_counts,
    looks_causal,
    mean_distance,
    previous_token_score,
    sink_mass,
)
from .heads import CHUNK_ELEMENTS, Computation, HeadMetrics, head_metrics
from .probe import InductionProbe, head_induction, induction_probe, probe_candidates

__all__ = [
    "CHUNK_ELEMENTS",
    "METRICS",
    "ROW_METRICS",
    "Computation",
    "HeadMetrics",
    "InductionProbe",
    "Metric",
    "diagonal_score",
    "entropy",
    "group_coherence",
    "head_induction",
    "head_metrics",
    "induction_probe",
    "induction_score",
    "key_counts",
    "looks_causal",
    "mask_of",
    "mean_distance",
    "previous_token_score",
    "probe_candidates",
    "sink_mass",
]
