"""Generation captures as it goes (attnviz.capture.generation): the prompt runs through the model
once, and every probability still equals the model's eager attention over prompt + generation."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import torch
from sharp_models import TEXT, sharp

import attnviz
from attnviz.capture import generation
from attnviz.extract import extract_ids


def prompt_passes(lm, run) -> tuple[object, int]:
    """(run(), how many forwards fed the model more than one token: prompt passes)."""
    seen = []

    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[-1] > 1:
            seen.append(ids.shape[-1])

    handle = lm.model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        return run(), len(seen)
    finally:
        handle.remove()


@pytest.mark.parametrize(("arch", "stitched"), [("llama-gqa", True), ("qwen3", True), ("gpt2", True),
                                                ("mistral-sliding", False), ("gemma2", False)])  # fmt: skip
def test_generation_runs_the_prompt_once_and_stays_exact(arch, stitched):
    lm = sharp(arch)
    n_prompt = len(attnviz.extract(lm, TEXT).tokens.ids)
    res, passes = prompt_passes(lm, lambda: attnviz.extract(lm, TEXT, generate=5))
    assert passes == (1 if stitched else 2)  # generate's prefill (+ a capture forward where it must)
    ids = list(res.tokens.ids)
    assert len(ids) == n_prompt + 5 and list(res.tokens.generated) == [False] * n_prompt + [True] * 5
    plain = lm.model.generate(torch.tensor([ids[:n_prompt]]), max_new_tokens=5, do_sample=False)[0].tolist()
    assert ids == plain  # the same tokens as generate alone
    eager = extract_ids(lm, ids, path="eager")
    for layer in range(res.n_layers()):
        assert np.abs(res.layer(layer) - eager.layer(layer)).max() < 1e-5, layer


def test_a_record_that_is_not_whole_is_not_stitched():
    """Each check of `generation._stitch` refuses: the caller then runs a capture forward."""
    import torch

    lm = sharp("llama-gqa")
    ids = list(attnviz.extract(lm, TEXT).tokens.ids)
    kw = {
        "max_new_tokens": 3,
        "do_sample": False,
        "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
    }
    step = functools.partial(lm.forward, use_cache=True)  # the last token's forward, through the door
    got, calls = generation.captured_generate(lm.model, torch.tensor([ids]), lm.module_names, kw, step)
    assert calls is not None and calls[0].query.shape[2] == len(got) == len(ids) + 3
    records = []
    real = generation._stitch
    generation._stitch = lambda *a: records.append(a) or real(*a)  # the raw calls, once
    try:
        generation.captured_generate(lm.model, torch.tensor([ids]), lm.module_names, kw, step)
    finally:
        generation._stitch = real
    calls_, lens, last, n_prompt, _ = records[0]
    assert real(calls_, lens, last, n_prompt, True)[0] is None  # an unmodelled keyword
    assert real(calls_, lens[:-1], last, n_prompt, False)[0] is None  # a call too few
    bad = [*last]
    bad[0] = dataclasses.replace(bad[0], key=bad[0].key.clone())
    bad[0].key[:, :, 0] += 1  # the cache changed a prompt key
    assert real(calls_, lens, bad, n_prompt, False) == (None, "the cache changed earlier keys")
    step = dataclasses.replace(calls_[len(last)], mask=torch.ones(1, 1, 1, n_prompt + 1).bool())
    assert (
        real([*calls_[: len(last)], step, *calls_[len(last) + 1 :]], lens, last, n_prompt, False)[0] is None
    )
