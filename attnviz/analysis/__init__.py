"""What is computed from a result: rollout, block-pooled views, value-weighted attention, token
views, and aligning two texts or two models for comparison."""
