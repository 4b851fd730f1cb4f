"""A text as a model reads it: its token ids (through the chat template or not), how many
positions the model can take (`position_limit`: a learned position table is a hard limit), and the
longest start of a text that fits (`first_tokens`)."""

from __future__ import annotations

import torch

from .errors import AttnvizError, EmptyInput, InputTooLong, TooManyPositions
from .loading import LoadedModel

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


def position_limit(model: torch.nn.Module) -> int | None:
    """The most positions ``model`` can read, or None when it has no such limit.

    A model with learned (or tabulated sinusoidal) absolute positions looks each position up in
    a table (BERT's and MiniLM's ``position_embeddings``, GPT-2's ``wpe``, OPT's and BART's
    ``embed_positions``): a longer text fails inside the model with a size mismatch. The table's
    rows less the positions it skips are the limit: OPT/BART's learned table starts at
    ``offset`` 2, RoBERTa's at ``padding_idx + 1``. Rotary, ALiBi and relative-bucket models
    (Llama, Qwen, BLOOM, T5) compute positions and have no table; their
    ``max_position_embeddings`` is the training length, not a limit, so None. With several
    tables (an encoder and a decoder) the smallest counts: the text goes through both."""
    limits = []
    for name, mod in model.named_modules():
        leaf = name.rsplit(".", 1)[-1].lower()
        if not isinstance(mod, torch.nn.Embedding) or not ("pos" in leaf or leaf == "wpe"):
            continue
        skipped = int(getattr(mod, "offset", 0) or 0)
        if mod.padding_idx is not None:
            skipped += int(mod.padding_idx) + 1
        limits.append(int(mod.num_embeddings) - skipped)
    return min(limits) if limits else None


def check_positions(lm: LoadedModel, n_tokens: int, generate: int = 0) -> None:
    """Raise `TooManyPositions` (with the model's limit and the offer of the text's first tokens)
    when ``n_tokens`` (+ ``generate``) pass `position_limit` of ``lm``'s model."""
    limit = position_limit(lm.model)
    if limit is None or n_tokens + generate <= limit:
        return
    gen = f" (+{generate} to generate)" if generate else ""
    first = max(limit - generate, 0)
    raise TooManyPositions(
        f"{lm.spec!r} reads at most {limit:,} positions (its position table) and this text has "
        f"{n_tokens:,} tokens{gen}; shorten it or use its first {first:,} tokens",
        limit,
    )


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
