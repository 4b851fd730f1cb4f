"""Where a model's attention lives: one short eager forward that finds each attention module.

The model's own eager forward with ``output_attentions=True`` on a few tokens returns the
probabilities of every attention layer, in order. A hook on every module sees which module
produced each of those tensors: that module (the deepest one) is the attention layer, and its
name gives the model's own block index (hybrids have attention in only some blocks). A second
short forward with the capture attention tells whether the fast path sees exactly those layers
with arguments it models; if not, `extract` runs the exact layer-at-a-time path.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PretrainedConfig

from ..errors import ModelHasNoAttention

log = logging.getLogger(__name__)

_BLOCK = re.compile(r"\.(\d+)(?:\.|$)")


@dataclass(frozen=True)
class AttentionSite:
    """One attention layer: the module computing it and where its output holds the probabilities."""

    stack: str
    module_name: str
    out_index: int
    call: int = 0  # which call of that module (a shared block runs at several depths: Zamba)

    @property
    def block(self) -> int | None:
        """The model's own block index, read from the module name (``model.layers.3.self_attn``)."""
        m = _BLOCK.search(self.module_name)
        return int(m.group(1)) if m else None


@dataclass
class Probe:
    sites: dict[str, list[AttentionSite]]  # per stack, in the order eager returns them
    fast: bool  # the capture attention sees exactly these layers, with arguments it models
    why_not_fast: str = ""
    by_call: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # module name -> sites

    def site_of(self, module_name: str, call: int) -> tuple[str, int] | None:
        """(stack, layer) of the ``call``-th call of ``module_name`` in one forward."""
        calls = self.by_call.get(module_name, [])
        return calls[call] if call < len(calls) else None


def probe_inputs(model: Any, tokenizer: Any, encoder_decoder: bool) -> dict:
    """The load probe's input, shaped like what `extract` feeds: six ordinary ids between the
    tokenizer's own special tokens (BOS, [CLS] ... [SEP], ... </s>), and for an encoder-decoder the
    decoder started from the model's own start token (a pad where that is the pad: T5), shifted
    right as in `extract` (one token shorter, so the decoder and cross maps differ in shape)."""
    emb = model.get_input_embeddings()
    vocab = int(getattr(emb, "num_embeddings", None) or getattr(model.config, "vocab_size", None) or 10)
    prefix, suffix = special_tokens(tokenizer)
    content = [min(3 + 5 * i, vocab - 1) for i in range(6)]
    ids = [i for i in (*prefix, *content, *suffix) if 0 <= i < vocab]
    decoder_ids = [decoder_start(model), *ids[:-2]] if encoder_decoder else None
    return forward_inputs(model, ids, decoder_ids)


def special_tokens(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The ids ``tokenizer(text)`` puts before and after the text's own ids ([], [] if none)."""
    try:
        plain = list(tokenizer("attention", add_special_tokens=False)["input_ids"])
        full = list(tokenizer("attention")["input_ids"])
    except Exception:  # noqa: BLE001 - a tokenizer that cannot say: probe without special tokens
        return [], []
    for start in range(len(full) - len(plain) + 1):
        if plain and full[start : start + len(plain)] == plain:
            return full[:start], full[start + len(plain) :]
    return [], []


def decoder_start(model: Any) -> int:
    """The token the model's own decoder starts from, as `generate` picks it: the generation
    config's ``decoder_start_token_id``, the config's, the decoder sub-config's decoder start or
    BOS (T5Gemma keeps its start there: its own shift-right uses ``config.decoder.bos_token_id``),
    the generation config's BOS (generate's fallback), and only then the pad id (T5's convention)."""
    config = model.config
    generation = getattr(model, "generation_config", None)
    sub = _get(config, "decoder")
    sub = sub if isinstance(sub, PretrainedConfig) else None
    for source, name in (
        (generation, "decoder_start_token_id"),
        (config, "decoder_start_token_id"),
        (sub, "decoder_start_token_id"),
        (sub, "bos_token_id"),
        (generation, "bos_token_id"),
        (config, "pad_token_id"),
        (generation, "pad_token_id"),
    ):
        value = _get(source, name)
        if isinstance(value, list | tuple):
            value = value[0] if value else None
        if isinstance(value, int) and not isinstance(value, bool):
            return int(value)
    return 0


def _get(source: Any, name: str) -> Any:
    try:
        return getattr(source, name, None) if source is not None else None
    except Exception:  # noqa: BLE001 - a config attribute that raises (per-layer config): absent
        return None


def forward_inputs(model: Any, ids: list[int], decoder_ids: list[int] | None = None) -> dict:
    """The keyword arguments of every forward attnviz runs on ``ids`` (the fast capture, eager,
    layer at a time, the load probe), so each builds its masks from the same inputs.

    What ``tokenizer(text)`` gives one unpadded sequence: the ids and an all-ones attention mask;
    for an encoder-decoder, the decoder ids with an all-ones mask, as generate's decoder sees them.
    The masks are explicit because a model left to derive one may do it from pad ids, and not
    always the same way: T5Gemma masks pad ids in its decoder only when it runs without a cache
    (``use_cache=False``, as attnviz runs) - so a decoder started from the pad token lost key 0,
    where the model's own default call and generate attend to it."""
    device = _device(model)
    params = inspect.signature(model.forward).parameters
    inputs: dict = {"input_ids": torch.tensor([ids], device=device)}
    if "attention_mask" in params:
        inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    if decoder_ids is not None:
        inputs["decoder_input_ids"] = torch.tensor([decoder_ids], device=device)
        if "decoder_attention_mask" in params:
            inputs["decoder_attention_mask"] = torch.ones_like(inputs["decoder_input_ids"])
    if "use_cache" in params:
        inputs["use_cache"] = False
    return inputs


def _device(model: Any) -> torch.device:
    return torch.device(model.get_input_embeddings().weight.device)


def _tensors(output: Any) -> list[tuple[int, torch.Tensor]]:
    if isinstance(output, torch.Tensor):
        return [(-1, output)]
    if isinstance(output, tuple | list):
        return [(i, t) for i, t in enumerate(output) if isinstance(t, torch.Tensor) and t.dim() == 4]
    return []


def eager_attentions(out: Any, encoder_decoder: bool) -> dict[str, list[torch.Tensor]]:
    """The probabilities an eager forward returned, per stack (None entries of hybrids dropped)."""

    def keep(ts) -> list[torch.Tensor]:
        return [t for t in (ts or ()) if t is not None]

    if encoder_decoder:
        return {
            "encoder": keep(out.encoder_attentions),
            "decoder": keep(out.decoder_attentions),
            "cross": keep(out.cross_attentions),
        }
    return {"self": keep(out.attentions)}


def find_sites(
    model: Any, inputs: dict, encoder_decoder: bool
) -> tuple[dict[str, list[AttentionSite]], dict[str, list[torch.Tensor]]]:
    """Run the model's eager forward once (model already eager) and locate each attention layer."""
    seen: list[tuple[str, int, int, torch.Tensor]] = []  # (module name, call, out index, tensor)
    calls: Counter[str] = Counter()
    handles = []

    def hook(name: str):
        def fn(_module, args, output):
            call = calls[name]
            calls[name] += 1
            passed = {id(a) for a in args if isinstance(a, torch.Tensor)}
            for i, t in _tensors(output):
                if id(t) not in passed:  # a dropout / identity hands the probabilities on unchanged
                    seen.append((name, call, i, t))

        return fn

    for name, module in model.named_modules():
        if name:
            handles.append(module.register_forward_hook(hook(name)))
    try:
        with torch.inference_mode():
            out = model(**inputs, output_attentions=True)
    finally:
        for h in handles:
            h.remove()
    sites: dict[str, list[AttentionSite]] = {}
    probs = {
        stack: [t for t in tensors if _is_probabilities(t, inputs, stack)]
        for stack, tensors in eager_attentions(out, encoder_decoder).items()
    }
    for stack, tensors in probs.items():
        found: list[AttentionSite] = []
        for t in tensors:
            hits = [s for s in seen if s[3] is t] or [
                s for s in seen if s[3].shape == t.shape and torch.equal(s[3], t)
            ]
            if not hits:
                raise ModelHasNoAttention(
                    f"cannot tell which module of this {model.config.model_type!r} model computes its "
                    f"{stack} attention layer {len(found)}, so its probabilities cannot be checked; "
                    "this architecture is not supported"
                )
            name, call, index, _ = max(hits, key=lambda s: s[0].count("."))
            found.append(AttentionSite(stack, name, index, call))
        sites[stack] = found
    return sites, probs


def _is_probabilities(t: torch.Tensor, inputs: dict, stack: str) -> bool:
    """Whether an "attention" output is a map of softmax probabilities (one row per query token,
    rows of non-negative weights summing to at most 1). Linear-attention layers of some hybrids
    (MiniMax's lightning attention) return a state tensor there instead: not an attention map."""
    ids = inputs["decoder_input_ids"] if stack in ("decoder", "cross") else inputs["input_ids"]
    if t.dim() != 4 or t.shape[-2] != ids.shape[1]:
        return False
    t = t.float()
    return bool((t >= 0).all()) and bool((t.sum(-1) <= 1 + 1e-2).all())


def probe(
    model: Any,
    encoder_decoder: bool,
    capture_ok: bool,
    names: dict[int, str],
    switch: bool | None = None,
    tokenizer: Any = None,
) -> Probe:
    """Find the attention sites (eager) and whether the capture path reproduces them exactly.

    ``capture_ok``: the model records its attention calls. ``switch`` (default: ``capture_ok``):
    it runs transformers' attention functions and is switched to eager for the probe and back to
    the capture attention afterwards; adapted eager-only models (attnviz/adapters) run eager
    whenever no recorder is active, so they are not switched. ``tokenizer`` gives the probe input
    its special tokens (`probe_inputs`).
    """
    from . import hook as capture

    switch = capture_ok if switch is None else switch
    inputs = probe_inputs(model, tokenizer, encoder_decoder)
    if switch:
        model.set_attn_implementation("eager")
    try:
        sites, eager_probs = find_sites(model, inputs, encoder_decoder)
    finally:
        if switch:
            model.set_attn_implementation(capture.IMPLEMENTATION)
    if not any(sites.values()):
        raise ModelHasNoAttention(
            f"this {model.config.model_type!r} model returns no attention probabilities from "
            "transformers' eager attention (its layers are recurrent / state-space, or it does not "
            "expose them), so attnviz can neither show nor check them; pick a model with softmax attention"
        )
    by_call: dict[str, list[tuple[str, int]]] = {}
    order: dict[str, list[tuple[int, str, int]]] = {}
    for stack, found in sites.items():
        for layer, site in enumerate(found):
            order.setdefault(site.module_name, []).append((site.call, stack, layer))
    for name, entries in order.items():
        by_call[name] = [(stack, layer) for _, stack, layer in sorted(entries)]
    result = Probe(sites=sites, fast=False, by_call=by_call)
    if not capture_ok:
        result.why_not_fast = "its attention does not go through transformers' attention functions"
        return result
    with capture.recording(names) as rec, torch.inference_mode():
        model(**inputs)
    counted = Counter(c.module_name for c in rec.calls)
    expected = Counter(s.module_name for found in sites.values() for s in found)
    if rec.unsupported:
        args = ", ".join(sorted(rec.unsupported))
        result.why_not_fast = f"its attention takes arguments the fast path does not model ({args})"
    elif counted != expected:
        result.why_not_fast = (
            f"its attention calls ({sum(counted.values())}) do not match its attention layers "
            f"({sum(expected.values())})"
        )
    else:
        half = next(model.parameters()).dtype != torch.float32
        worst = _worst_diff(model, result, rec.calls, eager_probs, half)
        if worst > (PROBE_TOLERANCE if half else 1e-4):
            # e.g. a decoder whose SDPA path drops the causal mask (NLLB-MoE): never show that
            result.why_not_fast = f"its capture differs from eager by {worst:.1e} on a test input"
        else:
            result.fast = True
    return result


# Probe input: 6 ordinary tokens and the tokenizer's special ones. A dropped mask or a missing
# term is off by ~0.1-1. In bf16/fp16 the hidden states of an SDPA forward and an eager forward
# drift apart with depth (the kernels round differently), so there only each stack's first layer
# (same input in both forwards) is compared with the eager forward, and deeper layers with
# eager's function on the same Q/K.
PROBE_TOLERANCE = 2e-2


def _worst_diff(
    model: Any, found: Probe, calls: list, eager_probs: dict[str, list[torch.Tensor]], half: bool
) -> float:
    from ..errors import AttnvizError
    from ..exact.eager import comparable, eager_probabilities
    from ..exact.probabilities import probs_from_capture

    seen: Counter[str] = Counter()
    worst = 0.0
    for c in calls:
        where = found.site_of(c.module_name, seen[c.module_name])
        seen[c.module_name] += 1
        if where is None:
            return float("inf")
        if not half or (where[1] == 0 and where[0] != "cross"):
            ref = eager_probs[where[0]][where[1]][0].float()
        else:
            try:
                ref = eager_probabilities(model, c)
            except AttnvizError:
                continue  # no eager function to compare with; the first layer was compared
        ours = comparable(probs_from_capture(c).to(ref.device), ref, c)
        worst = max(worst, float((ours - ref).abs().max()))
    return worst
