"""Activation patching between two prompts: copy one component's activation from one run into the
other and measure how much of the answer's logit difference comes back.

    res = attnviz.patch(lm, clean, corrupted, over="heads")   # every (layer, head), denoising
    res.to_frame()                                            # one row per cell

Metric: the logit difference ``logit(answer) − logit(wrong)`` at the last position, normalised so
that the corrupted run is 0 and the clean run 1 (in both directions: "denoise" runs the corrupted
prompt with one clean activation patched in, "noise" runs the clean prompt with one corrupted
activation patched in). Default answer / wrong: the model's top prediction on the clean / the
corrupted prompt.

The sites, per layer l (the same hook points for every residual layout: pre-norm, parallel,
post-norm between the heads and the stream):

- ``heads``: head h's output z^h = Σ_j α v_j at every patched position, read and replaced inside
  attnviz's attention function (`attnviz.capture.hook.editing`) before the output projection;
- ``heads_by_position``: the same at one position;
- ``residual``: the stream entering block l at one position (l = 0: the embedding);
- ``blocks``: what the attention module or the MLP returns at one position (before a norm that
  sits between them and the stream: that norm is per token, so it follows the patch).

Every cell is one forward of the patched run (cells batched: row b carries cell b's patch only),
the model's own code and dtype. Prompts of different lengths are aligned (`patch_sites.pair`: the
token alignment by ids, a gap of equal length on both sides paired position by position, since
those are the tokens that differ); positions without a partner are listed in ``unpatched``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import AttnvizError
from ..inputs import tokenize
from ..limits import forward_bytes, free_bytes, require
from ..loading import LoadedModel
from ..tokens import Tokens
from .attribution import token_id
from .patch_sites import (
    DIRECTIONS,
    OVERS,
    PARTS,
    Activations,
    Capture,
    Direction,
    Over,
    Pairing,
    Patch,
    Progress,
    Sites,
    capture,
    pairing_of,
    patched_run,
    site_names,
    sites,
)
from .patching_result import Patching, normalised

MAX_BATCH = 32
BATCH_SHARE = 0.25  # at most this share of the free memory for one batch of patched forwards
MAX_PATCH_TOKENS = 8192
PREFIX_MIN = 32  # a shared unpatched prefix at least this long runs once, into a KV cache


# -- the grid -------------------------------------------------------------------------------------


Shape = tuple[int, ...]  # one size per entry of DIMS[over]
DIMS: dict[str, tuple[str, ...]] = {
    "heads": ("layer", "head"),
    "heads_by_position": ("layer", "head", "position"),
    "residual": ("layer", "position"),
    "blocks": ("layer", "part", "position"),
}


def grid_shape(
    over: str, n_layers: int, n_heads: int, pairing: Pairing, parts: tuple[str, ...] = PARTS
) -> Shape:
    """The grid of ``over``: one axis per entry of ``DIMS[over]``."""
    size = {"layer": n_layers, "head": n_heads, "position": len(pairing.target), "part": len(parts)}
    return tuple(size[d] for d in DIMS[over])


def planned_grid(lm: LoadedModel, clean: Tokens, corrupted: Tokens, over: str, direction: str) -> Shape:
    """The grid `patch` runs on these prompts, before it runs (a page counts its forwards here):
    `grid_shape` of the same sites and pairing. `Unsupported` where `patch` would refuse."""
    pairing = pairing_of(clean, corrupted, direction)
    st = sites(lm, over)
    return grid_shape(over, st.n_layers, st.n_heads or lm.layout.n_heads, pairing, st.parts)


def exists(st: Sites, p: Patch) -> bool:
    """Whether the model has ``p``'s site (a hybrid's blocks differ in parts and head counts)."""
    if p.site == "head":
        return not st.head_counts or p.head < st.head_counts[p.layer]
    return p.site == "residual" or st.module(p.site, p.layer) is not None


def patch_at(over: str, index: tuple[int, ...], pairing: Pairing, parts: tuple[str, ...] = PARTS) -> Patch:
    """The patch of the grid cell ``index`` (a position axis indexes ``pairing.target``)."""
    if over == "heads":
        return Patch("head", index[0], index[1])
    if over == "heads_by_position":
        return Patch("head", index[0], index[1], pairing.target[index[2]])
    if over == "residual":
        return Patch("residual", index[0], -1, pairing.target[index[1]])
    return Patch(parts[index[1]], index[0], -1, pairing.target[index[2]])


def batch_size(lm: LoadedModel, n_tokens: int, batch: int | None) -> int:
    """Rows per patched forward: ``batch`` if given, else what fits ``BATCH_SHARE`` of the free
    memory (at most ``MAX_BATCH``)."""
    if batch is not None:
        return max(1, int(batch))
    dtype = next(lm.model.parameters()).dtype
    per = forward_bytes(lm.layout, n_tokens, dtype) + 8 * lm.layout.d_model * n_tokens
    return int(max(1, min(MAX_BATCH, BATCH_SHARE * free_bytes(lm.device) // max(1, per))))


@dataclass(frozen=True)
class Setup:
    """Both prompts tokenised and run once: who is patched (target) with whose activations."""

    st: Sites
    clean: Tokens
    corrupted: Tokens
    target_ids: list[int]
    source: Activations
    target_acts: Activations
    pairing: Pairing
    answer: int
    wrong: int
    clean_diff: float
    corrupted_diff: float
    notes: tuple[str, ...] = ()


def _ids(lm: LoadedModel, text: str | Sequence[int], chat: bool) -> list[int]:
    ids = tokenize(lm, text, chat=chat)[0] if isinstance(text, str) else [int(i) for i in text]
    if not ids:
        raise AttnvizError("an empty prompt; give both a clean and a corrupted prompt")
    if len(ids) > MAX_PATCH_TOKENS:
        raise AttnvizError(
            f"a prompt has {len(ids)} tokens; patching takes at most {MAX_PATCH_TOKENS}. Shorten it."
        )
    return ids


def setup(
    lm: LoadedModel,
    clean: str | Sequence[int],
    corrupted: str | Sequence[int],
    answer: int | str | None,
    wrong: int | str | None,
    over: str,
    direction: str,
    *,
    chat: bool = False,
    keep_target: bool = True,
    run_target: Capture | None = None,
    admit: Callable[[Sites, int], None] | None = None,
) -> Setup:
    """Tokenise, check, run both prompts once (their logit differences and the source's sites).
    ``run_target`` runs the patched prompt instead of `capture` (attribution patching's forward
    with gradients); ``admit(sites, n)`` may refuse before either forward (its memory)."""
    if over not in OVERS:
        raise AttnvizError(f"unknown over={over!r}; use one of {OVERS}")
    if direction not in DIRECTIONS:
        raise AttnvizError(f"unknown direction={direction!r}; use one of {DIRECTIONS}")
    st = sites(lm, over)
    c_ids, x_ids = _ids(lm, clean, chat), _ids(lm, corrupted, chat)
    dtype = next(lm.model.parameters()).dtype
    n = max(len(c_ids), len(x_ids))
    require(
        2 * forward_bytes(lm.layout, n, dtype) + 4 * st.n_layers * n * lm.layout.d_model * 4,  # every block
        lm.device,
        what=f"patching two prompts of up to {n} tokens",
        hint="shorter prompts",
    )
    if admit is not None:
        admit(st, n)
    wanted = site_names(over, st.parts)
    denoise = direction == "denoise"
    src_ids, tgt_ids = (c_ids, x_ids) if denoise else (x_ids, c_ids)
    src_acts, src_logits = capture(lm, st, src_ids, wanted)
    tgt_acts, tgt_logits = (run_target or functools.partial(capture, lm))(st, tgt_ids, wanted)
    c_logits, x_logits = (src_logits, tgt_logits) if denoise else (tgt_logits, src_logits)
    ans = token_id(lm, answer, int(c_logits.argmax()))
    assert ans is not None
    notes: tuple[str, ...] = ()
    if wrong is None:
        top2 = [int(i) for i in x_logits.topk(2).indices]
        wr = top2[0] if top2[0] != ans else top2[1]
        if top2[0] == ans:
            notes = (
                "the model predicts the answer on both prompts; wrong = the corrupted prompt's second choice",
            )
    else:
        wr = token_id(lm, wrong, None)  # type: ignore[assignment]
    assert wr is not None
    if ans == wr:
        raise AttnvizError("answer and wrong are the same token; pick two different tokens")
    c_diff = float(c_logits[ans] - c_logits[wr])
    x_diff = float(x_logits[ans] - x_logits[wr])
    if abs(c_diff - x_diff) < 1e-6 * max(1.0, abs(c_diff)):
        raise AttnvizError(
            f"the logit difference is the same on both prompts ({c_diff:.4g}); the normalised metric "
            "(0 = corrupted, 1 = clean) is undefined: pick other answer / wrong tokens or prompts"
        )
    tc, tx = Tokens.build(lm.tokenizer, c_ids), Tokens.build(lm.tokenizer, x_ids)
    return Setup(
        st=st,
        clean=tc,
        corrupted=tx,
        target_ids=tgt_ids,
        source=src_acts,
        target_acts=tgt_acts if keep_target else Activations(),
        pairing=pairing_of(tc, tx, direction),
        answer=ans,
        wrong=wr,
        clean_diff=c_diff,
        corrupted_diff=x_diff,
        notes=notes,
    )


def result(
    lm: LoadedModel, s: Setup, over: str, direction: str, dims: tuple[str, ...], raw: np.ndarray, **extra: Any
) -> Patching:
    shown = Tokens.build(lm.tokenizer, [s.answer, s.wrong]).display
    values = normalised(raw, s.clean_diff, s.corrupted_diff)
    return Patching(
        model_name=lm.spec,
        clean=s.clean,
        corrupted=s.corrupted,
        over=over,  # type: ignore[arg-type]
        direction=direction,  # type: ignore[arg-type]
        answer=s.answer,
        answer_token=shown[0],
        wrong=s.wrong,
        wrong_token=shown[1],
        clean_diff=s.clean_diff,
        corrupted_diff=s.corrupted_diff,
        dims=dims,
        values=values,
        raw=raw,
        pairing=s.pairing,
        notes=s.notes,
        parts=s.st.parts,
        **extra,
    )


def run_cells(
    lm: LoadedModel,
    s: Setup,
    todo: Sequence[Patch],
    *,
    batch: int | None = None,
    progress: Progress | None = None,
) -> np.ndarray:
    """The patched logit difference of each cell (one patched forward each, batched): float64.

    Cells are batched in order of their first patched position; a batch whose cells all start at
    or after ``PREFIX_MIN`` tokens runs that shared prefix once into a KV cache (`patched_run`)."""
    size = batch_size(lm, len(s.target_ids), batch)
    out = np.empty(len(todo))
    every = max(s.pairing.shared, s.pairing.target[0])  # where an all-positions patch starts
    first = [min(every, s.pairing.target[-1]) if p.position is None else p.position for p in todo]
    order = sorted(range(len(todo)), key=lambda i: first[i])
    for start in range(0, len(todo), size):
        if progress is not None:
            progress(start, len(todo))  # may raise to cancel
        rows = order[start : start + size]
        prefix = min(first[i] for i in rows)
        prefix = prefix if prefix >= PREFIX_MIN and len(s.target_ids) > prefix and s.st.cacheable else 0
        batch_cells = [[todo[i]] for i in rows]
        logits = patched_run(lm, s.st, s.target_ids, s.source, s.pairing, batch_cells, prefix=prefix)
        out[rows] = (logits[:, s.answer] - logits[:, s.wrong]).double().cpu().numpy()
    if progress is not None:
        progress(len(todo), len(todo))
    return out


def patch(
    lm: LoadedModel,
    clean: str | Sequence[int],
    corrupted: str | Sequence[int],
    *,
    answer: int | str | None = None,
    wrong: int | str | None = None,
    over: Over = "heads",
    direction: Direction = "denoise",
    chat: bool = False,
    batch: int | None = None,
    progress: Progress | None = None,
) -> Patching:
    """Activation patching of every cell of ``over`` between ``clean`` and ``corrupted`` (texts or
    token ids). ``direction="denoise"`` runs the corrupted prompt with one clean activation patched
    in per cell; ``"noise"`` the reverse. Metric: logit(answer) − logit(wrong) at the last
    position, normalised (0 = corrupted run, 1 = clean run). ``progress(done, cells)`` hears each
    batch of patched forwards (raising cancels)."""
    s = setup(lm, clean, corrupted, answer, wrong, over, direction, chat=chat, keep_target=False)
    shape = grid_shape(over, s.st.n_layers, s.st.n_heads or lm.layout.n_heads, s.pairing, s.st.parts)
    cells = [patch_at(over, idx, s.pairing, s.st.parts) for idx in np.ndindex(*shape)]
    real = [i for i, p in enumerate(cells) if exists(s.st, p)]
    raw = np.full(len(cells), np.nan)  # NaN: a part its block does not have (a hybrid's blocks differ)
    raw[real] = run_cells(lm, s, [cells[i] for i in real], batch=batch, progress=progress)
    return result(lm, s, over, direction, DIMS[over], raw.reshape(shape))
