"""From-scratch attention: one layer's probabilities the readable way (`attention`: read it first;
every fast path in `attnviz.exact` names it as the identity it must equal), the textbook class, a
NumPy forward/backward, and the textbook run on a real model layer (`layer_walkthrough`), which
proves the textbook math gives the model's numbers.

Imports torch (and NumPy) only; never the UI.
"""

from .attention import attention_probabilities, head_outputs
from .numpy_mha import MHAGrads, MHAParams, init_params, mha_backward, mha_forward
from .textbook import MultiHeadAttention, causal_mask, from_torch_multihead, scaled_dot_product_attention
from .walkthrough import (
    SUPPORTED,
    Counterfactuals,
    LayerWeights,
    Step,
    Walkthrough,
    layer_walkthrough,
    layer_weights,
    recompute,
    shape_table,
)

__all__ = [
    "SUPPORTED",
    "Counterfactuals",
    "LayerWeights",
    "MHAGrads",
    "MHAParams",
    "MultiHeadAttention",
    "Step",
    "Walkthrough",
    "attention_probabilities",
    "causal_mask",
    "from_torch_multihead",
    "head_outputs",
    "init_params",
    "layer_walkthrough",
    "layer_weights",
    "mha_backward",
    "mha_forward",
    "recompute",
    "scaled_dot_product_attention",
    "shape_table",
]
