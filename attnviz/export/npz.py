"""A result as one ``.npz`` file, in one of two formats, and back.

``dense``    every layer's probabilities, float32: ``attentions`` (layers, heads, N, N), or
             ``encoder_attentions``, ``decoder_attentions`` and ``cross_attentions`` for
             encoder-decoder models (none for a model without softmax layers: Mamba, RWKV).
             Read with numpy alone; grows as layers × heads × N² × 4 bytes
             (smollm2-135m, 8192 tokens: 30 × 9 × 8192² × 4 B = 72 GB).
``compact``  what the fast path keeps: each layer's captured queries, keys and values (and the
             mask, position bias, sinks where the call had them), in the model's dtype; grows as
             layers × N × (heads + 2 × kv_heads) × head_dim × bytes (smollm2-135m, 8192 tokens,
             float32: 0.94 GB). `load_npz` turns it back into an `AttentionResult` that computes
             any head with the function the live result uses, from the same numbers: the same
             probabilities, bit for bit on the same device.

``auto`` (the default) writes dense while the dense arrays are at most `DENSE_AUTO_BYTES`
(256 MiB: about 500 tokens on smollm2-135m) and compact past that; results of the eager paths
keep no queries and keys, so they are always dense.

Both formats hold the token keys (``tokens``: display strings, ``raw_tokens``, ``input_ids``,
``special``; ``decoder_tokens``, ``decoder_input_ids`` for encoder-decoder models), ``format``
and ``meta`` (JSON: model, path, method, layout, every token field, the captured calls' scalars).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import IO, Any, Literal, get_args

import numpy as np
import torch

from .._version import __version__
from ..errors import AttnvizError
from ..layout import AttentionLayout
from ..loading.files import atomic_write
from ..mixers.store import MixerStore
from ..records import CapturedAttention, CapturedMixer
from ..result import AttentionResult
from ..tokens import Tokens

ExportFormat = Literal["auto", "dense", "compact"]
FORMATS: tuple[str, ...] = get_args(ExportFormat)
DENSE_AUTO_BYTES = 256 * 2**20
# torch dtypes numpy holds as they are; others (bfloat16, float8) are stored as their raw bytes.
_NUMPY_DTYPES = frozenset(
    {torch.float16, torch.float32, torch.float64, torch.bool, torch.uint8, torch.int8}
    | {torch.int16, torch.int32, torch.int64}
)
FileLike = str | Path | IO[bytes]


def dense_nbytes(result: AttentionResult) -> int:
    """Bytes of the dense format's attention arrays (float32, every layer of every stack)."""
    total = 0
    for stack in result.stacks:
        queries, keys = result.axes(stack)
        total += result.n_layers(stack) * result.n_heads * len(queries) * len(keys) * 4
    return total


def _has_capture(result: AttentionResult) -> bool:
    return all(
        result.captured(i, stack) is not None
        for stack in result.stacks
        for i in range(result.n_layers(stack))
    )


def choose_format(result: AttentionResult, format: str = "auto") -> Literal["dense", "compact"]:
    """The format ``format`` means for this result ("auto": dense up to `DENSE_AUTO_BYTES`)."""
    if format not in FORMATS:
        raise AttnvizError(f"unknown export format {format!r}; use one of {', '.join(FORMATS)}")
    capture = _has_capture(result)
    if format == "compact" and not capture:
        raise AttnvizError(
            f"a compact file holds the queries and keys the fast path captures; this result was "
            f"computed by {result.method or result.path!r}, which keeps none: use the dense format"
        )
    if format == "auto":
        return "compact" if capture and dense_nbytes(result) > DENSE_AUTO_BYTES else "dense"
    return "compact" if format == "compact" else "dense"


def save_npz(result: AttentionResult, file: FileLike, *, format: str = "auto") -> Literal["dense", "compact"]:
    """Write ``result`` to ``file`` (exactly that name: no ".npz" is added) and return the format
    written. Dense arrays are compressed (their causal zeros shrink well); compact ones are not
    (queries and keys barely compress, and writing stays at disk speed)."""
    fmt = choose_format(result, format)
    meta: dict[str, Any] = {
        "attnviz": __version__,
        "format": fmt,
        "model_name": result.model_name,
        "path": result.path,
        "method": result.method,
        "seconds": result.seconds,
        "check": result.check.caption() if result.check is not None else None,
        "layout": asdict(result.layout),
        "tokens": asdict(result.tokens),
        "decoder_tokens": None if result.decoder_tokens is None else asdict(result.decoder_tokens),
    }
    arrays = _token_arrays(result)
    if fmt == "dense" and not result.layout.n_layers:
        pass  # no softmax layer (Mamba, RWKV): no attentions array, only the mixers' below
    elif fmt == "dense":
        if result.layout.kind == "encoder-decoder":
            for stack in result.stacks:
                arrays[f"{stack}_attentions"] = result.all_layers(stack)
        else:
            arrays["attentions"] = result.all_layers()
    else:
        meta["calls"] = _capture_arrays(result, arrays)
    meta["mixers"] = _mixer_arrays(result, arrays, dense=fmt == "dense")
    arrays["format"] = np.array(fmt)
    arrays["meta"] = np.array(json.dumps(meta))
    save = np.savez_compressed if fmt == "dense" else np.savez
    if isinstance(file, str | Path):  # a temporary file renamed over ``file``: never half a file
        atomic_write(Path(file), lambda f: save(f, **arrays), what=repr(Path(file).name))  # type: ignore[arg-type]
    else:
        save(file, **arrays)  # type: ignore[arg-type]
    return fmt


def _token_arrays(result: AttentionResult) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {
        "tokens": np.array(result.tokens.display, dtype=str),
        "raw_tokens": np.array(result.tokens.raw, dtype=str),
        "input_ids": np.array(result.tokens.ids, dtype=np.int64),
        "special": np.array(result.tokens.special, dtype=bool),
    }
    if result.decoder_tokens is not None:
        arrays["decoder_tokens"] = np.array(result.decoder_tokens.display, dtype=str)
        arrays["decoder_input_ids"] = np.array(result.decoder_tokens.ids, dtype=np.int64)
    return arrays


def _capture_arrays(result: AttentionResult, arrays: dict[str, np.ndarray]) -> dict[str, list[dict]]:
    """Each captured call's tensors into ``arrays`` (one key per tensor: a mask shared by every
    layer is stored once) and its other fields as JSON; statistics from the forward are left out
    (they are recomputed on demand)."""
    stored: dict[int, str] = {}
    calls: dict[str, list[dict]] = {}
    for stack in result.stacks:
        calls[stack] = []
        for layer in range(result.n_layers(stack)):
            cap = result.captured(layer, stack)
            assert cap is not None  # choose_format checked every layer
            entry: dict[str, Any] = {}
            for f in fields(cap):
                value = getattr(cap, f.name)
                if isinstance(value, torch.Tensor):
                    key = stored.get(id(value))
                    if key is None:
                        key = stored[id(value)] = f"{stack}.{layer}.{f.name}"
                        arrays[key] = _to_numpy(value)
                    entry[f.name] = {"array": key, "dtype": str(value.dtype).removeprefix("torch.")}
                    entry[f.name]["shape"] = list(value.shape)
                elif value is None or isinstance(value, bool | int | float | str):
                    entry[f.name] = value
            calls[stack].append(entry)
    return calls


def _mixer_arrays(result: AttentionResult, arrays: dict[str, np.ndarray], *, dense: bool) -> dict:
    """The non-softmax mixers: each record's tensors (``mixer.<i>.<name>``) and scalars, so that
    `load_npz` rebuilds them and recomputes (and re-checks) every matrix; a dense file also holds
    each shown block's matrices as ``mixer_<block>_<kind>`` (heads, N, N) float32 for numpy."""
    from ..errors import MixerCheckFailed, MixerNotShown

    records, dtype = result.mixer_records()
    entries = []
    for i, rec in enumerate(records):
        entry: dict[str, Any] = {"kind": rec.kind, "module_name": rec.module_name, "block": rec.block}
        entry["n_tokens"], entry["output_rows"] = rec.n_tokens, list(rec.output_rows)
        entry["function"], entry["inputs"] = rec.function, {}
        named = {f"inputs.{k}": v for k, v in rec.inputs.items()}
        named |= {"output": rec.output, "out_out": rec.out_out, "out_weight": rec.out_weight}
        named |= {"out_bias": rec.out_bias, "scale": rec.scale}
        named |= {f"branch.{k}": v for k, v in rec.branches.items()}  # a parallel block's shares
        entry["branch_how"] = rec.branch_how
        for name, value in named.items():
            where = entry["inputs"] if name.startswith("inputs.") else entry
            key = name.removeprefix("inputs.")
            if isinstance(value, torch.Tensor):
                arrays[f"mixer.{i}.{name}"] = _to_numpy(value)
                ref = {"array": f"mixer.{i}.{name}", "dtype": str(value.dtype).removeprefix("torch.")}
                where[key] = {**ref, "shape": list(value.shape)}
            elif value is None or isinstance(value, bool | int | float | str | tuple):
                where[key] = value
        entries.append(entry)
        if dense:
            # a block the live result refuses is left out; loading says why again
            with contextlib.suppress(MixerNotShown, MixerCheckFailed):
                arrays[f"mixer_{rec.block}_{rec.kind}"] = result.layer(rec.block, mixer=rec.kind)
    return {"dtype": dtype, "records": entries}


def _mixers_from(data: Any, meta: dict, device: torch.device) -> MixerStore | None:
    saved = meta.get("mixers") or {}
    if not saved.get("records"):
        return None
    cache: dict[str, torch.Tensor] = {}

    def value(v: Any) -> Any:
        return _tensor(data, v, device, cache) if isinstance(v, dict) else _tuples(v)

    records = []
    for e in saved["records"]:
        rec = CapturedMixer(
            e["kind"], e["module_name"], e["block"], e["function"],
            {k: value(v) for k, v in e["inputs"].items()}, value(e["output"]),
        )  # fmt: skip
        rec.n_tokens, rec.output_rows = e.get("n_tokens", 0), tuple(e.get("output_rows", ()))
        rec.scale = value(e.get("scale"))
        rec.branches = {k.removeprefix("branch."): value(v) for k, v in e.items() if k.startswith("branch.")}
        rec.branch_how = e.get("branch_how", "")
        rec.out_out, rec.out_weight, rec.out_bias = (
            value(e.get(k)) for k in ("out_out", "out_weight", "out_bias")
        )
        records.append(rec)
    return MixerStore(records, getattr(torch, saved["dtype"]))


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    return t.numpy() if t.dtype in _NUMPY_DTYPES else t.view(torch.uint8).numpy()


def _tensor(data: Any, ref: dict, device: torch.device, cache: dict[str, torch.Tensor]) -> torch.Tensor:
    key = ref["array"]
    if key not in cache:
        t = torch.from_numpy(data[key])
        dtype = getattr(torch, ref["dtype"])
        if t.dtype != dtype:  # raw bytes of a dtype numpy lacks
            t = t.view(dtype).reshape(ref["shape"])
        cache[key] = t.to(device)
    return cache[key]


def _tuples(value: Any) -> Any:
    """JSON lists back to the tuples the frozen dataclasses hold."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _build(cls: Any, values: dict) -> Any:
    known = {f.name for f in fields(cls)}
    return cls(**{k: _tuples(v) for k, v in values.items() if k in known})


def load_npz(file: FileLike, *, device: str | torch.device = "cpu") -> AttentionResult:
    """An `AttentionResult` from a file `save_npz` (or ``attnviz extract``) wrote: a compact file
    computes every head from its captured queries and keys on ``device``, exactly as the live
    result did; a dense file serves its stored probabilities."""
    dev = torch.device(device)
    with np.load(file, allow_pickle=False) as data:
        if "meta" not in data.files:
            raise AttnvizError(
                f"{_name(file)} has no attnviz meta (written by another tool or an older attnviz); "
                "read its arrays with numpy.load"
            )
        meta = json.loads(str(data["meta"]))
        layout = _build(AttentionLayout, meta["layout"])
        tokens = _build(Tokens, meta["tokens"])
        decoder = None if meta["decoder_tokens"] is None else _build(Tokens, meta["decoder_tokens"])
        common = {
            "model_name": meta["model_name"],
            "layout": layout,
            "tokens": tokens,
            "decoder_tokens": decoder,
            "path": meta["path"],
            "method": meta["method"],
            "seconds": meta["seconds"],
        }
        if meta["format"] == "dense":
            eager: dict[str, list[torch.Tensor]] = {}
            for stack in layout.stacks:
                name = "attentions" if layout.kind != "encoder-decoder" else f"{stack}_attentions"
                if name not in data.files and not layout.layers_in(stack):  # a mixers-only file
                    eager[stack] = []
                    continue
                stored = data[name]
                eager[stack] = [torch.from_numpy(stored[i]).to(dev) for i in range(stored.shape[0])]
            return AttentionResult(**common, _eager=eager, _mixers=_mixers_from(data, meta, dev))
        cache: dict[str, torch.Tensor] = {}
        captured: dict[str, list[CapturedAttention]] = {}
        for stack, entries in meta["calls"].items():
            captured[stack] = []
            for entry in entries:
                values = {
                    k: _tensor(data, v, dev, cache) if isinstance(v, dict) else v for k, v in entry.items()
                }
                captured[stack].append(_build(CapturedAttention, values))
        return AttentionResult(**common, _captured=captured, _mixers=_mixers_from(data, meta, dev))


def _name(file: FileLike) -> str:
    return repr(str(file)) if isinstance(file, str | Path) else "this file"
