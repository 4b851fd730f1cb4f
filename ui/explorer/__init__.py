"""The Explorer page's parts: the layer's controls and grid, the big head, the token views,
the grid's hover frame and the exactness check."""
