"""What block_trace reads once and serves again: a gated attention's gate is the forward's own
sigmoid (o_proj's input over the attention's output before the gate, both from the forward), and a
delta-rule mixer's rows that the store's self-check scanned are not scanned again (routes read row
N-1, one of the check's rows)."""

from __future__ import annotations

import hybrids_tiny
import torch

from attnviz.explain.block_trace import block_trace
from attnviz.mixers import delta

N = 40
IDS = [3 + (i * 37) % 200 for i in range(N)]


def test_a_gated_attentions_frozen_gate_is_the_forwards_sigmoid():
    lm = hybrids_tiny.loaded("qwen3_5_text")
    attn_blocks = [b for b, kinds in enumerate(lm.layout.mixers) if "attention" in kinds]
    gates: dict[int, torch.Tensor] = {}
    handles = []
    for b in attn_blocks:
        attn = lm.model.model.layers[b].self_attn

        def keep(_m, _a, out, b=b, d=attn.head_dim):  # Qwen3.5: q_proj gives [query | gate] per head
            gates[b] = torch.sigmoid(out[0].view(N, -1, 2 * d).chunk(2, dim=-1)[1].reshape(N, -1))

        handles.append(attn.q_proj.register_forward_hook(keep))
    try:
        tr = block_trace(lm, IDS)
    finally:
        for h in handles:
            h.remove()
    assert attn_blocks and all(p == "" for p in tr.problems)
    for b in attn_blocks:
        sigma = tr.parts[b]["attention"].sigma
        assert sigma is not None
        sigma = sigma.reshape(N, -1)
        nonzero = sigma != 0  # where Σ α v is exactly 0 the gate is not read (0)
        assert nonzero.float().mean() > 0.99
        diff = float((sigma - gates[b].float())[nonzero].abs().max())
        assert diff <= 1e-6, (b, diff)


def test_a_delta_mixers_checked_rows_are_scanned_once(monkeypatch):
    lm = hybrids_tiny.loaded("qwen3_5_text")
    scanned: list[list[int]] = []
    for name in ("scan_rows", "chunked_rows"):  # delta_rows runs one or the other

        def counting(parts, heads, rows, scan=getattr(delta, name), **kw):
            scanned.append(rows.tolist())
            return scan(parts, heads, rows, **kw)

        monkeypatch.setattr(delta, name, counting)
    tr = block_trace(lm, IDS)
    mixer_blocks = [b for b, parts in enumerate(tr.parts) if "gated_delta" in parts]
    assert mixer_blocks and all(p == "" for p in tr.problems)
    before = len(scanned)
    for b in mixer_blocks:
        part = tr.parts[b]["gated_delta"]
        last = part.rows([N - 1], N)  # the routes' first row: one of the self-check's rows
        assert len(scanned) == before  # served from the self-check, no scan
        fresh = part.rows([N - 2, N - 1], N)[1:]  # not all checked rows: scanned
        assert len(scanned) == before + 1
        assert torch.equal(last, fresh)
        before = len(scanned)
