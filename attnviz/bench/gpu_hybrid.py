"""`make gpu-check`'s hybrid rows: a Qwen3.5-shaped (Gated DeltaNet + attention) and a
Bamba-shaped (Mamba-2 + attention) random bf16 model on one CUDA GPU.

With flash-linear-attention, mamba_ssm and causal_conv1d installed, transformers binds their
kernels behind each mixer's core function when the modeling module is imported
(``use_kernel_func_from_hub_with_fallback``); attnviz's capture wraps that core function, so it
sees whichever implementation runs. Each row says which ran (`bound_kernels`: "" is the torch
body, e.g. when the package is missing), times a plain forward (floor) and ``extract_ids`` with
the mixers' self-check (every mixer rebuilt and compared with the kernel's own bf16 output
before anything is drawn), and lists the checks' worst figures. It also times one cached decode
step after the prefill (``selective_state_update`` / ``fused_recurrent_gated_delta_rule`` and
``causal_conv1d_update``) and checks the steps' rows: each step's record joined to the prefill's
(`attnviz.mixers.steps`) must reproduce what the step kernel returned. A failed check or an
error is a failure of `make gpu-check`; a missing package is a note (the row then measures the
torch body). Without CUDA nothing runs (`rows` returns no rows and one reason).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import backend
from ..capture.hook import recording
from ..capture.mixers import find_mixers, install, kernel_behind
from ..extract import extract_ids
from ..loading import LoadedModel, wrap_model
from ..mixers.kinds import MIXERS
from ..mixers.store import MixerStore
from .common import floor, measure

SIZES = (1024, 8192)
VOCAB = 32000
PACKAGES = "flash-linear-attention, mamba-ssm and causal-conv1d"
DECODE_STEPS = 8  # cached steps after the prefill: timed (median) and checked


@dataclass
class HybridRow:
    model: str
    n: int
    floor_s: float = 0.0
    extract_s: float = 0.0
    kernels: dict[str, str] = field(default_factory=dict)  # core function -> kernel bound ("": torch body)
    checks: list[str] = field(default_factory=list)  # "kind: max abs diff at scale"
    failures: list[str] = field(default_factory=list)
    decode_s: float = 0.0  # one cached decode step after the N-token prefill (median)
    decode_checks: list[str] = field(default_factory=list)  # the steps' rows: "kind: diff at scale"


def bound_kernels(model: torch.nn.Module) -> dict[str, str]:
    """Each core function the model's mixers call -> the package kernel transformers bound behind
    it ("": its own torch body runs)."""
    modules = dict(model.named_modules())
    out: dict[str, str] = {}
    for site in find_mixers(model):
        modeling = sys.modules[type(modules[site.module_name]).__module__]
        for name in (*MIXERS[site.kind].core_functions, *MIXERS[site.kind].step_functions):
            fn = getattr(modeling, name, None)
            if fn is not None:
                out[name] = kernel_behind(fn)
    return out


def _word_level():
    from tokenizers import Tokenizer, models

    return Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))


def _wrapped(cfg, device: torch.device, dtype: torch.dtype, spec: str) -> LoadedModel:
    import transformers as tf

    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg).eval().to(device=device, dtype=dtype)
    tok = tf.PreTrainedTokenizerFast(tokenizer_object=_word_level(), pad_token="t0")
    return wrap_model(model, tok, spec=spec)


def qwen35_shaped(device: torch.device, dtype: torch.dtype = torch.bfloat16, blocks: int = 4) -> LoadedModel:
    """Qwen3.5-0.8B-like dims (as `attnviz.bench.hybrid`): 3 Gated DeltaNet blocks + 1 attention."""
    import transformers as tf

    cfg = tf.Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=1024, intermediate_size=3584, num_hidden_layers=blocks,
        num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
        linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
        layer_types=["linear_attention"] * (blocks - 1) + ["full_attention"], max_position_embeddings=65536,
    )  # fmt: skip
    return _wrapped(cfg, device, dtype, f"qwen3.5-shaped hybrid ({blocks} blocks, random, {dtype})")


def bamba_shaped(device: torch.device, dtype: torch.dtype = torch.bfloat16, blocks: int = 4) -> LoadedModel:
    """Bamba-9B-like mixer dims at hidden 1024: 3 Mamba-2 blocks (32 heads × 64, state 128,
    chunk 256) + 1 attention block."""
    import transformers as tf

    cfg = tf.BambaConfig(
        vocab_size=VOCAB, hidden_size=1024, intermediate_size=3584, num_hidden_layers=blocks,
        num_attention_heads=8, num_key_value_heads=2, attn_layer_indices=[blocks - 1], mamba_n_heads=32,
        mamba_d_head=64, mamba_d_state=128, mamba_n_groups=1, mamba_chunk_size=256, mamba_expand=2,
        max_position_embeddings=65536,
    )  # fmt: skip
    return _wrapped(cfg, device, dtype, f"bamba-shaped hybrid ({blocks} blocks, random, {dtype})")


MODELS: dict[str, Callable[..., LoadedModel]] = {
    "Qwen3.5-shaped": qwen35_shaped,
    "Bamba-shaped": bamba_shaped,
}


def row(name: str, lm: LoadedModel, n: int, repeats: int) -> HybridRow:
    """One model at ``n`` tokens: the kernels bound, floor and extract + self-check timed."""
    got = HybridRow(name, n)
    install(lm.model)
    got.kernels = bound_kernels(lm.model)
    vocab = lm.model.get_input_embeddings().num_embeddings
    ids = [(7 + 31 * i) % vocab for i in range(n)]
    try:
        floor(lm, ids[:32])()  # warm-up
        got.floor_s, _ = measure(floor(lm, ids), lm.device, repeats)
        holder: dict = {}

        def run() -> None:
            holder["res"] = extract_ids(lm, ids, max_tokens=n, verify=True)

        got.extract_s, _ = measure(run, lm.device, repeats)
        got.checks = [
            f"{c.mixer}: {c.max_abs_diff:.1e} at {c.scale:.1e}"
            for c in holder["res"].checks
            if c.mixer != "attention"
        ]
        holder.clear()
        got.decode_s, got.decode_checks = decode_steps(lm, ids, DECODE_STEPS)
    except Exception as err:  # noqa: BLE001 - a failed row is a failure in the report, not a crash
        got.failures.append(f"{name} {n}: {type(err).__name__}: {err}")
    return got


def _cached(lm: LoadedModel, ids: list[int], steps: int, timed: bool) -> list[float]:
    """A cached prefill of ``ids``, then ``steps`` cached one-token steps; each step's seconds."""
    out = lm.forward(ids, use_cache=True)
    cache = {
        k: getattr(out, k) for k in ("cache_params", "past_key_values") if getattr(out, k, None) is not None
    }
    seconds = []
    for i in range(steps):
        n = len(ids) + i
        at: dict[str, Any] = {
            "cache_position": torch.tensor([n], device=lm.device),
            "position_ids": torch.tensor([[n]], device=lm.device),
        }
        backend.synchronize(lm.device)
        t0 = time.perf_counter()
        lm.forward([ids[i % len(ids)]], use_cache=True, **at, **cache)
        if timed:
            backend.synchronize(lm.device)
        seconds.append(time.perf_counter() - t0)
    return seconds


def decode_steps(lm: LoadedModel, ids: list[int], steps: int) -> tuple[float, list[str]]:
    """(the median seconds of one cached decode step after a prefill of ``ids``, plain SDPA
    attention; the steps' checks: every mixer block's prefill and steps joined, each step's row
    against its step kernel's output). A failed check raises `MixerCheckFailed`."""
    with lm.lock:  # the shared model in SDPA for the timed steps only
        lm.model.set_attn_implementation("sdpa")
        try:
            seconds = sorted(_cached(lm, ids, steps, timed=True))
        finally:
            lm.model.set_attn_implementation("attnviz")
    with recording(lm.module_names) as rec:
        _cached(lm, ids, steps, timed=False)
    store = MixerStore(rec.mixers, lm.dtype)
    checks = [store.check(b, kind) for kind in store.kinds() for b in store.blocks(kind)]
    return seconds[len(seconds) // 2], [f"{c.mixer}: {c.max_abs_diff:.1e} at {c.scale:.1e}" for c in checks]


def rows(sizes: tuple[int, ...] = SIZES, repeats: int = 3) -> tuple[list[HybridRow], str]:
    """Every hybrid row on this machine's CUDA GPU, or no rows and why."""
    cuda = backend.backend()
    if not cuda.available():
        return [], "no CUDA GPU: the hybrid rows were not run"
    out = []
    for name, build in MODELS.items():
        try:
            lm = build(cuda.device())
        except Exception as err:  # noqa: BLE001
            out.append(HybridRow(name, 0, failures=[f"{name}: {type(err).__name__}: {err}"]))
            continue
        out += [row(name, lm, n, repeats) for n in sizes]
        del lm
        cuda.empty_cache()
    return out, ""


def markdown(found: list[HybridRow], why: str = "") -> str:
    """The hybrid rows, which kernel ran behind each core function, notes and failures."""
    if why:
        return f"Hybrid rows: {why}."
    lines = [
        "Hybrid rows (bf16, random weights, 4 blocks): floor = plain SDPA forward; extract = `extract_ids` "
        "with every mixer's self-check against the kernel's own output.",
        "",
        f"A decode step is one cached token after the N-token prefill (median of {DECODE_STEPS}, SDPA); "
        "its checks join the prefill's record and the steps' and hold each step's row to its kernel.",
        "",
        "| model | N | floor | extract + self-check | ratio | decode step | kernels that ran | "
        "self-checks (max abs diff at scale) | decode-step checks |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in found:
        ran = ", ".join(f"{f} → {k or 'torch body'}" for f, k in r.kernels.items())
        ratio = f"{r.extract_s / r.floor_s:.2f}×" if r.floor_s else "-"
        step = f"{r.decode_s * 1e3:.1f} ms" if r.decode_s else "-"
        lines.append(
            f"| {r.model} | {r.n} | {r.floor_s:.3f} s | {r.extract_s:.3f} s | {ratio} | {step} | {ran} | "
            f"{'; '.join(r.checks)} | {'; '.join(r.decode_checks)} |"
        )
    if any(k == "" for r in found for k in r.kernels.values()):
        lines += ["", f"- note: a torch body ran where a kernel package is missing (install {PACKAGES})"]
    lines += [f"- FAILURE: {f}" for r in found for f in r.failures]
    return "\n".join(lines)


def failures(found: list[HybridRow]) -> list[str]:
    return [f for r in found for f in r.failures]
