"""The captured mixers of one forward, and their exact matrices on demand (rows and tiles).

`MixerStore` keeps only what each core function received (never a (T, S) matrix) and computes
rows of a block's effective attention when asked, after that block's self-check passed: Σ_s A[t,s]
v_s (+ the skip term) must equal the kernel's own output on a few rows, within a tolerance relative
to the output's scale; otherwise `MixerCheckFailed` says why and nothing is shown. Everything
about a kind (its parts, rows, contributions, the check's reference) comes from its record in
`attnviz.mixers.kinds.MIXERS`; nothing here branches on a kind's name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..errors import BadIndex, MixerCheckFailed, MixerNotShown
from ..records import CapturedMixer, Check
from . import steps
from .branches import BranchShares, branch_shares
from .kinds import MIXERS, MixerKind, check_rows

# Allowed max |Δ| relative to the output's scale: the kernels compute in float32 (the model's
# own rounding dominates, measured 1e-7 of scale); a bf16 / fp16 model rounds its output.
RELATIVE_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-8}
HALF_RELATIVE_TOLERANCE = 2e-2
PARTS_KEPT = 2  # blocks whose float64 inputs stay built (the rest are rebuilt when asked again)


class MixerStore:
    """Non-softmax mixers captured in one forward, by (block, kind)."""

    def __init__(self, records: Sequence[CapturedMixer], dtype: torch.dtype) -> None:
        self._records: dict[tuple[int, str], CapturedMixer] = {}
        self._calls: dict[tuple[int, str], int] = {}  # core-function calls per block and kind
        # a module that ran without its core function (another path) left an empty record
        self._all = [r for r in records if r.output.numel()]
        groups: dict[tuple[int, str], list[CapturedMixer]] = {}
        for r in self._all:
            groups.setdefault((r.block, r.kind), []).append(r)
        self._refused: dict[tuple[int, str], str] = {}  # (block, kind) -> why it is not shown
        for key, group in groups.items():
            spec = _spec(key[1])
            if any(steps.continues(r) for r in group):  # cached decode steps: joined to their forward
                joined = steps.join(group, spec is not None and spec.channels_first)
                if isinstance(joined, str):
                    self._refused[key] = joined
                    joined = group[0]
                self._records[key], self._calls[key] = joined, 1
                continue
            # Zamba's Mamba-1 scans each channel group ("mamba head") with its own B and C
            merge = len(group) > 1 and spec is not None and spec.channel_groups
            self._records[key] = _channel_groups(group) if merge else group[0]
            self._calls[key] = 1 if merge else len(group)
        self.dtype = dtype
        self._parts: dict[tuple[int, str], dict] = {}
        self._checks: dict[tuple[int, str], Any] = {}
        self._checked_rows: dict[tuple[int, str], tuple[list[int], torch.Tensor]] = {}  # (rows, A)
        first = next(iter(self._records.values()), None)
        self.n_tokens = 0 if first is None else _n_tokens(first)

    def records(self) -> list[CapturedMixer]:
        """Every captured core call, in call order (for export)."""
        return list(self._all)

    def __len__(self) -> int:
        return len(self._records)

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self._records.values())

    def blocks(self, kind: str | None = None) -> list[int]:
        """Blocks with a captured mixer (of ``kind``), in order."""
        return sorted({b for b, k in self._records if kind is None or k == kind})

    def kinds(self) -> list[str]:
        return sorted({k for _, k in self._records})

    def spec(self, block: int, kind: str) -> MixerKind:
        """The record of a kind this store can show (`MixerNotShown` says why not)."""
        found = _spec(kind)
        if found is None or not found.shown:
            raise MixerNotShown(
                f"block {block}'s {kind} mixer {found.not_shown if found else 'is not shown'}"
            )
        return found

    def record(self, block: int, kind: str) -> CapturedMixer:
        self.spec(block, kind)
        if (block, kind) in self._refused:
            raise MixerNotShown(self._refused[(block, kind)])
        calls = self._calls.get((block, kind), 0)
        if calls > 1:  # Zamba's Mamba-1 runs one scan per "mamba head", each with its own B and C
            raise MixerNotShown(
                f"block {block}'s {kind} mixer called its core function {calls} times in one forward "
                "(one scan per sub-head); attnviz shows mixers that make one call per block"
            )
        try:
            return self._records[(block, kind)]
        except KeyError:
            have = ", ".join(f"{b} ({k})" for b, k in sorted(self._records)) or "none"
            raise BadIndex(f"no {kind} mixer was captured in block {block}; captured: {have}") from None

    def checkable(self, block: int, kind: str) -> bool:
        """Whether the block's mixer can be shown and checked (one core call, a shown kind)."""
        spec = _spec(kind)
        return (
            spec is not None
            and spec.shown
            and self._calls.get((block, kind), 0) == 1
            and (block, kind) not in self._refused
        )

    def n_heads(self, block: int, kind: str) -> int:
        """Heads of a per-head mixer; 1 for a per-channel one (its contribution view)."""
        inputs = self.record(block, kind).inputs
        return self.spec(block, kind).heads(inputs["steps"][0] if "steps" in inputs else inputs)

    def parts(self, block: int, kind: str) -> dict:
        key = (block, kind)
        if key not in self._parts:
            inputs = self.record(block, kind).inputs
            build = self.spec(block, kind).parts
            assert build is not None  # a shown kind has parts
            while len(self._parts) >= PARTS_KEPT:  # float64 copies of a block's inputs: a few at most
                self._parts.pop(next(iter(self._parts)))
            spec = self.spec(block, kind)
            try:  # a forward and its decode steps: one sequence's parts
                built = [build(i) for i in inputs.get("steps", [inputs])]
                self._parts[key] = steps.join_parts(built, spec.time_parts)
            except ValueError as err:
                raise MixerNotShown(f"block {block}'s {kind} mixer: {err}") from None
        return self._parts[key]

    def tensor(
        self,
        block: int,
        kind: str,
        heads: Sequence[int] | None = None,
        rows: slice | Sequence[int] | None = None,
    ) -> torch.Tensor:
        """float32 (nh', T, S): the block's effective attention (per-channel kinds: the
        token-contribution norms, one "head"), after the block's self-check passed; ``rows``: a
        slice or the query positions (the routes ask for the rows they expand)."""
        n_heads = self.n_heads(block, kind)
        heads = list(range(n_heads)) if heads is None else [int(h) for h in heads]
        for h in heads:
            if not 0 <= h < n_heads:
                raise BadIndex(
                    f"head {h} is out of range: block {block}'s {kind} mixer has heads 0..{n_heads - 1}"
                )
        self.check(block, kind)
        idx = torch.arange(self.n_tokens)[rows if rows is not None else slice(None)]
        if len(idx) == 0:
            return torch.zeros(len(heads), 0, self.n_tokens)
        from ..limits import require

        device = self.record(block, kind).output.device
        require(  # float64 while computed, float32 returned
            len(heads) * len(idx) * self.n_tokens * 12,
            device,
            what=f"block {block}'s {kind} matrix ({len(heads)} heads × {len(idx)} × {self.n_tokens})",
            hint="fewer rows (rows=slice(...)) or one head at a time, or res.mixer_pooled",
        )
        return self._rows(block, kind, heads, idx).float()

    def _rows(self, block: int, kind: str, heads: list[int], idx: torch.Tensor) -> torch.Tensor:
        spec, parts = self.spec(block, kind), self.parts(block, kind)
        if spec.rows is not None:  # per head: the effective attention itself
            kept, matrix = self._checked_rows.get((block, kind), ([], None))
            if matrix is not None and set(idx.tolist()) <= set(kept):  # the self-check's rows again
                at = [kept.index(t) for t in idx.tolist()]
                return matrix[heads][:, at]
            return spec.rows(parts, heads, idx)
        rec = self.record(block, kind)
        if rec.out_weight is None or spec.contributions is None:
            raise MixerNotShown(
                f"block {block}'s {kind} mixer has no output projection to push contributions through"
            )
        return spec.contributions(parts, rec.out_weight, idx.tolist(), self.n_tokens)[None]

    def contributions(
        self, block: int, kind: str, heads: Sequence[int] | None = None, rows: slice | None = None
    ) -> torch.Tensor:
        """float32 (nh', T, S): ‖c_{t,s}‖, the size of source token s's contribution to the
        mixer's output at t through its output projection (per head: that head's channels),
        gates and norm scales frozen at their forward values; SSD's D·x_t counts as token t's own.
        Per-channel kinds: the same as `tensor`."""
        spec = self.spec(block, kind)
        if not spec.per_head:
            return self.tensor(block, kind, heads, rows)
        rec = self.record(block, kind)
        if rec.scale is None or rec.out_weight is None:
            raise MixerNotShown(
                f"block {block}'s {kind} mixer kept no output path to push contributions through"
            )
        n_heads = self.n_heads(block, kind)
        heads = list(range(n_heads)) if heads is None else [int(h) for h in heads]
        matrix = self.tensor(block, kind, heads, rows).double()  # checked, bounded
        idx = torch.arange(self.n_tokens)[rows or slice(None)]
        parts = self.parts(block, kind)
        v = parts[spec.values]  # (S, nh, hs)
        d = v.shape[-1]
        scale = rec.scale[0].double().reshape(self.n_tokens, -1, d)  # (T, nh, hs)
        if "gate" in parts:  # a gate the kernel applied (Falcon-H1's decode step): frozen with the scale
            scale = scale * parts["gate"].to(scale.device)
        weight = rec.out_weight.double()
        out = torch.empty_like(matrix)
        for j, h in enumerate(heads):
            w_h = weight[:, h * d : (h + 1) * d]
            gram = w_h.T @ w_h  # ‖W_h (σ ⊙ v)‖² = (σ ⊙ v)ᵀ G (σ ⊙ v)
            vh = v[:, h].to(gram.device)
            a = matrix[j]
            if spec.skip:  # SSD's D_h x_t joins token t's own contribution
                a = a.clone()
                own = idx.to(a.device)
                a[torch.arange(len(idx)), own] += parts[spec.skip][h]
            for r0 in range(0, len(idx), 16):
                sig = scale[idx[r0 : r0 + 16].to(scale.device), h]  # (r, d)
                sv = vh[None] * sig[:, None]  # (T', S, hs)
                size = ((sv @ gram) * sv).sum(-1).clamp(min=0).sqrt()
                out[j, r0 : r0 + 16] = a[r0 : r0 + 16].abs() * size
        return out.float()

    def check(self, block: int, kind: str):
        """The block's self-check (a `attnviz.records.Check`), run once; raises `MixerCheckFailed`."""
        key = (block, kind)
        if key not in self._checks:
            self._checks[key] = self._check(block, kind)
        got = self._checks[key]
        if isinstance(got, MixerCheckFailed):
            raise got
        return got

    def _check(self, block: int, kind: str):
        spec, rec = self.spec(block, kind), self.record(block, kind)
        parts = self.parts(block, kind)
        n = self.n_tokens
        joined = "steps" in rec.inputs  # a forward and its decode steps: every step's row is checked
        idx = torch.tensor(list(rec.output_rows) if joined else check_rows(n))
        out = rec.output[0].double()
        if rec.output_rows:  # the capture kept only these rows: read them in place
            if list(rec.output_rows) != idx.tolist():
                return MixerCheckFailed(
                    f"block {block}'s {kind} record kept rows {rec.output_rows}, not {idx.tolist()}"
                )
            out = out[..., : len(idx)] if spec.channels_first else out[: len(idx)]
            out = _spread(out, idx, n, spec.channels_first)
        assert spec.reference is not None  # a shown kind has one
        if spec.outputs is not None and spec.rows is not None:  # the reference, its A kept for _rows
            heads = list(range(self.n_heads(block, kind)))
            matrix = spec.rows(parts, heads, idx)
            self._checked_rows[(block, kind)] = (idx.tolist(), matrix)
            got = spec.outputs(parts, matrix, heads).reshape(len(idx), -1)
        else:
            got = spec.reference(parts, idx).reshape(len(idx), -1)  # (T, ...): the core output rebuilt
        want = (out.T if spec.channels_first else out)[idx].reshape(len(idx), -1)
        ran = f"{rec.function} → {rec.implementation}" if rec.implementation else rec.function
        against = spec.against.format(function=ran)  # names the package kernel when one ran
        pairs = [(got, want)]
        if rec.out_weight is not None and rec.out_out is not None:  # and the mixer's output
            # the projection's output is always kept at the check's rows only
            out_out = _spread(rec.out_out[0].double(), idx, n, False)
            summed = self._mixer_output(spec, rec, parts, got, idx)
            if summed is not None:
                pairs.append((summed, out_out[idx].to(summed.device)))
                against += spec.against_mixer
        # each comparison against its own scale (the mixer output may be far larger than the core's)
        figures = [(float((g - w).abs().max()), float(w.abs().max())) for g, w in pairs]
        diff, scale = max(figures, key=lambda f: f[0] / max(f[1], 1e-6) if f[0] == f[0] else float("inf"))
        rel = RELATIVE_TOLERANCE.get(self.dtype, HALF_RELATIVE_TOLERANCE)
        tol = rel * max(scale, 1e-6)
        if not diff <= tol:  # NaN fails too
            return MixerCheckFailed(
                f"block {block}'s {kind} mixer: its effective attention misses the kernel's output by "
                f"max |Δ| {diff:.1e} (scale {scale:.1e}, allowed {tol:.1e}) against {against}; "
                "attnviz shows no matrix for it"
            )
        return Check(
            stack="self",
            layer=block,
            max_abs_diff=diff,
            dtype=str(self.dtype).removeprefix("torch."),
            tolerance=tol,
            against=against,
            mixer=kind,
            scale=scale,
        )

    @staticmethod
    def _mixer_output(spec: MixerKind, rec: CapturedMixer, parts: dict, got: torch.Tensor, idx: torch.Tensor):
        """Σ_s c_{t,s} (+ skip, biases) at the check's rows, or None where the record kept no
        frozen output path: per head, the rebuilt core output through the frozen scales and
        out_proj; per channel, the kind's own sum of contributions."""
        assert rec.out_weight is not None
        if spec.per_head:
            if rec.scale is None:
                return None
            sig = rec.scale[0].double()[idx.to(rec.scale.device)]  # (T, nh × hs)
            summed = (sig * got.to(sig.device)) @ rec.out_weight.double().T
            return summed if rec.out_bias is None else summed + rec.out_bias.double()
        assert spec.mixer_output is not None
        return torch.stack([spec.mixer_output(parts, rec.out_weight, rec.out_bias, int(t)) for t in idx])

    def branch_shares(self, block: int) -> BranchShares:
        """Each parallel branch's share of block ``block``'s token-mixing output, measured during
        the forward that captured it (`attnviz.mixers.branches`)."""
        return branch_shares(list(self._records.values()), block)  # decode steps joined


def checked_steps(records: Sequence[CapturedMixer], dtype: torch.dtype, n: int) -> list[CapturedMixer]:
    """``records`` (a generation's prefill and decode steps, `attnviz.mixers.steps`) when every
    shown mixer block joined into one record of ``n`` tokens whose self-check passed (each step's
    row against what its kernel returned); else [] (the caller then captures a forward over the
    ids: rows that do not check are never used)."""
    store = MixerStore(records, dtype)
    blocks = [(b, k) for k in store.kinds() if k in MIXERS and MIXERS[k].shown for b in store.blocks(k)]
    if not blocks:
        return []
    for block, kind in blocks:
        if not store.checkable(block, kind) or store.record(block, kind).n_tokens != n:
            return []
        try:
            store.check(block, kind)
        except (MixerCheckFailed, MixerNotShown):
            return []
    return list(records)


def _spec(kind: str) -> MixerKind | None:
    return MIXERS.get(kind)


def _channel_groups(group: list[CapturedMixer]) -> CapturedMixer:
    """One record for scans over consecutive channel groups of one mixer (concatenated in order,
    as the mixer concatenates their outputs before its projection)."""
    last = group[-1]  # the projection ran after the last scan
    return CapturedMixer(
        last.kind, last.module_name, last.block, last.function, {"groups": [r.inputs for r in group]},
        torch.cat([r.output for r in group], dim=1), out_out=last.out_out, out_weight=last.out_weight,
        out_bias=last.out_bias, n_tokens=last.n_tokens, output_rows=last.output_rows,
        branches=last.branches, branch_how=last.branch_how,
    )  # fmt: skip


def _n_tokens(rec: CapturedMixer) -> int:
    """S of a record: kept, or read from a whole output ((B, S, ...); (B, ch, S) channels first)."""
    spec = _spec(rec.kind)
    return rec.n_tokens or int(rec.output.shape[2 if spec is not None and spec.channels_first else 1])


def _spread(kept: torch.Tensor, idx: torch.Tensor, n: int, channels_first: bool) -> torch.Tensor:
    """Rows kept at ``idx`` placed back on a length-S axis (zeros elsewhere, never read), so that
    the check indexes every record the same way."""
    if channels_first:
        out = kept.new_zeros(*kept.shape[:-1], n)
        out[..., idx.to(kept.device)] = kept
        return out
    out = kept.new_zeros(n, *kept.shape[1:])
    out[idx.to(kept.device)] = kept
    return out


def meaning(kind: str) -> str:
    """What a mixer kind's matrix is, for a label ("effective attention (signed, not probabilities) ...")."""
    spec = _spec(kind)
    return kind if spec is None else spec.label
