"""Explain a prediction: information-flow routes, logit lens, direct logit attribution, head
ablation and rotary frequency bands, all from one traced forward pass (`trace`)."""

from .residual import Trace, Unsupported, trace
from .routes import DEFAULT_THRESHOLD, Edge, FlowGraph, Node, information_flow

__all__ = ["DEFAULT_THRESHOLD", "Edge", "FlowGraph", "Node", "Trace", "Unsupported", "information_flow", "trace"]
