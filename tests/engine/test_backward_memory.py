"""Attribution patching's memory check counts what its backward keeps in every block of a hybrid
(`attnviz.limits.backward_bytes`), and refuses with a message before any forward when that is more
than the free memory."""

from __future__ import annotations

import hybrids_tiny
import pytest
import torch

import attnviz
from attnviz import limits
from attnviz.errors import OutOfMemory
from attnviz.explain import attribution_patching as ap
from attnviz.explain.patch_sites import sites

N = 64
CLEAN = [3 + (i * 37) % 200 for i in range(N)]
CORRUPT = [3 + (i * 41) % 200 for i in range(N)]


def _saved_bytes(lm, over: str) -> int:
    """Every tensor autograd keeps for the backward of attribution patching's forward (storages
    counted once; the model's parameters, which exist anyway, left out)."""
    params = {p.untyped_storage().data_ptr() for p in lm.model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    run = ap._GradRun(lm)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run(sites(lm, over), CLEAN, ["head"] if over.startswith("heads") else list(sites(lm, over).parts))
    run.leaves, run.logits = {}, None
    return sum(seen.values())


@pytest.mark.parametrize("model_type", ["qwen3_5_text", "bamba"])
def test_the_estimate_bounds_what_the_backward_keeps_in_every_block(model_type):
    lm = hybrids_tiny.loaded(model_type)
    st = sites(lm, "heads_by_position")
    assert len(st.blocks) > lm.layout.n_layers  # a hybrid: blocks without softmax attention
    need = limits.backward_bytes(list(st.blocks), lm.layout, N, torch.float32)
    saved = _saved_bytes(lm, "heads_by_position")
    assert saved <= need <= 3 * saved, (saved, need)


def test_attribution_patching_refuses_before_any_forward_naming_what_it_needs(monkeypatch):
    lm = hybrids_tiny.loaded("qwen3_5_text")
    need = limits.backward_bytes(list(sites(lm, "blocks").blocks), lm.layout, N, torch.float32)
    free = int(need / limits.USABLE) - 1  # one byte short; the two prompts' own capture fits
    monkeypatch.setattr(limits, "free_bytes", lambda device: free)
    forwards = []
    handle = lm.model.register_forward_pre_hook(lambda *_: forwards.append(1))
    try:
        with pytest.raises(
            OutOfMemory, match=rf"^attribution patching of {N} tokens .*all 4 blocks.* GiB free"
        ):
            attnviz.attribution_patch(lm, CLEAN, CORRUPT, over="blocks", verify=0)
    finally:
        handle.remove()
    assert forwards == []
