"""The product on a CUDA GPU: every log-sum-exp entry point against the dense oracle.

Every head's statistics, token rollout (plain and sink-aware), pooled views and zoomed regions,
induction, value-weighted attention and the token views, on tiny architectures (GQA, sliding
window, soft-capping, ALiBi, learned sinks, encoder-only, encoder-decoder, T5's position bias)
and the built-in model, in float32 and bfloat16, each against the dense definitions and the
model's own eager attention. Any "blocked" path (a fused kernel that refused) fails; layers
whose scores are not standard must say "dense: <why>". Models are copies moved to the GPU
(the cached CPU tiny models are never moved in place).

`check_product` is shared: tests/test_cuda_contract_product.py runs it on the CPU under the CUDA
emulation (tests/cuda_emulation.py), so these checks run in every `make test`; here they run on
the real device (`make test` on a GPU machine, `make gpu-check`). Tolerances from the drift
measured on the emulated device (CPU arithmetic, sharp tiny models, 2026-11-24), about 3-10x:
float32 statistics 3.8e-6 (distance, tokens) / 1.2e-7, rollout 6e-8, probabilities 2.3e-5 (T5's
cross rows in another batch shape), eager on the same input 2e-6; bfloat16 statistics 4.1e-4,
rollout 8.4e-4, probabilities 1.07e-2 (the fused path's float32 scores of bf16 Q/K against the
dense path's bf16-rounded ones, as eager rounds them), eager on the same input within half a bf16
ulp (tests/test_bf16.py). Not yet measured on a GPU: no device was lent to issue 20.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import tiny
import torch
from test_fast_stats import TEXT, _assert_same, sharp

import attnviz
from attnviz import metrics as M
from attnviz.analysis import rollout as R
from attnviz.analysis import token_views as TV
from attnviz.analysis import value_weighted as VW
from attnviz.analysis.pooling import pooled, region
from attnviz.exact import lse
from attnviz.exact.eager import eager_probabilities

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# per dtype: statistics (distance × N), rollout sources, probabilities (pooled, views, induction),
# and the model's own eager attention on the same captured input (eager rounds its weights to the
# dtype: half a bf16 ulp at 1, tests/test_bf16.py)
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
        errs |= {f"{stack} {k}": v for k, v in _assert_same(fast, dense, tol_s).items()}
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("arch", tiny.ARCHS)
def test_every_entry_point_on_cuda(arch, dtype):
    lm = on(sharp(arch), "cuda", dtype)
    assert lm.device.type == "cuda" and tiny.model(arch).device.type == "cpu"  # the cached copy stayed
    print(arch, dtype, {k: f"{v:.1e}" for k, v in check_product(lm, text_ids(lm), arch).items()})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", ["falcon-alibi", "gpt_oss"])
def test_alibi_and_sinks_on_cuda(family, dtype):
    lm = on(family_model(family), "cuda", dtype)
    ids = [3 + (i * 37) % 300 for i in range(60)]
    print(family, dtype, {k: f"{v:.1e}" for k, v in check_product(lm, ids, family, induction=False).items()})


def family_model(family: str) -> attnviz.LoadedModel:
    """A tiny ALiBi (Falcon) or learned-sinks (GPT-OSS) model on the CPU."""
    if family == "falcon-alibi":
        from test_adapters import build, wrap

        return wrap(build("falcon-alibi")[0])
    import archs
    import transformers as tf

    model, _ = archs.build(family, archs.mapping_names().get(family, "causal"))
    tok = tf.PreTrainedTokenizerFast(tokenizer_object=archs._tokenizer(), pad_token="<pad>")
    return attnviz.wrap_model(model, tok, spec=f"tiny-{family}")


def test_explicit_device_and_multi_gpu_rollout():
    """device="cuda:N" keeps the whole model on GPU N; with two GPUs, a model split over both
    (device_map="auto" style) still rolls out: r follows each layer's device."""
    lm = attnviz.load_model("smollm2-135m", device=f"cuda:{torch.cuda.device_count() - 1}", dtype="float32")
    assert {p.device for p in lm.model.parameters()} == {torch.device("cuda", torch.cuda.device_count() - 1)}
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU: the split-model rollout needs two")
    from accelerate import dispatch_model

    base = copy.deepcopy(tiny.model("llama-gqa"))
    dmap = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.norm": 1, "lm_head": 1}
    dmap |= {f"model.layers.{i}": i % 2 for i in range(len(base.model.layers))}
    split = attnviz.wrap_model(
        dispatch_model(base, device_map=dmap), tiny.tokenizer("decoder"), spec="tiny-split"
    )
    res = attnviz.extract(split, TEXT)
    roll, oracle = R.token_rollout(res), R.token_rollout(res, computation="dense")
    assert np.abs(roll.sources - oracle.sources).max() < 1e-5 and set(roll.paths) == {"fused"}


@pytest.mark.slow
def test_builtin_on_cuda_bf16_and_fp32():
    """The built-in model as `load_model` gives it on a GPU (auto: CUDA, bf16), and in fp32."""
    lm = attnviz.load_model("smollm2-135m")
    assert lm.device.type == "cuda" and lm.dtype == torch.bfloat16
    ids = list(lm.tokenizer(TEXT * 3)["input_ids"])
    print("smollm2 bf16", {k: f"{v:.1e}" for k, v in check_product(lm, ids, "llama").items()})
    lm32 = attnviz.load_model("smollm2-135m", dtype="float32")
    print("smollm2 fp32", {k: f"{v:.1e}" for k, v in check_product(lm32, ids, "llama").items()})
