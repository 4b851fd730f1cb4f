"""The Model overview page's parts (the rollout flow)."""
