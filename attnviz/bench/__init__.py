"""How attnviz is measured: ratios to one plain SDPA forward in the same run. `extraction`
(`attnviz bench`), `stats` (whole-model statistics), `families` (adapted families at long
inputs), `drift` (fast vs eager per layer), with what they share in `common`."""
