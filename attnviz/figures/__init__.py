"""Plotly figures of attention: pure builders, arrays and labels in, ``go.Figure`` out.

Nothing here imports Streamlit; pages call ``st.plotly_chart(fig)``. Conventions:

- Token axes are ``"(i) token"`` labels on category axes. The position prefix makes every label
  unique, so repeated tokens never merge (the reason the project avoids bare token categories),
  and the hover shows the query and key tokens with no extra per-cell payload. Downsampled axes
  label each bin ``"(i–j) token…"``.
- Every label and title built from user text is HTML-escaped (``<``, ``>``, ``&``): Plotly
  renders ``<b>`` and ``<br>`` in labels, and a token must be shown literally.
- Short token axes label every token (Plotly thins category ticks to every other one); long
  ones keep Plotly's thinning. The hover always names both tokens.
- Titles sit above the plot area under a top margin that leaves room for the mode bar.
- Payload is bounded: a heatmap cell costs about 6.7 bytes in the JSON the browser gets
  (base64 float32), so the builders pool down to ``GRID_MAX_CELLS`` / ``SINGLE_MAX_CELLS`` /
  ``MOSAIC_MAX_CELLS`` cells; one page view stays under 5 MB at any sequence length.
"""

from attnviz.figures.bins import (
    BYTES_PER_CELL,
    GRID_MAX_CELLS,
    GRID_MAX_SIDE,
    MOSAIC_MAX_CELLS,
    PAYLOAD_LIMIT,
    POOLS,
    SINGLE_MAX_CELLS,
    SINGLE_MAX_KEYS,
    Pool,
    bin_edges,
    downsample,
    grid_side,
    payload_bytes,
    pool,
    pooled_rows,
)
from attnviz.figures.charts import MetricPanel, bar_chart, metric_heatmap, metric_panels, profile_chart
from attnviz.figures.colour import (
    COLORSCALES,
    DIVERGING,
    LOG_FLOOR_EXP,
    LONG_TEXT_TOKENS,
    SCALES,
    ColorScale,
    Scale,
    default_scale,
    rank_values,
    resolve_scale,
    scale_note,
)
from attnviz.figures.grid import grid_shape, head_grid, labels_fit
from attnviz.figures.heatmaps import head_heatmap, matrix_heatmap, rows_heatmap
from attnviz.figures.hover import HOVER_MAX_TOKENS, hover_lines_html, hover_text_html
from attnviz.figures.labels import (
    ALL_TICKS_MAX,
    TITLE_MARGIN,
    bin_labels,
    escape,
    figure_name,
    head_title,
    index_ticks,
    token_labels,
    token_ticks,
)
from attnviz.figures.mosaic import model_mosaic, mosaic_panels, mosaic_row_titles, mosaic_side
from attnviz.figures.tokens import (
    DIRECTIONS,
    Direction,
    head_colours,
    text_window,
    token_lines,
    token_text,
    token_text_html,
)

__all__ = [
    "ALL_TICKS_MAX",
    "BYTES_PER_CELL",
    "COLORSCALES",
    "DIRECTIONS",
    "DIVERGING",
    "GRID_MAX_CELLS",
    "GRID_MAX_SIDE",
    "HOVER_MAX_TOKENS",
    "LOG_FLOOR_EXP",
    "LONG_TEXT_TOKENS",
    "MOSAIC_MAX_CELLS",
    "PAYLOAD_LIMIT",
    "POOLS",
    "SCALES",
    "SINGLE_MAX_CELLS",
    "SINGLE_MAX_KEYS",
    "TITLE_MARGIN",
    "ColorScale",
    "Direction",
    "MetricPanel",
    "Pool",
    "Scale",
    "bar_chart",
    "bin_edges",
    "bin_labels",
    "default_scale",
    "downsample",
    "escape",
    "figure_name",
    "grid_shape",
    "grid_side",
    "head_colours",
    "head_grid",
    "head_heatmap",
    "head_title",
    "hover_lines_html",
    "hover_text_html",
    "index_ticks",
    "labels_fit",
    "matrix_heatmap",
    "metric_heatmap",
    "metric_panels",
    "model_mosaic",
    "mosaic_panels",
    "mosaic_row_titles",
    "mosaic_side",
    "payload_bytes",
    "pool",
    "pooled_rows",
    "profile_chart",
    "rank_values",
    "resolve_scale",
    "rows_heatmap",
    "scale_note",
    "text_window",
    "token_labels",
    "token_lines",
    "token_text",
    "token_text_html",
    "token_ticks",
]
