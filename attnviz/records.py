"""The engine's plain records: what one attention call saw (`CapturedAttention`, with its
`ForwardStats`) and what one mixer call saw (`CapturedMixer`), the records the capture keeps and the
exact math reads; and a self-check's figures (`Check`, with `checks_caption`), what a result says
it was proven equal to. They sit on the ground floor so that every engine part that captures or
checks (the exact paths, the mixers) can make one without importing the result.

Shapes use the one vocabulary of dimension names, the glossary of `attnviz.reference.attention`
(heads, kv_heads, group, query_pos, key_pos, d_head, d_model)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class ForwardStats:
    """What one layer's forward left for the statistics (float32, query heads)."""

    lse: torch.Tensor  # (heads, query_pos) L_i
    cross: torch.Tensor  # (heads, group, query_pos): [a, b] = scale · q_{b-th head of a's group}·E_{p_a}[k]
    e_pos: torch.Tensor  # (heads, query_pos) E_p[key_pos]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.lse, self.cross, self.e_pos))


@dataclass
class CapturedAttention:
    """What one attention call saw; enough to recompute its probabilities exactly."""

    module_name: str
    query: torch.Tensor  # (1, heads, query_pos, d_head), post-RoPE / post-norm, model dtype
    key: torch.Tensor  # (1, kv_heads, key_pos, d_head), before GQA repetition
    mask: torch.Tensor | None  # bool (True = attend) or additive float, (1, 1|heads, query_pos, key_pos)
    is_causal: bool  # applies when mask is None
    scaling: float
    softcap: float | None = None
    position_bias: torch.Tensor | None = None  # T5-style additive bias (1, heads, query_pos, key_pos)
    value: torch.Tensor | None = None  # (1, kv_heads, key_pos, d_head), before GQA repetition
    sinks: torch.Tensor | None = None  # (heads,) learned sink logits in the softmax (GPT-OSS `s_aux`)
    forward: ForwardStats | None = None  # L and expectations from the forward (statistics=True)

    @property
    def nbytes(self) -> int:
        return (0 if self.forward is None else self.forward.nbytes) + sum(
            t.numel() * t.element_size()
            for t in (self.query, self.key, self.mask, self.position_bias, self.value, self.sinks)
            if t is not None
        )


@dataclass
class CapturedMixer:
    """What one non-softmax token mixer's core function received and returned (`attnviz.mixers`).

    ``inputs`` are the core function's arguments by name, as the kernel got them (e.g. for
    ``mamba2_chunk_scan``: hidden_states, dt, A, B, C, D, dt_bias, dt_softplus, dt_limit);
    ``output`` its output; for a per-channel mixer, ``out_out`` what its output projection
    returned and that projection's weight and bias (the token-contribution view and its check).
    Never a (query_pos, key_pos) matrix.
    """

    kind: str  # a key of attnviz.mixers.MIXERS
    module_name: str  # the mixer module (model.layers.3.linear_attn)
    block: int  # the model's own block index
    function: str  # the core function's global name
    inputs: dict  # argument name -> tensor / number, detached
    output: torch.Tensor
    out_out: torch.Tensor | None = None  # (1, rows, d_model): the mixer's output at output_rows
    # per head: the output path's frozen channel scales, out_proj's input over the core output
    # (1, query_pos, heads × d_head): gates and per-token norm scales at their forward values
    scale: torch.Tensor | None = None
    full_output: torch.Tensor | None = None  # transient: the whole core output until out_proj runs
    n_tokens: int = 0  # query_pos count (0: read it from ``output``, which then has every row)
    output_rows: tuple[int, ...] = ()  # the rows of ``output`` / ``out_out`` kept (`check_rows`)
    out_weight: torch.Tensor | None = None  # the output projection's weight (a reference)
    out_bias: torch.Tensor | None = None
    # a block with parallel branches (Falcon-H1, Zamba2): kind -> (S,) float64 ‖o_t‖ of what each
    # branch wrote in this forward (multipliers applied), and one sentence saying what was measured
    branches: dict[str, torch.Tensor] = field(default_factory=dict)
    branch_how: str = ""
    # the package kernel transformers bound behind ``function`` and that ran
    # ("fla.ops.gated_delta_rule.chunk_gated_delta_rule"); "": the function's own torch body
    implementation: str = ""

    @property
    def nbytes(self) -> int:
        ts = [v for v in self.inputs.values() if isinstance(v, torch.Tensor)]
        ts += [t for t in (self.output, self.out_out, self.scale) if t is not None]
        return sum(t.numel() * t.element_size() for t in ts)


@dataclass(frozen=True)
class Check:
    """The self-check: one layer recomputed by transformers' own eager attention on the same input."""

    stack: str
    layer: int
    max_abs_diff: float
    dtype: str  # e.g. "float32"
    tolerance: float
    against: str = "transformers' eager attention on the same layer input"
    mixer: str = "attention"  # a non-softmax mixer's check: ``layer`` is then the model's block
    scale: float | None = None  # max |output| a mixer's check compared against (its Δ is absolute)

    def caption(self) -> str:
        """e.g. "checked against eager: max |Δ| 3e-08, float32 (self layer 1)"."""
        if self.against == "eager itself":
            return f"eager's own probabilities (one layer at a time), {self.dtype}"
        if self.mixer != "attention":
            return (
                f"{self.mixer} block {self.layer} checked against {self.against}: max |Δ| "
                f"{self.max_abs_diff:.0e} at output scale {self.scale or 0:.0e}, {self.dtype}"
            )
        where = f"{self.stack} layer {self.layer}"
        return f"checked against eager: max |Δ| {self.max_abs_diff:.0e}, {self.dtype} ({where})"


def checks_caption(checks: Sequence[Check]) -> str:
    """One line for the self-check of every stack: one stack reads as `Check.caption`; several as
    "checked against eager, float32: max |Δ| 2e-08 (encoder layer 1), 3e-08 (decoder layer 1),
    2e-08 (cross layer 1)"; "" when none ran."""
    if not checks:
        return ""
    mixers = [c for c in checks if c.mixer != "attention"]
    if mixers:
        rest = checks_caption([c for c in checks if c.mixer == "attention"])
        return "; ".join([*([rest] if rest else []), *(c.caption() for c in mixers)])
    if len(checks) == 1 or all(c.against == "eager itself" for c in checks):
        return checks[0].caption()
    dtypes = ", ".join(dict.fromkeys(c.dtype for c in checks))
    figures = ", ".join(f"{c.max_abs_diff:.0e} ({c.stack} layer {c.layer})" for c in checks)
    return f"checked against eager, {dtypes}: max |Δ| {figures}"
