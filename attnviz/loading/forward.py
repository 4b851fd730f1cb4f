"""The one front door to run a loaded model: `run` (what `LoadedModel.forward` calls).

Every engine path that runs the model goes through it, so the rules live here once:
- the model's lock (one forward at a time on a shared model; the demo's gate queues there too);
- inference mode (or gradients, for attribution patching);
- the forward's keyword arguments (`forward_kwargs`): no KV cache unless asked, and the LM head
  only at the positions asked for (N x vocab floats only when ``logits_at="all"``);
- hooks (`Hook`) registered once the lock is held, firing for this thread's forwards only, and
  removed however the forward ends (issue 34: hooks registered while waiting fired inside another
  visitor's forward).
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch


class Runnable(Protocol):
    """What the door needs of `attnviz.loading.model.LoadedModel` (named here, not imported: the
    model's methods call this module)."""

    model: Any
    lock: Any
    device: torch.device


# Where the LM head runs: the last position, every position, none, or these positions.
LogitsAt = Literal["last", "all", "none"] | Sequence[int]


@dataclass(frozen=True)
class Hook:
    """A forward hook for one run: ``fn`` on ``module`` before or after its forward, with the
    call's keyword arguments when ``with_kwargs`` (torch's hook signatures)."""

    module: torch.nn.Module
    fn: Callable[..., Any]
    when: Literal["before", "after"] = "after"
    with_kwargs: bool = False


def _rows(logits_at: LogitsAt) -> list[int] | None:
    """The positions whose logits are asked for (None: all of them)."""
    if logits_at == "all":
        return None
    if logits_at == "last":
        return [-1]
    if logits_at == "none":
        return []
    return [int(p) for p in logits_at]  # type: ignore[union-attr]


def keeps_logits(model: Any) -> bool:
    """The model's forward takes ``logits_to_keep`` (its LM head can run on some positions only)."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def forward_kwargs(model: Any, logits_at: LogitsAt = "last") -> dict:
    """The forward's keyword arguments: ``use_cache=False`` where the model takes it, and
    ``logits_to_keep`` for the positions asked for where it takes that (otherwise it returns every
    position's logits and `run` keeps the asked ones).

    ``logits_to_keep`` is always an index tensor, never the int 1: Gemma 4 reads an int as leave
    to run its KV-shared layers on the last position only, and those layers' attention would then
    have one query row. On the CPU: it indexes the last hidden states wherever a sharded model
    leaves them."""
    params = inspect.signature(model.forward).parameters
    kwargs: dict = {}
    if "use_cache" in params:
        kwargs["use_cache"] = False
    rows = _rows(logits_at)
    if "logits_to_keep" in params and rows is not None:
        kwargs["logits_to_keep"] = torch.tensor(rows, dtype=torch.long)
    return kwargs


def _mine(fn: Callable[..., Any], owner: int) -> Callable[..., Any]:
    """``fn`` for the forwards of thread ``owner`` only (another thread's call passes by)."""

    def scoped(*args: Any) -> Any:
        return fn(*args) if threading.get_ident() == owner else None

    return scoped


@contextlib.contextmanager
def hooked(lm: Runnable, hooks: Sequence[Hook]) -> Iterator[None]:
    """``hooks`` on ``lm``'s modules for the block, under its lock, for this thread only; removed
    on exit, also after an exception (an engine call that runs the model through `extract`)."""
    with lm.lock:
        owner = threading.get_ident()
        handles = []
        try:
            for h in hooks:
                fn = _mine(h.fn, owner)
                if h.when == "before":
                    handles.append(h.module.register_forward_pre_hook(fn, with_kwargs=h.with_kwargs))
                else:
                    handles.append(h.module.register_forward_hook(fn, with_kwargs=h.with_kwargs))
            yield
        finally:
            for handle in handles:
                handle.remove()


def grad_mode(grad: bool) -> contextlib.ExitStack:
    """Inference mode, or (``grad``) gradients even when the caller runs under inference_mode /
    no_grad (attribution patching's forward, and what it computes from the logits)."""
    stack = contextlib.ExitStack()
    if grad:
        stack.enter_context(torch.inference_mode(False))
        stack.enter_context(torch.enable_grad())
    else:
        stack.enter_context(torch.inference_mode())
    return stack


def run(
    lm: Runnable,
    ids: Sequence[int] | torch.Tensor | None = None,
    *,
    inputs: Mapping[str, Any] | None = None,
    hooks: Sequence[Hook] = (),
    logits_at: LogitsAt = "last",
    grad: bool = False,
    **extra: Any,
) -> Any:
    """One forward of ``lm`` on token ``ids`` (a list, or a (batch, N) tensor) or on prepared
    ``inputs`` (an encoder-decoder's two id tensors and masks). Returns the model's output; its
    ``logits`` hold the positions of ``logits_at`` only, in that order (``"last"``: one row), on
    every model. ``extra`` keyword arguments go to the model as they are (``use_cache=True`` with
    ``past_key_values``, ``output_attentions``)."""
    model = lm.model
    rows = _rows(logits_at)
    with lm.lock, grad_mode(grad), hooked(lm, hooks):
        # built inside the mode: an index tensor made under a caller's inference_mode could not be
        # saved for attribution patching's backward (the ids, logits_to_keep)
        args: dict = dict(inputs) if inputs is not None else {}
        if ids is not None:
            t = ids if isinstance(ids, torch.Tensor) else torch.tensor([list(ids)], device=lm.device)
            args["input_ids"] = t.clone() if grad and t.is_inference() else t
        kwargs = forward_kwargs(model, logits_at)
        kept = "logits_to_keep" in kwargs
        out = model(**{**args, **kwargs, **extra})
        logits = getattr(out, "logits", None)
        if rows is not None and not kept and isinstance(logits, torch.Tensor):
            out["logits"] = logits[:, rows]  # the model ran its head everywhere: keep the asked rows
    return out
