"""The Explain page's parts: its views over one trace, patching, and why a head attends."""
