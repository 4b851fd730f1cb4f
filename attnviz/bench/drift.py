"""How far attnviz's probabilities are from transformers' eager ones, per layer, and whose part is whose.

Two numbers per layer (max |Δ| over heads, rows and keys):

- **same input**: our probabilities vs transformers' own eager attention function on the SAME
  captured query/key of that layer. Both softmax the same scores in fp32; eager then casts its
  output to the model dtype, so this is exactly that cast's rounding (0 in fp32 up to float
  noise; at most half a bf16 ulp of a probability in bf16).
- **SDPA run vs eager run**: our probabilities from an SDPA forward vs the eager forward's
  ``output_attentions``. The two forwards' hidden states drift apart (different kernels,
  different rounding, compounding with depth): this is the kernel's drift, not ours.

``python -m attnviz.bench.drift`` measures the built-in smollm2-135m on CPU in fp32 and bf16 and writes
the table into docs/benchmarks.md between its markers.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from ..exact.eager import eager_probabilities
from ..extract import extract_ids
from ..loading import LoadedModel
from ..loading.files import atomic_write_text

log = logging.getLogger(__name__)

START, END = "<!-- drift:start -->", "<!-- drift:end -->"


@dataclass(frozen=True)
class LayerDrift:
    layer: int
    same_input: float  # ours vs eager's function on the same captured Q/K (the dtype cast only)
    sdpa_vs_eager: float  # ours from an SDPA forward vs an eager forward's probabilities


def measure(lm: LoadedModel, ids: list[int]) -> list[LayerDrift]:
    """Per-layer drift of ``lm`` on ``ids`` (a decoder with the fast exact path)."""
    fast = extract_ids(lm, ids, path="fast")
    if fast.method != "fast exact":
        raise ValueError(f"{lm.spec} does not take the fast path ({fast.method})")
    eager = extract_ids(lm, ids, path="eager")
    rows = []
    for i in range(fast.n_layers()):
        ours = fast.layer_tensor(i)
        cap = fast.captured(i)
        assert cap is not None  # the fast path recorded every layer
        same = float((ours - eager_probabilities(lm.model, cap).to(ours.device)).abs().max())
        full = float((ours - eager.layer_tensor(i).to(ours.device)).abs().max())
        rows.append(LayerDrift(i, same, full))
    return rows


def table(results: dict[str, list[LayerDrift]], header: str) -> str:
    dtypes = list(results)
    cols = " | ".join(f"{d} same input | {d} SDPA run vs eager run" for d in dtypes)
    lines = [header, "", f"| layer | {cols} |", "|---" * (1 + 2 * len(dtypes)) + "|"]
    n = len(next(iter(results.values())))
    for i in range(n):
        cells = " | ".join(
            f"{results[d][i].same_input:.1e} | {results[d][i].sdpa_vs_eager:.1e}" for d in dtypes
        )
        lines.append(f"| {i} | {cells} |")
    worst = " | ".join(
        f"**{max(r.same_input for r in rs):.1e}** | **{max(r.sdpa_vs_eager for r in rs):.1e}**"
        for rs in (results[d] for d in dtypes)
    )
    lines.append(f"| max | {worst} |")
    return "\n".join(lines) + "\n"


def write_section(path: Path, body: str) -> None:
    """Replace the text between the drift markers (append the section if they are missing)."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    block = f"{START}\n{body}{END}"
    if START in text and END in text:
        head, rest = text.split(START, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n## Fast vs eager drift, per layer\n\n" + block + "\n"
    atomic_write_text(path, text)  # a full disk keeps the old file whole


def main(argv: list[str] | None = None) -> int:
    from ..loading import load_model

    ap = argparse.ArgumentParser(prog="python -m attnviz.bench.drift", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    results: dict[str, list[LayerDrift]] = {}
    for dtype in ("float32", "bfloat16"):
        lm = load_model(args.model, device=args.device, dtype=dtype)
        vocab = int(lm.model.get_input_embeddings().num_embeddings)
        ids = torch.randint(10, vocab, (args.tokens,), generator=torch.Generator().manual_seed(0)).tolist()
        results[dtype] = measure(lm, ids)
        lm.release()
    device = torch.device(args.device).type.upper()
    header = (
        f"`python -m attnviz.bench.drift`: {args.model}, {args.tokens} random tokens, {device}, max |Δ| of "
        "the probabilities per layer. *same input*: attnviz vs transformers' eager attention function "
        "on the same captured query/key (ours is the fp32 softmax; eager casts it to the model dtype, "
        "so this column is that cast). *SDPA run vs eager run*: attnviz on an SDPA forward vs the "
        "eager forward's `output_attentions` — the hidden states of the two forwards drift apart "
        "(kernel rounding, compounding with depth); that part is the kernel's, not attnviz's."
    )
    body = table(results, header)
    sys.stdout.write(body)
    if not args.no_write:
        write_section(args.out, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
