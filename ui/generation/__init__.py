"""The Generation page's parts (mixer rows on hybrids)."""
