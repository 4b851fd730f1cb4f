"""Issue 34: one visitor's model work never reaches into another's.

Explain's `trace` puts forward hooks on the shared model; they must exist only while its own
forward holds the model's lock, and fire only for its own thread. A forward that holds the lock
while a trace waits for it must come out exactly as a direct call, and so must the trace.
"""

from __future__ import annotations

import threading

import tiny_explain as TE
import torch

import attnviz
from attnviz.explain import trace
from attnviz.explain.blocks import BlockHooks
from attnviz.explain.residual import _decoder_layers

OTHER = "a different visitor's text, shorter"


class SpyLock:
    """The model's RLock, telling when another thread starts waiting for it."""

    def __init__(self) -> None:
        self.inner = threading.RLock()
        self.holder: int | None = None
        self.waiting = threading.Event()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        me = threading.get_ident()
        if self.holder is not None and self.holder != me:
            self.waiting.set()
        ok = self.inner.acquire(blocking, timeout)
        if ok:
            self.holder = me
        return ok

    def release(self) -> None:
        self.inner.release()
        try:  # still ours while a nested hold remains
            owned = self.inner._is_owned()  # type: ignore[attr-defined]
        except AttributeError:
            owned = False
        if not owned:
            self.holder = None

    __enter__ = acquire

    def __exit__(self, *exc: object) -> None:
        self.release()


def _logits(lm, text: str) -> torch.Tensor:
    ids = torch.tensor([lm.tokenizer(text)["input_ids"]])
    with torch.inference_mode():
        return lm.model(input_ids=ids).logits


def test_a_forward_while_a_trace_waits_is_untouched_and_so_is_the_trace():
    lm = TE.loaded("llama-gqa")
    want_trace = trace(lm, TE.TEXT)  # direct calls, nothing else running
    want_logits = _logits(lm, OTHER)
    want_res = attnviz.extract(lm, OTHER)
    spy = SpyLock()
    lm.lock = spy  # type: ignore[assignment]
    got: dict[str, object] = {}

    def visitor_b():
        try:
            got["trace"] = trace(lm, TE.TEXT)
        except Exception as err:  # noqa: BLE001 - compared below
            got["trace"] = err

    with lm.lock:  # visitor A holds the model
        b = threading.Thread(target=visitor_b, daemon=True)
        b.start()
        assert spy.waiting.wait(10)  # B waits for the lock now
        logits = _logits(lm, OTHER)  # A's forward while B waits
        res = attnviz.extract(lm, OTHER)
    b.join(30)
    assert torch.equal(logits, want_logits)
    assert (res.all_layers() == want_res.all_layers()).all()
    tr = got["trace"]
    assert isinstance(tr, attnviz.explain.Trace), tr
    assert torch.equal(tr.logits, want_trace.logits)
    assert all(torch.equal(a, b) for a, b in zip(tr.stream, want_trace.stream, strict=True))


def test_block_hooks_fire_only_for_their_own_thread():
    lm = TE.loaded("llama-gqa")
    blocks, attn, _ = _decoder_layers(lm)
    hooks = BlockHooks(blocks, attn, torch.float32)
    try:
        t = threading.Thread(target=_logits, args=(lm, OTHER), daemon=True)
        t.start()
        t.join(30)
        assert hooks.blocks == [] and hooks.stream == []  # another thread's forward passed by
        _logits(lm, OTHER)
        assert len(hooks.blocks) == len(blocks)  # this thread's forward is seen
    finally:
        hooks.close()
