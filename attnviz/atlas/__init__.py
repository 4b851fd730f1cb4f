"""Head atlas: rank every head of a model over a corpus, on this process or on a Ray cluster.

- `run`: `run_atlas`, the one call (engines, the disk cache, progress, cancel, resume);
- `corpus`: reading texts (built-in, uploaded, .txt/.jsonl/.parquet files) with stable keys;
- `cache`: the per-text disk cache (atomic writes, damage detection, full-disk messages);
- `worker`: one text -> one entry, the computation every engine runs;
- `local`, `ray_engine`: the engines (Ray is imported only when its engine runs);
- `ranking`: the `Atlas` result: rankings, examples, tables;
- `command`: the ``attnviz atlas`` command line.
"""

from .cache import AtlasCache, CacheWriteError, Entry, OtherWeights
from .corpus import MAX_TEXTS, TextItem, builtin_corpus, parse_texts, read_corpus, text_key
from .ranking import STATISTICS, Atlas, Example, snippet
from .run import (
    ATLAS_MAX_TOKENS,
    ENGINES,
    AtlasInterrupted,
    Engine,
    Progress,
    cached_count,
    cluster_address,
    run_atlas,
)
from .worker import ModelRef, fingerprint, strongest_links

__all__ = [
    "ATLAS_MAX_TOKENS",
    "ENGINES",
    "MAX_TEXTS",
    "STATISTICS",
    "Atlas",
    "AtlasCache",
    "AtlasInterrupted",
    "CacheWriteError",
    "Engine",
    "Entry",
    "Example",
    "ModelRef",
    "OtherWeights",
    "Progress",
    "TextItem",
    "builtin_corpus",
    "cached_count",
    "cluster_address",
    "fingerprint",
    "parse_texts",
    "read_corpus",
    "run_atlas",
    "snippet",
    "strongest_links",
    "text_key",
]
