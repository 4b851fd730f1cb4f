"""The QK split over every architecture attnviz reads exactly (docs/architectures.md's exact rows).

For each model_type, `check` builds the arch tests' tiny model (`archs.build`), splits one cell of
the first and the last attention layer's last head (`qk_attribution`), draws it (`qk_view`), its
Q/K scatter (`qk_space`) and the OV map (`ov_circuits`), and says one of:

- ``exact``: Σ terms + position bias = the model's own score (from the captured Q/K, fp32) to
  1e-4 relative to max(1, |score|) on every checked cell;
- ``refused``: an `AttnvizError` with its reason;
- ``WRONG``: the sum misses the score (never allowed);
- ``error``: any other exception (a bug).

``python tests/qk_sweep.py [model_type ...]`` runs them (default: every exact row) in one or two
worker processes, one import of torch each.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import subprocess
import sys
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
TOL = 1e-4


@dataclass
class QKRow:
    model_type: str
    status: str  # exact / refused / WRONG / error / skipped
    detail: str = ""
    worst: float | None = None
    ov: str = ""  # the OV map: "ok", "refused: why", "error: what"


def exact_rows() -> list[str]:
    """The model_types docs/architectures.md lists as read exactly (fast or eager)."""
    text = (ROOT / "docs" / "architectures.md").read_text(encoding="utf-8")
    return [
        m.group(1)
        for m in re.finditer(r"^\| ([\w-]+) \| (fast exact|eager exact[^|]*) \|", text, re.MULTILINE)
    ]


def _cells(lm, src) -> list[tuple[int, int]]:
    last = src.n_layers - 1
    return sorted({(0, src.n_heads - 1), (last, src.n_heads - 1), (last, 0)})


def check(model_type: str) -> QKRow:
    """One architecture's row; never raises. The split and the scatter decide ``status``; the OV
    map, a weights-only reading, is recorded in ``ov`` (ok / refused: why / error: what)."""
    import archs

    import attnviz
    from attnviz.explain.qk_parts import source

    kind = archs.mapping_names().get(model_type, "causal")
    try:
        model, _ = archs.build(model_type, kind)
    except Exception as err:  # noqa: BLE001 - recorded
        return QKRow(model_type, "skipped", f"no tiny model: {type(err).__name__}: {str(err)[:120]}")
    lm = attnviz.wrap_model(model, archs.tokenizer(), spec=f"tiny-{model_type}")
    ids = [3 + (i * 37) % 300 for i in range(12)]
    row = QKRow(model_type, "exact", "", 0.0)

    def split() -> None:
        from attnviz.explain import qk_attribution, qk_space
        from attnviz.figures.qk import qk_space_view, qk_view

        src = source(lm, ids)
        row.detail = f"{src.n_layers} attention layers"
        for layer, head in _cells(lm, src):
            for key in (None, -1):  # the key it attends to most; itself (never masked)
                cell = qk_attribution(lm, src, layer=layer, head=head, query=-1, key=key)
                rel = abs(cell.error) / max(1.0, abs(cell.score))
                row.worst = max(row.worst or 0.0, rel)
                if not rel <= TOL:
                    raise _Wrong(
                        f"layer {layer} head {head} key {cell.key}: Σ terms {cell.total:.6g} vs score "
                        f"{cell.score:.6g}"
                    )
            qk_view(cell)
            qk_space_view(qk_space(lm, src, layer=layer, head=head))

    def ov() -> None:
        from attnviz.explain import ov_circuits
        from attnviz.figures.qk import ov_map_view

        ov_map_view(ov_circuits(lm))

    status, detail = _outcome(split)
    if status != "exact":
        row.status, row.detail = status, detail
    row.ov = _outcome(ov)[1] or "ok"
    return row


class _Wrong(Exception):
    """The sum misses the model's own score."""


def _outcome(step) -> tuple[str, str]:
    """(status, detail) of running ``step``: exact / refused / WRONG / error."""
    import traceback

    from attnviz.errors import AttnvizError

    try:
        step()
    except _Wrong as err:
        return "WRONG", str(err)
    except AttnvizError as err:
        return "refused", "refused: " + " ".join(str(err).split())[:300]
    except Exception as err:  # noqa: BLE001 - a traceback is a bug
        tb = traceback.extract_tb(err.__traceback__)[-1]
        return (
            "error",
            f"error: {type(err).__name__} at {Path(tb.filename).name}:{tb.lineno}: {str(err)[:200]}",
        )
    return "exact", ""


def quiet_check(model_type: str) -> QKRow:
    import torch

    torch.set_num_threads(1)
    logging.disable(logging.WARNING)
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        return check(model_type)


def run_all(names: list[str], workers: int = 1, timeout: float = 900) -> list[QKRow]:
    """``names`` in ``workers`` subprocesses; a worker that dies costs only its current model."""
    from concurrent.futures import ThreadPoolExecutor

    rows: dict[str, QKRow] = {}

    def worker(chunk: list[str]) -> None:
        todo = list(chunk)
        while todo:
            try:
                proc = subprocess.run(
                    [sys.executable, __file__, "--worker", *todo],
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                    check=False,
                )
                out = proc.stdout
                why = f"the process died (exit {proc.returncode})"
            except subprocess.TimeoutExpired as err:
                out = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
                why = f"timed out after {timeout:.0f} s"
            for line in out.splitlines():
                if line.startswith("{"):
                    row = QKRow(**json.loads(line))
                    rows[row.model_type] = row
            todo = [n for n in todo if n not in rows]
            if todo:
                rows[todo[0]] = QKRow(todo[0], "error", why)
                todo = todo[1:]

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(worker, [names[i::workers] for i in range(workers)]))
    return [rows[n] for n in names]


def main(argv: list[str]) -> None:
    names = [a for a in argv if not a.startswith("-")]
    if "--worker" in argv:
        for name in names:
            sys.stdout.write(json.dumps(asdict(quiet_check(name))) + "\n")
            sys.stdout.flush()
        return
    workers = 2 if "--two" in argv else 1
    for row in run_all(names or exact_rows(), workers=workers):
        d = "" if row.worst is None else f"{row.worst:.1e}"
        ov = "ov ok" if row.ov == "ok" else f"ov {row.ov[:90]}"
        sys.stdout.write(f"{row.model_type:28s} {row.status:8s} {d:8s} {row.detail[:200]} | {ov}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    sys.path[:0] = [str(TESTS), str(ROOT)]
    main(sys.argv[1:])
