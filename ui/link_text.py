"""A link's query (`Query`) and long texts in it: deflated and URL-safe base64 (the ``tz``
parameter), decoded with a bound on the output so a small link cannot expand into gigabytes."""

from __future__ import annotations

import base64
import binascii
import urllib.parse
import zlib
from dataclasses import dataclass

MAX_TEXT_CHARS = 60_000  # the longest text the app accepts


def pack_text(text: str) -> str:
    """Deflate + URL-safe base64 (no padding): what a compressed ``tz`` parameter holds."""
    return base64.urlsafe_b64encode(zlib.compress(text.encode("utf-8"), 9)).decode().rstrip("=")


def unpack_text(raw: str) -> str:
    """The inverse of `pack_text`; a ValueError for anything that is not one (or decodes to
    more than `MAX_TEXT_CHARS` characters: the output is bounded before it is decoded)."""
    try:
        packed = base64.urlsafe_b64decode(raw.strip() + "=" * (-len(raw.strip()) % 4))
        inflate = zlib.decompressobj()
        data = inflate.decompress(packed, 4 * MAX_TEXT_CHARS + 1)
        if inflate.unconsumed_tail or len(data) > 4 * MAX_TEXT_CHARS:
            raise ValueError(f"the text is longer than {MAX_TEXT_CHARS} characters")
        if not inflate.eof:
            raise ValueError("the compressed text is cut off (copy the whole link)")
        text = data.decode("utf-8")
        if len(text) > MAX_TEXT_CHARS:
            raise ValueError(f"at most {MAX_TEXT_CHARS} characters")
        return text
    except (binascii.Error, zlib.error, UnicodeDecodeError):
        raise ValueError("not a compressed text (copy the whole link)") from None


@dataclass(frozen=True)
class Query:
    """A link's parameters and what had to be left out of it (texts past the budget)."""

    params: dict[str, str]
    left_out: tuple[str, ...] = ()

    def url(self, root: str, path: str) -> str:
        """``<root>/<path>?<params>``, every value percent-encoded."""
        return f"{root}/{path}?{urllib.parse.urlencode(self.params, quote_via=urllib.parse.quote)}"
