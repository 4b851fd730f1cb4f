"""Tiny random models for every text architecture transformers ships, and the parity check.

`check(model_type)` builds a tiny model (hidden 32, 2-4 layers) from the architecture's own
config class, runs attnviz's default path, and compares every attention layer with a SEPARATE
eager load of the same weights (``output_attentions=True``). The answer is one row of
docs/architectures.md. Run ``python tests/archs.py --write`` to regenerate that file.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from arch_configs import EXTRA, HEADER, NOT_TEXT, NOTES, SINK_AFTER_SOFTMAX, SMALL, VISION_LANGUAGE

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architectures.md"


@dataclass
class Row:
    model_type: str
    status: str  # "fast exact", "eager exact (one layer at a time)", MIXERS_ONLY_METHOD, "refused", "skipped"
    detail: str = ""  # refusal reason, skip reason, or "attention layers 1, 3 of 4"
    max_diff: float | None = None


def mapping_names() -> dict[str, str]:
    """model_type -> which Auto mapping it came from (causal LM, masked LM, seq2seq)."""
    from transformers.models.auto import modeling_auto as ma

    out: dict[str, str] = {}
    for kind, names in (
        ("seq2seq", ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES),
        ("masked", ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES),
        ("causal", ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES),
    ):
        for t in names:
            out.setdefault(t, kind)
    for t in VISION_LANGUAGE:
        out.setdefault(t, "vlm")
    return out


def _shrink(cls, overrides: dict):
    import transformers as tf

    try:
        default = cls()
    except Exception:  # noqa: BLE001 - a class whose defaults do not validate (Gemma 4 assistant)
        default = cls(**overrides)
    have = default.to_dict()
    kwargs = {k: v for k, v in SMALL.items() if k in have}
    for alias, real in getattr(cls, "attribute_map", {}).items():  # e.g. Bailing's num_expert_group
        if alias in SMALL and real in have and real not in kwargs:
            kwargs[real] = SMALL[alias]
    for key in have:
        try:
            sub = getattr(default, key, None)
        except RuntimeError:  # a per-layer attribute of a heterogeneous config
            continue
        if isinstance(sub, tf.PretrainedConfig):
            kwargs[key] = _shrink(type(sub), overrides.get(key, {})).to_dict()
    kwargs.update(
        {k: v for k, v in overrides.items() if k not in have or not isinstance(kwargs.get(k), dict)}
    )
    if "layer_types" in have:
        kwargs.setdefault("layer_types", None)
    return cls(**kwargs)


def tiny_config(model_type: str):
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    cfg = _shrink(cls, EXTRA.get(model_type, {}))
    return cfg


def build(model_type: str, kind: str):
    """(model built with transformers' default attention, the same weights loaded eager)."""
    import torch
    from transformers import (
        AutoModel,
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoModelForSeq2SeqLM,
    )

    auto = {
        "causal": AutoModelForCausalLM,
        "seq2seq": AutoModelForSeq2SeqLM,
        "masked": AutoModel,
        "vlm": AutoModelForImageTextToText,
    }[kind]
    cfg = tiny_config(model_type)
    torch.manual_seed(0)
    model = auto.from_config(cfg)
    with torch.no_grad():  # sharper attention than random init gives
        for name, p in model.named_parameters():
            if p.dim() == 2 and re.search(r"(q_proj|k_proj|query|key|\.q\.|\.k\.|c_attn|qkv)", name):
                p.mul_(3.0)
    eager = auto.from_config(copy.deepcopy(cfg), attn_implementation="eager")
    eager.load_state_dict(model.state_dict(), strict=False)
    return model.eval(), eager.eval()


def _eager_attentions(eager, inputs: dict) -> dict:
    """The eager twin on ``tokenizer(text)`` output (the ids and an all-ones attention mask) and the
    same decoder ids, teacher-forced without a cache (FSMT builds its decoder's causal mask only
    then; T5Gemma masks its decoder's pad ids only then: a decoder started from the pad differs)."""
    import inspect

    import torch

    inputs = dict(inputs)
    if "attention_mask" in inspect.signature(eager.forward).parameters:
        inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    with torch.inference_mode():
        out = eager(**inputs, output_attentions=True, use_cache=False)
    if getattr(out, "encoder_attentions", None) is not None:
        return {
            "encoder": list(out.encoder_attentions),
            "decoder": list(out.decoder_attentions),
            "cross": list(out.cross_attentions),
        }
    # A (queries x keys) map per layer; hybrids' linear-attention layers return None or a state
    # tensor of another shape (MiniMax's lightning attention), which is not an attention map.
    n = inputs["input_ids"].shape[1]
    maps = [a for a in out.attentions if a is not None]
    square = [a for a in maps if tuple(a.shape[-2:]) == (n, n)]
    # Other shapes are a state (linear attention of a hybrid) or a map attnviz does not show:
    # counted, so that a model whose attention layers are not all shown cannot pass unnoticed.
    return {"self": square, "other": [a for a in maps if tuple(a.shape[-2:]) != (n, n)]}


def check(model_type: str, kind: str | None = None) -> Row:
    """Build, extract with attnviz, compare with a separate eager load; never raises."""
    import torch

    import attnviz
    from attnviz.errors import AttnvizError

    kind = kind or mapping_names().get(model_type, "causal")
    if model_type in NOT_TEXT:
        return Row(model_type, "skipped", NOT_TEXT[model_type])
    try:
        model, eager = build(model_type, kind)
    except Exception as err:  # noqa: BLE001 - recorded in the table
        try:  # attnviz.load reads the config first and refuses before it loads any weights
            from attnviz.loading import attention_layout

            attention_layout(tiny_config(model_type))
        except AttnvizError as refusal:
            return Row(model_type, "refused", str(refusal))
        except Exception:  # noqa: BLE001 - the build error below is the one to show
            pass
        return Row(model_type, "skipped", f"no tiny model: {type(err).__name__}: {str(err)[:120]}")
    tok = tokenizer()
    ids = [3 + (i * 37) % 300 for i in range(12)]
    try:
        lm = attnviz.wrap_model(model, tok, spec=f"tiny-{model_type}")
        res = attnviz.extract_ids(lm, ids, verify=True)
    except AttnvizError as err:
        if "self-check failed" in str(err):
            return Row(model_type, "error", str(err))
        return Row(model_type, "refused", str(err))
    except Exception as err:  # noqa: BLE001 - an internal failure is a failed row
        return Row(model_type, "error", f"{type(err).__name__}: {str(err)[:200]}")
    if lm.layout.n_layers == 0:  # no softmax attention (Mamba, RWKV, xLSTM): its mixers only
        return Row(model_type, res.method, "no softmax attention; " + _mixer_detail(lm, res), 0.0)
    inputs: dict = {"input_ids": torch.tensor([ids])}
    if lm.layout.kind == "encoder-decoder":
        dec = res.decoder_tokens.ids if res.decoder_tokens is not None else ids
        inputs["decoder_input_ids"] = torch.tensor([list(dec)])
        wrong_start = _wrong_start(eager, ids, dec[0])
        if wrong_start:
            return Row(model_type, "WRONG", wrong_start)
    try:
        ref = _eager_attentions(eager, inputs)
    except Exception as err:  # noqa: BLE001
        return Row(model_type, "error", f"eager reference failed: {type(err).__name__}: {str(err)[:160]}")
    other = ref.pop("other", [])
    if other and not lm.layout.attention_layers:
        shapes = sorted({tuple(t.shape) for t in other})
        return Row(
            model_type, "error", f"eager returns {len(other)} attention maps of shape {shapes} not shown"
        )
    worst = 0.0
    for stack, tensors in ref.items():
        got = res.n_layers(stack) if stack in res.stacks else 0
        if got != len(tensors):
            return Row(
                model_type,
                "error",
                f"{stack}: {len(tensors)} eager layers, attnviz has {got}",
            )
        for i, t in enumerate(tensors):
            ours = res.layer_tensor(i, stack=stack).cpu()
            try:
                sliced = _slices_differ(res, stack, i, ours)
            except Exception as err:  # noqa: BLE001 - an internal failure is a failed row
                sliced = f"{stack} layer {i}: a rows / heads slice failed: {type(err).__name__}: {err}"
            if sliced:
                return Row(model_type, "WRONG", sliced)
            if model_type in SINK_AFTER_SOFTMAX:
                ours = ours / ours.sum(-1, keepdim=True)
            worst = max(worst, float((ours - t[0].float()).abs().max()))
    checked = {c.stack for c in res.checks}
    if checked != set(res.stacks):
        return Row(model_type, "WRONG", f"the self-check covered {sorted(checked)} of {list(res.stacks)}")
    detail = ""
    if model_type in SINK_AFTER_SOFTMAX:
        detail = "rows include the learned sink (sum < 1); eager returns them before the sink scaling"
    if lm.layout.attention_layers:
        detail = (
            f"attention in blocks {', '.join(map(str, lm.layout.attention_layers))} of {lm.layout.n_blocks}"
        )
    detail = "; ".join(d for d in (detail, _mixer_detail(lm, res)) if d)
    status = res.method
    if status != "fast exact" and lm.probe is not None and lm.probe.why_not_fast:
        detail = "; ".join(d for d in (detail, f"not fast: {lm.probe.why_not_fast}") if d)
    detail = "; ".join(d for d in (detail, NOTES.get(model_type, "")) if d)
    return Row(model_type, status if worst <= 1e-4 else "WRONG", detail, worst)


def _mixer_detail(lm, res) -> str:
    """The non-softmax mixers per kind: where they are and whether attnviz shows them (their
    self-check passed) or why not; blocks with two branches."""
    from attnviz.errors import AttnvizError
    from attnviz.mixers import PER_HEAD

    where: dict[str, list[int]] = {}
    for b, kinds in enumerate(lm.layout.mixers):
        for k in kinds:
            if k != "attention":
                where.setdefault(k, []).append(b)
    parts = []
    for kind, blocks in where.items():
        at = f"{kind} in blocks {', '.join(map(str, blocks))}"
        try:
            res.mixer_check(blocks[-1], kind)
        except AttnvizError as err:
            parts.append(f"{at}: not shown ({str(err).split(' mixer ', 1)[-1]})")
        else:
            per = "per head" if kind in PER_HEAD else "per channel, contribution view"
            parts.append(f"{at} (exact {per}, self-checked)")
    both = [b for b, kinds in enumerate(lm.layout.mixers) if len(kinds) > 1]
    if both:
        parts.append(
            f"blocks {', '.join(map(str, both))} run {' + '.join(lm.layout.mixers[both[0]])} side by side"
        )
    return "; ".join(parts)


def _slices_differ(res, stack: str, layer: int, full) -> str:
    """Any rows slice (the first row alone included) and any heads subset must be those rows of
    the full layer; the mismatch in words, or ""."""
    import random

    rng = random.Random(f"{res.model_name}/{stack}/{layer}")
    # The heads a caller may ask for: the layout's (a layer with more heads - Inkling's sliding
    # layers have their own head count - shows them in the full layer only).
    n_q, n_heads = full.shape[1], min(full.shape[0], res.n_heads)
    a = rng.randrange(n_q)
    for rows in (slice(0, 1), slice(1, 2), slice(n_q - 1, n_q), slice(a, a + rng.randint(1, 4))):
        heads = sorted(rng.sample(range(n_heads), rng.randint(1, n_heads)))
        got = res.layer_tensor(layer, heads=heads, rows=rows, stack=stack).cpu()
        diff = float((got - full[heads][:, rows]).abs().max()) if got.numel() else 0.0
        if got.shape != full[heads][:, rows].shape or not diff <= 1e-5:
            return (
                f"{stack} layer {layer}: rows {rows.start}:{rows.stop} of heads {heads} differ from "
                f"the full layer's by {diff:.1e}"
            )
    return ""


def _wrong_start(eager, ids: list[int], start: int) -> str:
    """Where attnviz's decoder does not start from the token the model's own generate starts
    from: that, in words ("" when it does)."""
    import torch

    x = torch.tensor([ids])
    try:
        with torch.inference_mode():
            out = eager.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=1, do_sample=False)
    except Exception as err:  # noqa: BLE001 - a start attnviz cannot be checked against is a failure
        return f"generate cannot start this decoder to check attnviz's start token {start}: {str(err)[:120]}"
    if int(out[0, 0]) != int(start):
        return f"the decoder starts from token {start}; the model's own generate starts from {int(out[0, 0])}"
    return ""


def tokenizer():
    """A word-level tokenizer over the tiny models' vocabulary ("t0" .. "t499")."""
    import transformers as tf

    return tf.PreTrainedTokenizerFast(tokenizer_object=_tokenizer(), pad_token="<pad>")


@__import__("functools").cache
def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(500)}
    vocab["<pad>"] = 0
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def quiet_check(model_type: str) -> Row:
    import torch

    torch.set_num_threads(1)
    logging.disable(logging.WARNING)
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        return check(model_type)


def render(rows: list[Row]) -> str:
    import transformers

    from attnviz.extract import MIXERS_ONLY_METHOD

    lines = [HEADER.format(version=transformers.__version__)]
    for r in sorted(rows, key=lambda r: r.model_type):
        if r.model_type in NOT_TEXT:
            status, note = "skipped", r.detail
        elif r.status == "skipped":
            status, note = "not covered", r.detail
        elif r.status == "refused":
            status, note = "refused", r.detail
        elif r.status == MIXERS_ONLY_METHOD:
            status, note = "mixers exact", r.detail
        else:
            status, note = r.status, r.detail
        note = " ".join(note.split()).replace("|", "/")[:320]
        lines.append(f"| {r.model_type} | {status} | {note} |\n")
    return "".join(lines)


def run_all(names: list[str], workers: int = 2, timeout: float = 600) -> list[Row]:
    """Check ``names`` in ``workers`` subprocesses (one import of torch each); a worker that dies
    (a crash in a model's own code) costs only the model it was on, which becomes an error row."""
    import json
    import subprocess

    chunks = [names[i::workers] for i in range(workers)]
    rows: dict[str, Row] = {}

    def worker(chunk: list[str]) -> None:
        todo = list(chunk)
        while todo:
            proc = subprocess.run(
                [sys.executable, __file__, "--worker", *todo],
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
            for line in proc.stdout.splitlines():
                if line.startswith("{"):
                    row = Row(**json.loads(line))
                    rows[row.model_type] = row
            todo = [n for n in todo if n not in rows]
            if todo:  # the worker died on todo[0]
                rows[todo[0]] = Row(todo[0], "error", f"the process died (exit {proc.returncode})")
                todo = todo[1:]

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(worker, chunks))
    return [rows[n] for n in names]


def main(argv: list[str]) -> None:
    import json
    from dataclasses import asdict

    names = [a for a in argv if not a.startswith("-")]
    if "--worker" in argv:
        for name in names:
            sys.stdout.write(json.dumps(asdict(quiet_check(name))) + "\n")
            sys.stdout.flush()
        return
    rows = run_all(names or sorted(mapping_names()))
    for row in rows:
        d = "" if row.max_diff is None else f"{row.max_diff:.1e}"
        sys.stdout.write(f"{row.model_type:28s} {row.status:14s} {d:8s} {row.detail[:150]}\n")
    if "--write" in argv:
        DOC.write_text(render(rows), encoding="utf-8")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main(sys.argv[1:])
