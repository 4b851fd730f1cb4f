"""A text as a model reads it: its token ids (through the chat template or not), how many
positions the model can take (`position_limit`: a learned position table is a hard limit), the
longest start of a text that fits (`first_tokens`), and the one admission rule for a text
(`admit`): the token cap, the model's position table and the device's free memory, checked in
one place for `extract`, the app's sidebar caption and its "Use the first N tokens" offer."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch

from . import limits
from .errors import AttnvizError, EmptyInput, InputTooLong, OutOfMemory, TooManyPositions
from .loading import LoadedModel

DEFAULT_MAX_TOKENS = 8192  # `extract`'s token cap unless the caller gives one
Limit = Literal["positions", "cap", "memory"]  # what limits a text, in the order ties are named

_SENTINEL = "\u27e6attnviz\u27e7"


def _chat_ids(lm: LoadedModel, text: str) -> tuple[list[int], list[bool]]:
    """Token ids of the chat-templated text and, per token, whether the template added it."""
    tok = lm.tokenizer
    if not lm.has_chat_template:
        raise AttnvizError(f"{lm.spec!r} has no chat template; turn the chat option off")

    def render(content: str) -> str:
        return tok.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )

    rendered = render(text)
    start = render(_SENTINEL).find(_SENTINEL)
    if start < 0 or rendered[start : start + len(text)] != text:
        start = rendered.find(text)
    end = start + len(text)
    enc = tok(rendered, add_special_tokens=False, return_offsets_mapping=True)
    template = [not (s < end and e > start) for s, e in enc["offset_mapping"]]
    return list(enc["input_ids"]), template


def tokenize(lm: LoadedModel, text: str, *, chat: bool = False) -> tuple[list[int], list[bool]]:
    """Ids exactly as ``tokenizer(text)`` gives them (or via the chat template), + template flags."""
    if not isinstance(text, str) or not text.strip():
        raise EmptyInput("the text is empty; type a sentence")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise AttnvizError(
            f"the text has invalid Unicode at character {err.start} (a lone surrogate); "
            "remove or retype that character"
        ) from None
    if chat:
        return _chat_ids(lm, text)
    ids = lm.tokenizer(text)["input_ids"]
    if not ids:
        raise EmptyInput("the text gives no tokens; type a sentence")
    return list(ids), [False] * len(ids)


def _text_owners(model: Any) -> list[str]:
    """Where the text's own tables live: the parent of each token embedding the text goes through
    (the model's input embeddings, and an encoder-decoder's decoder embeddings: the decoder reads
    the text too). "" is the whole model."""
    names = {id(m): n for n, m in model.named_modules()}
    found = [model.get_input_embeddings()] if hasattr(model, "get_input_embeddings") else []
    if getattr(model.config, "is_encoder_decoder", False) and hasattr(model, "get_decoder"):
        with contextlib.suppress(AttributeError, NotImplementedError, TypeError):
            found.append(model.get_decoder().get_input_embeddings())
    owners = []
    for emb in found:
        name = names.get(id(emb))
        if name is not None:
            owners.append(name.rsplit(".", 1)[0] if "." in name else "")
    return owners or [""]


def position_limit(model: torch.nn.Module) -> int | None:
    """The most positions the text can take through ``model``, or None when it has no such limit.

    A model with learned (or tabulated sinusoidal) absolute positions looks each position up in
    a table (BERT's and MiniLM's ``position_embeddings``, GPT-2's ``wpe``, OPT's and BART's
    ``embed_positions``): a longer text fails inside the model with a size mismatch. The table's
    rows less the positions it skips are the limit: OPT/BART's learned table starts at
    ``offset`` 2, RoBERTa's at ``padding_idx + 1``. Rotary, ALiBi and relative-bucket models
    (Llama, Qwen, BLOOM, T5) compute positions and have no table; their
    ``max_position_embeddings`` is the training length, not a limit, so None. With several
    tables (an encoder and a decoder) the smallest counts: the text goes through both.

    Only the tables the text goes through count: those beside its token embeddings (under the
    same parent module). A vision or audio tower's patch-position table (LLaVA's 577 patches,
    Gemma 3's 4,096, Qwen3-VL's, Whisper-style audio encoders) reads image or audio positions,
    never text ones."""
    owners = _text_owners(model)
    limits = []
    for name, mod in model.named_modules():
        leaf = name.rsplit(".", 1)[-1].lower()
        if not isinstance(mod, torch.nn.Embedding) or not ("pos" in leaf or leaf == "wpe"):
            continue
        if not any(o == "" or name.startswith(o + ".") for o in owners):
            continue
        skipped = int(getattr(mod, "offset", 0) or 0)
        if mod.padding_idx is not None:
            skipped += int(mod.padding_idx) + 1
        limits.append(int(mod.num_embeddings) - skipped)
    return min(limits) if limits else None


def first_tokens(lm: LoadedModel, text: str, n: int, *, chat: bool = False) -> str:
    """The longest start of ``text`` (cut at a token's end) that `tokenize` makes into at most
    ``n`` tokens, special and template tokens included (the whole text when it fits): what "use
    its first n tokens" runs, and what a view limited to n tokens shows of a longer text."""
    if len(tokenize(lm, text, chat=chat)[0]) <= n:
        return text
    enc = lm.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ends = [int(e) for _, e in enc["offset_mapping"]]
    keep = min(len(ends), n)
    while keep > 0:
        cut = text[: ends[keep - 1]]
        got = len(tokenize(lm, cut, chat=chat)[0]) if cut.strip() else 0
        if 0 < got <= n:
            return cut
        keep -= max(1, got - n)  # cutting a word can split it into more tokens: step back
    raise InputTooLong(f"not even one token of the text fits in {n} positions")


def token_limit(
    lm: LoadedModel, *, max_tokens: int = DEFAULT_MAX_TOKENS, memory: bool = True, free: int | None = None
) -> tuple[int, Limit]:
    """(the most tokens, prompt and generated together, ``lm`` takes here, which limit sets it):
    the smallest of its position table (`position_limit`), the cap ``max_tokens`` and, with
    ``memory``, what the device's free memory holds (`attnviz.limits.token_budget`). What the
    app's sidebar says before a text is typed; `admit` applies it to a text."""
    found: list[tuple[int, Limit]] = []
    table = position_limit(lm.model)
    if table is not None:
        found.append((table, "positions"))
    found.append((int(max_tokens), "cap"))
    if memory:
        found.append((limits.token_budget(lm.layout, lm.device, lm.dtype, free=free), "memory"))
    order = {"positions": 0, "cap": 1, "memory": 2}
    return min(found, key=lambda f: (f[0], order[f[1]]))


@dataclass(frozen=True)
class Admission:
    """A text as `admit` found it: its ids (and template flags), and whether it fits ``lm`` with
    ``generate`` tokens to generate. A refusal carries its reason (``refusal``, a sentence), which
    limit gave it (``limit``: the smallest one, ``limit_tokens`` long), how many of the prompt's
    tokens fit beside the generated ones (``fits``, 0 when none) and ``first``: the longest start
    of the text that fits (None when no token fits or the ids came without a text)."""

    ids: tuple[int, ...]
    template: tuple[bool, ...]
    generate: int
    limit: Limit
    limit_tokens: int
    refusal: str = ""
    first: str | None = None
    free: int | None = None  # the free bytes a memory refusal was measured against

    @property
    def n_tokens(self) -> int:
        return len(self.ids)

    @property
    def admitted(self) -> bool:
        return not self.refusal

    @property
    def fits(self) -> int:
        return max(self.limit_tokens - self.generate, 0)

    def check(self) -> Admission:
        """This admission when the text fits; otherwise raise the refusal as `TooManyPositions`
        (the position table), `InputTooLong` (the cap) or `OutOfMemory` (free memory)."""
        if self.admitted:
            return self
        if self.limit == "positions":
            raise TooManyPositions(self.refusal, self.limit_tokens)
        if self.limit == "memory":
            raise OutOfMemory(self.refusal)
        raise InputTooLong(self.refusal)


def _refusal(lm: LoadedModel, n: int, generate: int, limit: Limit, size: int, free: int | None) -> str:
    gen = f" (+{generate:,} to generate)" if generate else ""
    room = size - generate
    if limit == "memory":
        try:
            limits.check_tokens(n + generate, lm.layout, lm.device, lm.dtype, free=free)
        except OutOfMemory as err:
            return str(err)
    if room >= 1:
        advice = f"shorten it or use its first {room:,} tokens"
    else:
        advice = f"ask for fewer than {size:,} tokens to generate"
    if limit == "positions":
        return (
            f"{lm.spec!r} reads at most {size:,} positions (its position table) and this text has "
            f"{n:,} tokens{gen}; {advice}"
        )
    gen = f" (+{generate} to generate)" if generate else ""
    advice = f"use its first {room} tokens" if room >= 1 else f"ask for fewer than {size} tokens to generate"
    return f"the text has {n} tokens{gen}; the limit is {size}. Shorten the text or {advice}"


def admit_ids(
    lm: LoadedModel,
    ids: list[int] | tuple[int, ...],
    *,
    template: list[bool] | tuple[bool, ...] | None = None,
    generate: int = 0,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    memory: bool = True,
    free: int | None = None,
) -> Admission:
    """`admit` for token ids you already have (no text: a refusal offers no cut text)."""
    if generate < 0:
        raise AttnvizError("generate must be 0 or more tokens")
    ids = tuple(int(i) for i in ids)
    if not ids:
        raise EmptyInput("no tokens given")
    flags = tuple(bool(t) for t in template) if template is not None else (False,) * len(ids)
    if memory and free is None:
        free = limits.free_bytes(lm.device)  # measured once: the budget and its message agree
    size, limit = token_limit(lm, max_tokens=max_tokens, memory=memory, free=free)
    refusal = "" if len(ids) + generate <= size else _refusal(lm, len(ids), generate, limit, size, free)
    return Admission(ids, flags, int(generate), limit, size, refusal, free=free)


def admit(
    lm: LoadedModel,
    text: str,
    *,
    chat: bool = False,
    generate: int = 0,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    memory: bool = True,
    free: int | None = None,
) -> Admission:
    """The one admission rule for a text: tokenize it once (`tokenize`) and check the prompt and
    the ``generate`` tokens to generate against every limit of ``lm`` here (`token_limit`: its
    position table, the cap ``max_tokens``, the device's free memory with ``memory``). Bad text
    (empty, invalid Unicode) raises; a text over a limit gets an `Admission` that says why and
    offers the longest start that fits (``first``); ``Admission.check()`` raises it."""
    ids, template = tokenize(lm, text, chat=chat)
    adm = admit_ids(
        lm, ids, template=template, generate=generate, max_tokens=max_tokens, memory=memory, free=free
    )
    if adm.admitted or adm.fits < 1:
        return adm
    try:
        first = first_tokens(lm, text, adm.fits, chat=chat)
    except AttnvizError:
        first = None
    return replace(adm, first=first)
