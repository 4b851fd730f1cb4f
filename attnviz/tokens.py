"""Token strings for people: raw ids and strings, plus clean display strings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
    if shown.strip() == "":
        return "".join(_VISIBLE_WS.get(c, c) for c in shown) or "∅"
    return shown


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

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def labels(self) -> list[str]:
        """Axis labels that stay distinct when tokens repeat: ``"(i) token"``."""
        return [f"({i}) {d}" for i, d in enumerate(self.display)]

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
        display = []
        for i, r in zip(ids, raw, strict=True):
            try:
                decoded = tokenizer.decode([i], clean_up_tokenization_spaces=False)
            except Exception:  # noqa: BLE001 - a tokenizer that cannot decode one id: show raw
                decoded = None
            display.append(display_token(r, decoded))
        return cls(
            ids=tuple(ids),
            raw=tuple(raw),
            display=tuple(display),
            special=tuple(i in special_ids for i in ids),
            template=tuple(bool(x) for x in (template or [False] * n)),
            generated=tuple(bool(x) for x in (generated or [False] * n)),
        )
