"""The exact math and its oracle: where a layer's probabilities come from (`sources`: read it
right after `attnviz.reference.attention`), probabilities from a captured call in eager's order
(`probabilities`), the model's own eager attention as the oracle (`eager`), masks as data
(`masks`), log-sum-exp kernels for whole-model statistics (`lse`, `fused`) and the statistics
taken from the forward's own kernel (`statistics`). It reads `attnviz.records` and runs on the
device seam `attnviz.backend`; the self-check over a result is `attnviz.verify`."""

from .eager import CannotCheck, eager_probabilities
from .probabilities import attention_scores, probs_from_capture, softmax_fp32

__all__ = ["CannotCheck", "attention_scores", "eager_probabilities", "probs_from_capture", "softmax_fp32"]
