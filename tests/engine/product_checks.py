"""The product checks of the GPU suite: every log-sum-exp entry point of one model against the
dense oracle. tests/engine/test_gpu.py runs them on a CUDA GPU; test_cuda_contract_product.py on the
CPU under the CUDA emulation (cuda_emulation.py).

Tolerances from the drift measured on the emulated device (CPU arithmetic, sharp tiny models,
2026-11-24), about 3-10x: float32 statistics 1.2e-7 (distance 3.8e-6 tokens), rollout 6e-8,
probabilities 2.3e-5 (T5's cross rows in another batch shape), eager on the same input 3e-7;
bfloat16 statistics 4.1e-4, rollout 8.4e-4, probabilities 1.07e-2 (the fused path's float32 scores
of bf16 Q/K against the dense path's bf16-rounded ones, as eager rounds them), eager on the same
input within half a bf16 ulp (measured 1.95e-3; test_bf16.py). Not yet measured on a GPU: no device
was lent to issue 20.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from sharp_models import TEXT, assert_same

import attnviz
from attnviz import metrics as M
from attnviz.analysis import rollout as R
from attnviz.analysis import token_views as TV
from attnviz.analysis import value_weighted as VW
from attnviz.analysis.pooling import pooled, region
from attnviz.exact import lse
from attnviz.exact.eager import eager_probabilities

# per dtype: statistics (distance × N), rollout sources, probabilities (pooled, views, induction),
# and the model's own eager attention on the same captured input (eager rounds its weights to the
# dtype: half a bf16 ulp at 1, tests/engine/test_bf16.py)
TOL = {torch.float32: (1e-4, 1e-5, 5e-5, 1e-5), torch.bfloat16: (4e-3, 5e-3, 3e-2, 2.0**-9 + 1e-6)}
DENSE = {"gemma2": "dense: soft-capping", "t5": "dense: position bias", "gpt_oss": "dense: captured sinks"}


def on(lm: attnviz.LoadedModel, device: str | torch.device, dtype: torch.dtype) -> attnviz.LoadedModel:
    """A copy of ``lm`` on ``device`` in ``dtype`` (the original stays where it is)."""
    model = copy.deepcopy(lm.model).to(device, dtype)
    return attnviz.wrap_model(model, lm.tokenizer, spec=f"{lm.spec}-{dtype}".replace("torch.", ""))


def _paths_ok(paths, want: str) -> None:
    assert not any(p.startswith("blocked") for p in paths), paths  # no fallback, anywhere
    assert set(paths) == {want}, paths


def _close(errs: dict, name: str, got, want, tol: float) -> None:
    errs[name] = float(np.abs(np.asarray(got, dtype=np.float64) - np.asarray(want, dtype=np.float64)).max())
    assert errs[name] < tol, (name, errs[name], tol)


def check_product(lm: attnviz.LoadedModel, ids: list[int], arch: str, *, induction: bool = True) -> dict:
    """Every entry point of ``lm`` on ``ids`` against the dense oracle; returns the errors."""
    tol_s, tol_r, tol_p, tol_e = TOL[lm.dtype]
    want = DENSE.get(arch, "fused")
    res = attnviz.extract_ids(lm, ids)
    errs: dict[str, float] = {}
    for stack in res.stacks:
        fast = M.head_metrics(res, stack=stack)
        dense = M.head_metrics(res, stack=stack, computation="dense")
        errs |= {f"{stack} {k}": v for k, v in assert_same(fast, dense, tol_s).items()}
        _paths_ok(fast.paths, want)
        n_q, n_k = (len(t) for t in res.axes(stack))
        if stack != "cross":
            for sink in (False, True):
                roll = R.token_rollout(res, stack=stack, sink_aware=sink)
                oracle = R.token_rollout(res, stack=stack, sink_aware=sink, computation="dense")
                _close(errs, f"{stack} rollout sink={sink}", roll.sources, oracle.sources, tol_r)
                _paths_ok(roll.paths, want)
        layer = res.n_layers(stack) - 1
        pv, pd = (
            pooled(res, layer, cells=8, stack=stack),
            pooled(res, layer, cells=8, stack=stack, computation="dense"),
        )
        _close(errs, f"{stack} pooled mean", pv.mean, pd.mean, tol_p)
        _close(errs, f"{stack} pooled max", pv.max, pd.max, tol_p)
        assert pv.path == want, pv.path
        rows, cols, hs = slice(n_q // 3, n_q - 2), slice(1, n_k - 1), [0, res.n_heads - 1]
        own = eager_probabilities(lm.model, lse.captured(res, stack, layer))  # eager, same input
        full = res.layer_tensor(layer, stack=stack).float().cpu()
        _close(errs, f"{stack} layer vs eager", full, own.float().cpu(), tol_e)
        zoom = region(res, layer, hs, rows=rows, cols=cols, stack=stack)
        _close(errs, f"{stack} region", zoom, full[hs][:, rows, cols], tol_p)
        for direction in ("from", "to"):
            got = TV.token_rows(res, layer, [1, n_q // 2], direction=direction, stack=stack)
            ref = full if direction == "from" else full.transpose(1, 2)
            _close(errs, f"{stack} token view {direction}", got, ref[:, [1, n_q // 2]], tol_p)
        if stack != "cross" and res.layout.kind != "encoder-decoder":
            norms = VW.key_norms(lm, res, layer, stack=stack).float().cpu()
            vw = VW.value_weighted(lm, res, layer, stack=stack) / float(norms.max())
            _close(errs, f"{stack} value-weighted", vw, full * norms[:, None, :] / norms.max(), tol_p)
    if induction and res.layout.kind != "encoder":
        probe = M.induction_probe(lm, length=24, seed=1)
        stack = "self" if "self" in probe.result.stacks else "decoder"
        got, oracle = M.head_induction(probe, stack=stack), M.head_induction(probe, stack=stack, dense=True)
        _close(errs, "induction", got, oracle, tol_p)
    return errs


def text_ids(lm: attnviz.LoadedModel) -> list[int]:
    return list(lm.tokenizer(TEXT)["input_ids"])


def family_model(family: str) -> attnviz.LoadedModel:
    """A tiny ALiBi (Falcon) or learned-sinks (GPT-OSS) model on the CPU."""
    if family == "falcon-alibi":
        from adapter_models import build, wrap

        return wrap(build("falcon-alibi")[0])
    import archs

    model, _ = archs.build(family, archs.mapping_names().get(family, "causal"))
    return attnviz.wrap_model(model, archs.tokenizer(), spec=f"tiny-{family}")
