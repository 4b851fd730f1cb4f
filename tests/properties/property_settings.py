"""The property tests' Hypothesis profiles (registered by tests/properties/conftest.py) and the
example counts per tier.

- ``fast`` (the default; the fast tier): each property's own example count (`examples`),
  derandomized so a run is reproducible, no deadline (a busy 2-core machine), no database.
- ``slow``: `SLOW_EXAMPLES` examples and a fresh random seed each run. Chosen for the whole session
  by ``ATTNVIZ_HYPOTHESIS_PROFILE=slow``; tests marked ``slow`` (``make test``) run their own copy
  of a property under `slow_settings`: `SLOW_TIER_EXAMPLES` of them in ``make test`` (CI's hour
  budget: the gate machine's 10,000 take about 13 minutes on 2 cores), all `SLOW_EXAMPLES` under
  the slow profile.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

SLOW_EXAMPLES = 10_000
SLOW_TIER_EXAMPLES = 1_000
PROFILE_ENV = "ATTNVIZ_HYPOTHESIS_PROFILE"
SLOW = os.environ.get(PROFILE_ENV, "fast") == "slow"


def register() -> None:
    settings.register_profile(
        "fast",
        deadline=None,
        derandomize=True,
        database=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    settings.register_profile(
        "slow", settings.get_profile("fast"), max_examples=SLOW_EXAMPLES, derandomize=False
    )
    settings.load_profile("slow" if SLOW else "fast")


def examples(fast: int, **kwargs) -> settings:
    """Settings of a property: ``fast`` examples in the fast tier, `SLOW_EXAMPLES` in the slow
    profile."""
    return settings(max_examples=SLOW_EXAMPLES if SLOW else fast, **kwargs)


def slow_settings(**kwargs) -> settings:
    """The slow profile for one test (a ``slow``-marked copy of a fast property): `SLOW_EXAMPLES`
    under ``ATTNVIZ_HYPOTHESIS_PROFILE=slow``, `SLOW_TIER_EXAMPLES` in ``make test``."""
    count = SLOW_EXAMPLES if SLOW else SLOW_TIER_EXAMPLES
    return settings(settings.get_profile("slow"), max_examples=count, **kwargs)
