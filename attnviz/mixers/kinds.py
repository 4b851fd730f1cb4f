"""One record per token-mixer kind: everything attnviz knows about a kind, in one place.

`MIXERS` is to the mixers what transformers' ``ALL_ATTENTION_FUNCTIONS`` is to attention: a
registry keyed by the kind's name ("gated_delta"), and nothing else branches on that name. Each
`MixerKind` holds

- how to find and capture it: the module classes that are this kind (``classes``), the
  module-level core function(s) it calls by their global name (``core_functions``; every
  non-softmax mixer of transformers 5.23.0 does, decorated so that a hub kernel, ``fla`` /
  ``mamba_ssm`` or the function's own torch body runs; `attnviz.capture.mixers` wraps that name
  and keeps what the kernel received and returned, whichever ran), a core method of a submodule
  (``core_method``) and the submodule hooks that fill what the core function misses (``taps``);
- how to rebuild it: whether its effective attention is one matrix per head (``per_head``), its
  float64 ``parts`` from the kernel's inputs, its ``heads``, its ``rows`` (per head) or
  ``contributions`` (per channel), and the self-check's ``reference`` (the core output rebuilt
  from the matrix, compared with the kernel's own) with what it is ``against``;
- how to name it: its ``display`` name and its ``meaning`` (the label of what its matrix is).

`attnviz.mixers.store.MixerStore` asks the record for all of this; figures ask it for the
display name and how to draw it (``picture``).

**Adding a mixer** is one new record here: write its formulas in a module beside this one
(``parts(inputs)``, then either ``rows(parts, heads, query_rows)`` and ``n_heads(inputs)`` for a
per-head kind, or ``contribution_rows(parts, W_out, rows, n)`` and ``contribution_sum(parts,
W_out, bias, t)`` via `attnviz.mixers.channels` for a per-channel one, plus the core output
rebuilt for the check and the token-by-token oracle in `attnviz.mixers.reference`), then add
``"name": MixerKind("name", ...)`` to `MIXERS`. Capture, store, pooled views, the check, the
figures and the app pick it up; tests/engine/test_mixers.py then wants a tiny model of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from . import channels, conv, delta, linear, reference, rglru, selective, ssd, wkv

Picture = Literal["probabilities", "signed", "norms"]
SIGNED_MEANING = "effective attention (signed, not probabilities)"
THROUGH_OUT_PROJ = " and the mixer output (Σ_s contributions through out_proj)"


def _one_head(inputs: dict) -> int:
    return 1  # a per-channel kind's one "head": its token-contribution norms


@dataclass(frozen=True)
class MixerKind:
    """Everything about one kind of token mixer (see the module docstring)."""

    name: str  # the key in MIXERS and in AttentionLayout.mixers ("gated_delta")
    display: str  # for people ("Gated DeltaNet")
    meaning: str  # what its matrix is, for labels
    classes: tuple[str, ...] = ()  # module class names that are this kind
    core_functions: tuple[str, ...] = ()  # prefill first (Gated DeltaNet's recurrent one is also its step)
    # decode-step functions with their own layout (one token, the state updated in place:
    # Mamba's selective_state_update), and the map of their arguments and output to the prefill
    # function's layout (`attnviz.mixers.steps`: a step's record joins the forward it continues)
    step_functions: tuple[str, ...] = ()
    step_inputs: Callable[[dict, Any], tuple[dict, Any]] | None = None
    time_parts: tuple[str, ...] = ()  # the parts along S (joined over steps; "cum" runs on)
    core_method: tuple[str, str] | None = None  # (submodule attribute, method) when the core is a method
    # submodule hooks: (attribute, "input" | "output", record key; "output" = the core output)
    taps: tuple[tuple[str, str, str], ...] = ()
    per_head: bool = False  # one signed scalar per (query, key) per head; else per channel
    channels_first: bool = False  # the core output is laid out (B, ch, S), the kernel's own layout
    channel_groups: bool = False  # several scans over consecutive channel groups read as one (Zamba)
    not_shown: str = ""  # why it is not shown yet (completes "block b's <kind> mixer ...")
    # how to rebuild it (None: not shown)
    parts: Callable[[dict], dict] | None = None  # the kernel's inputs -> float64 parts
    heads: Callable[[dict], int] = _one_head  # the kernel's inputs -> nh
    # per head: (parts, heads, query rows) -> float64 (nh', T, S)
    rows: Callable | None = None
    # per head, for pooled views: the rows streamed block by block (emit), never (T, S) at once
    stream_rows: Callable | None = None
    values: str = ""  # per head: the parts key of the vectors A weighs (S, nh, hs)
    skip: str = ""  # per head: the parts key of a per-head skip weight (SSD's D·x_t), if any
    # per channel: (parts, W_out, rows, S) -> (T, S) norms, and (parts, W_out, bias, t) -> Σ_s c_{t,s}
    contributions: Callable | None = None
    mixer_output: Callable | None = None
    # per channel: parts -> channels.ChannelTerms (the output as vectors by source token: routes)
    channel_terms: Callable | None = None
    # the self-check: (parts, query rows) -> the core output rebuilt there, against the kernel's
    reference: Callable | None = None
    # per head, where the reference is Σ_s A v over ``rows``' matrix: (parts, A, heads) -> the core
    # output; the store then keeps the check's rows of A and serves them again (routes read row N-1)
    outputs: Callable | None = None
    against: str = ""  # "{function}" is the core function's name
    against_mixer: str = ""  # the second comparison, with the mixer's output
    oracle: Callable | None = None  # the token-by-token textbook form (tests), parts -> (nh, T, S)
    picture: Picture | None = None  # how figures draw it; None: signed per head, norms per channel

    @property
    def shown(self) -> bool:
        """Whether attnviz rebuilds and shows this kind from a captured record."""
        return self.reference is not None

    @property
    def drawn_as(self) -> Picture:
        """ "probabilities" (softmax), "signed" (a per-head effective attention, diverging at 0)
        or "norms" (a per-channel kind's contribution norms, sequential from 0)."""
        return self.picture or ("signed" if self.per_head else "norms")

    @property
    def label(self) -> str:
        """What ``res.layer(b, mixer=name)`` returns, or why it is not shown."""
        return self.meaning or self.not_shown


def _per_head(name: str, display: str, formula: str, module, **facts) -> MixerKind:
    return MixerKind(
        name, display, f"{SIGNED_MEANING}: {formula}", per_head=True, heads=module.n_heads,
        reference=module.core_output, against_mixer=THROUGH_OUT_PROJ, **facts,
    )  # fmt: skip


def _per_channel(name: str, display: str, meaning: str, module, output_at, **facts) -> MixerKind:
    return MixerKind(
        name, display, meaning, contributions=module.contribution_rows,
        mixer_output=module.contribution_sum, reference=channels.each_row(output_at),
        channel_terms=module.channel_terms, **facts,
    )  # fmt: skip


_DELTA = dict(
    parts=delta.delta_parts,
    time_parts=delta.TIME_PARTS,
    rows=delta.delta_rows,
    stream_rows=delta.chunked_rows,
    outputs=delta.delta_outputs,
    values="v",
    against="the {function} output (Σ_s A[t,s]·v_s)",
    oracle=reference.delta_dense,
)
_NORMS = "token contribution norms ‖c_{t,s}‖ through"

MIXERS: dict[str, MixerKind] = {
    "attention": MixerKind(
        "attention",
        "softmax attention",
        "softmax attention probabilities",
        per_head=True,
        picture="probabilities",
    ),
    "mamba": _per_channel(
        "mamba",
        "Mamba-1",
        f"{_NORMS} out_proj (Mamba-1 is exact per channel; gates frozen at their forward values)",
        selective,
        selective.core_output,
        classes=("MambaMixer", "FalconMambaMixer", "JambaMambaMixer", "ZambaMambaMixer"),
        core_functions=("mamba_selective_scan",),
        step_functions=("mamba_selective_state_update",),
        step_inputs=selective.step_inputs,
        time_parts=selective.TIME_PARTS,
        channels_first=True,
        channel_groups=True,
        parts=selective.selective_parts,
        against="the {function} output (per channel, gate frozen)",
        against_mixer=" and the mixer output (Σ_s contributions + skip + bias)",
    ),
    "mamba2": _per_head(
        "mamba2",
        "Mamba-2 (SSD)",
        "Mamba-2 SSD, A[t,s] = (C_t·B_s)·exp(A_h Σ_{r=s+1..t} Δ_r)·Δ_s over the scan's x (D·x separate)",
        ssd,
        classes=(
            "Mamba2Mixer",
            "BambaMixer",
            "FalconH1Mixer",
            "GraniteMoeHybridMambaLayer",
            "NemotronHMamba2Mixer",
            "Zamba2MambaMixer",
        ),
        core_functions=("mamba2_chunk_scan",),
        step_functions=("mamba2_selective_state_update",),
        step_inputs=ssd.step_inputs,
        time_parts=ssd.TIME_PARTS,
        parts=ssd.ssd_parts,
        rows=ssd.ssd_rows,
        values="x",
        skip="D",
        against="the {function} output (Σ_s A[t,s]·x_s + D·x_t)",
        oracle=reference.ssd_dense,
    ),
    "gated_delta": _per_head(
        "gated_delta",
        "Gated DeltaNet",
        "gated delta rule, A[t,s] = β_s k_sᵀ M_{s+1}⋯M_t q_t over v",
        delta,
        core_functions=("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"),
        **_DELTA,
        classes=(
            "Qwen3NextGatedDeltaNet",
            "Qwen3_5GatedDeltaNet",
            "Qwen3_5MoeGatedDeltaNet",
            "Qwen4ExpTextGatedDeltaNet",
            "OlmoHybridGatedDeltaNet",
        ),
    ),
    "kimi_delta": _per_head(
        "kimi_delta",
        "Kimi delta attention",
        "Kimi delta attention (per-key-channel decay), A[t,s] = β_s k_sᵀ M_{s+1}ᵀ⋯M_tᵀ q_t over v",
        delta,
        core_functions=("chunk_kimi_delta_attention", "recurrent_kimi_delta_attention"),
        **_DELTA,
        classes=("KimiLinearDeltaAttention", "BailingHybridDeltaAttention", "Glm5NextTextLinearAttention"),
    ),
    "lightning": _per_head(
        "lightning",
        "lightning attention",
        "MiniMax lightning attention, A[t,s] = (φ(q_t)·φ(k_s))·exp(-λ_h (t-s)) over φ(v)",
        linear,
        classes=("MiniMaxLightningAttention",),  # no core function: its own loop, hooked
        taps=(("act_fn", "output", "qkv"), ("norm", "input", "output")),
        parts=linear.lightning_parts,
        rows=linear.lightning_rows,
        values="v",
        against="the lightning attention's output before its norm (Σ_s A[t,s]·v_s)",
        oracle=reference.lightning_dense,
    ),
    "short_conv": _per_channel(
        "short_conv",
        "gated short conv",
        f"{_NORMS} out_proj (the LFM2 gated short convolution is "
        "exact per channel, a K-band; C gate frozen at its forward value)",
        conv,
        conv.conv_output,
        classes=("Lfm2ShortConv", "Lfm2MoeShortConv", "Lfm3ShortConv"),
        core_functions=("causal_conv1d_fn",),  # LFM2: the conv over B·x (no other conv in those files)
        taps=(("in_proj", "output", "BCx"),),
        channels_first=True,
        parts=conv.conv_parts,
        against="the {function} output (per channel)",
        against_mixer=" and the mixer output (Σ_s contributions + bias)",
    ),
    "rwkv": _per_channel(
        "rwkv",
        "RWKV-4",
        f"{_NORMS} the output projection (RWKV-4's WKV is exact per channel, rows "
        "of probabilities; receptance gate frozen at its forward value)",
        wkv,
        wkv.wkv_output,
        classes=("RwkvSelfAttention",),
        core_functions=("rwkv_linear_attention",),
        taps=(("receptance", "output", "r_pre"),),
        parts=wkv.wkv_parts,
        against="the {function} output (per channel)",
        against_mixer=" and the block's mixer output (Σ_s contributions)",
    ),
    "mlstm": MixerKind(
        "mlstm",
        "mLSTM",
        "",
        classes=("xLSTMLayer",),
        per_head=True,
        not_shown="(xLSTM mLSTM) is not implemented in this version (its parallel form with the "
        "stabiliser is known, its capture is not)",
    ),
    "rglru": _per_channel(
        "rglru",
        "RG-LRU",
        f"{_NORMS} linear_out (RecurrentGemma's RG-LRU is exact per channel; the "
        "GeLU branch frozen at its forward value)",
        rglru,
        rglru.rglru_output,
        classes=("RecurrentGemmaRecurrentBlock",),
        core_functions=("_rnn_scan",),
        core_method=("rg_lru", "_rnn_scan"),
        taps=(("act_fn", "output", "gate"),),
        parts=rglru.rglru_parts,
        against="the {function} output (per channel)",
        against_mixer=" and the block's mixer output (Σ_s contributions)",
    ),
}

# Views of MIXERS for callers that want a set (never edited by hand).
MIXER_KINDS: tuple[str, ...] = tuple(MIXERS)
PER_HEAD = frozenset(k for k, m in MIXERS.items() if m.per_head and m.shown)
SHOWN = frozenset(k for k, m in MIXERS.items() if m.shown)
NOT_YET: dict[str, str] = {k: m.not_shown for k, m in MIXERS.items() if m.not_shown}
_BY_CLASS: dict[str, MixerKind] = {c: m for m in MIXERS.values() for c in m.classes}


def check_rows(n: int) -> list[int]:
    """The query rows the self-check compares (the capture keeps the kernel's output only there)."""
    return sorted({0, n // 3, (2 * n) // 3, n - 1})


def mixer_of(module) -> MixerKind | None:
    """The record of a module that is a non-softmax mixer (None: it is not one)."""
    return _BY_CLASS.get(type(module).__name__)


def mixer_kind(module) -> str | None:
    """The mixer kind's name of a module (None: not a non-softmax mixer)."""
    found = mixer_of(module)
    return None if found is None else found.name
