"""Token strings for people: raw ids and strings, plus clean display strings.

The display rule lives here once: a token shows as the text it stands for (the tokenizer's own
decode), never as its byte-level BPE spelling ("ðŁĺĢ" is the emoji U+1F600's four bytes written
with GPT-2's byte-to-character table). A character whose bytes are split over several tokens is
merged for display: each of those tokens shows the whole character with its part, "😀⟨1/2⟩",
"😀⟨2/2⟩", and `Tokens.pieces` lists the pieces (their bytes) for a hover. Bytes that never form
a character show as a placeholder, "⟨E2 82⟩". Display strings are plain text; figure builders
escape them.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# Byte-level BPE (GPT-2, Llama 3, SmolLM2) and SentencePiece space/newline markers.
_MARKERS = {"Ġ": " ", "▁": " ", "Ċ": "\n", "ĉ": "\t"}
_VISIBLE_WS = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}


def visible(text: str) -> str:
    """Make control characters visible (Unicode control pictures) and whitespace-only text visible."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch in "\n\t\r":
            out.append(_VISIBLE_WS[ch])
        elif code < 32:
            out.append(chr(0x2400 + code))
        elif code == 127:
            out.append("␡")
        else:
            out.append(ch)
    shown = "".join(out)
    if shown and all(unicodedata.category(c) in ("Cf", "Mn", "Zl", "Zp") for c in shown):
        return " ".join(f"U+{ord(c):04X}" for c in shown)  # a zero-width joiner, a lone accent...
    if shown.strip() == "":
        return "".join(_VISIBLE_WS.get(c, c) for c in shown) or "∅"
    return shown


MAX_SPLIT = 8  # tokens one character may be split over (UTF-8 has at most 4 bytes; byte merges)
_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")  # SentencePiece byte fallback (Llama 2)


@functools.cache
def _byte_table() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, character -> byte (the inverse of ``bytes_to_unicode``)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


def byte_level(tokenizer: Any) -> bool:
    """True for a byte-level BPE tokenizer (GPT-2, Llama 3, SmolLM2, Qwen): its decoder (or a
    slow tokenizer's ``byte_decoder``) maps each character of a token back to one byte."""
    if getattr(tokenizer, "byte_decoder", None):
        return True
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    try:  # the decoder's own JSON (the whole tokenizer's, vocabulary included, took ~0.1 s a text)
        return decoder is not None and b'"ByteLevel"' in decoder.__getstate__()
    except Exception:  # noqa: BLE001 - an unusual tokenizer: decode token by token instead
        return False


def token_bytes(raw: str, byte_level: bool = True) -> bytes | None:
    """The bytes a token stands for when its spelling says so: SentencePiece's ``<0xNN>`` byte
    fallback, or (``byte_level``) a byte-level BPE spelling (every character in GPT-2's byte
    alphabet); else None."""
    m = _BYTE_FALLBACK.match(raw)
    if m:
        return bytes([int(m.group(1), 16)])
    table = _byte_table()
    if byte_level and raw and all(c in table for c in raw):
        return bytes(table[c] for c in raw)
    return None


def _hex(data: bytes) -> str:
    return " ".join(f"{b:02X}" for b in data)


def readable(
    raw: Sequence[str], decode: Callable[[list[int]], str | None], ids: Sequence[int], *, byte_level: bool
) -> tuple[list[str], list[str]]:
    """(display, pieces) of a sequence: each token as text (`display_token`), a character split
    over tokens merged (``"😀⟨1/2⟩"``, ``"😀⟨2/2⟩"``) with its pieces listed (``pieces[i]``, "" for
    a whole token), bytes that never form a character as ``"⟨E2 82⟩"``. ``decode(ids)`` is the
    tokenizer's decode of a list of ids (None when it cannot); ``byte_level``: the tokens are
    spelled in GPT-2's byte alphabet (`byte_level`)."""
    n = len(ids)
    data = [token_bytes(r, byte_level) for r in raw]
    display, pieces = [""] * n, [""] * n
    i = 0
    while i < n:
        text = _whole(data, decode, ids, i, i + 1)
        if text is not None:
            display[i] = display_token(raw[i], text)
            i += 1
            continue
        # the shortest run of tokens from i that decodes to whole characters: a split character
        end = next(
            (j for j in range(i + 2, min(n, i + MAX_SPLIT) + 1) if _whole(data, decode, ids, i, j)), None
        )
        if end is None:  # bytes that form no character here: a placeholder, never mojibake
            b = data[i]
            display[i] = f"⟨{_hex(b)}⟩" if b is not None else display_token(raw[i], None)
            pieces[i] = f"bytes {_hex(b)}: not a whole character" if b is not None else ""
            i += 1
            continue
        shown = display_token("", _whole(data, decode, ids, i, end))
        spelled = " | ".join(
            _hex(b) if b is not None else raw[j] for j, b in zip(range(i, end), data[i:end], strict=True)
        )
        m = end - i
        for k, j in enumerate(range(i, end)):
            display[j] = f"{shown}⟨{k + 1}/{m}⟩"
            pieces[j] = f"token {k + 1} of {m} of {shown!r}: bytes {spelled}"
        i = end
    return display, pieces


def _whole(
    data: Sequence[bytes | None],
    decode: Callable[[list[int]], str | None],
    ids: Sequence[int],
    i: int,
    j: int,
) -> str | None:
    """The text of tokens i..j-1 when it is whole characters, else None: their bytes decoded as
    strict UTF-8 where every token's bytes are known, else the tokenizer's decode with no U+FFFD."""
    run = data[i:j]
    if all(b is not None for b in run):
        try:
            return b"".join(b for b in run if b is not None).decode("utf-8")
        except UnicodeDecodeError:
            return None
    text = decode(list(ids[i:j]))
    return None if text is None or "\ufffd" in text else text


def display_token(raw: str, decoded: str | None = None) -> str:
    """A display string for one token: markers cleaned, a leading word-start space dropped,
    whitespace-only and control characters made visible."""
    text = decoded if decoded is not None and "\ufffd" not in decoded else raw
    for marker, char in _MARKERS.items():
        text = text.replace(marker, char)
    if text.strip() and text.startswith(" "):
        text = text[1:]
    return visible(text)


@dataclass(frozen=True)
class Tokens:
    """The tokens of one sequence, position by position (all tuples have length N)."""

    ids: tuple[int, ...]
    raw: tuple[str, ...]  # tokenizer.convert_ids_to_tokens
    display: tuple[str, ...]  # cleaned, whitespace visible; plain text, never HTML
    special: tuple[bool, ...]  # tokenizer special tokens (BOS, [CLS], <|im_start|> ...)
    template: tuple[bool, ...]  # added by the chat template (not from the user's text)
    generated: tuple[bool, ...]  # produced by greedy generation
    # a token that is part of a character split over tokens: its pieces ("" for a whole token)
    pieces: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def labels(self) -> list[str]:
        """Axis labels that stay distinct when tokens repeat: ``"(i) token"``."""
        return [f"({i}) {d}" for i, d in enumerate(self.display)]

    def hover(self, i: int) -> str:
        """What a hover says about token ``i``: its display, and its pieces when it is part of a
        character split over tokens."""
        extra = self.pieces[i] if i < len(self.pieces) else ""
        return f"{self.display[i]} · {extra}" if extra else self.display[i]

    @property
    def hidden(self) -> np.ndarray:
        """Positions a 'hide special tokens' view drops: special or chat-template tokens."""
        return np.array(self.special, dtype=bool) | np.array(self.template, dtype=bool)

    @classmethod
    def build(
        cls,
        tokenizer,
        ids: Sequence[int],
        *,
        template: Sequence[bool] | None = None,
        generated: Sequence[bool] | None = None,
    ) -> Tokens:
        ids = [int(i) for i in ids]
        n = len(ids)
        raw = [str(t) for t in tokenizer.convert_ids_to_tokens(ids)]
        special_ids = set(getattr(tokenizer, "all_special_ids", []) or [])
        display, pieces = readable(raw, _decoder(tokenizer), ids, byte_level=byte_level(tokenizer))
        return cls(
            ids=tuple(ids),
            raw=tuple(raw),
            display=tuple(display),
            special=tuple(i in special_ids for i in ids),
            template=tuple(bool(x) for x in (template or [False] * n)),
            generated=tuple(bool(x) for x in (generated or [False] * n)),
            pieces=tuple(pieces),
        )


def _decoder(tokenizer: Any) -> Callable[[list[int]], str | None]:
    """The tokenizer's decode of a list of ids, None when it cannot decode them."""

    def decode(chunk: list[int]) -> str | None:
        try:
            return str(tokenizer.decode(chunk, clean_up_tokenization_spaces=False))
        except Exception:  # noqa: BLE001 - a tokenizer that cannot decode an id: show raw
            return None

    return decode


def displays(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Display strings of ids that are NOT one sequence (a top-k list, a target and its contrast):
    each id shown alone by the display rule, as `Tokens.build` of that id alone would show it, so
    a byte that is no whole character stays its placeholder (``"⟨D3⟩"``) and never merges with
    the id listed beside it. The tokenizer is read once for all of them."""
    ids = [int(i) for i in ids]
    raw = [str(t) for t in tokenizer.convert_ids_to_tokens(ids)]
    decode, bl = _decoder(tokenizer), byte_level(tokenizer)
    return [readable([r], decode, [i], byte_level=bl)[0][0] for r, i in zip(raw, ids, strict=True)]


def previous_occurrences(ids: Sequence[int], offset: int = 0) -> list[tuple[int, int]]:
    """The one definition of what a previous-occurrence head (``offset=0``) and an induction head
    (``offset=1``: the token after that occurrence) attend to: (query_pos t, key_pos j + offset)
    for every t whose token occurred before, j its latest earlier occurrence, where j + offset < t.

    On the induction probe (one copy of distinct tokens, repeated) these are exactly the second
    copy's rows i with key_pos i - length + 1: what `induction_score` gathers by index;
    `attnviz.explain.search.previous_occurrence_heads` reads them on any text, and
    `attnviz.metrics.definitions.induction_score` on the probe (here, beside the tokens, so both
    read it from below).
    """
    last: dict[int, int] = {}
    out = []
    for t, tok in enumerate(ids):
        if tok in last and last[tok] + offset < t:
            out.append((t, last[tok] + offset))
        last[tok] = t
    return out
