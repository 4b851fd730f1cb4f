"""What the QK split and the OV circuits show on smollm2-135m's induction heads (issue 41, item 6).

    OMP_NUM_THREADS=1 .venv/bin/python scripts/qk_induction.py [--length 50] [--seed 0]

Random tokens repeated twice (after the BOS). Induction score of a head: its mean α from a token
in the second copy to the token after that token's first occurrence; previous-token score: its
mean α to the token before. For the three heads with the highest induction score: the key-side
parts (`qk_row`) that add most to the score of the induction key, at the last query, and the
largest terms of that cell (`qk_attribution`); then their OV copying scores (`ov_circuits`) and
rank among every head. Olsson et al. (2022) predict the key side to come from previous-token
heads (K-composition) and the OV circuits to copy. Prints markdown, whatever it shows.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import attnviz
from attnviz.explain import ov_circuits, qk_attribution, qk_row, trace


def head_scores(tr, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(induction, previous-token) scores, (layers, heads)."""
    n = tr.n_tokens
    second = list(range(1 + length + 1, n))  # second copy, from its 2nd token
    everyone = list(range(2, n))
    ind, prev = [], []
    for layer in range(tr.n_layers):
        a = tr.probs_rows(layer, second)  # (rows, heads, keys)
        ind.append(torch.stack([a[r, :, i - length + 1] for r, i in enumerate(second)]).mean(0).numpy())
        b = tr.probs_rows(layer, everyone)
        prev.append(torch.stack([b[r, :, i - 1] for r, i in enumerate(everyone)]).mean(0).numpy())
    return np.array(ind), np.array(prev)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--length", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    lm = attnviz.load_model("smollm2-135m", device="cpu")
    g = torch.Generator().manual_seed(args.seed)
    rand = torch.randint(1000, 20000, (args.length,), generator=g).tolist()
    bos = lm.tokenizer.bos_token_id
    ids = ([bos] if bos is not None else []) + rand + rand
    off = 1 if bos is not None else 0
    tr = trace(lm, ids)
    ind, prev = head_scores(tr, args.length)
    ov = ov_circuits(lm)
    flat_prev = np.argsort(-prev, axis=None)
    prev_rank = {divmod(int(k), prev.shape[1]): r + 1 for r, k in enumerate(flat_prev)}
    out = [
        f"smollm2-135m, {args.length} random tokens (ids 1000..20000, seed {args.seed}) repeated twice "
        f"after the BOS ({tr.n_tokens} tokens).\n",
        "Top previous-token heads (mean α to the token before): "
        + ", ".join(f"L{k // prev.shape[1]}H{k % prev.shape[1]} {prev.flat[k]:.2f}" for k in flat_prev[:6])
        + ".\n",
        "| induction head (score) | top key-side parts of the induction key's score (value; prev-token "
        "rank of a head part) | largest terms of that cell | OV copying (rank of 270) "
        "| positive eigenvalues |",
        "|---|---|---|---|---|",
    ]
    copy_rank = {
        divmod(int(k), ov.copying.shape[1]): r + 1 for r, k in enumerate(np.argsort(-ov.copying, axis=None))
    }
    query = tr.n_tokens - 1
    key = query - args.length + 1
    assert key == off + (query - off - args.length) + 1
    for k in np.argsort(-ind, axis=None)[:3]:
        layer, head = divmod(int(k), ind.shape[1])
        row = qk_row(lm, tr, layer=layer, head=head, query=query)
        parts = []
        for name, value in row.top_key_parts(key, 5):
            rank = ""
            if name.startswith("L") and "H" in name:
                pl, ph = (int(x) for x in name[1:].split("H"))
                rank = f", prev #{prev_rank[(pl, ph)]}"
            parts.append(f"{name} {value:+.2f}{rank}")
        cell = qk_attribution(lm, tr, layer=layer, head=head, query=query, key=key)
        terms = "; ".join(f"{a} × {b} {v:+.2f}" for a, b, v in cell.top(3)) + f" (of {cell.score:.2f})"
        out.append(
            f"| L{layer}H{head} ({ind[layer, head]:.2f}) | {', '.join(parts)} | {terms} | "
            f"{ov.copying[layer, head]:+.2f} (#{copy_rank[(layer, head)]}) | {ov.positive[layer, head]:.0%} |"
        )
    out.append(
        f"\nAll heads: median OV copying {np.median(ov.copying):+.2f}; "
        f"{(ov.copying > 0.5).sum()} of {ov.copying.size} heads above +0.5."
    )
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
