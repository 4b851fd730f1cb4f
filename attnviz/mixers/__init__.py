"""Token mixers other than softmax attention: exact effective attention, on demand.

Every non-softmax mixer of transformers 5.23.0 is linear in its values once its gates are fixed,
so each block's output is y_t = Σ_s A[t,s]·v_s (+ a skip term) with A built from what the mixer's
core function received (captured by `attnviz.capture.mixers`, whichever kernel ran). A is signed
and not normalised: it is "effective attention (signed, not probabilities)", never a probability
map (entropy, sink share and rollout do not apply to it).

What views should call (all on an `AttentionResult` from `attnviz.extract`):

- ``res.layout.mixers[b]``: block b's mixers, e.g. ("attention",), ("gated_delta",),
  ("attention", "mamba2") for a block with two parallel branches (Falcon-H1; Zamba2's hybrid
  blocks); ``res.layout.mixer_note(b)`` is the sentence a page must show beside such a block.
- ``res.layer(b, mixer=kind)`` -> float32 (nh, T, S); ``res.head(b, h, mixer=kind, rows=...)``
  -> (T, S). With ``mixer`` given, ``b`` is the model's own block index. Rows are computed on
  demand: ask for ``rows=slice(...)`` tiles at long context, never the whole stack.
- ``res.mixer_heads(b, kind)``, ``res.mixer_meaning(kind)`` (the label), ``res.mixer_check(b, kind)``
  (a `Check`: max |Δ| against the kernel's own output, its scale and dtype). A block whose matrix
  does not reproduce its kernel raises `attnviz.errors.MixerCheckFailed` with the reason; a kind
  not shown yet raises `attnviz.errors.MixerNotShown` naming what is missing.
- ``res.mixer_pooled(b, kind, head, cells=256)``: one head's pooled view (signed mean and max |A|
  per block of tokens) without the (T, S) matrix: what an overview or a long input should draw.
- ``res.mixer_contributions(b, kind, heads=..., rows=...)``: ‖c_{t,s}‖, how much source token s
  adds to the mixer's output at t through its output projection (per head: its channels), gates
  and norm scales frozen at their forward values: the value-weighted view of a mixer, the one
  exact per-head view of the per-channel kinds, and the way to compare two parallel branches.
- ``res.branch_shares(b)``: each parallel branch's share of block b's token-mixing output
  (Falcon-H1, Zamba2), measured during the extract's own forward (`branches.BranchShares`).
- ``attnviz.head_view(res, layer=b, mixer=kind)``: the notebook figure (diverging scale at 0).
- Per-head kinds (``PER_HEAD``): mamba2 (SSD, over the scan's x, Δ_s inside, D·x separate),
  gated_delta and kimi_delta (over v, β_s inside), lightning (over v). Per-channel kinds (mamba =
  Mamba-1, short_conv, rwkv, rglru) return one "head": the norms ‖c_{t,s}‖ of each source token's
  contribution to the mixer's output through its output projection, gates frozen at their forward
  values (non-negative, not probabilities either). Entropy, sink share and rollout do not apply.
- Files: `attnviz.export.save_npz` keeps every mixer's kernel inputs; `load_npz` rebuilds them.

Modules: `kinds` (`MIXERS`: one `MixerKind` record per kind, everything about it: its classes
and core function, its formulas, its check, its names; a new mixer is one new record), `ssd`,
`delta`, `linear` (per-head formulas), `selective`, `conv`, `wkv`, `rglru` (per-channel formulas,
their contributions through `channels`), `reference` (the token-by-token oracle the tests use),
`store` (the captured records and the per-block self-check), `pooling`, `branches`.

Dimension names in shape comments are the glossary of `attnviz.reference.attention`: B batch,
nh heads, T query positions, S key (source) positions, hs head size (hs_k / hs_v where keys and
values differ). A mixer reads a whole prefill, so T == S == the text's tokens. Mixers add two:
ch channels (a per-channel mixer's d_inner) and n the state size (SSD / Mamba-1's B and C).
"""

from .branches import BranchShares
from .kinds import MIXER_KINDS, MIXERS, PER_HEAD, SHOWN, MixerKind
from .store import MixerStore, meaning

__all__ = ["MIXERS", "MIXER_KINDS", "PER_HEAD", "SHOWN", "BranchShares", "MixerKind", "MixerStore", "meaning"]
