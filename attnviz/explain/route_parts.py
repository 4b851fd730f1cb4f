"""The token-mixing parts of a hybrid's or recurrent model's block, as the routes read them.

With its gates and norm scales frozen at their forward values, every token mixer writes

    out_t = Σ_s c_{t,s} + rest_t

to the residual stream: a softmax head c^h_{t,s} = α^h[t,s] · W_h (σ_{t,h} ⊙ v^h_s) (σ: an output
gate, Qwen3.5's sigmoid gate, frozen; 1 without one), a per-head mixer (SSD, gated delta, Kimi
delta, lightning) the same with its signed effective attention A^h[t,s] in place of α (SSD's
D_h x_t is token t's own: on the diagonal), and a per-channel mixer (Mamba-1, RWKV, RG-LRU, short
conv), one component, c_{t,s} = W (g_t ⊙ A[:, t, s] ⊙ v_s) with its channel terms
(`attnviz.mixers.channels.ChannelTerms`). ``rest_t`` is what comes from no token: the output
projection's bias (and LFM2's conv bias C_t ⊙ b). W includes the scalar between the part and the
stream (Falcon-H1's multipliers). A part's vectors (``vectors(t)``) are the literal definition
(tests, node inspection); the routes score them with `signed_importances`, never making the
(targets, sources, d_model) tensor of a whole block.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

MAKE_CHUNK = 1 << 13  # parts made at once where a sign may flip (n, d_model)
Make = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (target rows, part index) -> (n, d)


def signed_importances(
    whole: torch.Tensor, lin: torch.Tensor, bound: torch.Tensor, make: Make
) -> torch.Tensor:
    """max(‖w‖₁ − ‖w − p‖₁, 0) for every target row w of ``whole`` (T, d) and part p (T, P).

    With s = sign(w) (+1 at 0), ‖w‖₁ − ‖w − p‖₁ = s · p wherever no component of p flips the sign
    of w's (|p_i| ≤ |w_i| for all i): ``lin`` holds s · p, made cheaply by each kind. ``bound``
    ≥ max_i |p_i|; a part whose bound exceeds some |w_i| may flip one and is made in full
    (``make(t, p)``) and scored literally. Same numbers as the literal definition, to float32
    rounding; signed parts (a mixer's A) are fine. float32 (T, P)."""
    n_t = whole.shape[0]
    imp = lin.reshape(n_t, -1).clone()
    ranked = whole.abs().sort(dim=-1).values.contiguous()  # (T, d) smallest first
    loose = torch.searchsorted(ranked, bound.reshape(n_t, -1).contiguous()) > 0
    cand = torch.nonzero(loose)
    for c in range(0, cand.shape[0], MAKE_CHUNK):
        t, p = cand[c : c + MAKE_CHUNK].unbind(1)
        parts = make(t, p)
        imp[t, p] = whole[t].abs().sum(-1) - (whole[t] - parts).abs().sum(-1)
    return imp.clamp_(min=0).reshape(lin.shape)


@dataclass(frozen=True)
class HeadPart:
    """A per-head token mixer of one block (softmax attention or a per-head mixer)."""

    part: str  # "attention" or a mixer kind
    w: torch.Tensor  # (heads, d_model, d_head) float32: W_h, times the part's scalar into the stream
    v: torch.Tensor  # (heads, S, d_head) float32: the vectors the matrix weighs
    sigma: torch.Tensor | None  # (T, heads, d_head) float32: the frozen gate / norm scale; None: 1
    rows: Callable[[list[int], int], torch.Tensor]  # (targets, keys) -> (T, heads, keys) signed A
    bias: torch.Tensor | None  # (d_model,) float32, the scalar applied

    @property
    def n_heads(self) -> int:
        return int(self.w.shape[0])

    @property
    def per_head(self) -> bool:
        return True

    def _scaled_v(self, targets: torch.Tensor, heads: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        v = self.v[heads, keys]  # (n, d_head)
        return v if self.sigma is None else v * self.sigma[targets, heads]

    def vectors(self, t: int) -> torch.Tensor:
        """c^h_{t,s} for every head and s ≤ t: float32 (heads, t + 1, d_model) (the literal form)."""
        a = self.rows([t], t + 1)[0]  # (heads, keys)
        sv = self.v[:, : t + 1] if self.sigma is None else self.v[:, : t + 1] * self.sigma[t][:, None]
        return torch.einsum("hk,hkd,hmd->hkm", a, sv, self.w)

    def rest(self, t: int) -> torch.Tensor:
        return self.bias if self.bias is not None else self.w.new_zeros(self.w.shape[1])

    def sums(self, targets: list[int]) -> torch.Tensor:
        """Σ_h Σ_s c^h_{t,s} for each target: float32 (T, d_model), the rows made once (the check)."""
        a = self.rows(targets, self.v.shape[1])  # (T, heads, keys)
        z = torch.einsum("thk,hkd->thd", a, self.v)
        if self.sigma is not None:
            z = z * self.sigma[torch.tensor(targets, device=z.device)]
        return torch.einsum("thd,hmd->tm", z, self.w)

    def importances(self, whole: torch.Tensor, targets: list[int], n_keys: int) -> torch.Tensor:
        """(T, heads, keys) importances of c^h_{t,s} in ``whole`` (T, d): O(heads · keys · d)."""
        a = self.rows(targets, n_keys)  # (T, heads, keys)
        idx = torch.tensor(targets, device=self.w.device)
        sign = torch.where(whole >= 0, 1.0, -1.0)
        pulled = torch.einsum("hmd,tm->thd", self.w, sign)  # W_hᵀ s: (T, heads, d_head)
        v = self.v[:, :n_keys]
        if self.sigma is None:
            lin = torch.einsum("hkd,thd->thk", v, pulled)
            size = v.norm(dim=-1)[None].expand(len(targets), -1, -1)  # ‖v_s‖
        else:
            sig = self.sigma[idx]  # (T, heads, d_head)
            lin = torch.einsum("hkd,thd->thk", v, pulled * sig)
            size = torch.einsum("thd,hkd->thk", sig.square(), v.square()).sqrt()  # ‖σ_t ⊙ v_s‖
        w_max = self.w.norm(dim=-1).amax(dim=-1)  # (heads,) max row norm of W_h
        bound = a.abs() * size * w_max[None, :, None] * (1 + 1e-5)  # Cauchy-Schwarz per component
        n_h, n_k = self.n_heads, n_keys

        def make(t: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
            h, j = p // n_k, p % n_k
            out = torch.empty(t.shape[0], self.w.shape[1], dtype=self.w.dtype, device=self.w.device)
            for head in torch.unique(h).tolist():
                sel = h == head
                sv = self._scaled_v(idx[t[sel]], h[sel], j[sel])
                out[sel] = (a[t[sel], head, j[sel]][:, None] * sv) @ self.w[head].T
            return out

        assert a.shape == (len(targets), n_h, n_k)
        return signed_importances(whole, lin * a, bound, make)


@dataclass(frozen=True)
class ChannelPart:
    """A per-channel token mixer of one block (Mamba-1, RWKV, RG-LRU, short conv): one component."""

    part: str
    w: torch.Tensor  # (d_model, ch) float64: the output projection, times the part's scalar
    terms: object  # attnviz.mixers.channels.ChannelTerms
    bias: torch.Tensor | None  # (d_model,) float64, the scalar applied

    @property
    def n_heads(self) -> int:
        return 1

    @property
    def per_head(self) -> bool:
        return False

    def _inner(self, t: int) -> torch.Tensor:
        """(t + 1, ch) float64: g_t ⊙ A[:, t, s] ⊙ v_s for s ≤ t."""
        terms = self.terms
        return terms.rows_of(t).T * terms.values[: t + 1] * terms.gate[t]  # type: ignore[attr-defined]

    def vectors(self, t: int) -> torch.Tensor:
        """c_{t,s} for s ≤ t: float32 (1, t + 1, d_model)."""
        return (self._inner(t) @ self.w.T).float()[None]

    def sums(self, targets: list[int]) -> torch.Tensor:
        """Σ_s c_{t,s} for each target: float32 (T, d_model)."""
        return torch.stack([(self._inner(t).sum(0) @ self.w.T).float() for t in targets])

    def rest(self, t: int) -> torch.Tensor:
        terms = self.terms
        out = self.w @ (terms.gate[t] * terms.rest_of(t))  # type: ignore[attr-defined]
        return (out if self.bias is None else out + self.bias).float()

    def importances(self, whole: torch.Tensor, targets: list[int], n_keys: int) -> torch.Tensor:
        """(T, 1, keys) importances of c_{t,s} in ``whole`` (T, d), one target at a time:
        O(keys · ch) per target, plus W_out for the parts that may flip a sign."""
        out = whole.new_zeros(len(targets), 1, n_keys)
        w_max = float(self.w.norm(dim=-1).max())
        for i, t in enumerate(targets):
            inner = self._inner(t)  # (t + 1, ch)
            row = whole[i : i + 1]
            sign = torch.where(row >= 0, 1.0, -1.0).double()
            lin = (inner @ (self.w.T @ sign[0]))[None]  # (1, t + 1)
            bound = (inner.norm(dim=-1) * w_max * (1 + 1e-5))[None]

            def make(_t: torch.Tensor, p: torch.Tensor, inner: torch.Tensor = inner) -> torch.Tensor:
                return (inner[p] @ self.w.T).float()

            out[i, 0, : t + 1] = signed_importances(row, lin.float(), bound.float(), make)[0]
        return out
