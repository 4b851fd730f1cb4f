"""The options each page's controls offer, each from one ``Literal`` (``get_args``), never a
second list; `ui.params` validates link values against them."""

from __future__ import annotations

from typing import Literal, get_args

import attnviz
from attnviz.figures import SCALES

CompareMode = Literal["two texts", "two models"]
COMPARE_MODES: tuple[str, ...] = get_args(CompareMode)
ScratchMode = Literal["real layer", "toy"]
SCRATCH_MODES: tuple[str, ...] = get_args(ScratchMode)
Change = Literal["none", "no RoPE", "no mask", "no scaling", "ungrouped K/V"]
CHANGES: tuple[str, ...] = get_args(Change)
TokenView = Literal["lines", "text"]  # the explorer's token view: lines between tokens or coloured text
TOKEN_VIEWS: tuple[str, ...] = get_args(TokenView)
ExplainView = Literal["routes", "logit lens", "attribution", "ablation", "patching", "why this head attends"]
QKBy = Literal["part", "layer"]  # why a head attends: the split by part or by layer of origin
QK_BY_CHOICES: tuple[str, ...] = get_args(QKBy)
EXPLAIN_VIEWS: tuple[str, ...] = get_args(ExplainView)
PATCH_OVER_CHOICES: tuple[str, ...] = attnviz.explain.OVERS  # the Patching view (issue 33)
PATCH_DIRECTION_CHOICES: tuple[str, ...] = attnviz.explain.DIRECTIONS
GenRow = Literal["new token", "predicting position"]
GEN_ROWS: tuple[str, ...] = get_args(GenRow)
STACKS: tuple[str, ...] = ("", *get_args(attnviz.layout.Stack))
SCALE_CHOICES: tuple[str, ...] = ("auto", *SCALES)
# Every page's one colour control ("Colour scale"), with the options that make sense there:
# the explorer adds "perhead" (auto's scale, each head its own range); Compare leaves out "rank"
# (a percentile per figure: the same colour would mean different weights in A and in B).
EXPLORER_SCALES: tuple[str, ...] = (*SCALE_CHOICES, "perhead")
COMPARE_SCALES: tuple[str, ...] = tuple(s for s in SCALE_CHOICES if s != "rank")
