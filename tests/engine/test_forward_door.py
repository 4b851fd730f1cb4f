"""`LoadedModel.forward`, the one front door to run a model: its hooks fire for the calling
thread's forward only and are always removed; the LM head runs only where logits are asked; the
kwargs (no cache, logits_to_keep) come from one place for every model."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import hybrids_tiny
import pytest
import tiny
import torch

from attnviz.loading import Hook
from attnviz.loading.forward import forward_kwargs
from attnviz.reference import mixers as R

IDS = [1, 40, 41, 42, 43, 44, 45, 46]


@contextlib.contextmanager
def head_rows(lm) -> Iterator[list[int]]:
    """A spy on the LM head: the number of positions each of its calls sees."""
    seen: list[int] = []
    head = lm.model.get_output_embeddings()
    handle = head.register_forward_hook(lambda _m, args, _o: seen.append(args[0].shape[1]))
    try:
        yield seen
    finally:
        handle.remove()


def n_hooks(module: torch.nn.Module) -> int:
    return len(module._forward_hooks) + len(module._forward_pre_hooks)


def test_hooks_are_removed_after_the_forward_and_after_an_exception():
    lm = tiny.loaded("llama-gqa")
    block = lm.model.model.layers[0]
    before = n_hooks(block)
    calls: list[int] = []
    lm.forward(IDS, hooks=[Hook(block, lambda *a: calls.append(1))])
    assert calls == [1] and n_hooks(block) == before

    def boom(*_args):
        raise RuntimeError("a hook failed")

    with pytest.raises(RuntimeError, match="a hook failed"):
        lm.forward(IDS, hooks=[Hook(block, lambda *a: calls.append(2)), Hook(block, boom, "before")])
    assert n_hooks(block) == before and calls == [1]  # gone: a later forward does not call them
    lm.forward(IDS)
    assert calls == [1] and n_hooks(block) == before


def test_hooks_of_another_thread_do_not_fire():
    """Two wrappers of one model (two locks, the same modules): while thread A's hooks are on the
    modules, thread B's forward passes them by; A's own forward is seen."""
    lm_a, lm_b = tiny.loaded("llama-gqa"), tiny.loaded("llama-gqa")
    assert lm_a.model is lm_b.model and lm_a.lock is not lm_b.lock
    seen: list[str] = []
    block = lm_a.model.model.layers[1]
    errors: list[BaseException] = []

    def other() -> None:
        try:
            lm_b.forward(IDS)
        except BaseException as err:  # noqa: BLE001 - reported by the assert below
            errors.append(err)

    with lm_a.hooked([Hook(block, lambda *a: seen.append(threading.current_thread().name))]):
        t = threading.Thread(target=other, name="B")
        t.start()
        t.join()
        assert seen == [] and not errors
        lm_a.forward(IDS)
    assert seen == [threading.current_thread().name]


@pytest.mark.parametrize("arch", ["llama-gqa", "gpt2", "bart"])
def test_logits_only_at_the_asked_positions(arch):
    """A model with ``logits_to_keep`` runs its head on the asked rows only; every model returns
    those rows, in the order asked, equal to the full forward's rows (float32, 1e-6)."""
    lm = tiny.loaded(arch)
    ids = [1, *IDS[1:]] if arch != "bart" else IDS[1:]
    full = lm.forward(ids, logits_at="all").logits[0]
    assert full.shape[0] == len(ids)
    keeps = "logits_to_keep" in forward_kwargs(lm.model, "last")
    for asked, rows in (("last", [-1]), ([1, 3, 0], [1, 3, 0]), ("none", [])):
        with head_rows(lm) as spy:
            got = lm.forward(ids, logits_at=asked).logits[0]
        assert got.shape[0] == len(rows)
        torch.testing.assert_close(got, full[rows], rtol=0, atol=1e-6)
        assert spy == [len(rows) if keeps else len(ids)]


def test_the_kwargs_are_no_cache_and_an_index_tensor():
    """Never the int 1 (Gemma 4 reads it as leave to skip the KV-shared layers' other rows)."""
    kw = forward_kwargs(tiny.model("llama-gqa"), [2, -1])
    assert kw["use_cache"] is False and torch.equal(kw["logits_to_keep"], torch.tensor([2, -1]))
    assert "logits_to_keep" not in forward_kwargs(tiny.model("llama-gqa"), "all")
    assert forward_kwargs(tiny.model("bert"), "last") == {"use_cache": False}


def test_the_mixer_walkthrough_runs_no_lm_head():
    """It reads a mixer's inputs only: the LM head sees no position (it ran over N x vocab)."""
    qwen = hybrids_tiny.loaded("qwen3_5_text")
    with head_rows(qwen) as spy:
        R.capture(qwen, IDS * 3, 0, "gated_delta")
    assert spy == [0]
