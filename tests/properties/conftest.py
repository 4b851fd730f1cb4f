"""The property tests (Hypothesis): engine invariants over generated inputs and the demo gate as
a state machine. The profiles (fast: each property's own count, reproducible; slow: 10,000
examples) are in property_settings.py."""

from __future__ import annotations

import property_settings

property_settings.register()
