"""`extract`: run a model on a text and return its attention, by the fast or the eager path."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from . import backend
from .capture import layerwise
from .capture.generation import captured_generate
from .capture.hook import IMPLEMENTATION, recording
from .capture.layerwise import LayerInput
from .capture.sites import decoder_start, eager_attentions, forward_inputs
from .errors import AttnvizError, OutOfMemory
from .exact.eager import CannotCheck
from .inputs import DEFAULT_MAX_TOKENS, Admission, admit, admit_ids
from .loading import LoadedModel, is_out_of_memory
from .mixers.kinds import SHOWN
from .mixers.store import MixerStore, checked_steps
from .records import CapturedAttention, CapturedMixer
from .result import PATHS, AttentionResult, PathName
from .tokens import Tokens
from .verify import VerifyArg, pick_layers, self_check

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]  # (attention layers done, attention layers in all)
FAST_METHOD = "fast exact"
# A model without softmax attention (Mamba, RWKV): on either path only its mixers are captured.
MIXERS_ONLY_METHOD = "no softmax attention: the token mixers' captured kernel inputs"
AUTO_VERIFY_TOKENS = 1024  # verify="auto": one layer's (heads, N, N) in eager is cheap up to here


def auto_check_skipped(n_tokens: int) -> str:
    """Why ``verify="auto"`` does not check a text of ``n_tokens`` tokens ("" when it does)."""
    if n_tokens > AUTO_VERIFY_TOKENS:
        return (
            f"past {AUTO_VERIFY_TOKENS:,} tokens the automatic check is skipped (eager holds one layer's "
            f"heads × {n_tokens:,} × {n_tokens:,} weights)"
        )
    return ""


def _group(lm: LoadedModel, calls: list[CapturedAttention]) -> dict[str, list[CapturedAttention]] | None:
    """Captured calls per stack, in layer order (None: they do not match the model's layers)."""
    if lm.probe is None:
        return None
    stacks: dict[str, list[CapturedAttention | None]] = {
        s: [None] * len(found) for s, found in lm.probe.sites.items()
    }
    seen: Counter[str] = Counter()
    for c in calls:
        where = lm.probe.site_of(c.module_name, seen[c.module_name])
        seen[c.module_name] += 1
        if where is None:
            return None
        stacks[where[0]][where[1]] = c
    if any(c is None for found in stacks.values() for c in found):
        return None
    return {s: [c for c in found if c is not None] for s, found in stacks.items()}


def _pad_id(tok: Any) -> int | None:
    """The tokenizer's pad id (0 is one), else its EOS: what generate pads a finished row with."""
    pad = getattr(tok, "pad_token_id", None)
    return pad if pad is not None else getattr(tok, "eos_token_id", None)


@dataclass(frozen=True)
class Sampling:
    """Sampled generation: temperature > 0, nucleus top-p in (0, 1], and a seed (same seed, same
    tokens on the same device)."""

    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.temperature > 0 or not 0 < self.top_p <= 1:
            raise AttnvizError("sampling needs temperature > 0 and 0 < top-p <= 1")

    def kwargs(self) -> dict[str, Any]:
        return {
            "do_sample": True,
            "temperature": float(self.temperature),
            "top_p": float(self.top_p),
            "top_k": 0,
        }


def extract(
    lm: LoadedModel,
    text: str,
    *,
    path: PathName = "fast",
    chat: bool = False,
    generate: int = 0,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    verify: VerifyArg = False,
    sampling: Sampling | None = None,
    progress: Progress | None = None,
    statistics: bool = False,
    admission: Admission | None = None,
) -> AttentionResult:
    """Attention of ``lm`` on ``text``.

    ``path="eager"`` runs the model's eager attention with ``output_attentions=True`` (ground
    truth). ``path="fast"`` runs the model's SDPA attention, keeps each layer's post-RoPE queries
    and keys, and computes probabilities only for what is asked; equal to eager within 1e-5 in
    fp32. ``generate=k`` greedily generates k tokens first and returns the attention of prompt +
    generation. Encoder-decoder models without generation feed the decoder the same text shifted
    right (teacher forcing). A text is admitted by `attnviz.inputs.admit` (tokenized once): over
    ``max_tokens`` tokens, the model's position table or what the free memory holds (prompt +
    ``generate``) it is refused with the reason and how many tokens fit, never truncated.
    ``verify`` (True, "auto" or a layer index) recomputes one layer of every stack (encoder,
    decoder, cross) with transformers' own eager attention on the same layer input and records each
    stack's max |Δ| in ``result.checks``; a mismatch above the dtype's tolerance raises. "auto"
    checks only where it is cheap (<= 1024 tokens). An encoder-decoder's decoder starts from the
    model's own start token (`attnviz.capture.sites.decoder_start`, the one generate starts from).
    ``sampling`` generates by sampling (temperature, top-p, seed: reproducible) instead of greedily.
    ``progress(done, total)`` hears the fast forward's attention layers as they finish (a UI's
    progress bar; an exception it raises stops the forward and frees its work).
    ``statistics=True`` is for a result that will go to `head_metrics` (or rollout): the fast
    forward keeps each layer's log-sum-exp and feature expectations where the CPU flash kernel
    runs it in float32 (`attnviz.exact.statistics`), so the statistics need no second attention
    pass there; the output equals a plain run to float32 rounding.
    ``admission``: what `attnviz.inputs.admit` said of this text already (the app admits it
    before its progress bar): the text is not tokenized again.
    """
    if path not in PATHS:
        raise AttnvizError(f"unknown path {path!r}; use one of {PATHS}")
    adm = admission
    if adm is None or adm.generate != generate:
        adm = admit(lm, text, chat=chat, generate=generate, max_tokens=max_tokens)
    adm.check()
    return _extract(
        lm, adm, path=path, verify=verify, sampling=sampling, progress=progress, statistics=statistics
    )


def _teller(progress: Progress | None, total: int) -> Callable[[int], None] | None:
    """The recorder's per-call hook for ``progress`` (calls past ``total`` count as done)."""
    if progress is None:
        return None
    report = progress

    def tell(done: int) -> None:
        report(min(done, total), total)

    return tell


def extract_ids(
    lm: LoadedModel,
    ids: list[int],
    *,
    path: PathName = "fast",
    template: list[bool] | None = None,
    generate: int = 0,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    verify: VerifyArg = False,
    sampling: Sampling | None = None,
    progress: Progress | None = None,
    statistics: bool = False,
) -> AttentionResult:
    """`extract` on token ids you already have (e.g. the induction probe's repeated random ids),
    admitted by `attnviz.inputs.admit_ids` (the same limits as a text)."""
    if path not in PATHS:
        raise AttnvizError(f"unknown path {path!r}; use one of {PATHS}")
    adm = admit_ids(lm, ids, template=template, generate=generate, max_tokens=max_tokens).check()
    return _extract(
        lm, adm, path=path, verify=verify, sampling=sampling, progress=progress, statistics=statistics
    )


def _extract(
    lm: LoadedModel,
    adm: Admission,
    *,
    path: PathName,
    verify: VerifyArg,
    sampling: Sampling | None,
    progress: Progress | None,
    statistics: bool,
) -> AttentionResult:
    """The run of an admitted text (`extract`, `extract_ids`)."""
    ids, template, generate = list(adm.ids), list(adm.template), adm.generate
    model: Any = lm.model
    tok = lm.tokenizer
    enc_dec = lm.layout.kind == "encoder-decoder"
    t0 = time.perf_counter()
    input_ids = torch.tensor([ids], device=lm.device)
    start = decoder_start(model) if enc_dec else 0
    try:
        dec_ids: list[int] | None = None
        generated = [False] * len(ids)
        calls: list[CapturedAttention] | None = None  # captured while generating
        generated_mixers: list[CapturedMixer] = []  # the mixers' prefill and decode steps, likewise
        if generate:
            gen_kwargs = {
                "attention_mask": torch.ones_like(input_ids),
                "max_new_tokens": generate,
                **(sampling.kwargs() if sampling is not None else {"do_sample": False}),
                "pad_token_id": _pad_id(tok),
                **({"decoder_start_token_id": start} if enc_dec else {}),
            }
            capture = path == "fast" and lm.fast_exact and not enc_dec and not statistics
            out, calls = _generate(lm, input_ids, gen_kwargs, sampling, capture, generated_mixers)
            if enc_dec:
                dec_ids = out
            else:
                generated = [False] * len(ids) + [True] * (len(out) - len(ids))
                template = template + [False] * (len(out) - len(ids))
                ids = out
        if enc_dec and dec_ids is None:
            dec_ids = [start, *ids[:-1]]
        # The same inputs (ids, all-ones masks) for the fast, eager and layer-at-a-time forwards
        inputs: dict = forward_inputs(model, ids, dec_ids)
        captured: dict[str, list[CapturedAttention]] = {}
        mixer_calls: list[CapturedMixer] = []
        eager: dict[str, list[torch.Tensor]] = {}
        layers: dict[str, list[LayerInput]] = {}
        used, method = path, "eager (all layers)"
        if path == "fast" and lm.fast_exact:
            total = sum(lm.layout.layers_in(st) for st in lm.layout.stacks)
            tell = _teller(progress, total)
            unsupported: set[str] = set()
            if calls is None:
                with recording(lm.module_names, on_call=tell, statistics=statistics) as rec:
                    lm.forward(inputs=inputs)
                calls, unsupported, mixer_calls = rec.calls, rec.unsupported, rec.mixers
            grouped = _group(lm, calls)
            if grouped is not None and not unsupported:
                captured, method = grouped, FAST_METHOD
            else:  # never silently wrong: this input took a path the capture does not model
                log.warning("%s: the capture did not match the attention layers; exact eager", lm.spec)
        if path == "fast" and not captured:
            used, method = "eager", layerwise.METHOD
            layers = _record_layers(lm, inputs)
        elif path == "eager" and lm.layout.n_layers:
            eager = _run_eager(lm, inputs)
        if not lm.layout.n_layers:  # nothing for the eager path to ask transformers for
            method, eager, layers = MIXERS_ONLY_METHOD, {}, {}
            captured = {s: [] for s in lm.layout.stacks}
        if lm.mixer_sites and not mixer_calls:  # the generation's own steps, where every one checks
            mixer_calls = checked_steps(generated_mixers, lm.dtype, len(ids))
        if lm.mixer_sites and not mixer_calls:  # generated, eager or layer-at-a-time: one more forward
            with recording(lm.module_names) as rec:
                lm.forward(inputs=inputs)
            mixer_calls = rec.mixers
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as err:
        if not is_out_of_memory(err):
            raise
        _free()
        raise OutOfMemory(
            f"{len(ids)} tokens did not fit in memory on {lm.device}; shorten the text or use the fast path"
        ) from None
    tokens = Tokens.build(tok, ids, template=template, generated=generated)
    decoder_tokens = None
    if dec_ids is not None:
        gen_flags = [False] + [bool(generate)] * (len(dec_ids) - 1)
        decoder_tokens = Tokens.build(tok, dec_ids, generated=gen_flags)
    for stack in lm.layout.stacks:
        got = len(captured.get(stack, eager.get(stack, layers.get(stack, []))))
        if got != lm.layout.layers_in(stack):
            raise AttnvizError(
                f"this {lm.layout.model_type!r} model returned {got} {stack} attention maps for this "
                f"input where it has {lm.layout.layers_in(stack)} attention layers; attnviz cannot "
                "tell which map belongs to which layer, so it shows none"
            )
    backend.synchronize(lm.device)  # CUDA runs asynchronously: time the work, not its queueing
    seconds = time.perf_counter() - t0
    log.info("extract model=%s tokens=%d path=%s seconds=%.3f", lm.spec, len(ids), used, seconds)
    store = MixerStore(mixer_calls, lm.dtype) if lm.mixer_sites else None
    result = AttentionResult(
        model_name=lm.spec,
        layout=lm.layout,
        tokens=tokens,
        path=used,
        method=method,
        decoder_tokens=decoder_tokens,
        _captured=captured,
        _eager=eager,
        _layers=layers,
        _recompute=_eager_mode(lm) if layers else None,
        seconds=seconds,
        _mixers=store,
    )
    if verify and store is not None and not (verify == "auto" and auto_check_skipped(len(ids))):
        result = dataclasses.replace(result, checks=_mixer_checks(store))
    if verify == "auto" and (auto_check_skipped(len(ids)) or used != "fast"):
        verify = False
    picks = pick_layers(result, verify) if lm.layout.n_layers else {}
    if picks:
        try:
            checks = self_check(lm.model, result, picks)
        except CannotCheck:
            if verify != "auto":
                raise
            log.info("%s: no eager attention function to self-check against", lm.spec)
        else:
            result = dataclasses.replace(result, checks=checks + result.checks)
    return result


def _generate(
    lm: LoadedModel,
    input_ids: torch.Tensor,
    gen_kwargs: dict,
    sampling: Sampling | None,
    capture: bool,
    mixers: list[CapturedMixer],
) -> tuple[list[int], list[CapturedAttention] | None]:
    """(prompt + generated ids, the attention calls captured while generating or None): the
    model's own ``generate`` under its lock, greedy or seeded sampling (the global RNG untouched).
    Capturing, ``mixers`` receives the mixers' records of the prefill and every decode step."""
    with lm.lock, torch.inference_mode(), torch.random.fork_rng(devices=[]):
        if sampling is not None:
            torch.manual_seed(sampling.seed)
        if capture:
            step = functools.partial(lm.forward, logits_at="last", use_cache=True)
            return captured_generate(lm.model, input_ids, lm.module_names, gen_kwargs, step, mixers)
        return lm.model.generate(input_ids, **gen_kwargs)[0].tolist(), None


def _mixer_checks(store: MixerStore) -> tuple:
    """The self-check of the middle block of each shown mixer kind (raises on a mismatch)."""
    out = []
    for kind in store.kinds():
        blocks = [b for b in store.blocks(kind) if store.checkable(b, kind)]
        if kind in SHOWN and blocks:
            out.append(store.check(blocks[len(blocks) // 2], kind))
    return tuple(out)


@contextlib.contextmanager
def eager_mode(lm: LoadedModel) -> Iterator[None]:
    """The model in transformers' eager attention for the block, under ``lm.lock``. Models that
    cannot switch were loaded eager (never switched: that would lose their causal mask)."""
    with lm.lock:
        if not lm.supports_capture:
            yield
            return
        lm.model.set_attn_implementation("eager")
        try:
            yield
        finally:
            lm.model.set_attn_implementation(IMPLEMENTATION)


def _eager_mode(lm: LoadedModel):
    return lambda: eager_mode(lm)


def _run_eager(lm: LoadedModel, inputs: dict) -> dict[str, list[torch.Tensor]]:
    """The model's own eager attention with output_attentions=True."""
    with eager_mode(lm):
        out = lm.forward(inputs=inputs, output_attentions=True)
    stacks = eager_attentions(out, lm.layout.kind == "encoder-decoder")
    return {s: [t[0].float() for t in ts] for s, ts in stacks.items()}


def _record_layers(lm: LoadedModel, inputs: dict) -> dict[str, list[LayerInput]]:
    """One eager forward keeping each attention module's inputs."""
    assert lm.probe is not None
    with eager_mode(lm):
        return layerwise.record(lm.model, lm.probe.sites, lambda: lm.forward(inputs=inputs))


def _free() -> None:
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
