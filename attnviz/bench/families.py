"""`python -m attnviz.bench.families`: long inputs on every family with a fast adapter.

For each family attnviz/adapters covers, a random model built from the family's own config class
(hidden 256, 2 layers, 4 heads, fp32; not a trained model) at N tokens (default 4096) on the CPU:

  (a) plain  - one forward of the same model as attnviz loaded it (these families run eager)
  (c) fast   - `extract_ids` (fast path) up to layer 0's probabilities

Times are medians of --repeats runs in this process; peaks are resident memory above the start
of a run (the process runs with glibc's MALLOC_MMAP_THRESHOLD_ fixed so freed tensors go back to
the OS and each run's peak is its own; see attnviz/bench.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass

import torch

from ..extract import extract_ids
from ..loading import LoadedModel, wrap_model
from .common import machine_line, measure

log = logging.getLogger(__name__)
VOCAB = 1024
LAYERS = 2  # keeps the whole run under 5 minutes on 2 cores
_SIZE = {"hidden_size": 256, "num_hidden_layers": LAYERS, "num_attention_heads": 4, "vocab_size": VOCAB}


def _configs(n: int) -> dict[str, tuple[str, dict]]:
    """family label -> (model_type, config kwargs); positions cover ``n`` tokens."""
    pos = n + 8
    gpt = {"n_embd": 256, "n_layer": LAYERS, "n_head": 4, "n_inner": 1024, "vocab_size": VOCAB}
    gpt["n_positions"] = pos
    falcon = {**_SIZE, "max_position_embeddings": pos}
    return {
        "GPT-J (rotary)": ("gptj", {**gpt, "rotary_dim": 32}),
        "CodeGen (rotary)": ("codegen", {**gpt, "rotary_dim": 32, "n_ctx": pos}),
        "GPT-Neo (global + local 256)": (
            "gpt_neo",
            {
                "hidden_size": 256,
                "num_layers": LAYERS,
                "num_heads": 4,
                "vocab_size": VOCAB,
                "attention_types": [[["global", "local"], LAYERS // 2]],
                "max_position_embeddings": pos,
            },
        ),
        "Falcon (rotary, multi-query)": ("falcon", falcon),
        "Falcon (new architecture, 2 KV heads)": (
            "falcon",
            {**falcon, "new_decoder_architecture": True, "num_kv_heads": 2},
        ),
        "Falcon (ALiBi)": ("falcon", {**falcon, "alibi": True, "multi_query": False}),
        "BLOOM (ALiBi)": ("bloom", {"hidden_size": 256, "n_layer": LAYERS, "n_head": 4, "vocab_size": VOCAB}),
        "MPT (ALiBi)": (
            "mpt",
            {"d_model": 256, "n_layers": LAYERS, "n_heads": 4, "vocab_size": VOCAB, "max_seq_len": pos},
        ),
        "XGLM": (
            "xglm",
            {
                "d_model": 256,
                "num_layers": LAYERS,
                "attention_heads": 4,
                "ffn_dim": 1024,
                "vocab_size": VOCAB,
                "max_position_embeddings": pos,
            },
        ),
        "MPNet (relative position bias, encoder)": (
            "mpnet",
            {**_SIZE, "intermediate_size": 1024, "max_position_embeddings": pos + 2},
        ),
    }


def _tokenizer():
    import transformers as tf
    from tokenizers import Tokenizer, models

    vocab = {f"t{i}": i for i in range(VOCAB)}
    return tf.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0")), pad_token="t0"
    )


def build(model_type: str, kwargs: dict) -> LoadedModel:
    from transformers import CONFIG_MAPPING, AutoModel, AutoModelForCausalLM

    config = CONFIG_MAPPING[model_type](**kwargs)
    auto = AutoModel if model_type == "mpnet" else AutoModelForCausalLM
    torch.manual_seed(0)
    model = auto.from_config(config, attn_implementation="eager")
    return wrap_model(model.eval(), _tokenizer(), spec=f"random-{model_type}")


@dataclass
class Row:
    family: str
    method: str
    plain_s: float
    fast_s: float
    plain_peak: int
    fast_peak: int

    def line(self) -> str:
        return (
            f"| {self.family} | {self.method} | {self.plain_s:.2f} s | {self.fast_s:.2f} s | "
            f"{self.fast_s / self.plain_s:.2f} | {self.plain_peak / 2**20:.0f} MiB | "
            f"{self.fast_peak / 2**20:.0f} MiB |"
        )


HEADER = (
    "| family | attnviz path | (a) plain forward | (c) fast, to layer 0 | (c)/(a) | "
    "(a) peak | (c) peak |\n|---|---|---|---|---|---|---|"
)


def bench_family(label: str, model_type: str, kwargs: dict, n: int, repeats: int) -> Row:
    lm = build(model_type, kwargs)
    ids = [(7 + 31 * i) % VOCAB for i in range(n)]

    def plain(token_ids: list[int] = ids) -> object:  # the model's own forward, every position's logits
        return lm.forward(token_ids, logits_at="all")

    method = ""

    def fast() -> object:
        nonlocal method
        res = extract_ids(lm, ids)
        method = res.method
        return res.layer_tensor(0)

    plain(ids[:64])  # one-time allocations are not part of any peak
    plain_s, plain_peak = measure(plain, lm.device, repeats)
    fast_s, fast_peak = measure(fast, lm.device, repeats)
    return Row(label, method, plain_s, fast_s, plain_peak, fast_peak)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attnviz.bench.families", description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated model types (e.g. bloom,mpt)")
    args = ap.parse_args(argv)
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") is None and sys.platform.startswith("linux"):
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "1048576"}
        os.execve(sys.executable, [sys.executable, "-m", "attnviz.bench.families", *sys.argv[1:]], env)
    logging.disable(logging.WARNING)
    only = {s for s in args.only.split(",") if s}
    sys.stdout.write(f"{machine_line(torch.device('cpu'))}; N = {args.tokens}, medians of {args.repeats}\n\n")
    sys.stdout.write(HEADER + "\n")
    for label, (model_type, kwargs) in _configs(args.tokens).items():
        if only and model_type not in only:
            continue
        row = bench_family(label, model_type, kwargs, args.tokens, args.repeats)
        sys.stdout.write(row.line() + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
