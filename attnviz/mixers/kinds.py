"""Which token mixer each module of a transformers 5.23.0 model is, and the core function it calls.

Every non-softmax mixer of transformers 5.23.0 calls a module-level function by its global name
(``mamba2_chunk_scan``, ``torch_chunk_gated_delta_rule``, ...), decorated so that a hub kernel,
``fla`` / ``mamba_ssm`` or the function's own torch body runs. attnviz wraps that name
(`attnviz.capture.mixers`) and keeps what the kernel received and returned, whichever ran.
"""

from __future__ import annotations

from typing import Literal, get_args

MixerKind = Literal[
    "attention",
    "mamba",
    "mamba2",
    "gated_delta",
    "kimi_delta",
    "lightning",
    "short_conv",
    "rwkv",
    "mlstm",
    "rglru",
]
MIXER_KINDS: tuple[str, ...] = get_args(MixerKind)

# The module class of each non-softmax mixer -> its kind.
MIXER_CLASSES: dict[str, str] = {
    **dict.fromkeys(("MambaMixer", "FalconMambaMixer", "JambaMambaMixer", "ZambaMambaMixer"), "mamba"),
    **dict.fromkeys(
        (
            "Mamba2Mixer",
            "BambaMixer",
            "FalconH1Mixer",
            "GraniteMoeHybridMambaLayer",
            "NemotronHMamba2Mixer",
            "Zamba2MambaMixer",
        ),
        "mamba2",
    ),
    **dict.fromkeys(
        (
            "Qwen3NextGatedDeltaNet",
            "Qwen3_5GatedDeltaNet",
            "Qwen3_5MoeGatedDeltaNet",
            "Qwen4ExpTextGatedDeltaNet",
            "OlmoHybridGatedDeltaNet",
        ),
        "gated_delta",
    ),
    **dict.fromkeys(
        ("KimiLinearDeltaAttention", "BailingHybridDeltaAttention", "Glm5NextTextLinearAttention"),
        "kimi_delta",
    ),
    "MiniMaxLightningAttention": "lightning",
    **dict.fromkeys(("Lfm2ShortConv", "Lfm2MoeShortConv", "Lfm3ShortConv"), "short_conv"),
    "RwkvSelfAttention": "rwkv",
    "xLSTMLayer": "mlstm",
    "RecurrentGemmaRecurrentBlock": "rglru",
}

# The module-level core function(s) each kind calls (prefill first; the per-step decode kernels
# are not listed: attnviz reads a whole prefill with use_cache=False).
CORE_FUNCTIONS: dict[str, tuple[str, ...]] = {
    "mamba": ("mamba_selective_scan",),
    "mamba2": ("mamba2_chunk_scan",),
    "gated_delta": ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"),
    "kimi_delta": ("chunk_kimi_delta_attention", "recurrent_kimi_delta_attention"),
    "rwkv": ("rwkv_linear_attention",),
    "rglru": ("_rnn_scan",),
    "short_conv": ("causal_conv1d_fn",),  # LFM2: the conv over B·x (no other conv in those files)
}
# Mixers without a core function (or whose core function misses a part): what their submodules'
# hooks keep, as (submodule attribute, "input" | "output", record key; "output" = the core output).
MODULE_TAPS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "lightning": (("act_fn", "output", "qkv"), ("norm", "input", "output")),
    "short_conv": (("in_proj", "output", "BCx"),),
    "rwkv": (("receptance", "output", "r_pre"),),
    "rglru": (("act_fn", "output", "gate"),),
}
# Core functions that are methods of a submodule's class: kind -> (submodule attribute, method).
CORE_METHODS: dict[str, tuple[str, str]] = {"rglru": ("rg_lru", "_rnn_scan")}

# Kinds whose effective attention is one signed scalar per (query, key) per head.
PER_HEAD = frozenset({"mamba2", "gated_delta", "kimi_delta", "lightning"})
# Kinds attnviz shows in this version (the others are listed per block and refused with a reason).
SHOWN = frozenset(
    {"mamba2", "gated_delta", "kimi_delta", "lightning", "mamba", "short_conv", "rwkv", "rglru"}
)
# Why a listed kind is not shown yet (completes "block b's <kind> mixer ...").
NOT_YET: dict[str, str] = {
    "mlstm": "(xLSTM mLSTM) is not implemented in this version (its parallel form with the "
    "stabiliser is known, its capture is not)",
}
# What a shown matrix is, for labels.
MEANING: dict[str, str] = {
    "attention": "softmax attention probabilities",
    "mamba2": "effective attention (signed, not probabilities): Mamba-2 SSD, "
    "A[t,s] = (C_t·B_s)·exp(A_h Σ_{r=s+1..t} Δ_r)·Δ_s over the scan's x (D·x separate)",
    "gated_delta": "effective attention (signed, not probabilities): gated delta rule, "
    "A[t,s] = β_s k_sᵀ M_{s+1}⋯M_t q_t over v",
    "kimi_delta": "effective attention (signed, not probabilities): Kimi delta attention "
    "(per-key-channel decay), A[t,s] = β_s k_sᵀ M_{s+1}ᵀ⋯M_tᵀ q_t over v",
    "lightning": "effective attention (signed, not probabilities): MiniMax lightning attention, "
    "A[t,s] = (φ(q_t)·φ(k_s))·exp(-λ_h (t-s)) over φ(v)",
    "short_conv": "token contribution norms ‖c_{t,s}‖ through out_proj (the LFM2 gated short "
    "convolution is exact per channel, a K-band; C gate frozen at its forward value)",
    "rwkv": "token contribution norms ‖c_{t,s}‖ through the output projection (RWKV-4's WKV is "
    "exact per channel, rows of probabilities; receptance gate frozen at its forward value)",
    "rglru": "token contribution norms ‖c_{t,s}‖ through linear_out (RecurrentGemma's RG-LRU is "
    "exact per channel; the GeLU branch frozen at its forward value)",
    "mamba": "token contribution norms ‖c_{t,s}‖ through out_proj (Mamba-1 is exact per channel; "
    "gates frozen at their forward values)",
}


# Kinds whose core output is laid out (1, channels, N) (the kernel's own layout).
CHANNELS_FIRST = frozenset({"mamba", "short_conv"})


def check_rows(n: int) -> list[int]:
    """The query rows the self-check compares (the capture keeps the kernel's output only there)."""
    return sorted({0, n // 3, (2 * n) // 3, n - 1})


def mixer_kind(module) -> str | None:
    """The mixer kind of a module (None: not a non-softmax mixer)."""
    return MIXER_CLASSES.get(type(module).__name__)
