"""Head atlas: every head of a model ranked by each statistic across a corpus of texts.

    atlas = run_atlas(lm, builtin_corpus(), progress=lambda done, total, note: print(done, total))
    atlas.ranking("previous_token")[:5]     # [(layer, head, mean over texts), ...]
    atlas.example("previous_token", 3, 0)   # the text where head (3, 0) scores highest + its link
    atlas.to_frame().to_csv("atlas.csv")

Per text the statistics are `attnviz.metrics.head_metrics` of that text (the same numbers the
overview page shows for it); the atlas keeps them all, (texts, layers, heads) per statistic, so
means, maxima and the example text are exact reductions of per-text values. For each head and
text it also keeps the strongest link: the (query, key) pair with the largest weight outside
row 0 (whose only key is forced) and key 0 (the sink most heads fall back on), which makes the
example snippet. Runs are cached on disk under ``cache_dir()/atlas`` keyed by the model
(spec, layout, dtype and a fingerprint of its weights), the texts and the settings.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import AttnvizError
from .extract import extract_ids, tokenize
from .layout import Stack
from .loading import LoadedModel, cache_dir
from .metrics import head_metrics

log = logging.getLogger(__name__)

STATISTICS: tuple[str, ...] = ("entropy", "sink", "previous_token", "diagonal", "distance")
ATLAS_MAX_TOKENS = 512  # per text; longer texts are skipped (listed in ``skipped``), never cut
MAX_TEXTS = 1000
CACHE_VERSION = 1
Progress = Callable[[int, int, str], "bool | None"]


def builtin_corpus() -> list[str]:
    """The built-in corpus: short varied texts (prose, code, lists, dialogue, several scripts)."""
    raw = resources.files("attnviz").joinpath("data/corpus.txt").read_text(encoding="utf-8")
    return parse_texts(raw, lines=True)


def parse_texts(raw: str, *, lines: bool | None = None) -> list[str]:
    """Texts from a user file: one per line (``lines=True``) or per blank-line-separated
    paragraph (``False``; default: paragraphs when the file has blank lines). ``#`` lines are
    comments; a literal ``\\n`` inside a line is a line break."""
    raw = raw.replace("\r\n", "\n")
    if lines is None:
        lines = "\n\n" not in raw.strip()
    chunks = raw.split("\n") if lines else raw.split("\n\n")
    texts = []
    for chunk in chunks:
        kept = "\n".join(x for x in chunk.split("\n") if not x.lstrip().startswith("#"))
        text = kept.replace("\\n", "\n").strip()
        if text:
            texts.append(text)
    if not texts:
        raise AttnvizError("the file has no texts; put one text per line (or per paragraph)")
    if len(texts) > MAX_TEXTS:
        raise AttnvizError(f"the file has {len(texts)} texts; the atlas takes up to {MAX_TEXTS}")
    return texts


@dataclass(frozen=True)
class Example:
    """A head's example for one statistic: the text where it scores highest and its strongest link."""

    text_index: int
    value: float
    query: int
    key: int
    weight: float
    snippet: str  # plain text (escape before showing as HTML)


@dataclass(frozen=True, eq=False)
class Atlas:
    """Per-text head statistics of one model over a corpus (see the module doc)."""

    model_name: str
    stack: Stack
    texts: tuple[str, ...]  # the texts that ran, in order
    tokens: tuple[tuple[str, ...], ...]  # display tokens per text
    values: dict[str, np.ndarray]  # statistic -> float64 (texts, layers, heads)
    links: np.ndarray  # float64 (texts, layers, heads, 3): query, key, weight of the strongest link
    skipped: tuple[tuple[int, str], ...] = ()  # (index in the input, reason)
    cancelled: bool = False
    seconds: float = 0.0
    from_cache: bool = False
    layer_labels: tuple[str, ...] = field(default=())

    @property
    def n_texts(self) -> int:
        return len(self.texts)

    @property
    def shape(self) -> tuple[int, int]:
        """(layers, heads)."""
        any_values = next(iter(self.values.values()))
        return int(any_values.shape[1]), int(any_values.shape[2])

    def _values(self, statistic: str) -> np.ndarray:
        if statistic not in self.values:
            raise AttnvizError(f"unknown statistic {statistic!r}; use one of {tuple(self.values)}")
        if self.n_texts == 0:
            raise AttnvizError("the atlas has no texts yet")
        return self.values[statistic]

    def mean(self, statistic: str) -> np.ndarray:
        """Mean over texts: float64 (layers, heads)."""
        return self._values(statistic).mean(axis=0)

    def ranking(self, statistic: str, k: int | None = None) -> list[tuple[int, int, float]]:
        """Heads by mean over texts, highest first: (layer, head, mean)."""
        m = self.mean(statistic)
        order = np.argsort(-m, axis=None, kind="stable")[:k]
        return [(int(i) // m.shape[1], int(i) % m.shape[1], float(m.flat[i])) for i in order]

    def example(self, statistic: str, layer: int, head: int, context: int = 4) -> Example:
        """The text where head (layer, head) scores highest on ``statistic``, with its link."""
        v = self._values(statistic)[:, layer, head]
        t = int(np.argmax(v))
        q, k, w = self.links[t, layer, head]
        return Example(
            t, float(v[t]), int(q), int(k), float(w), snippet(self.tokens[t], int(q), int(k), context)
        )

    def to_rows(self) -> list[dict[str, Any]]:
        """One row per head: layer, head, then each statistic's mean, max and example snippet."""
        n_l, n_h = self.shape
        rows = []
        for layer in range(n_l):
            for head in range(n_h):
                row: dict[str, Any] = {"layer": layer, "head": head}
                for s in self.values:
                    ex = self.example(s, layer, head)
                    row[f"{s}_mean"] = float(self.values[s][:, layer, head].mean())
                    row[f"{s}_max"] = ex.value
                    row[f"{s}_example"] = ex.snippet
                rows.append(row)
        return rows

    def to_frame(self):
        """A pandas DataFrame of `to_rows` (``.to_csv`` / ``.to_parquet`` export it)."""
        import pandas as pd

        return pd.DataFrame(self.to_rows())


def snippet(tokens: Sequence[str], query: int, key: int, context: int = 4) -> str:
    """Plain text around a link: ``…before [key] after … before [query] …`` (one window if close)."""

    def window(a: int, b: int) -> str:
        lo, hi = max(0, a - context), min(len(tokens), b + context + 1)
        parts = [f"[{tokens[i]}]" if i in (query, key) else tokens[i] for i in range(lo, hi)]
        return ("… " if lo > 0 else "") + " ".join(parts) + (" …" if hi < len(tokens) else "")

    a, b = min(query, key), max(query, key)
    if b - a <= 2 * context + 1:
        return window(a, b)
    return f"{window(a, a)} ⇢ {window(b, b)}"


def _fingerprint(lm: LoadedModel) -> str:
    h = hashlib.sha256(f"{lm.spec}|{lm.layout!r}|{lm.dtype}".encode())
    params = list(lm.model.parameters())
    for p in (params[0], params[-1]) if params else ():
        if p.device.type != "meta":
            h.update(f"{tuple(p.shape)}:{float(p.detach().double().sum()):.10e}".encode())
    return h.hexdigest()[:20]


def cache_key(lm: LoadedModel, texts: Sequence[str], stack: Stack | None, max_tokens: int) -> str:
    h = hashlib.sha256(f"v{CACHE_VERSION}|{_fingerprint(lm)}|{stack}|{max_tokens}".encode())
    for t in texts:
        h.update(hashlib.sha256(t.encode("utf-8", "surrogatepass")).digest())
    return h.hexdigest()[:32]


def _save(path: Path, atlas: Atlas) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "model_name": atlas.model_name,
        "stack": atlas.stack,
        "texts": atlas.texts,
        "tokens": atlas.tokens,
        "skipped": atlas.skipped,
        "layer_labels": atlas.layer_labels,
        "seconds": atlas.seconds,
    }
    tmp = path.with_name(f"{path.stem}.{threading.get_ident()}.tmp.npz")
    arrays: dict[str, Any] = {f"v_{k}": v for k, v in atlas.values.items()}
    arrays.update(links=atlas.links, meta=np.array(json.dumps(meta)))
    np.savez(tmp, **arrays)
    tmp.replace(path)  # atomic: a half-written cache is never read


def _load(path: Path) -> Atlas | None:
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            values = {k[2:]: z[k] for k in z.files if k.startswith("v_")}
            links = z["links"]
    except (OSError, ValueError, KeyError) as err:
        log.warning("atlas cache %s unreadable (%s); recomputing", path, err)
        return None
    return Atlas(
        model_name=meta["model_name"],
        stack=meta["stack"],
        texts=tuple(meta["texts"]),
        tokens=tuple(tuple(t) for t in meta["tokens"]),
        values=values,
        links=links,
        skipped=tuple((int(i), str(r)) for i, r in meta["skipped"]),
        seconds=float(meta["seconds"]),
        from_cache=True,
        layer_labels=tuple(meta["layer_labels"]),
    )


def strongest_links(probs: torch.Tensor) -> np.ndarray:
    """(heads, q, k) -> float64 (heads, 3): query, key and weight of the largest weight outside
    row 0 and key 0 (-1, -1, 0 when there is no such cell)."""
    h, n_q, n_k = probs.shape
    if n_q < 2 or n_k < 2:
        return np.tile(np.array([-1.0, -1.0, 0.0]), (h, 1))
    inner = probs[:, 1:, 1:].reshape(h, -1)
    w, idx = inner.max(dim=-1)
    q = (idx // (n_k - 1) + 1).double().cpu().numpy()
    k = (idx % (n_k - 1) + 1).double().cpu().numpy()
    return np.stack([q, k, w.double().cpu().numpy()], axis=-1)


def run_atlas(
    lm: LoadedModel,
    texts: Sequence[str],
    *,
    stack: Stack | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    use_cache: bool = True,
    max_tokens: int = ATLAS_MAX_TOKENS,
) -> Atlas:
    """Run every text, keep each head's statistics per text, and rank heads across texts.

    ``progress(done, total, note)`` is called before each text and at the end; returning False
    cancels, like setting ``cancel``. A cancelled run returns what it has (``cancelled=True``)
    and is not cached. Texts over ``max_tokens`` tokens are skipped with a reason.
    """
    texts = [str(t) for t in texts]
    if not texts:
        raise AttnvizError("no texts to run; give at least one")
    path = cache_dir() / "atlas" / f"{cache_key(lm, texts, stack, max_tokens)}.npz"
    if use_cache and path.exists():
        cached = _load(path)
        if cached is not None:
            if progress is not None:
                progress(len(texts), len(texts), "loaded from the cache")
            return cached
    t0 = time.perf_counter()
    values: dict[str, list[np.ndarray]] = {s: [] for s in STATISTICS}
    links: list[np.ndarray] = []
    kept: list[str] = []
    toks: list[tuple[str, ...]] = []
    skipped: list[tuple[int, str]] = []
    cancelled = False
    stack_used: Stack = stack if stack is not None else lm.layout.stacks[0]
    for i, text in enumerate(texts):
        went_on = progress is None or progress(i, len(texts), f"text {i + 1} of {len(texts)}") is not False
        if not went_on or (cancel is not None and cancel.is_set()):
            cancelled = True
            break
        try:
            ids, template = tokenize(lm, text)
        except AttnvizError as err:
            skipped.append((i, str(err)))
            continue
        if len(ids) > max_tokens:
            skipped.append((i, f"{len(ids)} tokens, over the atlas limit of {max_tokens}"))
            continue
        res = extract_ids(lm, ids, template=template, max_tokens=max_tokens)
        hm = head_metrics(res, stack=stack_used)
        for s in STATISTICS:
            values[s].append(np.asarray(hm.values(s), dtype=np.float64))  # type: ignore[arg-type]
        links.append(np.stack([strongest_links(t) for _, t in res.iter_layers(stack_used)]))
        kept.append(text)
        q_tokens, _ = res.axes(stack_used)
        toks.append(tuple(q_tokens.display))
    n_l = lm.layout.layers_in(stack_used)
    n_h = lm.layout.n_heads
    atlas = Atlas(
        model_name=lm.spec,
        stack=stack_used,
        texts=tuple(kept),
        tokens=tuple(toks),
        values={s: np.stack(v) if v else np.zeros((0, n_l, n_h)) for s, v in values.items()},
        links=np.stack(links) if links else np.zeros((0, n_l, n_h, 3)),
        skipped=tuple(skipped),
        cancelled=cancelled,
        seconds=time.perf_counter() - t0,
        layer_labels=tuple(lm.layout.layer_label(i) for i in range(n_l)),
    )
    if progress is not None and not cancelled:
        progress(len(texts), len(texts), "done")
    if use_cache and not cancelled and kept:
        try:
            _save(path, atlas)
        except OSError as err:  # a read-only cache folder costs the cache, not the result
            log.warning("atlas cache not written to %s: %s", path, err)
    log.info(
        "atlas model=%s texts=%d skipped=%d cancelled=%s seconds=%.2f",
        lm.spec, len(kept), len(skipped), cancelled, atlas.seconds,
    )  # fmt: skip
    return atlas
