"""Attribution patching: every cell of a patching grid ESTIMATED from two forwards and one backward.

Nanda (2023); Syed et al. (2023); Kramár et al. (2024, AtP*). With a the patched run's activation
at a site, a' the other run's and m the logit difference, the effect of patching is taken to first
order:

    m(a') − m(a)  ≈  (a' − a) · ∂m/∂a          (evaluated on the patched run)

so one forward of the source prompt (its activations), one forward of the patched prompt with a
zero tensor added at every site (its activations; the gradient of m with respect to that tensor is
∂m/∂a) and one backward give every cell at once. It is an ESTIMATE, labelled so everywhere it is
shown (``Patching.estimate`` is True): AtP* shows it misses cells where attention saturates or
effects cancel. It is exact where m is linear in the activation (the last layer's heads into a
linear readout, `tests/engine/test_patching_estimate.py`). ``verify=k`` patches the k cells with
the largest estimated effect for real (`attnviz.explain.patching`) and keeps both figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch

from ..limits import backward_bytes, require
from ..loading import LoadedModel
from .blocks import Unsupported
from .patch_sites import Activations, Direction, Over, Progress, Site, Sites, hooked, run_ids
from .patching import DIMS, Patching, Setup, patch_at, result, run_cells, setup

ESTIMATE_LABEL = "estimate (attribution patching, first order)"
DEFAULT_VERIFY = 20


class _GradRun:
    """The patched prompt's forward with a zero leaf added at every site, kept for one backward."""

    def __init__(self, lm: LoadedModel) -> None:
        self.lm = lm
        self.leaves: dict[tuple[Site, int], torch.Tensor] = {}
        self.logits: torch.Tensor | None = None

    def admit(self, st: Sites, n: int) -> None:
        """Refuse (`OutOfMemory`, before any forward) when the backward of ``n`` tokens would not fit."""
        lm = self.lm
        dtype = next(lm.model.parameters()).dtype
        cfg = lm.model.config.get_text_config() if hasattr(lm.model.config, "get_text_config") else None
        top_k = int(getattr(cfg, "num_experts_per_tok", None) or 1)
        require(  # what the backward keeps: every block (a hybrid's mixers too), not only attention
            backward_bytes(list(st.blocks), lm.layout, n, dtype, experts_per_token=top_k),
            lm.device,
            what=f"attribution patching of {n} tokens (a forward keeping all {len(st.blocks)} "
            "blocks' activations for the backward)",
            hint="a shorter text, or real patches over='heads' / 'blocks'",
        )

    def __call__(self, st: Sites, ids: list[int], wanted: Sequence[Site]) -> tuple[Activations, torch.Tensor]:
        acts = Activations()
        lm = self.lm

        def add_leaf(site: Site, layer: int, x: torch.Tensor) -> torch.Tensor:
            acts.put(site, layer, x[0].detach().clone())
            leaf = torch.zeros_like(x.detach(), requires_grad=True)
            self.leaves[(site, layer)] = leaf
            return x + leaf

        # gradients here even when the caller runs under inference_mode / no_grad
        # the [0] too: a view taken under the caller's inference_mode would record no graph
        with hooked(lm, st, add_leaf, wanted) as hooks, torch.inference_mode(False), torch.enable_grad():
            self.logits = run_ids(lm, torch.tensor([ids], device=lm.device), hooks, grad=True)[0]
        return acts, self.logits.detach()

    def grads(self, answer: int, wrong: int) -> dict[tuple[Site, int], torch.Tensor]:
        """∂(logit(answer) − logit(wrong))/∂ every site (batch row 0), one backward."""
        assert self.logits is not None
        keys = list(self.leaves)
        with self.lm.lock, torch.inference_mode(False), torch.enable_grad():
            metric = self.logits[answer] - self.logits[wrong]
            try:
                got = torch.autograd.grad(metric, [self.leaves[k] for k in keys], allow_unused=True)
            except RuntimeError as err:
                raise Unsupported(
                    f"attribution patching needs gradients through {self.lm.spec!r}'s attention, which "
                    "attnviz computes in place for soft-capping, position biases and sinks; use "
                    f"attnviz.patch (real patches) for this model ({str(err)[:80]}...)"
                ) from err
            finally:
                self.leaves, self.logits = {}, None  # free the graph
        return {k: (torch.zeros(0) if g is None else g[0].detach()) for k, g in zip(keys, got, strict=True)}


def _effects(s: Setup, grads: dict[tuple[Site, int], torch.Tensor]) -> dict[tuple[Site, int], np.ndarray]:
    """(a' − a) · g per site and layer at each paired position: float64 (positions,) or
    (positions, heads) for heads."""
    tgt = torch.tensor(s.pairing.target)
    src = torch.tensor(s.pairing.source)
    out = {}
    for (site, layer), g in grads.items():
        a = s.target_acts.of(site)[layer].double().cpu()
        a2 = s.source.of(site)[layer].double().cpu()
        grad = g.double().cpu()
        if grad.numel() == 0:
            grad = torch.zeros_like(a)
        delta = (a2[src] - a[tgt]) * grad[tgt]  # (positions, ...) elementwise
        out[(site, layer)] = delta.sum(-1).numpy()  # heads: (positions, heads); else (positions,)
    return out


def attribution_patch(
    lm: LoadedModel,
    clean: str | Sequence[int],
    corrupted: str | Sequence[int],
    *,
    answer: int | str | None = None,
    wrong: int | str | None = None,
    over: Over = "heads_by_position",
    direction: Direction = "denoise",
    verify: int = DEFAULT_VERIFY,
    chat: bool = False,
    batch: int | None = None,
    progress: Progress | None = None,
) -> Patching:
    """Every cell of ``over`` ESTIMATED by attribution patching (``estimate`` = True), then the
    ``verify`` cells with the largest estimated effect patched for real (``verified``: {cell:
    (estimate, real)}, normalised). Same arguments and metric as `attnviz.patch`.
    ``progress(done, total)`` hears the three passes, then each batch of the verification."""
    tell = progress or (lambda _d, _t: None)
    tell(0, 3 + verify)
    run = _GradRun(lm)
    s = setup(
        lm, clean, corrupted, answer, wrong, over, direction, chat=chat, run_target=run, admit=run.admit
    )
    tell(2, 3 + verify)
    effects = _effects(s, run.grads(s.answer, s.wrong))
    tell(3, 3 + verify)
    L = s.st.n_layers
    if over.startswith("heads"):  # (positions, heads) per layer; a hybrid's blocks differ: NaN pads
        n_pos, n_heads = len(s.pairing.target), s.st.n_heads or lm.layout.n_heads
        per = np.full((L, n_pos, n_heads), np.nan)
        for la in range(L):
            got = effects.get(("head", la))
            if got is not None:
                per[la, :, : got.shape[1]] = got
        est = per.sum(1) if over == "heads" else per.transpose(0, 2, 1)  # (layers, heads[, positions])
    elif over == "residual":
        est = np.stack([effects[("residual", la)] for la in range(L)])  # (layers, positions)
    else:
        none = np.full(len(s.pairing.target), np.nan)  # a part this block does not have
        est = np.stack([np.stack([effects.get((part, la), none) for part in s.st.parts]) for la in range(L)])
    target_diff = s.corrupted_diff if direction == "denoise" else s.clean_diff
    res = result(lm, s, over, direction, DIMS[over], target_diff + est, estimate=True, method=ESTIMATE_LABEL)
    top = [idx for idx, _ in res.ranking(verify)] if verify > 0 else []
    if top:
        sub = None if progress is None else (lambda d, t: progress(3 + d * len(top) // max(t, 1), 3 + verify))
        cells = [patch_at(over, idx, s.pairing, s.st.parts) for idx in top]
        real = run_cells(lm, s, cells, batch=batch, progress=sub)
        verified = {
            idx: (float(res.values[idx]), float(res.normalise(r))) for idx, r in zip(top, real, strict=True)
        }
        res = _with_verified(res, verified)
    tell(3 + verify, 3 + verify)
    return res


def _with_verified(res: Patching, verified: dict[tuple[int, ...], tuple[float, float]]) -> Patching:
    return replace(res, verified=verified)
