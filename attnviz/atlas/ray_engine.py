"""The Ray engine: pending texts through Ray Data ``map_batches`` with a callable class, one model
per actor.

    texts (sorted by key) -> ray.data.from_items, one text a block
        -> map_batches(AtlasWorker, batch_size=1, concurrency=workers, num_gpus=1 | num_cpus=c)
        -> iter_batches on the driver: each entry is checked and written to the disk cache at once

- **Same answer.** Every text runs alone (no padding, no batching across texts) with the same
  `compute_entry` as the local engine, so a result does not depend on which worker ran it or how
  many there were; the driver assembles the atlas in corpus order from the entries.
- **Stable sharding.** The work list is sorted by text key (SHA-256 of the text), so a run and
  its resumption hand out the texts in the same order.
- **Fault tolerance is Ray's.** Ray Data creates the actors with ``max_restarts=-1`` and
  ``max_task_retries=-1``: a worker that dies is restarted (it loads the model again) and its
  text is retried. Results travel back to the driver, which writes the cache: workers need no
  shared file system.
- **Resources.** With GPUs in the cluster each actor takes ``num_gpus=1`` (``device="cuda"``);
  on CPUs each of the N workers takes ``CPU // N`` cores and sets torch's threads to match, so
  workers do not fight over cores.

Ray is imported here only, and only when this engine runs (`import_ray`).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from ..errors import AttnvizError
from ..layout import Stack
from .cache import Entry, decode, encode
from .corpus import TextItem
from .local import Sink
from .worker import ModelRef, compute_entry, fingerprint

log = logging.getLogger(__name__)
INSTALL_HINT = 'the Ray engine needs Ray: pip install "attnviz[ray]"'
_INIT = threading.Lock()  # one ray.init per process, whichever thread (app session) comes first


def import_ray() -> Any:
    try:
        import ray
        import ray.data  # the engine needs Ray Data too
    except ImportError:
        raise AttnvizError(INSTALL_HINT) from None
    return ray


class AtlasWorker:
    """A Ray Data callable class: loads the model once, then one text per call."""

    def __init__(self, ref: ModelRef, stack: Stack | None, max_tokens: int, threads: int = 0):
        if threads:
            torch.set_num_threads(threads)
        self.lm = ref.load()
        self.stack: Stack = stack or self.lm.layout.stacks[0]
        self.max_tokens = max_tokens
        self.weights = fingerprint(self.lm)

    def entry(self, key: str, text: str) -> Entry:
        return compute_entry(
            self.lm, key, text, stack=self.stack, max_tokens=self.max_tokens, weights=self.weights
        )

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        keys = [str(k) for k in batch["key"]]
        blobs = [encode(self.entry(k, str(t))) for k, t in zip(keys, batch["text"], strict=True)]
        return {"key": np.array(keys, dtype=object), "entry": np.array(blobs, dtype=object)}


@dataclass(frozen=True)
class RayPlan:
    """How a run uses the cluster: the model as workers load it, and each actor's resources."""

    ref: ModelRef  # device and dtype explicit ("cuda"/"cpu", "bfloat16"/"float32"/...)
    workers: int
    num_cpus: float
    num_gpus: float
    threads: int  # torch threads per worker (0: leave torch's default, on GPUs)


class RaySession:
    """A connection to a Ray cluster (``address``), or a local Ray started for this run (None)."""

    def __init__(self, address: str | None = None):
        self.ray = import_ray()
        self.address = None if address in (None, "", "local") else address
        self.started = False
        with _INIT:
            self._connect()
        logging.getLogger("ray.data").setLevel(logging.ERROR)  # attnviz reports progress itself
        ctx = self.ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        ctx.print_on_execution_start = False

    def _connect(self) -> None:
        if not self.ray.is_initialized():
            kwargs: dict[str, Any] = dict(
                include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING
            )
            try:
                self.ray.init(address=self.address, **kwargs)
            except (ConnectionError, RuntimeError, ValueError) as err:
                where = f"the Ray cluster at {self.address!r}" if self.address else "a local Ray"
                raise AttnvizError(
                    f"cannot start or reach {where}: {_first_line(err)}; start one with `ray start --head`"
                ) from None
            self.started = self.address is None

    def close(self) -> None:
        if self.started and self.ray.is_initialized():
            self.ray.shutdown()

    def plan(self, ref: ModelRef, workers: int | None) -> RayPlan:
        """Workers, resources and the explicit device/dtype they load the model with."""
        res = self.ray.cluster_resources()
        gpus, cpus = int(res.get("GPU", 0)), max(1, int(res.get("CPU", 1)))
        if ref.device not in ("auto", "cpu") and not ref.device.startswith("cuda"):
            raise AttnvizError(f"device {ref.device!r}: Ray workers run on cpu or cuda; use auto")
        if ref.device.startswith("cuda") and not gpus:
            raise AttnvizError(f"device {ref.device!r}: the Ray cluster has no GPU; use cpu or auto")
        use_gpu = gpus > 0 and ref.device != "cpu"
        have, kind = (gpus, "GPU") if use_gpu else (cpus, "CPU")
        n = workers or (gpus if use_gpu else 1)
        if n > have:
            raise AttnvizError(
                f"{n} workers: the Ray cluster has {have} {kind}s; give --workers {have} or fewer"
            )
        if use_gpu:
            dtype = self._gpu_dtype() if ref.dtype == "auto" else ref.dtype
            return RayPlan(replace(ref, device="cuda", dtype=dtype), n, 1, 1, 0)
        per = cpus // n  # cores per worker; torch uses as many threads
        dtype = "float32" if ref.dtype == "auto" else ref.dtype
        return RayPlan(replace(ref, device="cpu", dtype=dtype), n, per, 0, per)

    def _gpu_dtype(self) -> str:
        """dtype "auto" as a GPU worker resolves it (bfloat16 where supported, else float16)."""

        def probe() -> str:
            from attnviz.loading import resolve_dtype

            return str(resolve_dtype("auto", torch.device("cuda"))).removeprefix("torch.")

        return str(self.ray.get(self.ray.remote(num_gpus=1)(probe).remote(), timeout=600))

    def run(
        self, plan: RayPlan, pending: Sequence[TextItem], *, stack: Stack | None, max_tokens: int, sink: Sink
    ) -> bool:
        """Run ``pending`` texts; each entry goes to ``sink`` as it arrives. True when all ran."""
        if not pending or not sink.before():
            return not pending
        work = sorted(pending, key=lambda it: it.key)  # stable sharding: by key, not by position
        ds = self.ray.data.from_items(
            [{"key": it.key, "text": it.text} for it in work], override_num_blocks=len(work)
        )
        out = ds.map_batches(
            AtlasWorker,
            fn_constructor_kwargs=dict(
                ref=plan.ref, stack=stack, max_tokens=max_tokens, threads=plan.threads
            ),
            batch_size=1,
            compute=self.ray.data.ActorPoolStrategy(size=plan.workers),
            num_cpus=plan.num_cpus,
            num_gpus=plan.num_gpus,
            batch_format="numpy",
        )
        batches = iter(out.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=0))
        waiting = {it.key for it in work}
        try:
            while waiting:
                try:
                    batch = next(batches)
                except StopIteration:
                    break
                except Exception as err:  # a failure of Ray itself (a worker's text failures are entries)
                    raise AttnvizError(f"the Ray run failed: {_first_line(err)}") from err
                for key, blob in zip(batch["key"], batch["entry"], strict=True):
                    if str(key) not in waiting:
                        continue  # a retried text delivered twice: the first copy counts
                    waiting.discard(str(key))
                    sink.finished(decode(bytes(blob), str(key)))
                    if waiting and not sink.before():
                        return False
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()
        if waiting:
            raise AttnvizError(
                f"the Ray run ended without {len(waiting)} of its texts; run it again to add them"
            )
        return True


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_RAISED = re.compile(r"^(?:[A-Za-z_][\w]*\.)*([A-Za-z_]\w*): (.+)$")  # "pkg.mod.SomeError: message"


def _first_line(err: BaseException) -> str:
    """One line for a Ray failure: the root cause's own message (Ray wraps a worker's exception,
    traceback included, in several layers), e.g. "a worker could not start: local folder ... does
    not exist"."""
    chain: list[BaseException] = []
    link: BaseException | None = err
    while link is not None and len(chain) < 8:
        chain.append(link)
        link = link.__cause__ or link.__context__
    for e in chain:
        text = _ANSI.sub("", str(getattr(e, "error_msg", "") or e))
        lines = [ln.strip() for ln in text.splitlines() if ln.strip(" ^~")]
        if not lines:
            continue
        raised = _RAISED.match(lines[-1])
        if raised is None:
            detail = lines[-1]
        elif lines[-1].startswith("attnviz."):  # our own errors say what to do: the message alone
            detail = raised.group(2)
        else:
            detail = f"{raised.group(1)}: {raised.group(2)}"
        if getattr(e, "_actor_init_failed", False) or "creation task" in lines[0]:
            detail = f"a worker could not start: {detail}"
        return detail[:400]
    return type(err).__name__
