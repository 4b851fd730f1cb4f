"""What every benchmark shares: the machine line, timing with peak memory, the floor (one plain
SDPA forward of the same ids), inputs of a given length, a Llama-3.2-3B-shaped random model, and
rewriting one marked section of a Markdown file."""

from __future__ import annotations

import gc
import platform
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import torch

from .. import backend
from ..loading import LoadedModel, wrap_model
from ..loading.files import atomic_write_text

_CLEAR_REFS, _STATUS = Path("/proc/self/clear_refs"), Path("/proc/self/status")
WORDS = [
    "the",
    "bank",
    "river",
    "money",
    "water",
    "loan",
    "fish",
    "stream",
    "account",
    "shore",
    "deposit",
    "interest",
    "flows",
    "north",
]


def _hwm() -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class _PeakRSS:
    """Peak resident memory above the starting point (CPU runs).

    On Linux the kernel's high-water mark is reset (clear_refs 5) and read back (VmHWM); with
    MALLOC_MMAP_THRESHOLD_ fixed (see `_cpu_peaks_in_child`) large tensors are returned to the OS when
    freed, so each measurement starts clean. Elsewhere RSS is sampled every 2 ms.
    """

    def __init__(self) -> None:
        self.proc = psutil.Process()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        try:
            _CLEAR_REFS.write_text("5")
            self.kernel = _hwm() is not None
        except OSError:
            self.kernel = False
        self.base = self.peak = self.proc.memory_info().rss

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.002)

    def __enter__(self) -> _PeakRSS:
        if not self.kernel:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.kernel:
            self.peak = max(self.peak, _hwm() or 0)
        else:
            self._stop.set()
            self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)

    @property
    def extra(self) -> int:
        return self.peak - self.base


def cuda_run(fn: Callable[[], Any], device: torch.device) -> tuple[float, int, Any]:
    """One run of ``fn()`` on a CUDA device, the timing protocol every benchmark uses: garbage
    collected first, the device synchronised and its peak counter reset, then (wall seconds to the
    synchronised end, peak bytes allocated above the start, fn's output)."""
    gc.collect()
    cuda = backend.backend()
    backend.synchronize(device)
    cuda.reset_peak_memory_stats(device)
    base = cuda.memory_allocated(device)
    t0 = time.perf_counter()
    out = fn()
    backend.synchronize(device)
    seconds = time.perf_counter() - t0
    return seconds, cuda.max_memory_allocated(device) - base, out


def measure(fn: Callable[[], object], device: torch.device, repeats: int) -> tuple[float, int]:
    """(median seconds, peak extra bytes) of fn(): `cuda_run` on CUDA, the resident-set high-water
    mark on the CPU (garbage collected first likewise)."""
    times, peaks = [], []
    for _ in range(repeats):
        if backend.on_cuda(device):
            seconds, peak, out = cuda_run(fn, device)
            times.append(seconds)
            peaks.append(peak)
        else:
            gc.collect()
            with _PeakRSS() as mem:
                t0 = time.perf_counter()
                out = fn()
                times.append(time.perf_counter() - t0)
            peaks.append(mem.extra)
        del out
    return statistics.median(times), max(peaks)


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(wall seconds, this process' CPU seconds, fn's output) of one call on the CPU. With one
    thread the CPU seconds move less with other processes' load. (No garbage collection here: with
    transformers imported a full collection takes most of a second; callers collect between runs.)"""
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w, time.process_time() - c, out


def ids_of_length(lm: LoadedModel, n: int) -> list[int]:
    """Exactly n token ids of plain repeated words."""
    words = (WORDS * (n // len(WORDS) + 2))[: n + 8]
    ids = lm.tokenizer(" ".join(words))["input_ids"]
    while len(ids) < n:
        ids = ids + ids
    return ids[:n]


def floor(lm: LoadedModel, ids: list[int]) -> Callable[[], object]:
    def run() -> object:
        with lm.lock:  # the shared model in SDPA for this forward only
            lm.model.set_attn_implementation("sdpa")
            try:
                return lm.forward(ids)
            finally:
                lm.model.set_attn_implementation("attnviz")

    return run


def machine_line(device: torch.device) -> str:
    if backend.on_cuda(device):
        return f"{backend.backend().device_name(device)}, torch {torch.__version__}"
    return (
        f"CPU: {platform.processor() or platform.machine()}, {psutil.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB RAM, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )


def llama3b_shaped(device: torch.device) -> LoadedModel:
    """Llama-3.2-3B's attention shape with random weights (28 layers, 24 heads, 8 KV heads)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from ..loading import builtin_folder

    cfg = LlamaConfig(
        vocab_size=49152, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
        num_attention_heads=24, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
    )  # fmt: skip
    with torch.device(device):
        model: Any = LlamaForCausalLM(cfg)
    model = model.to(torch.bfloat16)
    tok = AutoTokenizer.from_pretrained(builtin_folder("smollm2-135m"))  # vocab 49152 like cfg
    return wrap_model(model, tok, spec="llama-3.2-3b-shaped (random)")


def replace_section(path: Path, name: str, body: str) -> None:
    """Replace the text between <!-- name:start --> and <!-- name:end --> in a Markdown file
    (appended if missing); everything outside the markers is kept."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{body}\n{end}"
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    if start in old and end in old:
        new = old[: old.index(start)] + block + old[old.index(end) + len(end) :]
    else:
        new = old.rstrip() + "\n\n" + block + "\n"
    atomic_write_text(path, new)  # a full disk keeps the old file whole
