"""Generation that captures as it goes: the prompt runs once, not twice.

`extract(generate=k)` needs the attention of prompt + generation. Generating and then running a
capture forward over all of it pays the prompt twice (the prefill, then the capture). Here the
recorder listens to `generate` itself: its prefill gives every prompt row, each decode step one
row, and one more cached step on the last generated token (which generate never feeds) gives its
row and every key (1, kv_heads, prompt + k, d_head). Per layer, the rows concatenate in order:

    query = cat(prefill rows, step rows…, last row)   # (1, heads, P + k, d_head)
    key   = the last step's keys                      # (1, kv_heads, P + k, d_head)

That is exactly what the model computed for each position, so the probabilities recomputed
from it are the model's own (the decode steps are the same layers on the same inputs; only the
matrix shapes differ, which moves float32 rounding, ~1e-7). It is used only where that record is
provably whole, else `captured_generate` says None and `extract` runs its capture forward:
every call plain causal attention (no mask tensor: causal prefill, steps that see every key), no
soft-capping, position bias or sinks, each step's keys growing by one, and the prompt's keys
unchanged in the last step's (no sliding or quantised cache).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

import torch

from ..records import CapturedAttention, CapturedMixer
from .hook import recording

log = logging.getLogger(__name__)


def captured_generate(
    model: Any,
    input_ids: torch.Tensor,
    names: dict[int, str],
    gen_kwargs: dict,
    step: Callable[..., Any],
    mixers: list[CapturedMixer] | None = None,
) -> tuple[list[int], list[CapturedAttention] | None]:
    """(prompt + generated ids, one stitched call per attention layer in call order, or None
    when the record is not provably whole: then capture with a forward over the ids). ``step(**inputs)``
    runs the model once on the last token with the generation's cache (`LoadedModel.forward`).
    ``mixers``, when given, receives the non-softmax mixers' records of the prefill, every decode
    step and the last step, in call order (`attnviz.mixers.steps` joins them; unchecked here)."""
    key_lens: list[int] = []

    def keep_one_key(count: int) -> None:  # a step keeps only its own new key row (memory: the
        c = rec.calls[count - 1]  # last step's keys hold them all, and are checked against it)
        key_lens.append(c.key.shape[2])
        if c.query.shape[2] == 1:
            c.key, c.value = c.key[:, :, -1:].clone(), None

    with recording(names, on_call=keep_one_key) as rec:
        out = model.generate(input_ids, return_dict_in_generate=True, use_cache=True, **gen_kwargs)
    ids = out.sequences[0].tolist()
    n_prompt, n = input_ids.shape[1], len(ids)
    cache = getattr(out, "past_key_values", None)
    if cache is None or n == n_prompt:
        return ids, None
    device = input_ids.device
    extra: dict[str, Any] = {
        "attention_mask": torch.ones(1, n, dtype=torch.long, device=device),
        "past_key_values": cache,
    }
    # its position, as generate gives each step's where the forward takes one (Bamba's model puts
    # a token given without one at position 0 whatever its cache holds: its attention rotated the
    # last query and key so, and that row was 0.4 off a forward's)
    if "position_ids" in inspect.signature(model.forward).parameters:
        extra["position_ids"] = torch.tensor([[n - 1]], device=device)
    with recording(names) as last:
        step(torch.tensor([ids[-1:]], device=device), **extra)
    if mixers is not None:
        mixers.extend([*rec.mixers, *last.mixers])
    calls, why = _stitch(rec.calls, key_lens, last.calls, n_prompt, bool(rec.unsupported or last.unsupported))
    if calls is None:
        log.info("generation capture not used (%s): a capture forward over the ids", why)
    return ids, calls


def _plain(c: CapturedAttention) -> bool:
    return c.softcap is None and c.position_bias is None and c.sinks is None and c.mask is None


def _stitch(
    calls: list[CapturedAttention],
    key_lens: list[int],
    last: list[CapturedAttention],
    n_prompt: int,
    unsupported: bool,
) -> tuple[list[CapturedAttention] | None, str]:
    """Per layer, the prefill's rows, one row per decode step, the last step's row and keys;
    (None, why) unless every check of the module docstring holds."""
    n_layers = len(last)
    if unsupported or not n_layers or len(calls) % n_layers or len(key_lens) != len(calls):
        return None, "the calls do not split into a prefill and one call per step"
    steps = len(calls) // n_layers - 1  # generate's decode steps (k - 1)
    out = []
    for i in range(n_layers):
        first, end = calls[i], last[i]
        rest = [calls[i + (j + 1) * n_layers] for j in range(steps)]
        lens = [key_lens[i + (j + 1) * n_layers] for j in range(steps)]
        n = n_prompt + steps + 1
        if any(c.module_name != first.module_name for c in [*rest, end]):
            return None, "the steps call the layers in another order"
        if not (all(map(_plain, [first, *rest, end])) and first.is_causal):
            return None, "a mask, soft-capping, a bias or sinks"
        if first.query.shape[2] != n_prompt or first.key.shape[2] != n_prompt or end.value is None:
            return None, "the prefill did not see the whole prompt"
        if end.query.shape[2] != 1 or end.key.shape[2] != n or lens != list(range(n_prompt + 1, n)):
            return None, "a step's keys did not grow by one"
        if any(c.query.shape[2] != 1 or c.scaling != first.scaling for c in [*rest, end]):
            return None, "a step saw more than one query or another scale"
        if not torch.equal(end.key[:, :, :n_prompt], first.key) or any(
            not torch.equal(c.key, end.key[:, :, n_prompt + j : n_prompt + j + 1]) for j, c in enumerate(rest)
        ):
            return None, "the cache changed earlier keys"
        query = torch.cat([first.query, *(c.query for c in rest), end.query], dim=2)  # (1, heads, n, d)
        name, scale = first.module_name, first.scaling
        out.append(CapturedAttention(name, query, end.key, None, True, scale, value=end.value))
    return out, ""
