"""The Compare page's parts: aligned tokens and how much each head changed."""
