"""Head ablation: run the model again with some heads' outputs replaced, and compare.

attnviz's attention function computes every head's output before the output projection reads
them, so an `attnviz.capture.editing` function can replace head h's output z^h at every position
without touching the model's code: by 0 ("zero") or by the head's mean output over this text's
positions in the unablated run ("mean", taken from the trace's forward). The rerun's next-token
distribution at the chosen position is compared with the unablated one: top-k before and after,
KL(before ‖ after), the target token's logit and probability.

The *total* effect of an ablation is the change of the target's logit; its *direct* effect is
what the ablated heads' own writes to the stream change in that logit through the final norm
frozen at the unablated scale (`attnviz.explain.attribution`): −Σ r · N(W_O^h (z^h − replacement)).
The difference is what later layers did with those heads' outputs (the indirect effect).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
import torch

from ..capture.hook import editing
from ..errors import AttnvizError
from ..loading import LoadedModel
from ..tokens import Tokens, displays
from .attribution import head_outputs, head_writes, readout, token_id
from .residual import Trace, trace, unembed

Mode = Literal["zero", "mean"]
MODES: tuple[str, ...] = get_args(Mode)
DEFAULT_K = 5


@dataclass(frozen=True)
class Ablation:
    """The next-token distribution at ``position`` with and without the ablated heads."""

    model_name: str
    tokens: Tokens
    position: int
    heads: tuple[tuple[int, int], ...]  # (layer, head)
    mode: Mode
    target: int
    target_token: str
    top_before: tuple[tuple[int, str, float], ...]  # (id, token, probability)
    top_after: tuple[tuple[int, str, float], ...]
    logit_before: float
    logit_after: float
    prob_before: float
    prob_after: float
    kl: float  # KL(before ‖ after), nats
    direct: dict[tuple[int, int], float]  # each ablated head's direct effect on the target logit

    @property
    def total_effect(self) -> float:
        """Change of the target's logit when the heads are ablated together."""
        return self.logit_after - self.logit_before

    @property
    def direct_effect(self) -> float:
        """The ablated heads' own direct share of that change (frozen final norm)."""
        return float(sum(self.direct.values()))


def _valid_heads(tr: Trace, heads: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    out = []
    for layer, head in heads:
        if not 0 <= int(layer) < tr.n_layers or not 0 <= int(head) < tr.n_heads:
            raise AttnvizError(
                f"layer {layer}, head {head} is out of range: this model has layers 0..{tr.n_layers - 1} "
                f"and heads 0..{tr.n_heads - 1}"
            )
        out.append((int(layer), int(head)))
    if not out:
        raise AttnvizError("no heads to ablate; pick at least one (layer, head)")
    return tuple(sorted(set(out)))


def _replacements(
    tr: Trace, heads: tuple[tuple[int, int], ...], mode: Mode
) -> dict[int, tuple[list[int], torch.Tensor | None]]:
    """Per layer: the heads to replace and what replaces them ((heads, d_head) means, or None = 0)."""
    per: dict[int, list[int]] = {}
    for layer, head in heads:
        per.setdefault(layer, []).append(head)
    if mode == "zero":
        return {layer: (hs, None) for layer, hs in per.items()}
    if tr.head_means is None:
        raise AttnvizError("mean ablation needs the heads' mean outputs, which this trace did not keep")
    return {layer: (hs, tr.head_means[layer][hs]) for layer, hs in per.items()}


def ablated_logits(
    lm: LoadedModel,
    tr: Trace,
    heads: tuple[tuple[int, int], ...],
    mode: Mode,
    position: int,
    progress: Callable[[int, int], None] | None = None,
) -> torch.Tensor:
    """The model's own logits at ``position`` (float32 (vocab,)) with ``heads`` ablated.
    ``progress(done, n_layers)`` hears each attention layer of the rerun (raising stops it)."""
    if not lm.supports_capture:
        how = "attnviz's adapter" if lm.adapted else "its own eager code"
        raise AttnvizError(
            f"head ablation replaces heads' outputs inside attnviz's attention function; {lm.spec!r} "
            f"computes its attention in {how}, so its heads cannot be ablated here"
        )
    plan = _replacements(tr, heads, mode)
    layer_of = {name: i for i, name in enumerate(tr.attn_modules)}
    calls = [0]

    def edit(module: torch.nn.Module, out: torch.Tensor) -> torch.Tensor:
        layer = layer_of.get(lm.module_names.get(id(module), ""))
        calls[0] += 1
        if progress is not None:
            progress(min(calls[0], tr.n_layers), tr.n_layers)  # may raise to cancel the rerun
        if layer not in plan:
            return out
        hs, means = plan[layer]
        out = out.clone()  # (1, q_pos, heads, d_head)
        out[0, :, hs] = 0.0 if means is None else means.to(out.dtype).to(out.device)[None]
        return out

    with editing(edit):
        logits = lm.forward(list(tr.tokens.ids), logits_at=[position]).logits
    return logits[0, 0].float()


def _top(lm: LoadedModel, probs: torch.Tensor, k: int) -> tuple[tuple[int, str, float], ...]:
    top = probs.topk(k)
    ids = [int(i) for i in top.indices]
    shown = displays(lm.tokenizer, ids)  # each id alone: neighbouring byte tokens never merge
    return tuple((i, s, float(p)) for i, s, p in zip(ids, shown, top.values.tolist(), strict=True))


def ablate_heads(
    lm: LoadedModel,
    text: str | Trace,
    heads: Iterable[tuple[int, int]],
    mode: Mode = "zero",
    *,
    token: int = -1,
    target: int | str | None = None,
    k: int = DEFAULT_K,
    chat: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> Ablation:
    """Ablate ``heads`` ((layer, head) pairs) together and compare the prediction at ``token``
    (default: the last) for ``target`` (default: the unablated prediction). ``progress(done,
    n_layers)`` hears each layer of the rerun; an exception it raises stops the rerun."""
    if mode not in MODES:
        raise AttnvizError(f"unknown ablation {mode!r}; use one of {MODES}")
    tr = text if isinstance(text, Trace) else trace(lm, text, chat=chat)
    chosen = _valid_heads(tr, heads)
    t = tr.position(token)
    with torch.inference_mode():
        before = tr.logits if t == tr.n_tokens - 1 else unembed(lm, tr.stream[-1][t : t + 1])[0]
    after = ablated_logits(lm, tr, chosen, mode, t, progress)
    tgt = token_id(lm, target, int(before.argmax()))
    assert tgt is not None
    log_p, log_q = torch.log_softmax(before, -1), torch.log_softmax(after, -1)
    kl = float((log_p.exp() * (log_p - log_q)).sum())
    direct = _direct(lm, tr, chosen, mode, t, tgt) if not tr.heads_problem and not tr.unembed_problem else {}
    return Ablation(
        model_name=tr.model_name,
        tokens=tr.tokens,
        position=t,
        heads=chosen,
        mode=mode,
        target=tgt,
        target_token=Tokens.build(lm.tokenizer, [tgt]).display[0],
        top_before=_top(lm, log_p.exp(), k),
        top_after=_top(lm, log_q.exp(), k),
        logit_before=float(before[tgt]),
        logit_after=float(after[tgt]),
        prob_before=float(log_p[tgt].exp()),
        prob_after=float(log_q[tgt].exp()),
        kl=max(kl, 0.0),
        direct=_direct_dict(direct),
    )


def _direct(
    lm: LoadedModel, tr: Trace, heads: tuple[tuple[int, int], ...], mode: Mode, t: int, tgt: int
) -> dict[tuple[int, int], float]:
    """−r · N(W_O^h (z^h − replacement)) per ablated head (the final norm frozen unablated)."""
    with torch.inference_mode():
        r, _ = readout(lm, tr, t, tgt, None)
        out: dict[tuple[int, int], float] = {}
        for layer in sorted({h[0] for h in heads}):
            z = head_outputs(tr, layer, t)  # (heads, d_head)
            repl = (
                torch.zeros_like(z) if mode == "zero" or tr.head_means is None else tr.head_means[layer].to(z)
            )
            change = head_writes(lm, tr, layer, t, repl - z)  # (heads, d_model)
            for _, h in (x for x in heads if x[0] == layer):
                out[(layer, h)] = float(change[h].double() @ r.double().to(change.device))
    return out


def _direct_dict(d: dict[tuple[int, int], float]) -> dict[tuple[int, int], float]:
    return {k: float(np.float64(v)) for k, v in sorted(d.items())}
