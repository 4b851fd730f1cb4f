"""Reading a corpus, each text with a stable key.

- `builtin_corpus`: short varied texts shipped with attnviz (prose, code, lists, several scripts);
- `parse_texts`: an uploaded file in the app (one text per line or per paragraph, up to MAX_TEXTS);
- `read_corpus`: a file on disk for the command line, any size: ``.txt`` (one text a line),
  ``.jsonl`` (an object with a ``"text"`` field a line) or ``.parquet`` (a ``text`` column).

A text's key is the SHA-256 of its UTF-8 bytes (`text_key`): it names its entry in the disk
cache and orders the work sent to Ray workers, so the same text always lands in the same place
whatever its position, the worker count or the run. A line that cannot be read (bad UTF-8, bad
JSON, no text) becomes a `TextItem` with ``error`` set: the run records it and goes on.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import AttnvizError

MAX_TEXTS = 1000  # an uploaded file in the app; files on disk (`read_corpus`) have no limit
CORPUS_SUFFIXES = (".txt", ".jsonl", ".parquet")


@dataclass(frozen=True)
class TextItem:
    """One text of a corpus: its position, stable key, and the text (None when it could not be read)."""

    index: int
    key: str
    text: str | None
    error: str = ""


def text_key(text: str | bytes) -> str:
    """The stable key of a text: the first 32 hex digits of the SHA-256 of its UTF-8 bytes."""
    raw = text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
    return hashlib.sha256(raw).hexdigest()[:32]


def items(texts: Iterable[str]) -> list[TextItem]:
    """Texts given in Python, as `TextItem`s in order."""
    return [TextItem(i, text_key(str(t)), str(t)) for i, t in enumerate(texts)]


def builtin_corpus() -> list[str]:
    """The built-in corpus: short varied texts (prose, code, lists, dialogue, several scripts)."""
    raw = resources.files("attnviz").joinpath("data/corpus.txt").read_text(encoding="utf-8")
    return parse_texts(raw, lines=True)


def _clean(line: str) -> str:
    return line.replace("\\n", "\n").strip()


def parse_texts(raw: str, *, lines: bool | None = None) -> list[str]:
    """Texts from a user file: one per line (``lines=True``) or per blank-line-separated
    paragraph (``False``; default: paragraphs when the file has blank lines). ``#`` lines are
    comments; a literal ``\\n`` inside a line is a line break."""
    raw = raw.replace("\r\n", "\n")
    if lines is None:
        lines = "\n\n" not in raw.strip()
    chunks = raw.split("\n") if lines else raw.split("\n\n")
    texts = []
    for chunk in chunks:
        text = _clean("\n".join(x for x in chunk.split("\n") if not x.lstrip().startswith("#")))
        if text:
            texts.append(text)
    if not texts:
        raise AttnvizError("the file has no texts; put one text per line (or per paragraph)")
    if len(texts) > MAX_TEXTS:
        raise AttnvizError(f"the file has {len(texts)} texts; the atlas takes up to {MAX_TEXTS}")
    return texts


def check_corpus_path(path: Path) -> None:
    """Raise a one-line AttnvizError unless ``path`` is a readable corpus file (checked before a
    model loads)."""
    if path.suffix.lower() not in CORPUS_SUFFIXES:
        raise AttnvizError(f"{str(path)!r}: a corpus is a {', '.join(CORPUS_SUFFIXES)} file")
    if not path.is_file():
        raise AttnvizError(f"{str(path)!r} does not exist (or is not a file)")
    try:
        with path.open("rb") as f:
            f.read(1)
    except OSError as err:
        raise AttnvizError(f"cannot read {str(path)!r}: {err.strerror or err}") from None


def read_corpus(path: str | Path, *, column: str = "text") -> list[TextItem]:
    """Every text of a corpus file, in order (see the module doc for the formats)."""
    path = Path(path).expanduser()
    check_corpus_path(path)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        found = _parquet(path, column)
    else:
        found = list(_lines(path.read_bytes(), jsonl=suffix == ".jsonl", column=column))
    if not found:
        raise AttnvizError(f"{str(path)!r} has no texts; put one text per line")
    return [TextItem(i, key, text, error) for i, (key, text, error) in enumerate(found)]


Found = tuple[str, "str | None", str]  # key, text, error


def _lines(raw: bytes, *, jsonl: bool, column: str) -> Iterable[Found]:
    for number, line in enumerate(raw.removeprefix(b"\xef\xbb\xbf").split(b"\n"), start=1):
        line = line.rstrip(b"\r")
        if not line.strip():
            continue
        try:
            decoded = line.decode("utf-8")
        except UnicodeDecodeError as err:
            yield text_key(line), None, f"line {number} is not valid UTF-8 (byte {err.start + 1})"
            continue
        if not jsonl:
            if not decoded.lstrip().startswith("#") and _clean(decoded):
                yield text_key(_clean(decoded)), _clean(decoded), ""
            continue
        try:
            obj = json.loads(decoded)
        except json.JSONDecodeError as err:
            yield text_key(line), None, f"line {number} is not JSON ({err.msg})"
            continue
        value = obj.get(column) if isinstance(obj, dict) else None
        if not isinstance(value, str) or not value.strip():
            yield text_key(line), None, f"line {number} has no {column!r} text"
            continue
        yield text_key(value), value, ""


def _parquet(path: Path, column: str) -> list[Found]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise AttnvizError("reading .parquet needs pyarrow: pip install pyarrow") from None
    try:
        names = pq.read_schema(path).names
        if column not in names:
            raise AttnvizError(f"{str(path)!r} has no {column!r} column (it has {', '.join(names[:8])})")
        values: Sequence[object] = pq.read_table(path, columns=[column]).column(column).to_pylist()
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise AttnvizError(f"cannot read {str(path)!r} as Parquet: {err}") from None
    out: list[Found] = []
    for row, value in enumerate(values):
        if isinstance(value, str) and value.strip():
            out.append((text_key(value), value, ""))
        else:
            out.append((text_key(f"row {row}: {value!r}"), None, f"row {row} has no text ({value!r})"))
    return out
