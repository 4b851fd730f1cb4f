"""Logit lens: what the residual stream would predict if the model stopped after each block.

For chosen positions and every layer boundary l (0: the embeddings, n_layers: the final stream,
whose lens is the model's own prediction exactly), the stream is read with the model's own head:
``softmax(unembed(final_norm(stream[l][t])))`` (soft-capped where the model is). Each cell keeps
the top-k tokens and their probabilities, and the rank and probability of the model's final
prediction at that position. Cost: (n_layers + 1) × positions rows through the LM head, no
forward pass (it reads a `Trace`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import AttnvizError
from ..loading import LoadedModel
from ..tokens import Tokens, displays
from .residual import Trace, trace, unembed
from .stream import Stream, needs_stream, stream

DEFAULT_POSITIONS = 16
DEFAULT_K = 5
LENS_ROWS = 256  # (layer, position) rows per product with the LM head


@dataclass(frozen=True)
class LogitLens:
    """Rows are layer boundaries 0 .. n_layers (the stream entering each block; the last row is
    the final stream), columns the positions."""

    model_name: str
    tokens: Tokens
    positions: tuple[int, ...]
    top_ids: np.ndarray  # (n_layers + 1, positions, k) int64
    top_probs: np.ndarray  # (n_layers + 1, positions, k) float32
    top_tokens: tuple[tuple[tuple[str, ...], ...], ...]  # display strings of top_ids
    predicted: np.ndarray  # (positions,) int64: the model's prediction at each position
    predicted_tokens: tuple[str, ...]
    rank: np.ndarray  # (n_layers + 1, positions) int64: rank of the prediction (0 = top)
    prob: np.ndarray  # (n_layers + 1, positions) float32: its probability

    @property
    def n_rows(self) -> int:
        return int(self.top_ids.shape[0])

    def to_frame(self) -> Any:
        """A pandas DataFrame: one row per (layer boundary, position, rank among the top k)."""
        import pandas as pd

        rows = []
        for layer in range(self.n_rows):
            for c, pos in enumerate(self.positions):
                for r in range(self.top_ids.shape[2]):
                    rows.append(
                        {
                            "layer": layer,
                            "position": pos,
                            "input_token": self.tokens.display[pos],
                            "rank": r,
                            "token_id": int(self.top_ids[layer, c, r]),
                            "token": self.top_tokens[layer][c][r],
                            "probability": float(self.top_probs[layer, c, r]),
                            "prediction_rank": int(self.rank[layer, c]),
                            "prediction_probability": float(self.prob[layer, c]),
                        }
                    )
        return pd.DataFrame(rows)


def default_positions(n_tokens: int, count: int = DEFAULT_POSITIONS) -> list[int]:
    """The last ``count`` positions."""
    return list(range(max(0, n_tokens - count), n_tokens))


def logit_lens(
    lm: LoadedModel,
    text: str | list[int] | Trace | Stream,
    positions: Sequence[int] | None = None,
    k: int = DEFAULT_K,
    *,
    chat: bool = False,
) -> LogitLens:
    """The logit lens at ``positions`` (default: the last 16; negative counts from the end). On a
    hybrid or recurrent model the rows are block boundaries read by `attnviz.explain.stream`."""
    if isinstance(text, Trace | Stream):
        tr: Trace | Stream = text
    elif needs_stream(lm.layout):  # a hybrid or a recurrent model: the lens reads block boundaries
        tr = stream(lm, text, chat=chat)
    else:
        tr = trace(lm, text, chat=chat)
    if tr.unembed_problem:
        raise AttnvizError(tr.unembed_problem)
    pos = [tr.position(p) for p in (default_positions(tr.n_tokens) if positions is None else positions)]
    if not pos:
        raise AttnvizError("no positions to read; pick at least one token")
    k = int(k)
    if not 1 <= k <= 100:
        raise AttnvizError(f"k = {k}; pick 1 .. 100 top tokens")
    n_rows = tr.n_layers + 1
    n_pos = len(pos)
    with torch.inference_mode():
        # every (layer, position) row through the head in a few big products: the LM head's
        # weights (vocab × d_model) are read once per block of rows, not once per layer
        x = torch.stack([tr.stream[layer][pos] for layer in range(n_rows)]).reshape(n_rows * n_pos, -1)
        predicted = unembed(lm, tr.stream[-1][pos]).argmax(dim=-1)  # (P,)
        want = predicted.repeat(n_rows)[:, None]  # the prediction, for each row
        ids_flat = np.empty((n_rows * n_pos, k), dtype=np.int64)
        probs_flat = np.empty((n_rows * n_pos, k), dtype=np.float32)
        rank_flat = np.empty(n_rows * n_pos, dtype=np.int64)
        prob_flat = np.empty(n_rows * n_pos, dtype=np.float32)
        for a in range(0, n_rows * n_pos, LENS_ROWS):
            rows = slice(a, a + LENS_ROWS)
            logits = unembed(lm, x[rows])  # (rows, vocab)
            lse = torch.logsumexp(
                logits, dim=-1, keepdim=True
            )  # p = exp(logit − lse): no (rows, vocab) softmax
            top = logits.topk(k, dim=-1)
            ids_flat[rows] = top.indices.cpu().numpy()
            probs_flat[rows] = (top.values - lse).exp_().cpu().numpy()
            mine = logits.gather(1, want[rows])  # (rows, 1)
            rank_flat[rows] = (logits > mine).sum(dim=-1).cpu().numpy()
            prob_flat[rows] = (mine - lse)[:, 0].exp_().cpu().numpy()
    top_ids, top_probs = ids_flat.reshape(n_rows, n_pos, k), probs_flat.reshape(n_rows, n_pos, k)
    rank, prob = rank_flat.reshape(n_rows, n_pos), prob_flat.reshape(n_rows, n_pos)
    pred = predicted.cpu().numpy()
    # each id shown alone (not one text: neighbouring byte tokens would merge into a character);
    # one call for the top tokens and the predictions reads the tokenizer once
    everything = displays(lm.tokenizer, np.concatenate([top_ids.reshape(-1), pred]).tolist())
    shown, pred_shown = everything[: top_ids.size], everything[top_ids.size :]
    per_cell = [tuple(shown[i : i + k]) for i in range(0, len(shown), k)]
    per_row = [tuple(per_cell[r * n_pos : (r + 1) * n_pos]) for r in range(n_rows)]
    return LogitLens(
        model_name=tr.model_name,
        tokens=tr.tokens,
        positions=tuple(pos),
        top_ids=top_ids,
        top_probs=top_probs,
        top_tokens=tuple(per_row),
        predicted=pred,
        predicted_tokens=tuple(pred_shown),
        rank=rank,
        prob=prob,
    )
