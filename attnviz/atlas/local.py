"""The local engine: every pending text in this process, one after another, in corpus order.

Both engines report to a `Sink` (the run in `attnviz.atlas.run`): ``before()`` ahead of each
text (progress, and False to stop), ``finished(entry)`` as each text finishes (the entry goes to
the disk cache at once; a run stops only at ``before()``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..layout import Stack
from ..loading import LoadedModel
from .cache import Entry
from .corpus import TextItem
from .worker import compute_entry


class Sink(Protocol):
    def before(self) -> bool: ...

    def finished(self, entry: Entry) -> None: ...


def run_local(
    lm: LoadedModel,
    pending: Sequence[TextItem],
    *,
    stack: Stack,
    max_tokens: int,
    weights: str,
    sink: Sink,
) -> bool:
    """Compute ``pending`` texts in order; True when all ran, False when the sink stopped it."""
    for item in pending:
        if not sink.before():
            return False
        assert item.text is not None
        entry = compute_entry(lm, item.key, item.text, stack=stack, max_tokens=max_tokens, weights=weights)
        sink.finished(entry)
    return True
