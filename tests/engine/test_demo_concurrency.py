"""Issue 34: one visitor's model work never reaches into another's.

Explain's `trace` puts forward hooks on the shared model; they must exist only while its own
forward holds the model's lock, and fire only for its own thread. A forward that holds the lock
while a trace waits for it must come out exactly as a direct call, and so must the trace.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np
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
    with lm.hooked(hooks.hooks):  # what LoadedModel.forward does with them
        t = threading.Thread(target=_logits, args=(lm, OTHER), daemon=True)
        t.start()
        t.join(30)
        assert hooks.blocks == [] and hooks.stream == []  # another thread's forward passed by
        _logits(lm, OTHER)
        assert len(hooks.blocks) == len(blocks)  # this thread's forward is seen


def _actions(lm):
    """Each page's heavy model work (what its page calls), as name -> call returning comparable
    numbers: Explorer / Model overview (extract), Compare (two texts in one turn), Generation,
    From scratch (the walkthrough), Explain (trace + ablation), Head atlas (a few texts)."""
    from attnviz.atlas import run_atlas
    from attnviz.explain import ablate_heads
    from attnviz.reference.walkthrough import layer_walkthrough

    def explorer():
        return attnviz.extract(lm, TE.TEXT).all_layers()

    def overview():
        return attnviz.extract(lm, OTHER, statistics=True).all_layers()

    def compare():
        return np.concatenate([attnviz.extract(lm, t).all_layers().ravel() for t in (TE.TEXT, OTHER)])

    def generation():
        res = attnviz.extract(lm, OTHER, generate=3)
        return np.asarray(res.tokens.ids)

    def scratch():
        wt = layer_walkthrough(lm, TE.TEXT, 1, counterfactuals=False)
        return np.concatenate([s.value.ravel() for s in wt.steps])

    def explain():
        tr = trace(lm, TE.TEXT)
        ab = ablate_heads(lm, tr, [(0, 0), (1, 1)])
        return np.concatenate([tr.logits.numpy(), np.array([ab.kl, ab.prob_after])])

    def atlas():
        at = run_atlas(lm, [TE.TEXT, OTHER, "one more short text"], use_cache=False)
        return np.concatenate([np.asarray(at.mean(s), dtype=np.float64).ravel() for s in ("entropy",)])

    return {
        "explorer": explorer,
        "overview": overview,
        "compare": compare,
        "generation": generation,
        "scratch": scratch,
        "explain": explain,
        "atlas": atlas,
    }


ENGINE_ONLY = ("atlas", "explain", "scratch")


def test_every_pages_model_work_at_once_through_one_gate_matches_direct_calls():
    """Every page's heavy action from its own thread at once, each taking a turn like the app
    does (Compare: one turn for both texts; `ENGINE_ONLY` through lm.lock alone) on a model
    whose lock is the demo's gated lock: one forward at a time, the queue drains, and every
    result equals a direct call's (planted the old trace: Explain fails, 3 of 3)."""
    from attnviz.server.gate import InferenceGate

    lm = TE.loaded("llama-gqa")
    want = {name: run() for name, run in _actions(lm).items()}  # direct calls, one by one
    gate = InferenceGate(max_queue=0, run_limit=60)
    lm.lock = gate.lock(lm.lock)  # type: ignore[assignment]
    active, peak, guard = [0], [0], threading.Lock()

    def enter(*_):
        with guard:
            active[0] += 1
            peak[0] = max(peak[0], active[0])

    def leave(*_):
        with guard:
            active[0] -= 1

    handles = [lm.model.register_forward_pre_hook(enter), lm.model.register_forward_hook(leave)]
    got: dict[str, object] = {}
    start = threading.Barrier(len(want))

    def visit(name, run):
        start.wait(10)
        try:
            # pages take a turn around their work; the atlas (a turn per text), Explain and From
            # scratch here rely on the engine's own lm.lock, the gated lock alone
            page_turn = gate.turn(visitor=name, poll_seconds=0.001)
            with contextlib.nullcontext() if name in ENGINE_ONLY else page_turn:
                got[name] = run()
        except Exception as err:  # noqa: BLE001 - compared below
            got[name] = err

    try:
        threads = [threading.Thread(target=visit, args=item, daemon=True) for item in _actions(lm).items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        for h in handles:
            h.remove()
    assert set(got) == set(want)
    for name, value in got.items():
        assert not isinstance(value, Exception), (name, value)
        assert np.array_equal(np.asarray(value), np.asarray(want[name])), name
    assert peak[0] == 1  # never two forwards at once
    st = gate.status()
    assert st.waiting == 0 and st.running_for is None and st.typical_run is not None


def test_the_atlas_disk_cache_evicts_the_least_recently_used_entries(tmp_path):
    """The demo's atlas cache stays within its budget; an entry read recently is kept longest."""
    import os

    from attnviz.atlas import cache as C
    from attnviz.atlas import run_atlas

    lm = TE.loaded("llama-gqa")
    texts = [f"text number {i} for the atlas" for i in range(4)]
    run_atlas(lm, texts, cache_root=tmp_path)
    files = sorted(tmp_path.glob("*/entries/*/*.entry"))
    assert len(files) == 4
    for age, path in enumerate(files):  # oldest first
        os.utime(path, (1000 + age, 1000 + age))
    cache = C.AtlasCache(files[0].parents[2])
    assert cache.get(files[0].stem) is not None  # read now: the most recently used
    size = files[0].stat().st_size
    assert C.evict(2 * size + size // 2, root=tmp_path) == 2
    left = sorted(tmp_path.glob("*/entries/*/*.entry"))
    assert left == [files[0], files[3]]
    assert C.evict(10 * size, root=tmp_path) == 0
