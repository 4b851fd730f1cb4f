"""Explain a prediction: information-flow routes, logit lens, direct logit attribution, head
ablation and rotary frequency bands, all readable from one traced forward pass (`trace`).

    tr = attnviz.explain.trace(lm, text)          # one forward, the residual stream per block
    attnviz.information_flow(lm, tr)             # routes to the last token's prediction
    attnviz.logit_lens(lm, tr)                   # what each layer would predict
    attnviz.logit_attribution(lm, tr)            # every head's and MLP's share of the logit
    attnviz.ablate_heads(lm, tr, [(3, 1)])       # the prediction without head 1 of layer 3
    attnviz.qk_attribution(lm, tr, layer=2, head=3, query=-1, key=5)  # why it attends there

Hybrids and recurrent models (Qwen3.5, Falcon-H1, Mamba, RWKV, ...) are read at block boundaries
(`stream`): the logit lens and patching over "residual" / "blocks" run on them; routes and node
inspection read a `block_trace` (every mixing branch's c_{t,s} as edges, mixer heads included);
`qk_attribution` splits their attention blocks' scores into every earlier block's branches
(mixers by head: `mixed_trace`); the views that split blocks into softmax heads only refuse them
with the reason.

Every function also takes the text itself (and then runs its own forward).
"""

from .ablation import MODES, Ablation, ablate_heads
from .attribution import Attribution, logit_attribution
from .attribution_patching import attribution_patch
from .block_attribution import BlockAttribution, block_attribution
from .block_trace import BlockTrace, block_trace
from .circuits import OVCircuits, QKSpace, ov_circuits, ov_tokens, qk_space
from .lens import LogitLens, logit_lens
from .mixer_ablation import MixerAblation, ablate_mixer_heads
from .patching import DIRECTIONS, OVERS, Patching, patch
from .qk import QKAttribution, QKRow, qk_attribution, qk_row
from .qk_mixed import MixedTrace, mixed_trace
from .qk_parts import reads_blocks
from .residual import Trace, Unsupported, trace
from .rotary import RotaryBands, RotarySpec, bands, rotary_bands
from .routes import DEFAULT_THRESHOLD, EDGE_KINDS, Edge, FlowGraph, Node, information_flow
from .search import HeadScores, MixerHeadScores, previous_occurrence_heads, search_heads, search_mixer_heads
from .stream import Stream, needs_stream, read_stream, stream
from .writes import NodeWrites, node_writes

__all__ = [
    "DEFAULT_THRESHOLD",
    "DIRECTIONS",
    "EDGE_KINDS",
    "MODES",
    "OVERS",
    "Ablation",
    "Attribution",
    "BlockAttribution",
    "BlockTrace",
    "Edge",
    "FlowGraph",
    "HeadScores",
    "LogitLens",
    "MixedTrace",
    "MixerAblation",
    "MixerHeadScores",
    "Node",
    "NodeWrites",
    "OVCircuits",
    "Patching",
    "QKAttribution",
    "QKRow",
    "QKSpace",
    "RotaryBands",
    "RotarySpec",
    "Stream",
    "Trace",
    "Unsupported",
    "ablate_heads",
    "ablate_mixer_heads",
    "attribution_patch",
    "bands",
    "block_attribution",
    "block_trace",
    "information_flow",
    "logit_attribution",
    "logit_lens",
    "mixed_trace",
    "needs_stream",
    "node_writes",
    "ov_circuits",
    "ov_tokens",
    "patch",
    "previous_occurrence_heads",
    "qk_attribution",
    "qk_row",
    "qk_space",
    "read_stream",
    "reads_blocks",
    "rotary_bands",
    "search_heads",
    "search_mixer_heads",
    "stream",
    "trace",
]
